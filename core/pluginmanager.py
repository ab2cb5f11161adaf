"""Finding, loading and ordering plugins, and the typed facade the loop calls hooks through.

Names in ``[plugins] enabled`` (whose order is the call order) resolve, in this order, to:

1. a built-in plugin (``max_steps``, ``repeat_call``, ... -- :data:`BUILTIN_PLUGINS`);
2. an installed entry point in the group ``loopwarden.plugins`` -- loaded only when named;
   entry-point loading is turned off by ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD=1``;
3. ``module:attr`` -- an importable object, for plugins that are not packaged.

``LOOPWARDEN_PLUGINS`` (comma-separated) appends names.  ``[plugins] blocked`` and
``LOOPWARDEN_BLOCK_PLUGINS`` remove names *before anything is imported*: a blocked plugin's
module never runs.  Essential plugins (``max_steps``) are always loaded and cannot be blocked.
``LOOPWARDEN_TRACE_PLUGINS=1`` writes every hook call and its verdicts to stderr.

Start-up fails with :class:`~loopwarden.PluginLoadError` naming the plugin when a name is
ambiguous (a built-in and an entry point, or two entry points, share it), when a plugin
implements no hook, misspells one (``befor_tool``), forgets ``@hookimpl`` on a hook-named
method, implements a hook as ``async def``, or carries a ``tryfirst``/``trylast`` that would
break the configured order.  pluggy calls implementations last-registered-first, so plugins are
registered in reverse config order and the effective order of every hook is read back from
``get_hookimpls()`` and compared with the config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

import pluggy
from pydantic import BaseModel, ValidationError

from loopwarden import hookspecs
from loopwarden.config import Config, validation_error
from loopwarden.exceptions import ConfigError, PluginLoadError
from loopwarden.plugin import unused_shim
from loopwarden.verdicts import (
    EMPTY,
    UNKNOWN_PLUGIN,
    Resolution,
    Skip,
    Stop,
    Verdict,
    Warn,
    resolve,
)

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment
    from loopwarden.events import ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.run import Run, RunOutcome

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
    "PluginSet",
    "Verdict",
    "builtin_settings",
    "check_tables",
    "installed_entry_points",
    "instantiate_plugin",
    "load_plugins",
    "new_plugin_manager",
    "plugin_hooks",
    "register",
    "resolve_names",
    "settings_model",
]

log = logging.getLogger("loopwarden.plugins")

ENTRY_POINT_GROUP = "loopwarden.plugins"

#: built-in plugin names -> "module:attr"
BUILTIN_PLUGINS: dict[str, str] = {
    "max_steps": "loopwarden.plugins.max_steps:MaxSteps",
    "timeout": "loopwarden.plugins.timeout:Timeout",
    "token_budget": "loopwarden.plugins.token_budget:TokenBudget",
    "cost_budget": "loopwarden.plugins.cost_budget:CostBudget",
    "spend_limits": "loopwarden.plugins.spend_limits:SpendLimits",
    "tool_calls": "loopwarden.plugins.tool_calls:ToolCalls",
    "retry_policy": "loopwarden.plugins.retry_policy:RetryPolicy",
    "repeat_call": "loopwarden.plugins.repeat_call:RepeatCall",
    "oscillation": "loopwarden.plugins.oscillation:Oscillation",
    "no_progress": "loopwarden.plugins.no_progress:NoProgress",
    "stall": "loopwarden.plugins.stall:Stall",
    "failure_streak": "loopwarden.plugins.failure_streak:FailureStreak",
    "terminal_tool": "loopwarden.plugins.terminal_tool:TerminalTool",
    "conversation_limits": "loopwarden.plugins.conversation_limits:ConversationLimits",
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
    """One loaded plugin: its configured name, where it came from, the registered object.

    ``source`` is ``"builtin"``, ``"entry point (<distribution> <version>)"``,
    ``"module:attr"`` or ``"object"`` (built in code and handed to the deployment).
    """

    name: str
    source: str
    spec: str  # the module:attr it was loaded from (or the object's repr)
    obj: Any
    settings: BaseModel | None = None
    hooks: list[str] = field(default_factory=list)

    @property
    def observer(self) -> bool:
        """True for a pure observer: it implements no run hook, so it can never change a run
        (it subscribes to signals in ``on_configure``)."""
        return not any(h in hookspecs.RUN_HOOK_NAMES for h in self.hooks)


# -- environment -------------------------------------------------------------------------


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


# -- names ---------------------------------------------------------------------------------


def resolve_names(config: Config, extra: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """The plugin names to load, in call order, and the names blocked -- before any import.

    Order: ``[plugins] enabled``, then ``LOOPWARDEN_PLUGINS``, then ``extra``; essential plugins
    missing from the list go first.  A name listed twice, or an essential plugin blocked, is a
    :class:`ConfigError`.
    """
    path = config.path
    blocked = list(dict.fromkeys([*config.plugins.blocked, *_env_list(ENV_BLOCK)]))
    for name in blocked:
        if name in ESSENTIAL_PLUGINS:
            source = "plugins.blocked" if name in config.plugins.blocked else ENV_BLOCK
            raise ConfigError(
                f"{name!r} is essential and cannot be blocked (configure its limits instead)",
                path=path, key=source,
            )
    names: list[str] = []
    for name in [*config.plugins.enabled, *_env_list(ENV_EXTRA), *extra]:
        if name in names:
            raise ConfigError(f"plugin {name!r} is listed twice", path=path, key="plugins.enabled")
        names.append(name)
    for ess in reversed(ESSENTIAL_PLUGINS):
        if ess not in names:
            names.insert(0, ess)
    return [n for n in names if not is_blocked(n, blocked)], blocked


def is_blocked(name: str, blocked: Iterable[str]) -> bool:
    """Whether ``name`` is blocked: by its own name, or -- for ``module:attr`` -- by its module
    or a parent package (blocking ``sidefx`` also keeps ``sidefx:Plugin`` from importing)."""
    module = name.partition(":")[0] if ":" in name else None
    for b in blocked:
        if name == b:
            return True
        if module is not None and (module == b or module.startswith(b + ".")):
            return True
    return False


# -- finding -------------------------------------------------------------------------------


def installed_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Installed entry points of the group ``loopwarden.plugins``, by name (nothing loaded).

    Empty when ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` is set.  A name with two entries is kept
    with both, so that using it fails naming both distributions.
    """
    if _env_flag(ENV_NO_AUTOLOAD):
        return {}
    found: dict[str, list[metadata.EntryPoint]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        entries = found.setdefault(ep.name, [])
        if not any(e.value == ep.value and _dist_label(e) == _dist_label(ep) for e in entries):
            entries.append(ep)
    return found


def _dist_label(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"{dist.metadata['Name']} {dist.version}"


def _import_spec(spec: str, plugin: str) -> Any:
    if ":" not in spec:
        hint = ""
        if _env_flag(ENV_NO_AUTOLOAD):
            hint = f" ({ENV_NO_AUTOLOAD} is set: installed entry points are not loaded)"
        close = difflib.get_close_matches(spec, [*BUILTIN_PLUGINS, *installed_entry_points()],
                                          n=1)
        if close:
            hint += f"; did you mean {close[0]!r}?"
        raise PluginLoadError(
            f"cannot resolve {spec!r}: not a built-in name, not an installed entry point "
            f"(group {ENTRY_POINT_GROUP!r}), and not 'module:attr'{hint}",
            plugin=plugin,
        )
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # module code may do anything
        raise PluginLoadError(f"cannot import {mod_name!r}: {_describe_exc(exc)}",
                              plugin=plugin) from exc
    for part in attr.split(".") if attr else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginLoadError(
                f"{mod_name!r} has no attribute {attr!r}", plugin=plugin
            ) from None
        except Exception as exc:  # a module __getattr__ or a property that raises
            raise PluginLoadError(f"reading {attr!r} from {mod_name!r} failed: "
                                  f"{_describe_exc(exc)}", plugin=plugin) from exc
    return obj


def _describe_exc(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _find(name: str, eps: Mapping[str, list[metadata.EntryPoint]]) -> tuple[Any, str, str]:
    """Import the object ``name`` refers to: (target, source, spec)."""
    candidates = eps.get(name, [])
    if name in BUILTIN_PLUGINS:
        if candidates:
            raise PluginLoadError(
                "the name is built in and also declared as an entry point by "
                + ", ".join(f"{_dist_label(e)} ({e.value})" for e in candidates)
                + f"; rename that entry point (or set {ENV_NO_AUTOLOAD}=1 to ignore entry "
                "points)",
                plugin=name,
            )
        spec = BUILTIN_PLUGINS[name]
        return _import_spec(spec, name), "builtin", spec
    if len(candidates) > 1:
        raise PluginLoadError(
            "two installed distributions declare this entry point: "
            + " and ".join(f"{_dist_label(e)} ({e.value})" for e in candidates)
            + "; uninstall one",
            plugin=name,
        )
    if candidates:
        ep = candidates[0]
        try:
            target = ep.load()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise PluginLoadError(
                f"cannot load entry point {ep.value!r} of {_dist_label(ep)}: "
                f"{_describe_exc(exc)}", plugin=name
            ) from exc
        return target, f"entry point ({_dist_label(ep)})", ep.value
    return _import_spec(name, name), "module:attr", name


# -- configuring ---------------------------------------------------------------------------


def _validate_settings(model: type[BaseModel], table: Mapping[str, Any], cfg_path: str | None,
                       name: str) -> BaseModel:
    """Validate a plugin's table; a validator that raises anything is a config error too."""
    try:
        return model.model_validate(dict(table))
    except ValidationError as exc:
        raise validation_error(exc, path=cfg_path, prefix=f"plugins.{name}") from None
    except Exception as exc:  # a validator raising TypeError, KeyError, ... (not wrapped)
        raise ConfigError(f"the plugin's settings validator failed: {_describe_exc(exc)}",
                          path=cfg_path, key=f"plugins.{name}") from exc


def settings_model(target: Any) -> type[BaseModel] | None:
    """The pydantic model that validates ``target``'s ``[plugins.<name>]`` table, if any."""
    try:
        model = getattr(target, "Settings", None)
    except Exception as exc:  # an object whose attribute access raises
        raise PluginLoadError(f"reading its Settings failed: {_describe_exc(exc)}") from exc
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return None


def instantiate_plugin(
    name: str, target: Any, table: Mapping[str, Any], cfg_path: str | None = None
) -> tuple[Any, BaseModel | None]:
    """Build the plugin object ``name`` from ``target`` and its settings table.

    A class is constructed with its validated settings (``Settings``) and named ``name``.
    A module or object is used as it is: it may take settings through ``configure(settings)``;
    a table for an object that cannot take it is a :class:`ConfigError`.
    """
    model = settings_model(target)
    settings: BaseModel | None = None
    if model is not None:
        settings = _validate_settings(model, table, cfg_path, name)
    elif table:
        raise ConfigError(
            f"plugin {name!r} takes no settings, got {sorted(table)}",
            path=cfg_path, key=f"plugins.{name}",
        )
    if inspect.isclass(target):
        cls: Any = target
        try:
            obj = cls(settings) if settings is not None else cls()
        except Exception as exc:
            raise PluginLoadError(
                f"cannot construct {cls.__name__}: {exc}", plugin=name
            ) from exc
        _set_name(obj, name)
        return obj, settings
    if table:
        configure = getattr(target, "configure", None)
        if not callable(configure):
            raise ConfigError(
                f"plugin {name!r} is a ready object ({type(target).__name__}), which cannot take "
                "settings; point the config or entry point at its class instead",
                path=cfg_path, key=f"plugins.{name}",
            )
        configure(settings)
    return target, settings


def _set_name(obj: Any, name: str) -> None:
    """Give a plugin object its configured name (state slot and verdict attribution)."""
    if hasattr(obj, "name"):
        with contextlib.suppress(AttributeError):
            obj.name = name


def builtin_settings(*, skip_missing: bool = True) -> dict[str, type[BaseModel] | None]:
    """The settings model of every importable built-in plugin, in :data:`BUILTIN_PLUGINS` order.

    A built-in whose module does not exist (yet) is skipped when ``skip_missing``; any other
    import error propagates, so a broken plugin is never silently left out.
    """
    out: dict[str, type[BaseModel] | None] = {}
    for name, spec in BUILTIN_PLUGINS.items():
        mod_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if skip_missing and exc.name == mod_name:
                continue
            raise
        out[name] = settings_model(getattr(module, attr))
    return out


def check_tables(config: Config) -> list[str]:
    """Validate the ``[plugins.<name>]`` tables of built-ins that are not enabled.

    :func:`load_plugins` validates the tables of enabled plugins and calls this for the rest:
    a typo in the table of a built-in that is switched off fails before any run as well.
    Blocked plugins are never imported, so their tables are not checked.  Returns the names
    checked.
    """
    names, blocked = resolve_names(config)
    checked = []
    for tname, table in config.plugins.tables().items():
        if tname in names or tname in blocked or tname not in BUILTIN_PLUGINS:
            continue
        model = settings_model(_import_spec(BUILTIN_PLUGINS[tname], tname))
        if model is None:
            if table:
                raise ConfigError(f"plugin {tname!r} takes no settings, got {sorted(table)}",
                                  path=config.path, key=f"plugins.{tname}")
        else:
            _validate_settings(model, table, config.path, tname)
        checked.append(tname)
    return checked


# -- loading -------------------------------------------------------------------------------


def load_plugins(
    config: Config,
    *,
    extra: Iterable[str] = (),
    objects: Mapping[str, Any] | None = None,
) -> PluginSet:
    """Resolve, import, configure and register the config's plugins, in config order.

    ``objects`` maps names to plugins built in code (used by tests and by
    :class:`~loopwarden.Deployment` callers); they are appended after the configured names
    unless the config names them.  A class is constructed with the config's table for its
    name, a ready object is used as it is (a table for it is an error).
    """
    objects = dict(objects or {})
    names, blocked = resolve_names(
        config, [*extra, *[n for n in objects if n not in config.plugins.enabled]]
    )
    tables = config.plugins.tables()
    eps = installed_entry_points()
    known = set(names) | set(blocked) | set(BUILTIN_PLUGINS) | set(eps)
    for tname in tables:
        if tname not in known and ":" not in tname:
            raise ConfigError(
                "settings for a plugin that is neither enabled, blocked, built in nor installed "
                f"(enabled: {', '.join(names)})",
                path=config.path, key=f"plugins.{tname}",
            )
    loaded: list[LoadedPlugin] = []
    for name in names:
        table = tables.get(name, {})
        if name in objects:
            obj = objects[name]
            if inspect.isclass(obj):
                inst, settings = instantiate_plugin(name, obj, table, config.path)
                loaded.append(LoadedPlugin(name, "object", _qualname(obj), inst, settings))
                continue
            if table:
                raise ConfigError(
                    "settings given for a plugin object built in code (pass its class instead)",
                    path=config.path, key=f"plugins.{name}",
                )
            if not isinstance(obj, ModuleType):
                _set_name(obj, name)
            loaded.append(LoadedPlugin(name, "object", repr(obj), obj,
                                       getattr(obj, "settings", None)))
            continue
        try:
            target, source, spec = _find(name, eps)
            obj, settings = instantiate_plugin(name, target, table, config.path)
        except PluginLoadError as exc:
            if exc.plugin is None:
                exc = PluginLoadError(exc.reason, plugin=name)
            raise exc.located(config.path, _where(config, name)) from exc.__cause__
        except ConfigError:
            raise
        except Exception as exc:  # plugin code raising while it is looked at or configured
            raise PluginLoadError(f"loading failed: {_describe_exc(exc)}", plugin=name).located(
                config.path, _where(config, name)) from exc
        loaded.append(LoadedPlugin(name, source, spec, obj, settings))
    check_tables(config)  # a bad table of a switched-off built-in fails before any run, too
    try:
        return register(loaded)
    except PluginLoadError as exc:
        if exc.path is not None or exc.plugin is None:
            raise
        raise exc.located(config.path, _where(config, exc.plugin)) from exc.__cause__
    except Exception as exc:  # a plugin object whose attributes raise while registered
        raise PluginLoadError(f"registering the plugins failed: {_describe_exc(exc)}",
                              path=config.path, key="plugins.enabled") from exc


def _where(config: Config, name: str) -> str:
    """The config key (or environment variable) that named plugin ``name``."""
    if name in config.plugins.enabled:
        return f"plugins.enabled[{config.plugins.enabled.index(name)}]"
    if name in _env_list(ENV_EXTRA):
        return ENV_EXTRA
    return "plugins.enabled"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


# -- registering ---------------------------------------------------------------------------


class LoopwardenPluginManager(pluggy.PluginManager):
    """pluggy's manager, telling the :class:`Hooks` facade when it must dispatch through pluggy.

    The facade calls hook implementations directly on the hot path (see :class:`Hooks`); it
    falls back to pluggy's own dispatch while anything monitors hook calls
    (``add_hookcall_monitoring``, which tracing and the test kit's ``HookRecorder`` use) and
    rebuilds its call plans after ``register``/``unregister``.
    """

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        self.monitors = 0
        self.generation = 0

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        if unused_shim(plugin, name):  # Plugin's lifecycle shims, when they would do nothing
            return None
        return super().parse_hookimpl_opts(plugin, name)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        try:
            return super().register(plugin, name)
        finally:
            self.generation += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        try:
            return super().unregister(plugin, name)
        finally:
            self.generation += 1

    def add_hookcall_monitoring(self, before: Any, after: Any) -> Callable[[], None]:
        undo_pluggy = super().add_hookcall_monitoring(before, after)
        self.monitors += 1
        undone = False

        def undo() -> None:
            nonlocal undone
            undo_pluggy()
            if not undone:
                undone = True
                self.monitors -= 1

        return undo


def new_plugin_manager() -> LoopwardenPluginManager:
    """A pluggy manager with loopwarden's hook specs (tracing with ``LOOPWARDEN_TRACE_PLUGINS``)."""
    pm = LoopwardenPluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if _env_flag(ENV_TRACE):
        pm.trace.root.setwriter(_trace_writer)
        pm.enable_tracing()
    return pm


def _trace_writer(text: str) -> None:
    sys.stderr.write("".join("[loopwarden trace] " + ln for ln in text.splitlines(True)))


#: 0.1 method names a plain (non-Plugin) object may still carry -> the hook that replaced them
_LEGACY_METHODS = {"connect": "on_configure", "close": "on_unconfigure",
                   "check_model": "validate_model"}


def _check_legacy(lp: LoadedPlugin, implemented: list[str]) -> None:
    """A plain object's 0.1 lifecycle method is no longer called: say so, instead of silently
    skipping it (a :class:`~loopwarden.Plugin` subclass's methods are called by the base
    class's hook implementations)."""
    from loopwarden.plugin import Plugin

    if isinstance(lp.obj, Plugin):
        return
    for method, hook in _LEGACY_METHODS.items():
        if hook not in implemented and callable(getattr(lp.obj, method, None)):
            raise PluginLoadError(
                f"defines {method}(), which loopwarden no longer calls on a plain object: "
                f"implement the hook {hook} with @hookimpl (or subclass loopwarden.Plugin)",
                plugin=lp.name,
            )


def _check_plugin(pm: pluggy.PluginManager, lp: LoadedPlugin) -> None:
    """Unknown or unmarked hooks, async hooks, and plugins with nothing to do fail here."""
    callers = pm.get_hookcallers(lp.obj) or []
    implemented: list[str] = []
    for hc in callers:
        impls = [i for i in hc.get_hookimpls() if i.plugin is lp.obj]
        if not hc.has_spec():
            if all(i.optionalhook for i in impls):
                continue
            close = difflib.get_close_matches(hc.name, hookspecs.HOOK_NAMES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PluginLoadError(
                f"unknown hook {hc.name!r}: {hint}(known hooks: "
                f"{', '.join(hookspecs.HOOK_NAMES)})",
                plugin=lp.name,
            )
        for impl in impls:
            fn = impl.function
            if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
                raise PluginLoadError(
                    f"{hc.name} is 'async def'; hooks are synchronous (pluggy would take the "
                    "coroutine for a result): make it a plain 'def'",
                    plugin=lp.name,
                )
        implemented.append(hc.name)
    for hname in hookspecs.HOOK_NAMES:
        if hname in implemented:
            continue
        attr = inspect.getattr_static(lp.obj, hname, None)
        if attr is not None and not unused_shim(lp.obj, hname) \
                and callable(getattr(lp.obj, hname, None)):
            raise PluginLoadError(
                f"defines {hname}() without @hookimpl, so it would never be called "
                "(decorate it with 'from loopwarden import hookimpl')",
                plugin=lp.name,
            )
    _check_legacy(lp, implemented)
    lp.hooks = sorted(set(implemented), key=_hook_rank)
    if not lp.hooks:
        raise PluginLoadError(
            "implements no hook (expected @hookimpl methods named one of: "
            f"{', '.join(hookspecs.HOOK_NAMES)}, or a connect() that subscribes to signals)",
            plugin=lp.name,
        )


def register(loaded: list[LoadedPlugin]) -> PluginSet:
    """Register ``loaded`` (in call order) with a new pluggy manager and verify the order."""
    pm = new_plugin_manager()
    seen: dict[int, str] = {}
    names: set[str] = set()
    for lp in loaded:
        if lp.name in names:
            raise PluginLoadError("two plugins are registered under this name", plugin=lp.name)
        names.add(lp.name)
        if id(lp.obj) in seen:
            raise PluginLoadError(
                f"the same object is registered under two names ({seen[id(lp.obj)]!r} too)",
                plugin=lp.name,
            )
        seen[id(lp.obj)] = lp.name
    for lp in reversed(loaded):
        try:
            pm.register(lp.obj, name=lp.name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginLoadError(str(exc), plugin=lp.name) from exc
    for lp in loaded:
        _check_plugin(pm, lp)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:  # pragma: no cover - _check_plugin is stricter
        plugin_name = pm.get_name(exc.plugin) if exc.plugin is not None else None
        raise PluginLoadError(str(exc), plugin=plugin_name) from exc
    plugin_set = PluginSet(pm, loaded)
    config_order = [lp.name for lp in loaded]
    for hook in hookspecs.HOOK_NAMES:
        actual = plugin_set.call_order(hook)
        expected = [n for n in config_order if n in actual]
        if actual != expected:
            culprit = _out_of_order(pm, hook, actual, expected)
            raise PluginLoadError(
                f"its tryfirst/trylast on {hook} would break the configured order "
                f"(config: {expected}, effective: {actual}); remove the marker or move the "
                "plugin in [plugins] enabled",
                plugin=culprit,
            )
    return plugin_set


def _out_of_order(
    pm: pluggy.PluginManager, hook: str, actual: list[str], expected: list[str]
) -> str:
    """The plugin whose ``tryfirst``/``trylast`` moved it away from its configured place."""
    marked = {
        i.plugin_name
        for i in getattr(pm.hook, hook).get_hookimpls()
        if (i.tryfirst or i.trylast) and not (i.hookwrapper or i.wrapper)
    }
    for a, e in zip(actual, expected, strict=False):
        if a != e:
            # The first mismatch shows either a tryfirst plugin jumping ahead (a) or a trylast
            # plugin that left its place (e).
            if a in marked:
                return a
            if e in marked:
                return e
    return next(iter(sorted(marked)), actual[0] if actual else "?")


def _hook_rank(name: str) -> int:
    try:
        return hookspecs.HOOK_NAMES.index(name)
    except ValueError:
        return len(hookspecs.HOOK_NAMES)


def plugin_hooks(obj: Any) -> list[str]:
    """Names of the hooks ``obj`` implements (by marker), without registering it."""
    out = []
    for attr in dir(obj):
        fn = getattr(obj, attr, None)
        if fn is not None and hasattr(fn, hookspecs.PROJECT + "_impl") \
                and not unused_shim(obj, attr):
            out.append(attr)
    return sorted(out, key=_hook_rank)


# -- calling -------------------------------------------------------------------------------


def _impl_owner_map(pm: pluggy.PluginManager) -> dict[Any, list[tuple[str, Any]]]:
    """Map each hook implementation's code object to the (name, plugin) pairs that use it."""
    owners: dict[Any, list[tuple[str, Any]]] = {}
    for hname in hookspecs.HOOK_NAMES:
        for impl in getattr(pm.hook, hname).get_hookimpls():
            fn = getattr(impl.function, "__func__", impl.function)
            code = getattr(fn, "__code__", None)
            if code is not None:
                pairs = owners.setdefault(code, [])
                if all(n != impl.plugin_name for n, _ in pairs):
                    pairs.append((impl.plugin_name, impl.plugin))
    return owners


#: the arguments each decision hook passes, in order
_HOOK_ARGS: dict[str, tuple[str, ...]] = {
    "on_start": ("run",),
    "before_model": ("run", "request"),
    "after_response": ("run", "response"),
    "before_tool": ("run", "call"),
    "after_tool": ("run", "call", "result"),
}

#: one implementation in a call plan: plugin name, function, argument positions (None: all)
_Step = tuple[str, Callable[..., Any], "tuple[int, ...] | None"]


_REDACTOR: list[Any] = []  # the default redactor, built on first use


def _ill_typed(v: Warn | Skip | Stop) -> str | None:
    """What is wrong with a verdict's fields (a plugin built it by hand), or None.

    The loop puts these texts into requests, records and logs: they must be text."""
    texts: dict[str, Any] = {"message": v.message}
    if isinstance(v, Skip):
        texts["observation"] = v.observation
    if isinstance(v, Stop):
        texts["answer"] = v.answer
        reason: Any = v.reason  # typed str, but a plugin may have passed anything
        soft: Any = v.soft
        if not isinstance(reason, str) or not reason:
            return "a reason that is not a non-empty str"
        if not isinstance(soft, bool):
            return "soft that is not a bool"
    for field_name, value in texts.items():
        required = field_name in ("observation",) or isinstance(v, Warn)
        if not isinstance(value, str) and (required or value is not None):
            return f"a {field_name} of type {type(value).__name__}, not str"
    evidence: Any = v.evidence
    plugin: Any = v.plugin
    if not isinstance(evidence, dict):
        return f"evidence of type {type(evidence).__name__}, not dict"
    if not isinstance(plugin, str):
        return "a plugin name that is not a str"
    return None


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"


def _default_redact(text: str) -> str:
    if not _REDACTOR:
        from loopwarden.redaction import Redactor

        _REDACTOR.append(Redactor())
    out: str = _REDACTOR[0].text(text)
    return out


class Hooks:
    """The typed facade the loop calls hooks through.

    Each decision hook returns a :class:`~loopwarden.verdicts.Resolution`.  A plugin that
    raises is blamed by name and turned into a hard ``plugin_error`` stop (fail closed).
    ``on_stop`` runs every implementation even when one raises.

    Dispatch: pluggy decides *what* is called and in which order (registration, validation,
    ``tryfirst``/``trylast``); the facade then calls the implementations in exactly that order
    from a call plan read off ``get_hookimpls()``, with positional arguments -- no keyword
    dictionary and no generic multicall per event -- and it attributes a verdict built
    without ``plugin=`` (``loopwarden.warn(...)`` from a plain object) to the plugin that
    returned it.  It uses pluggy's own dispatch instead
    whenever a hook has wrappers or while anything monitors hook calls (tracing,
    ``add_hookcall_monitoring``, the test kit's ``HookRecorder``), and rebuilds its plans when
    plugins are registered or unregistered.  (pluggy's result list carries no attribution: on
    that path such verdicts stay ``<unknown>``, so prefer ``Plugin.warn()`` & co.)
    """

    def __init__(self, pm: pluggy.PluginManager, order: Sequence[str]) -> None:
        self._pm = pm
        self._order = list(order)
        #: masks secrets in the error texts of failing plugins (records, logs); a deployment
        #: sets its own (which also knows the model's API key)
        self.redact: Callable[[str], str] = _default_redact
        h = pm.hook
        self._on_start = h.on_start
        self._before_model = h.before_model
        self._after_response = h.after_response
        self._before_tool = h.before_tool
        self._after_tool = h.after_tool
        self._on_stop = h.on_stop
        self._owners = _impl_owner_map(pm)
        self._plans: dict[str, tuple[_Step, ...] | None] = {}
        self._generation = -1
        self._build_plans()

    # -- direct dispatch -------------------------------------------------------------------

    def _build_plans(self) -> None:
        pm = self._pm
        plans: dict[str, tuple[_Step, ...] | None] = {}
        for hook, full in _HOOK_ARGS.items():
            impls = getattr(pm.hook, hook).get_hookimpls()
            if any(i.hookwrapper or i.wrapper for i in impls):
                plans[hook] = None  # wrappers need pluggy's multicall
                continue
            plan: list[_Step] = []
            for impl in reversed(impls):  # pluggy calls the last registered first
                idx = tuple(full.index(a) for a in impl.argnames)
                plan.append((impl.plugin_name, impl.function,
                             None if idx == tuple(range(len(full))) else idx))
            plans[hook] = tuple(plan)
        self._plans = plans
        self._generation = getattr(pm, "generation", 0)
        self._owners = _impl_owner_map(pm)

    def _plan(self, hook: str) -> tuple[_Step, ...] | None:
        """The direct call plan for ``hook``, or None when pluggy must dispatch."""
        pm = self._pm
        if getattr(pm, "monitors", 1):  # a plain pluggy manager: always pluggy
            return None
        if pm.generation != self._generation:  # type: ignore[attr-defined]
            self._build_plans()
        return self._plans.get(hook)

    def _direct(self, hook: str, plan: tuple[_Step, ...], args: tuple[Any, ...]) -> Resolution:
        results: list[Any] = []
        for name, fn, idx in plan:
            try:
                r = fn(*args) if idx is None else fn(*[args[i] for i in idx])
            except Exception as exc:
                return self._failed(hook, exc, plugin=name)
            if r is not None:
                if not isinstance(r, (Warn, Skip, Stop)) or _ill_typed(r) \
                        or (type(r) is Skip and hook != "before_tool"):
                    return self._not_a_verdict(hook, r, plugin=name)
                if r.plugin == UNKNOWN_PLUGIN:  # built with loopwarden.warn() & co.
                    r = dataclasses.replace(r, plugin=name)
                results.append(r)
        return resolve(results) if results else EMPTY

    def blame(self, exc: BaseException) -> str:
        """The plugin whose hook implementation raised ``exc`` (``<unknown>`` if none)."""
        return self._blame(exc)

    def _blame(self, exc: BaseException) -> str:
        """The plugin whose hook implementation is on ``exc``'s traceback (outermost first)."""
        tb: TracebackType | None = exc.__traceback__
        while tb is not None:
            pairs = self._owners.get(tb.tb_frame.f_code)
            if pairs:
                if len(pairs) == 1:
                    return str(pairs[0][0])
                this = tb.tb_frame.f_locals.get("self")
                for name, plugin in pairs:
                    if plugin is this:
                        return str(name)
                return str(pairs[0][0])
            tb = tb.tb_next
        return "<unknown>"

    def _failed(self, hook: str, exc: Exception, plugin: str | None = None) -> Resolution:
        plugin = plugin or self._blame(exc)
        error = self._log_failure(plugin, hook, exc)
        verdict = Stop(
            reason="plugin_error",
            plugin=plugin,
            soft=False,
            message=f"plugin {plugin!r} raised in {hook}: {error}",
            evidence={"hook": hook, "error": error},
        )
        return Resolution(verdict, (), (verdict,))

    def _log_failure(self, plugin: str, hook: str, exc: BaseException) -> str:
        """Log a plugin's failure with its traceback, both redacted; return the error text."""
        redact = self.redact
        try:
            text = f"{type(exc).__name__}: {exc}"
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # an exception whose __str__ raises is third-party code too
            text = trace = f"{type(exc).__name__}: <unprintable>"
        log.error("plugin %r failed in %s: %s", plugin, hook, redact(trace.rstrip()))
        return redact(text)

    def _not_a_verdict(self, hook: str, returned: Any, plugin: str | None = None) -> Resolution:
        who = f"plugin {plugin!r}" if isinstance(plugin, str) else f"a {hook} implementation"
        why = _ill_typed(returned) if isinstance(returned, (Warn, Skip, Stop)) else None
        if why is None and isinstance(returned, Skip):
            shown = self.redact(_safe_repr(returned)[:500])
            verdict = Stop(
                reason="plugin_error",
                plugin=plugin if isinstance(plugin, str) else UNKNOWN_PLUGIN,
                soft=False,
                message=f"{who} returned a skip from {hook}, which cannot honour it (only "
                        "before_tool can skip a call): warn or stop instead",
                evidence={"hook": hook, "returned": shown},
            )
            return Resolution(verdict, (), (verdict,))
        shown = self.redact(_safe_repr(returned)[:500])
        what = f"a verdict with {why}" if why else f"{shown}, not a verdict"
        verdict = Stop(
            reason="plugin_error",
            plugin=plugin if isinstance(plugin, str) else UNKNOWN_PLUGIN,
            soft=False,
            message=f"{who} returned {what} from {hook}",
            evidence={"hook": hook, "returned": shown},
        )
        return Resolution(verdict, (), (verdict,))

    def _resolve(self, hook: str, results: list[Any]) -> Resolution:
        if not results:
            return EMPTY
        for r in results:
            if not isinstance(r, (Warn, Skip, Stop)) or _ill_typed(r) \
                    or (type(r) is Skip and hook != "before_tool"):
                return self._not_a_verdict(hook, r, plugin=getattr(r, "plugin", None))
        return resolve(results)

    def on_start(self, run: Run) -> Resolution:
        plan = self._plan("on_start")
        if plan is not None:
            return self._direct("on_start", plan, (run,))
        try:
            return self._resolve("on_start", self._on_start(run=run))
        except Exception as exc:
            return self._failed("on_start", exc)

    def before_model(self, run: Run, request: ModelRequest) -> Resolution:
        plan = self._plan("before_model")
        if plan is not None:
            return self._direct("before_model", plan, (run, request))
        try:
            return self._resolve("before_model", self._before_model(run=run, request=request))
        except Exception as exc:
            return self._failed("before_model", exc)

    def after_response(self, run: Run, response: ModelResponse) -> Resolution:
        plan = self._plan("after_response")
        if plan is not None:
            return self._direct("after_response", plan, (run, response))
        try:
            return self._resolve(
                "after_response", self._after_response(run=run, response=response)
            )
        except Exception as exc:
            return self._failed("after_response", exc)

    def before_tool(self, run: Run, call: ToolCall) -> Resolution:
        plan = self._plan("before_tool")
        if plan is not None:
            return self._direct("before_tool", plan, (run, call))
        try:
            return self._resolve("before_tool", self._before_tool(run=run, call=call))
        except Exception as exc:
            return self._failed("before_tool", exc)

    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Resolution:
        plan = self._plan("after_tool")
        if plan is not None:
            return self._direct("after_tool", plan, (run, call, result))
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
                failures.append({"plugin": plugin, "hook": "on_stop",
                                 "error": self._log_failure(plugin, "on_stop", exc)})
                # Call the implementations that the exception skipped: the ones after the
                # failing plugin in call order.
                impls = [i.plugin_name for i in reversed(self._on_stop.get_hookimpls())
                         if not (i.hookwrapper or i.wrapper)]
                if plugin not in impls:
                    return failures
                done.update(impls[: impls.index(plugin) + 1])
                remove = [self._pm.get_plugin(n) for n in done]
                caller = self._pm.subset_hook_caller("on_stop", remove_plugins=remove)

    # -- lifecycle hooks (not on the hot path: pluggy dispatches them) ---------------------

    def configure(self, deployment: Deployment) -> None:
        """``on_configure``: once, when ``deployment`` has loaded its plugins."""
        self._pm.hook.on_configure(deployment=deployment)

    def unconfigure(self, deployment: Deployment) -> None:
        """``on_unconfigure``: once, when ``deployment`` closes."""
        self._pm.hook.on_unconfigure(deployment=deployment)

    def validate_model(self, model: str, path: str | None) -> None:
        """``validate_model``: a plugin refuses ``model`` by raising ConfigError."""
        self._pm.hook.validate_model(model=model, path=path)

    def budget_limits(self, run: Run) -> dict[str, float]:
        """``budget_limits``: the limits the plugins enforce for ``run``, by budget (the
        earlier plugin in config order wins a tie)."""
        out: dict[str, float] = {}
        for limits in self._pm.hook.budget_limits(run=run):
            if isinstance(limits, Mapping):
                for budget, value in limits.items():
                    out.setdefault(str(budget), value)
        return out

    def record_fields(
        self, run: Run, reserved: Container[str] = ()
    ) -> tuple[dict[str, Any], list[dict[str, str]]]:
        """``record_fields``: the plugins' fields for ``run``'s record, and the failures
        (plugin, hook, error) of implementations that raised or named a ``reserved`` field
        -- each called on its own, so one failing plugin never costs the others' fields."""
        fields: dict[str, Any] = {}
        failures: list[dict[str, str]] = []
        for impl in reversed(self._pm.hook.record_fields.get_hookimpls()):
            try:
                got = impl.function(run) if impl.argnames else impl.function()
                if got is not None and not isinstance(got, Mapping):
                    raise TypeError(f"returned {_safe_repr(got)[:200]}, not a mapping")
                taken = sorted(str(k) for k in (got or {}) if k in reserved)
                if taken:
                    raise ValueError(f"the record's own fields cannot be replaced: {taken}")
            except Exception as exc:
                failures.append({"plugin": impl.plugin_name, "hook": "record_fields",
                                 "error": self._log_failure(impl.plugin_name, "record_fields",
                                                            exc)})
                continue
            for key, value in (got or {}).items():
                fields.setdefault(str(key), value)
        return fields, failures

    @property
    def order(self) -> list[str]:
        return list(self._order)


class PluginSet:
    """The plugins of one deployment, loaded and registered in config order."""

    def __init__(self, pm: pluggy.PluginManager, plugins: list[LoadedPlugin]) -> None:
        self.pm = pm
        self.plugins = plugins
        self.hooks = Hooks(pm, [p.name for p in plugins])

    def __iter__(self) -> Iterator[LoadedPlugin]:
        return iter(self.plugins)

    def __len__(self) -> int:
        return len(self.plugins)

    def get(self, name: str) -> Any:
        """The plugin object registered as ``name``, or None."""
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

    def describe(self) -> list[dict[str, Any]]:
        """One row per plugin, in call order: position, name, source, spec, hooks, essential."""
        return [
            {"position": i, "name": p.name, "source": p.source, "spec": p.spec,
             "hooks": list(p.hooks), "essential": p.name in ESSENTIAL_PLUGINS}
            for i, p in enumerate(self.plugins, 1)
        ]
