"""Finding, loading and ordering plugins -- the public face of the plugin machinery.

Registration and the load-time checks live in :mod:`loopwarden.engine.registry`, the typed facade
the loop calls hooks through in :mod:`loopwarden.engine.dispatch`; their public names are
re-exported here.

Names in ``[plugins] enabled`` (whose order is the call order) resolve, in this order, to:

1. a built-in plugin (``max_steps``, ``repeat_call``, ... -- :data:`BUILTIN_PLUGINS`);
2. an installed entry point in the group ``loopwarden.plugins`` -- loaded only when named;
   entry-point loading is turned off by ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD=1``;
3. ``module:attr`` -- an importable object, for plugins that are not packaged: looked for on
   ``sys.path``, then in the config file's directory (:func:`config_dir`), so a
   ``my_guards.py`` next to ``config.toml`` loads without ``PYTHONPATH``.

**One name per plugin.**  That name attributes its verdicts, keys its state, its record
fields and its settings table ``[plugins.<name>]``.  An entry point's name *is* the plugin's
name, as in pytest (``probe = "acme_probe"`` is the plugin ``probe``); a plugin that
*declares* another ``name`` (:func:`declared_name`) fails at start-up, since it would be
called two things.  A built-in's name is the one it declares.  A ``module:attr`` reference is
only where to find the plugin, which is named by the ``name`` it declares, else its
``__name__`` (:func:`plugin_name`) -- the name the testing kit gives a class or object too.
Two plugins with one name fail at start-up, naming both; so does a settings table that
configures nothing (``[plugins."mod:Cls"]`` beside ``[plugins.<name>]``, or a table for no
enabled, blocked, built-in or installed plugin).

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
import difflib
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from loopwarden.config import Config, default_config_path, validation_error
from loopwarden.engine.dispatch import Hooks
from loopwarden.engine.registry import (
    ENV_TRACE,
    ESSENTIAL_PLUGINS,
    LoadedPlugin,
    PluginSet,
    _env_flag,
    new_plugin_manager,
    plugin_hooks,
    register,
)
from loopwarden.exceptions import ConfigError, PluginLoadError
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
    "load_plugins",
    "new_plugin_manager",
    "plugin_hooks",
    "plugin_name",
    "register",
    "resolve_names",
    "resolve_plugin_name",
    "settings_model",
    "unloaded_tables",
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
    "circuit_breaker": "loopwarden.plugins.circuit_breaker:CircuitBreaker",
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
    "otel": "loopwarden.plugins.otel:OTel",
    "run_record": "loopwarden.plugins.run_record:RunRecord",
}

ENV_EXTRA = "LOOPWARDEN_PLUGINS"
ENV_BLOCK = "LOOPWARDEN_BLOCK_PLUGINS"
ENV_NO_AUTOLOAD = "LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD"


# -- environment -------------------------------------------------------------------------


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


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
                path=path,
                key=source,
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
    return _scan_entry_points()


def autoload_off_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """The installed entry points that ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` keeps from
    loading (empty when it is not set): for messages that name them, never to load them."""
    return _scan_entry_points() if _env_flag(ENV_NO_AUTOLOAD) else {}


def _scan_entry_points() -> dict[str, list[metadata.EntryPoint]]:
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


def config_dir(config: Config) -> Path | None:
    """The directory of ``config``'s file, where ``module:attr`` plugins are also looked for
    (pytest's rootdir for ``conftest.py``); None for the shipped default or a config built in
    code."""
    if not config.path or config.path.startswith("<"):
        return None
    path = Path(config.path)
    if not path.is_file() or path.resolve() == default_config_path().resolve():
        return None
    return path.resolve().parent


def _import_module(mod_name: str, search: Path | None) -> ModuleType:
    """Import ``mod_name``; when its top-level module is not on ``sys.path`` but lies in
    ``search`` (the config file's directory), append that directory to ``sys.path`` -- for
    good: the plugin's own imports of its neighbours work later too -- and import it from
    there.  Appended, so it never shadows an installed module."""
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        top = mod_name.partition(".")[0]
        if search is None or exc.name != top:
            raise
        if not ((search / top).is_dir() or (search / f"{top}.py").is_file()):
            raise ModuleNotFoundError(
                f"{exc}, neither on sys.path nor in {search} (the config file's directory)",
                name=exc.name,
            ) from None
    if str(search) not in sys.path:
        sys.path.append(str(search))
    importlib.invalidate_caches()
    return importlib.import_module(mod_name)


def _import_spec(spec: str, plugin: str, search: Path | None = None) -> Any:
    if ":" not in spec:
        switched_off = autoload_off_entry_points().get(spec)
        if switched_off:
            ep = switched_off[0]
            raise PluginLoadError(
                f"{spec!r} is the entry point of {_dist_label(ep)}, and {ENV_NO_AUTOLOAD} is "
                f"set: entry points are not loaded -- unset it, or enable the plugin as "
                f"{ep.value if ':' in ep.value else ep.value + ':'!r}",
                plugin=plugin,
            )
        hint = ""
        if _env_flag(ENV_NO_AUTOLOAD):
            hint = f" ({ENV_NO_AUTOLOAD} is set: installed entry points are not loaded)"
        close = difflib.get_close_matches(spec, [*BUILTIN_PLUGINS, *installed_entry_points()], n=1)
        if close:
            hint += f"; did you mean {close[0]!r}?"
        raise PluginLoadError(
            f"cannot resolve {spec!r}: not a built-in name, not an installed entry point "
            f"(group {ENTRY_POINT_GROUP!r}), and not 'module:attr'{hint}",
            plugin=plugin,
        )
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = _import_module(mod_name, search)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # module code may do anything
        raise PluginLoadError(
            f"cannot import {mod_name!r}: {_describe_exc(exc)}", plugin=plugin
        ) from exc
    for part in attr.split(".") if attr else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginLoadError(
                f"{mod_name!r} has no attribute {attr!r}", plugin=plugin
            ) from None
        except Exception as exc:  # a module __getattr__ or a property that raises
            raise PluginLoadError(
                f"reading {attr!r} from {mod_name!r} failed: {_describe_exc(exc)}", plugin=plugin
            ) from exc
    return obj


def _describe_exc(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def plugin_name(target: Any) -> str:
    """The name a plugin declares: its ``name`` attribute when that is a non-empty string, else
    its ``__name__`` (a class's or a module's), else its type's name.

    The loader and the testing kit both name a plugin so; see the module docstring."""
    try:
        declared = getattr(target, "name", None)
    except Exception as exc:  # an object whose attribute access raises
        raise PluginLoadError(f"reading its name failed: {_describe_exc(exc)}") from exc
    if isinstance(declared, str) and declared.strip():
        return declared
    fallback = getattr(target, "__name__", None)
    return fallback if isinstance(fallback, str) and fallback else type(target).__name__


def declared_name(target: Any) -> str | None:
    """The ``name`` a plugin declares itself, or None when it declares none.

    A non-empty string ``name`` attribute is a declaration; a :class:`~loopwarden.Plugin`
    instance whose class declares no name carries its class name only as a fallback (set in
    ``__init__``), which is not one."""
    try:
        declared = getattr(target, "name", None)
        if not inspect.isclass(target) and not isinstance(target, ModuleType):
            cls_declared = getattr(type(target), "name", None)
            if (
                isinstance(cls_declared, str)
                and not cls_declared.strip()
                and declared == type(target).__name__
            ):
                return None
    except Exception as exc:  # an object whose attribute access raises
        raise PluginLoadError(f"reading its name failed: {_describe_exc(exc)}") from exc
    return declared if isinstance(declared, str) and declared.strip() else None


def resolve_plugin_name(ref: str) -> str:
    """The name of the plugin ``ref`` (a name in ``[plugins] enabled``) refers to.

    A built-in's or an entry point's name is the reference itself; a ``module:attr`` is
    imported to read the name it declares (:func:`plugin_name`)."""
    eps = installed_entry_points()
    if ref in BUILTIN_PLUGINS or ref in eps or ":" not in ref:
        return ref
    return plugin_name(_import_spec(ref, ref))


def _named(ref: str, target: Any, source: str) -> str:
    """The plugin's one name: an entry point's name (pytest's convention), a built-in's
    name, or what a ``module:attr`` target declares.  An entry point or built-in whose plugin
    declares another name fails: it would be called two things."""
    if source == "module:attr":
        return plugin_name(target)
    declared = declared_name(target) if source != "builtin" else plugin_name(target)
    if declared is not None and declared != ref:
        what = "built-in" if source == "builtin" else "entry point"
        raise PluginLoadError(
            f"the {what} {ref!r} loads a plugin that declares the name {declared!r}: a plugin "
            f"has one name, in tests and production -- name the entry point {declared!r}, "
            f"declare name = {ref!r}, or drop the plugin's name (the entry point's name is "
            "its name)",
            plugin=ref,
        )
    return ref


def _find(
    name: str, eps: Mapping[str, list[metadata.EntryPoint]], search: Path | None = None
) -> tuple[Any, str, str]:
    """Import the object ``name`` refers to: (target, source, spec); a ``module:attr`` is
    also looked for in ``search`` (:func:`config_dir`)."""
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
                f"cannot load entry point {ep.value!r} of {_dist_label(ep)}: {_describe_exc(exc)}",
                plugin=name,
            ) from exc
        return target, f"entry point ({_dist_label(ep)})", ep.value
    return _import_spec(name, name, search), "module:attr", name


# -- configuring ---------------------------------------------------------------------------


def _validate_settings(
    model: type[BaseModel], table: Mapping[str, Any], cfg_path: str | None, name: str
) -> BaseModel:
    """Validate a plugin's table; a validator that raises anything is a config error too."""
    try:
        return model.model_validate(dict(table))
    except ValidationError as exc:
        raise validation_error(exc, path=cfg_path, prefix=f"plugins.{name}", model=model) from None
    except Exception as exc:  # a validator raising TypeError, KeyError, ... (not wrapped)
        raise ConfigError(
            f"the plugin's settings validator failed: {_describe_exc(exc)}",
            path=cfg_path,
            key=f"plugins.{name}",
        ) from exc


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
            path=cfg_path,
            key=f"plugins.{name}",
        )
    if inspect.isclass(target):
        cls: Any = target
        try:
            obj = cls(settings) if settings is not None else cls()
        except Exception as exc:
            raise PluginLoadError(f"cannot construct {cls.__name__}: {exc}", plugin=name) from exc
        _set_name(obj, name)
        return obj, settings
    if table:
        configure = getattr(target, "configure", None)
        if not callable(configure):
            raise ConfigError(
                f"plugin {name!r} is a ready object ({type(target).__name__}), which cannot take "
                "settings; point the config or entry point at its class instead",
                path=cfg_path,
                key=f"plugins.{name}",
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
                raise ConfigError(
                    f"plugin {tname!r} takes no settings, got {sorted(table)}",
                    path=config.path,
                    key=f"plugins.{tname}",
                )
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
    loaded: list[LoadedPlugin] = []
    refs: dict[str, str] = {}  # plugin name -> the reference that enabled it
    for name in names:
        table = tables.get(name, {})
        if name in objects:
            _claim(refs, name, name, config)
            obj = objects[name]
            if inspect.isclass(obj):
                inst, settings = instantiate_plugin(name, obj, table, config.path)
                loaded.append(LoadedPlugin(name, "object", _qualname(obj), inst, settings))
                continue
            if table:
                raise ConfigError(
                    "settings given for a plugin object built in code (pass its class instead)",
                    path=config.path,
                    key=f"plugins.{name}",
                )
            if not isinstance(obj, ModuleType):
                _set_name(obj, name)
            loaded.append(
                LoadedPlugin(name, "object", repr(obj), obj, getattr(obj, "settings", None))
            )
            continue
        ref = name
        try:
            target, source, spec = _find(ref, eps, config_dir(config))
            name = _named(ref, target, source)
            _claim(refs, name, ref, config)
            if name != ref and ref in tables:
                raise ConfigError(
                    f"configures nothing: the plugin {ref!r} is named {name!r}, so its settings "
                    f"go in [plugins.{name}]",
                    path=config.path,
                    key=f'plugins."{ref}"',
                )
            obj, settings = instantiate_plugin(name, target, tables.get(name, {}), config.path)
        except PluginLoadError as exc:
            if exc.plugin is None:
                exc = PluginLoadError(exc.reason, plugin=ref)
            raise exc.located(config.path, _where(config, ref)) from exc.__cause__
        except ConfigError:
            raise
        except Exception as exc:  # plugin code raising while it is looked at or configured
            raise PluginLoadError(f"loading failed: {_describe_exc(exc)}", plugin=ref).located(
                config.path, _where(config, ref)
            ) from exc
        loaded.append(LoadedPlugin(name, source, spec, obj, settings))
    _check_unused_tables(config, [lp.name for lp in loaded], blocked, eps)
    check_tables(config)  # a bad table of a switched-off built-in fails before any run, too
    try:
        return register(loaded)
    except PluginLoadError as exc:
        if exc.path is not None or exc.plugin is None:
            raise
        raise exc.located(config.path, _where(config, exc.plugin)) from exc.__cause__
    except Exception as exc:  # a plugin object whose attributes raise while registered
        raise PluginLoadError(
            f"registering the plugins failed: {_describe_exc(exc)}",
            path=config.path,
            key="plugins.enabled",
        ) from exc


def _claim(refs: dict[str, str], name: str, ref: str, config: Config) -> None:
    """Take ``name`` for the plugin enabled as ``ref``; a second plugin of that name fails."""
    if name in refs:
        first = refs[name]
        how = "" if (first, ref) == (name, name) else f" (enabled as {first!r} and {ref!r})"
        raise PluginLoadError(
            f"two plugins are named {name!r}{how}; a name belongs to one plugin -- remove "
            "one, or give one another name",
            plugin=name,
        ).located(config.path, _where(config, ref))
    refs[name] = ref


def _check_unused_tables(
    config: Config,
    loaded: list[str],
    blocked: list[str],
    eps: Mapping[str, list[metadata.EntryPoint]],
) -> None:
    """A ``[plugins.<name>]`` table must configure something: a loaded plugin, a blocked one,
    a built-in (validated while switched off, see :func:`check_tables`) or an installed entry
    point (validated once enabled; its code is not imported while it is off)."""
    # an installed plugin's table stays valid while LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD keeps
    # entry points from loading (the same file serves both): see :func:`unloaded_tables`
    known = set(loaded) | set(blocked) | set(BUILTIN_PLUGINS) | set(eps)
    known |= set(autoload_off_entry_points())
    for tname in config.plugins.tables():
        if tname in known:
            continue
        close = difflib.get_close_matches(tname, sorted(known), n=1)
        hint = f"; did you mean [plugins.{close[0]}]?" if close else ""
        raise ConfigError(
            "configures nothing: no enabled, blocked, built-in or installed plugin has this "
            f"name (loaded: {', '.join(loaded)}){hint}",
            path=config.path,
            key=f"plugins.{tname}" if ":" not in tname else f'plugins."{tname}"',
        )


def enabled_and_blocked(config: Config) -> list[tuple[str, str]]:
    """``(name, what blocks it)`` for every plugin both enabled (``[plugins] enabled``,
    ``LOOPWARDEN_PLUGINS``) and blocked: blocking wins, so it is silently not loaded --
    worth a warning from ``loopwarden config check``."""
    sources = (("[plugins] blocked", config.plugins.blocked), (ENV_BLOCK, _env_list(ENV_BLOCK)))
    out = []
    for name in dict.fromkeys([*config.plugins.enabled, *_env_list(ENV_EXTRA)]):
        for what, names in sources:
            if is_blocked(name, names):
                out.append((name, what))
                break
    return out


def unloaded_tables(config: Config) -> list[tuple[str, str]]:
    """``(table, distribution)`` for the ``[plugins.<name>]`` tables of installed plugins
    that ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` keeps from loading: not checked, not used."""
    eps = autoload_off_entry_points()
    return [(t, _dist_label(eps[t][0])) for t in config.plugins.tables() if t in eps]


def _where(config: Config, name: str) -> str:
    """The config key (or environment variable) that named plugin ``name``."""
    if name in config.plugins.enabled:
        return f"plugins.enabled[{config.plugins.enabled.index(name)}]"
    if name in _env_list(ENV_EXTRA):
        return ENV_EXTRA
    return "plugins.enabled"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"
