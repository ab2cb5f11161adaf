"""loopwarden's built-in plugins: one module per defence line, plus observers.

Built-in plugins register exactly like third-party ones: they are named in ``[plugins]
enabled`` and configured in ``[plugins.<name>]``.  See ``loopwarden plugins`` for the order in
effect and the README for every plugin's settings.

May import: the public vocabulary (``from loopwarden import Plugin, hookimpl``, the modules at
the top of the package), :mod:`loopwarden.store`, :mod:`loopwarden.models` and
:mod:`loopwarden.tools` -- never the engine, the deployment (a plugin is handed a
:class:`loopwarden.run.DeploymentView`; not even ``from loopwarden import Deployment``), the
MCP servers, the recorded-traffic tools, the reports, the commands, the demo, the adapters or
the test kit, directly or through another module.  Nothing below the deployment imports a
plugin: the plugin host loads them by name.
"""
