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
name these modules (``loopwarden.MOVED``); the old ``pluginmanager``'s other names are looked
up in the role modules when asked (:func:`__getattr__`).
"""

import sys
from typing import Any

from loopwarden import verdicts
from loopwarden.host.dispatch import Hooks
from loopwarden.host.find import (
    BUILTIN_PLUGINS,
    ENV_EXTRA,
    ENV_NO_AUTOLOAD,
    enabled_and_blocked,
    plugin_name,
    resolve_names,
    resolve_plugin_name,
    unloaded_tables,
)
from loopwarden.host.load import builtin_settings, instantiate_plugin, load_plugins
from loopwarden.host.register import ESSENTIAL_PLUGINS, LoadedPlugin, PluginSet, register

__all__ = [
    "BUILTIN_PLUGINS",
    "ENV_EXTRA",
    "ENV_NO_AUTOLOAD",
    "ESSENTIAL_PLUGINS",
    "Hooks",
    "LoadedPlugin",
    "PluginSet",
    "builtin_settings",
    "enabled_and_blocked",
    "instantiate_plugin",
    "load_plugins",
    "plugin_name",
    "register",
    "resolve_names",
    "resolve_plugin_name",
    "unloaded_tables",
]


def __getattr__(name: str) -> Any:
    """Any other public name of the role modules (``loopwarden.engine.pluginmanager``'s
    ``check_tables``, ``ENTRY_POINT_GROUP``, its ``Verdict``): one lookup, not a second list."""
    roles = [sys.modules[f"{__name__}.{role}"] for role in ("find", "load", "register")]
    for module in (*roles, verdicts):
        if not name.startswith("_") and name in vars(module):
            return vars(module)[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
