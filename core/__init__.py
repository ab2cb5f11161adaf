"""loopwarden keeps LLM agent loops from running away.

The model proposes, the runtime decides: a minimal agent loop emits hook events
(``before_model``, ``after_response``, ``before_tool``, ``after_tool``, ``on_stop``, and
``on_start``), and pluggy plugins -- one per defence line -- return verdicts that warn, skip a
tool call, or stop the run.  Plugins are enabled and ordered per deployment in ``config.toml``.

A plugin in ten lines::

    from loopwarden import Plugin, hookimpl

    class NoRefunds(Plugin):
        name = "no_refunds"

        @hookimpl
        def before_tool(self, run, call):
            if call.name == "apply_refund":
                return self.stop("forbidden_tool", tool=call.name,
                                 answer="I can't issue refunds here; nothing was refunded.")
"""

from __future__ import annotations

import importlib
import importlib.machinery
import logging
import sys
import types
from typing import TYPE_CHECKING, Any, cast

from loopwarden._version import __version__

# A library never configures logging: records go nowhere until the application (or the CLI's
# --log-level) adds a handler -- Python's last-resort stderr handler stays out of it.
logging.getLogger("loopwarden").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from importlib.abc import Loader

    from loopwarden.clock import CancelToken, Clock, FakeClock, SystemClock
    from loopwarden.config import Config, load_config
    from loopwarden.deployment import Deployment
    from loopwarden.events import (
        ModelRequest,
        ModelResponse,
        ProposedCall,
        RetryPlan,
        ToolCall,
        ToolResult,
        Usage,
    )
    from loopwarden.exceptions import (
        ConfigError,
        LoopwardenError,
        ModelError,
        PluginLoadError,
        ScenarioError,
        ToolDefinitionError,
        ToolError,
    )
    from loopwarden.hookspecs import hookimpl, hookspec
    from loopwarden.plugin import NoSettings, Plugin, PluginSettings
    from loopwarden.run import Conversation, Limits, Run, RunOutcome
    from loopwarden.stash import Stash, StashKey
    from loopwarden.tools import Tool, ToolContext, ToolRegistry, tool
    from loopwarden.verdicts import Skip, Stop, Verdict, Warn, skip, stop, warn

# Public names -> the private module that defines them.  Imported on first use, so that
# `import loopwarden` (and `loopwarden --help`) stays fast.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("CancelToken", "Clock", "FakeClock", "SystemClock"), "clock"),
    **dict.fromkeys(("Config", "load_config"), "config"),
    "Deployment": "deployment",
    **dict.fromkeys(
        (
            "ModelRequest",
            "ModelResponse",
            "ProposedCall",
            "RetryPlan",
            "ToolCall",
            "ToolResult",
            "Usage",
        ),
        "events",
    ),
    **dict.fromkeys(
        (
            "ConfigError",
            "LoopwardenError",
            "ModelError",
            "PluginLoadError",
            "ScenarioError",
            "ToolDefinitionError",
            "ToolError",
        ),
        "exceptions",
    ),
    **dict.fromkeys(("hookimpl", "hookspec"), "hookspecs"),
    **dict.fromkeys(("NoSettings", "Plugin", "PluginSettings"), "plugin"),
    **dict.fromkeys(("Conversation", "Limits", "Run", "RunOutcome"), "run"),
    **dict.fromkeys(("Stash", "StashKey"), "stash"),
    # your own tools (pydantic builds their schemas: imported on first use too)
    **dict.fromkeys(("Tool", "ToolContext", "ToolRegistry", "tool"), "tools"),
    **dict.fromkeys(("Skip", "Stop", "Verdict", "Warn", "skip", "stop", "warn"), "verdicts"),
    # the client wrapper (a front end; imported only when asked for)
    "wrap": "gateway.wrap",
}

__all__ = [
    "CancelToken",
    "Clock",
    "Config",
    "ConfigError",
    "Conversation",
    "Deployment",
    "FakeClock",
    "Limits",
    "LoopwardenError",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "NoSettings",
    "Plugin",
    "PluginLoadError",
    "PluginSettings",
    "ProposedCall",
    "RetryPlan",
    "Run",
    "RunOutcome",
    "ScenarioError",
    "Skip",
    "Stash",
    "StashKey",
    "Stop",
    "SystemClock",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "Usage",
    "Verdict",
    "Warn",
    "__version__",
    "hookimpl",
    "hookspec",
    "load_config",
    "skip",
    "stop",
    "tool",
    "warn",
    "wrap",
]


# The modules 0.2 had at the top of the package, and where they live now (docs/upgrading.md).
# Importing an old path gives the new module itself -- one module object under two names, so
# patching through either name patches both.  Nothing is imported until an old path is.
MOVED: dict[str, str] = {
    "loopwarden.loop": "loopwarden.engine.loop",
    "loopwarden.dispatch": "loopwarden.host.dispatch",
    "loopwarden.execution": "loopwarden.engine.execution",
    "loopwarden.streaming": "loopwarden.engine.streaming",
    "loopwarden.registry": "loopwarden.host.register",
    "loopwarden.pluginmanager": "loopwarden.host",
    "loopwarden.replay": "loopwarden.traffic.replay",
    "loopwarden.calibrate": "loopwarden.traffic.calibrate",
    "loopwarden.offline": "loopwarden.traffic.offline",
    "loopwarden.scenario": "loopwarden.models.scenario",
    "loopwarden.tokens": "loopwarden.models.tokens",
    "loopwarden.schema": "loopwarden.commands.schema",
    "loopwarden.cli": "loopwarden.commands.cli",
    "loopwarden.tools.shop": "loopwarden.demo.shop",
    # the plugin host, in the engine in earlier 0.3 builds: a folder of its own now
    "loopwarden.engine.pluginmanager": "loopwarden.host",
    "loopwarden.engine.registry": "loopwarden.host.register",
    "loopwarden.engine.dispatch": "loopwarden.host.dispatch",
    "loopwarden.engine.shadow": "loopwarden.host.shadow",
}


class _MovedModule:
    """Answers an old module path with the module at its new one (a meta path finder and its
    loader; not derived from ``importlib.abc``, whose import costs ``import loopwarden``
    ~15 ms)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""

    def get_code(self, fullname: str) -> types.CodeType | None:
        """The new module's code, for ``python -m <old path>`` (``runpy`` asks for it)."""
        import importlib.util

        spec = importlib.util.find_spec(MOVED[fullname])
        get_code = getattr(spec.loader, "get_code", None) if spec is not None else None
        return get_code(spec.name) if get_code is not None and spec is not None else None


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.append(_MovedModule())


def __getattr__(name: str) -> Any:
    if name == "run":  # the module, callable: ``with loopwarden.run("id"):`` (loopwarden.wrap)
        return importlib.import_module("loopwarden.run")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'loopwarden' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"loopwarden.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
