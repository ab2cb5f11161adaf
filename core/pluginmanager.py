"""Loading plugins in config order, and the typed facade the loop calls hooks through.

Names in ``[plugins] enabled`` resolve, in this order, to:

1. a built-in plugin (``max_steps``, ``repeat_call``, ...);
2. an entry point in the group ``loopwarden.plugins`` (loaded only when named; turned off by
   ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD=1``);
3. ``module:attr`` -- an importable object, for plugins that are not packaged.

``LOOPWARDEN_PLUGINS`` (comma-separated) appends names; ``[plugins] blocked`` and
``LOOPWARDEN_BLOCK_PLUGINS`` remove names *before* anything is imported.  Essential plugins
(``max_steps``) are always loaded and cannot be blocked.

pluggy calls implementations last-registered-first, so plugins are registered in reverse
config order; after loading, the effective order of every hook is read back from
``get_hookimpls()`` and compared with the config -- a ``tryfirst``/``trylast`` that would
break it fails at start-up, naming the plugin.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

import pluggy
from pydantic import BaseModel, ValidationError

from loopwarden import hookspecs
from loopwarden.config import Config, validation_error
from loopwarden.exceptions import ConfigError, PluginLoadError
from loopwarden.verdicts import EMPTY, Resolution, Skip, Stop, Verdict, Warn, resolve

if TYPE_CHECKING:
    from loopwarden.events import ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.run import Run, RunOutcome

__all__ = ["BUILTIN_PLUGINS", "ESSENTIAL_PLUGINS", "Hooks", "LoadedPlugin", "PluginSet", "load_plugins"]

log = logging.getLogger("loopwarden.plugins")

ENTRY_POINT_GROUP = "loopwarden.plugins"

#: built-in plugin names -> "module:attr"
BUILTIN_PLUGINS: dict[str, str] = {
    "max_steps": "loopwarden.plugins.max_steps:MaxSteps",
    "timeout": "loopwarden.plugins.timeout:Timeout",
    "token_budget": "loopwarden.plugins.token_budget:TokenBudget",
    "cost_budget": "loopwarden.plugins.cost_budget:CostBudget",
    "tool_calls": "loopwarden.plugins.tool_calls:ToolCalls",
    "retry_policy": "loopwarden.plugins.retry_policy:RetryPolicy",
    "repeat_call": "loopwarden.plugins.repeat_call:RepeatCall",
    "oscillation": "loopwarden.plugins.oscillation:Oscillation",
    "no_progress": "loopwarden.plugins.no_progress:NoProgress",
    "stall": "loopwarden.plugins.stall:Stall",
    "failure_streak": "loopwarden.plugins.failure_streak:FailureStreak",
    "terminal_tool": "loopwarden.plugins.terminal_tool:TerminalTool",
    "logging": "loopwarden.plugins.logging:LoggingPlugin",
    "alerting": "loopwarden.plugins.alerting:Alerting",
    "metrics": "loopwarden.plugins.metrics:Metrics",
    "run_record": "loopwarden.plugins.run_record:RunRecord",
}

#: plugins that can be configured but never disabled (pytest's "essential plugins")
ESSENTIAL_PLUGINS: tuple[str, ...] = ("max_steps",)

ENV_EXTRA = "LOOPWARDEN_PLUGINS"
ENV_BLOCK = "LOOPWARDEN_BLOCK_PLUGINS"
ENV_NO_AUTOLOAD = "LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD"
ENV_TRACE = "LOOPWARDEN_TRACE_PLUGINS"


@dataclass
class LoadedPlugin:
    """One loaded plugin: its configured name, where it came from, the registered object."""

    name: str
    source: str  # "builtin", "entry point <dist>", or "module:attr"
    spec: str  # the module:attr it was loaded from
    obj: Any
    settings: BaseModel | None = None
    hooks: list[str] = field(default_factory=list)


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def _import_spec(spec: str, plugin: str) -> Any:
    if ":" not in spec:
        raise PluginLoadError(
            f"cannot resolve {spec!r}: not a built-in name, not an installed entry point "
            f"(group {ENTRY_POINT_GROUP!r}), and not 'module:attr'",
            plugin=plugin,
        )
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:
        raise PluginLoadError(f"cannot import {mod_name!r}: {exc}", plugin=plugin) from exc
    for part in attr.split(".") if attr else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginLoadError(f"{mod_name!r} has no attribute {attr!r}", plugin=plugin) from None
    return obj


def _entry_points() -> dict[str, metadata.EntryPoint]:
    if os.environ.get(ENV_NO_AUTOLOAD, "").strip() not in ("", "0", "false", "no"):
        return {}
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            raise PluginLoadError(
                f"two installed entry points share this name: {found[ep.name].value!r} and "
                f"{ep.value!r}",
                plugin=ep.name,
            )
        found[ep.name] = ep
    return found


def _ep_source(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return f"entry point ({dist.metadata['Name']} {dist.version})"
    return "entry point"


def _instantiate(name: str, target: Any, table: Mapping[str, Any], cfg_path: str | None) -> tuple[Any, BaseModel | None]:
    """Build the plugin object: classes get their validated settings; other objects as-is."""
    settings_model: type[BaseModel] | None = getattr(target, "Settings", None)
    if settings_model is not None and not (
        isinstance(settings_model, type) and issubclass(settings_model, BaseModel)
    ):
        settings_model = None
    settings: BaseModel | None = None
    if settings_model is not None:
        try:
            settings = settings_model.model_validate(dict(table))
        except ValidationError as exc:
            raise validation_error(exc, path=cfg_path, prefix=f"plugins.{name}") from None
    elif table:
        raise ConfigError(
            f"plugin {name!r} takes no settings, got {sorted(table)}",
            path=cfg_path, key=f"plugins.{name}",
        )
    if inspect.isclass(target):
        try:
            obj = target(settings) if settings is not None else target()
        except Exception as exc:
            raise PluginLoadError(f"cannot construct {target.__name__}: {exc}", plugin=name) from exc
        if hasattr(obj, "name"):
            try:
                obj.name = name
            except AttributeError:
                pass
        return obj, settings
    if settings is not None and hasattr(target, "configure"):
        target.configure(settings)
    return target, settings


def _impl_owner_map(pm: pluggy.PluginManager) -> dict[Any, str]:
    """Map each hook implementation's code object to its plugin name (for blame)."""
    owners: dict[Any, str] = {}
    for hname in hookspecs.HOOK_NAMES:
        for impl in getattr(pm.hook, hname).get_hookimpls():
            fn = getattr(impl.function, "__func__", impl.function)
            code = getattr(fn, "__code__", None)
            if code is not None:
                owners[code] = impl.plugin_name
    return owners


