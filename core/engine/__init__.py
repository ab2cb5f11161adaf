"""The engine: the step machine and everything that runs it.

The loop (:mod:`~loopwarden.engine.loop`: the step machine of effects), its drivers
(:mod:`~loopwarden.engine.drivers`, :mod:`~loopwarden.engine.streaming`), the effects it asks
for and the outcomes it ends with, tool-call parsing (:mod:`~loopwarden.engine.calls`), tool
execution under deadlines (:mod:`~loopwarden.engine.execution`), hook dispatch and shadow mode
(:mod:`~loopwarden.engine.dispatch`, :mod:`~loopwarden.engine.shadow`), and plugin loading
(:mod:`~loopwarden.engine.registry`, :mod:`~loopwarden.engine.pluginmanager`).

May import: the public vocabulary at the top of the package (config, events, verdicts, run,
hookspecs, plugin, signals, reasons, exceptions, stash, clock, notes, sanitize, redaction,
fingerprint), :mod:`loopwarden.models`, :mod:`loopwarden.store` and :mod:`loopwarden.tools`.
Never a plugin, the deployment (not even type-only: it names
:class:`loopwarden.run.DeploymentView`), the MCP servers, the demo, the adapters, the
commands, the recorded-traffic tools, the reports, the docs generator or the test kit --
directly or through another module (checked by import-linter: ``[tool.importlinter]`` in
pyproject.toml).  Plugins never import the engine: they see it only through the hook
payloads.
"""
