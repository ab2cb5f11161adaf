"""The plugin host: plugins found, ordered, configured and called -- by role, as pluggy is.

:mod:`~loopwarden.host.find` resolves the names ``[plugins] enabled`` lists (built-ins, entry
points, ``module:attr``) to objects; :mod:`~loopwarden.host.load` configures them, each settings
table validated by one function, :func:`settings_of` -- which ``loopwarden config schema`` and
the docs ask too;
:mod:`~loopwarden.host.register` registers them with pluggy in config order and checks them;
:mod:`~loopwarden.host.dispatch` is the facade the loop calls hooks through (verdicts, blame,
fail closed); :mod:`~loopwarden.host.shadow` undoes what shadowed plugins change.

A folder of its own, beside the engine rather than inside it: loading plugins is asked for by
more than runs (``loopwarden plugins``, ``config check``, ``config schema``, the docs, the test
kit), and the engine only calls the hooks it is handed.  May import: the public vocabulary at
the top of the package (config, exceptions, hookspecs, plugin, verdicts, redaction; ``run``
and ``events`` for types only: a deployment is a :class:`loopwarden.run.DeploymentView` here)
and pluggy -- never the engine, a plugin (each is imported by name, when enabled), the
deployment, the MCP servers, the store, the commands, the docs or the test kit (checked by
import-linter: ``[tool.importlinter]`` in pyproject.toml).
The 0.3 paths ``loopwarden.engine.pluginmanager``, ``.registry``, ``.dispatch`` and ``.shadow``
name these modules (``loopwarden.MOVED``).
"""

from loopwarden.host.dispatch import Hooks
from loopwarden.host.find import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    ENV_BLOCK,
    ENV_EXTRA,
    ENV_NO_AUTOLOAD,
    autoload_off_entry_points,
    config_dir,
    declared_name,
    enabled_and_blocked,
    installed_entry_points,
    is_blocked,
    plugin_name,
    resolve_names,
    resolve_plugin_name,
    unloaded_tables,
)
from loopwarden.host.load import (
    builtin_settings,
    check_tables,
    instantiate_plugin,
    load_plugins,
    settings_of,
)
from loopwarden.host.register import (
    ENV_TRACE,
    ESSENTIAL_PLUGINS,
    LoadedPlugin,
    LoopwardenPluginManager,
    PluginSet,
    new_plugin_manager,
    register,
)
from loopwarden.verdicts import Verdict

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "ENV_BLOCK",
    "ENV_EXTRA",
    "ENV_NO_AUTOLOAD",
    "ENV_TRACE",
    "ESSENTIAL_PLUGINS",
    "Hooks",
    "LoadedPlugin",
    "LoopwardenPluginManager",
    "PluginSet",
    "Verdict",
    "autoload_off_entry_points",
    "builtin_settings",
    "check_tables",
    "config_dir",
    "declared_name",
    "enabled_and_blocked",
    "installed_entry_points",
    "instantiate_plugin",
    "is_blocked",
    "load_plugins",
    "new_plugin_manager",
    "plugin_name",
    "register",
    "resolve_names",
    "resolve_plugin_name",
    "settings_of",
    "unloaded_tables",
]