class Hooks:
    """The typed facade the loop calls hooks through.

    Each decision hook returns a :class:`Resolution`.  A plugin that raises is blamed by name
    and turned into a hard ``plugin_error`` stop (fail closed).  ``on_stop`` runs every
    implementation even when one raises.
    """

    def __init__(self, pm: pluggy.PluginManager, order: Sequence[str]) -> None:
        self._pm = pm
        self._order = list(order)
        h = pm.hook
        self._on_start = h.on_start
        self._before_model = h.before_model
        self._after_response = h.after_response
        self._before_tool = h.before_tool
        self._after_tool = h.after_tool
        self._on_stop = h.on_stop
        self._owners = _impl_owner_map(pm)

    def _blame(self, exc: BaseException) -> str:
        tb: TracebackType | None = exc.__traceback__
        culprit = "<unknown>"
        while tb is not None:
            name = self._owners.get(tb.tb_frame.f_code)
            if name is not None:
                culprit = name
                break
            tb = tb.tb_next
        return culprit

    def _failed(self, hook: str, exc: Exception) -> Resolution:
        plugin = self._blame(exc)
        log.error("plugin %r failed in %s: %r", plugin, hook, exc, exc_info=exc)
        verdict = Stop(
            reason="plugin_error",
            plugin=plugin,
            soft=False,
            message=f"plugin {plugin!r} raised in {hook}: {type(exc).__name__}: {exc}",
            evidence={"hook": hook, "error": f"{type(exc).__name__}: {exc}"},
        )
        return Resolution(verdict, (), (verdict,))

    def _resolve(self, hook: str, results: list[Any]) -> Resolution:
        if not results:
            return EMPTY
        for r in results:
            if not isinstance(r, (Warn, Skip, Stop)):
                verdict = Stop(
                    reason="plugin_error",
                    soft=False,
                    message=f"a {hook} implementation returned {r!r}, not a verdict",
                    evidence={"hook": hook, "returned": repr(r)},
                )
                return Resolution(verdict, (), (verdict,))
        return resolve(results)

    def on_start(self, run: Run) -> Resolution:
        try:
            return self._resolve("on_start", self._on_start(run=run))
        except Exception as exc:
            return self._failed("on_start", exc)

    def before_model(self, run: Run, request: ModelRequest) -> Resolution:
        try:
            return self._resolve("before_model", self._before_model(run=run, request=request))
        except Exception as exc:
            return self._failed("before_model", exc)

    def after_response(self, run: Run, response: ModelResponse) -> Resolution:
        try:
            return self._resolve(
                "after_response", self._after_response(run=run, response=response)
            )
        except Exception as exc:
            return self._failed("after_response", exc)

    def before_tool(self, run: Run, call: ToolCall) -> Resolution:
        try:
            return self._resolve("before_tool", self._before_tool(run=run, call=call))
        except Exception as exc:
            return self._failed("before_tool", exc)

    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Resolution:
        try:
            return self._resolve(
                "after_tool", self._after_tool(run=run, call=call, result=result)
            )
        except Exception as exc:
            return self._failed("after_tool", exc)

    def on_stop(self, run: Run, outcome: RunOutcome) -> list[dict[str, str]]:
        """Call every ``on_stop``; return the failures (plugin, error) instead of raising."""
        failures: list[dict[str, str]] = []
        done: set[str] = set()
        caller = self._on_stop
        while True:
            try:
                caller(run=run, outcome=outcome)
                return failures
            except Exception as exc:
                plugin = self._blame(exc)
                log.error("plugin %r failed in on_stop: %r", plugin, exc, exc_info=exc)
                failures.append({"plugin": plugin, "hook": "on_stop",
                                 "error": f"{type(exc).__name__}: {exc}"})
                # Call the implementations that the exception skipped: the ones after the
                # failing plugin in call order.
                impls = [i.plugin_name for i in reversed(self._on_stop.get_hookimpls())
                         if not (i.hookwrapper or i.wrapper)]
                if plugin not in impls:
                    return failures
                done.update(impls[: impls.index(plugin) + 1])
                remove = [self._pm.get_plugin(n) for n in done]
                caller = self._pm.subset_hook_caller("on_stop", remove_plugins=remove)

    @property
    def order(self) -> list[str]:
        return list(self._order)


