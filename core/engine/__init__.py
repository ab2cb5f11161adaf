"""The engine: the step machine and everything that runs it.

The loop (:mod:`~loopwarden.engine.loop`: the step machine of effects) and its two turns
(:mod:`~loopwarden.engine.calls`: the model turn and tool-call parsing;
:mod:`~loopwarden.engine.toolturn`: the tool turn; both over
:mod:`~loopwarden.engine.guards`), its drivers (:mod:`~loopwarden.engine.drivers`,
:mod:`~loopwarden.engine.streaming`), the effects it asks for and the outcomes it ends with,
tool execution under deadlines (:mod:`~loopwarden.engine.execution`).  It calls the hooks
through the facade the plugin host hands it (:class:`loopwarden.host.Hooks`).

May import: the public vocabulary at the top of the package (config, events, verdicts, run,
hookspecs, plugin, signals, reasons, exceptions, stash, clock, notes, sanitize, redaction,
fingerprint), the plugin host (:mod:`loopwarden.host`), :mod:`loopwarden.models`,
:mod:`loopwarden.store` and :mod:`loopwarden.tools`.
Never a plugin, the deployment (not even type-only: it names
:class:`loopwarden.run.DeploymentView`), the MCP servers, the demo, the adapters, the
commands, the recorded-traffic tools, the reports, the docs generator or the test kit --
directly or through another module (checked by import-linter: ``[tool.importlinter]`` in
pyproject.toml).  Plugins never import the engine: they see it only through the hook
payloads.
"""