class PluginSet:
    """The plugins of one deployment, loaded and registered in config order."""

    def __init__(self, pm: pluggy.PluginManager, plugins: list[LoadedPlugin]) -> None:
        self.pm = pm
        self.plugins = plugins
        self.hooks = Hooks(pm, [p.name for p in plugins])

    def __iter__(self) -> Any:
        return iter(self.plugins)

    def __len__(self) -> int:
        return len(self.plugins)

    def get(self, name: str) -> Any:
        for p in self.plugins:
            if p.name == name:
                return p.obj
        return None

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    def call_order(self, hook: str) -> list[str]:
        """The effective call order of ``hook`` (read from pluggy), wrappers excluded."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return [i.plugin_name for i in reversed(impls) if not (i.hookwrapper or i.wrapper)]


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if os.environ.get(ENV_TRACE):
        pm.trace.root.setwriter(lambda s: sys.stderr.write(s))
        pm.enable_tracing()
    return pm


def resolve_names(config: Config, extra: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """The plugin names to load, in call order, and the names blocked (before any import)."""
    path = config.path
    blocked = list(config.plugins.blocked) + _env_list(ENV_BLOCK)
    for name in blocked:
        if name in ESSENTIAL_PLUGINS:
            raise ConfigError(
                f"{name!r} is essential and cannot be blocked (configure its limits instead)",
                path=path, key="plugins.blocked",
            )
    names: list[str] = []
    for name in [*config.plugins.enabled, *_env_list(ENV_EXTRA), *extra]:
        if name in names:
            raise ConfigError(f"plugin {name!r} is listed twice", path=path, key="plugins.enabled")
        names.append(name)
    for ess in ESSENTIAL_PLUGINS:
        if ess not in names:
            names.insert(0, ess)
    return [n for n in names if n not in blocked], blocked


def load_plugins(
    config: Config,
    *,
    extra: Iterable[str] = (),
    objects: Mapping[str, Any] | None = None,
) -> PluginSet:
    """Resolve, import, configure and register the config's plugins, in config order.

    ``objects`` maps extra names to ready plugin objects (used by tests and by
    :class:`~loopwarden.Deployment` callers who build plugins in code); they are appended after
    the configured ones unless the config names them.
    """
    objects = dict(objects or {})
    names, _blocked = resolve_names(config, [*extra, *[n for n in objects if n not in config.plugins.enabled]])
    tables = config.plugins.tables()
    eps: dict[str, metadata.EntryPoint] | None = None
    loaded: list[LoadedPlugin] = []
    known = set(names) | set(BUILTIN_PLUGINS)
    for tname in tables:
        if tname not in known:
            if eps is None:
                eps = _entry_points()
            if tname not in eps and ":" not in tname:
                raise ConfigError(
                    f"settings for a plugin that is neither enabled, built in nor installed "
                    f"(enabled: {', '.join(names)})",
                    path=config.path, key=f"plugins.{tname}",
                )
    for name in names:
        table = tables.get(name, {})
        if name in objects:
            obj = objects[name]
            if table and hasattr(obj, "Settings"):
                # A ready object gets the config's settings only through construction.
                raise ConfigError(
                    "settings given for a plugin object built in code",
                    path=config.path, key=f"plugins.{name}",
                )
            if hasattr(obj, "name") and not inspect.isclass(obj) and not isinstance(obj, ModuleType):
                try:
                    obj.name = name
                except AttributeError:
                    pass
            loaded.append(LoadedPlugin(name, "object", repr(obj), obj))
            continue
        if name in BUILTIN_PLUGINS:
            spec, source = BUILTIN_PLUGINS[name], "builtin"
            target = _import_spec(spec, name)
        else:
            if eps is None:
                eps = _entry_points()
            if name in eps:
                ep = eps[name]
                spec, source = ep.value, _ep_source(ep)
                try:
                    target = ep.load()
                except Exception as exc:
                    raise PluginLoadError(f"cannot load entry point {ep.value!r}: {exc}", plugin=name) from exc
            else:
                spec, source = name, "module:attr"
                target = _import_spec(name, name)
        obj, settings = _instantiate(name, target, table, config.path)
        loaded.append(LoadedPlugin(name, source, spec, obj, settings))
    return register(loaded)


def register(loaded: list[LoadedPlugin]) -> PluginSet:
    """Register ``loaded`` (in call order) with a new pluggy manager and verify the order."""
    pm = new_plugin_manager()
    seen: set[int] = set()
    for lp in loaded:
        if id(lp.obj) in seen:
            raise PluginLoadError("the same object is registered under two names", plugin=lp.name)
        seen.add(id(lp.obj))
    for lp in reversed(loaded):
        try:
            pm.register(lp.obj, name=lp.name)
        except ValueError as exc:
            raise PluginLoadError(str(exc), plugin=lp.name) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(str(exc), plugin=lp.name) from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        plugin_name = pm.get_name(exc.plugin) if exc.plugin is not None else None
        raise PluginLoadError(
            f"{exc} (known hooks: {', '.join(hookspecs.HOOK_NAMES)})", plugin=plugin_name
        ) from exc
    for lp in loaded:
        impls = pm.get_hookcallers(lp.obj) or []
        lp.hooks = sorted({hc.name for hc in impls}, key=_hook_rank)
        has_connect = callable(getattr(lp.obj, "connect", None)) and type(lp.obj).connect is not _base_connect()
        if not lp.hooks and not has_connect:
            raise PluginLoadError(
                f"implements no hook (expected @hookimpl methods named one of: "
                f"{', '.join(hookspecs.HOOK_NAMES)})",
                plugin=lp.name,
            )
    plugin_set = PluginSet(pm, loaded)
    config_order = [lp.name for lp in loaded]
    for hook in hookspecs.HOOK_NAMES:
        actual = plugin_set.call_order(hook)
        expected = [n for n in config_order if n in actual]
        if actual != expected:
            culprit = _first_out_of_order(actual, expected)
            raise PluginLoadError(
                f"its tryfirst/trylast on {hook} would break the configured order "
                f"(config: {expected}, effective: {actual}); remove the marker or move the "
                "plugin in [plugins] enabled",
                plugin=culprit,
            )
    return plugin_set


def _first_out_of_order(actual: list[str], expected: list[str]) -> str:
    for a, e in zip(actual, expected):
        if a != e:
            return a
    return actual[0] if actual else "?"


def _hook_rank(name: str) -> int:
    try:
        return hookspecs.HOOK_NAMES.index(name)
    except ValueError:
        return len(hookspecs.HOOK_NAMES)


def _base_connect() -> Callable[..., Any]:
    from loopwarden.plugin import Plugin

    return Plugin.connect


def plugin_hooks(obj: Any) -> list[str]:
    """Names of the hooks ``obj`` implements (by marker), without registering it."""
    out = []
    for attr in dir(obj):
        fn = getattr(obj, attr, None)
        if fn is not None and hasattr(fn, hookspecs.PROJECT + "_impl"):
            out.append(attr)
    return out


__all__ += ["ENTRY_POINT_GROUP", "Verdict", "plugin_hooks", "register", "resolve_names"]
