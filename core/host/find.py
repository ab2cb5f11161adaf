"""Find: which plugins the config names, and the object each name means (nothing configured).

A name in ``[plugins] enabled`` (the call order), ``LOOPWARDEN_PLUGINS`` or handed in code is
a built-in (:data:`BUILTIN_PLUGINS`), else an installed entry point of the group
``loopwarden.plugins`` (loaded only when named; none with
``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD=1``), else ``module:attr`` -- looked for on ``sys.path``,
then in the config file's directory (:func:`config_dir`).  Blocked names (``[plugins]
blocked``, ``LOOPWARDEN_BLOCK_PLUGINS``) go before anything is imported; the essential
``max_steps`` is always there.  One name per plugin: an entry point's or a built-in's name is
its plugin's (a plugin declaring another fails, :func:`_named`); a ``module:attr`` plugin is
named by the name it declares, else its ``__name__`` (:func:`plugin_name`), as the testing kit
names it.  The rules for users: docs/plugin-guide.md.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from loopwarden.config import Config, default_config_path
from loopwarden.exceptions import ConfigError, PluginLoadError
from loopwarden.host.register import ESSENTIAL_PLUGINS, _env_flag

ENTRY_POINT_GROUP = "loopwarden.plugins"
ENV_EXTRA = "LOOPWARDEN_PLUGINS"
ENV_BLOCK = "LOOPWARDEN_BLOCK_PLUGINS"
ENV_NO_AUTOLOAD = "LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD"

#: built-in plugin names -> "module:attr"
BUILTIN_PLUGINS: dict[str, str] = {
    name: f"loopwarden.plugins.{name}:{cls}"
    for name, cls in (
        ("max_steps", "MaxSteps"),
        ("timeout", "Timeout"),
        ("token_budget", "TokenBudget"),
        ("cost_budget", "CostBudget"),
        ("spend_limits", "SpendLimits"),
        ("circuit_breaker", "CircuitBreaker"),
        ("tool_calls", "ToolCalls"),
        ("retry_policy", "RetryPolicy"),
        ("repeat_call", "RepeatCall"),
        ("oscillation", "Oscillation"),
        ("no_progress", "NoProgress"),
        ("stall", "Stall"),
        ("failure_streak", "FailureStreak"),
        ("terminal_tool", "TerminalTool"),
        ("conversation_limits", "ConversationLimits"),
        ("logging", "LoggingPlugin"),
        ("alerting", "Alerting"),
        ("metrics", "Metrics"),
        ("otel", "OTel"),
        ("run_record", "RunRecord"),
    )
}


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


# -- names ---------------------------------------------------------------------------------


def resolve_names(config: Config, extra: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """The plugin names to load, in call order, and the names blocked -- before any import.

    Order: ``[plugins] enabled``, then ``LOOPWARDEN_PLUGINS``, then ``extra``; essential plugins
    missing from the list go first.  A name listed twice, or an essential plugin blocked, is a
    :class:`ConfigError`.
    """
    own_blocked, path = config.plugins.blocked, config.path
    blocked = list(dict.fromkeys([*own_blocked, *_env_list(ENV_BLOCK)]))
    for name in blocked:
        if name in ESSENTIAL_PLUGINS:
            raise ConfigError(
                f"{name!r} is essential and cannot be blocked (configure its limits instead)",
                path=path,
                key="plugins.blocked" if name in own_blocked else ENV_BLOCK,
            )
    names: list[str] = []
    for name in [*config.plugins.enabled, *_env_list(ENV_EXTRA), *extra]:
        if name in names:
            raise ConfigError(f"plugin {name!r} is listed twice", path=path, key="plugins.enabled")
        names.append(name)
    names[:0] = [ess for ess in ESSENTIAL_PLUGINS if ess not in names]
    return [n for n in names if not is_blocked(n, blocked)], blocked


def is_blocked(name: str, blocked: Iterable[str]) -> bool:
    """Whether ``name`` is blocked: by its own name, or -- for ``module:attr`` -- by its module
    or a parent package (blocking ``sidefx`` also keeps ``sidefx:Plugin`` from importing)."""
    module = name.partition(":")[0] if ":" in name else None
    return any(
        name == b or (module is not None and (module == b or module.startswith(b + ".")))
        for b in blocked
    )


def enabled_and_blocked(config: Config) -> list[tuple[str, str]]:
    """``(name, what blocks it)`` for every plugin both enabled (``[plugins] enabled``,
    ``LOOPWARDEN_PLUGINS``) and blocked: blocking wins, so it is silently not loaded --
    worth a warning from ``loopwarden config check``."""
    sources = (("[plugins] blocked", config.plugins.blocked), (ENV_BLOCK, _env_list(ENV_BLOCK)))
    out = []
    for name in dict.fromkeys([*config.plugins.enabled, *_env_list(ENV_EXTRA)]):
        by = next((what for what, names in sources if is_blocked(name, names)), None)
        if by is not None:
            out.append((name, by))
    return out


def plugin_name(target: Any) -> str:
    """The name a plugin goes by: the ``name`` it declares (:func:`declared_name`), else its
    ``__name__`` (a class's or a module's), else its type's name -- the loader and the testing
    kit both name a plugin so."""
    fallback = getattr(target, "__name__", None)
    if not (isinstance(fallback, str) and fallback):
        fallback = type(target).__name__
    return declared_name(target) or fallback


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
    if ref in BUILTIN_PLUGINS or ":" not in ref or ref in installed_entry_points():
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


# -- finding and importing -----------------------------------------------------------------


def installed_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Installed entry points of the group ``loopwarden.plugins``, by name (nothing loaded).

    Empty when ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` is set.  A name with two entries is kept
    with both, so that using it fails naming both distributions.
    """
    return {} if _env_flag(ENV_NO_AUTOLOAD) else _scan_entry_points()


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
    return "an unknown distribution" if dist is None else f"{dist.metadata['Name']} {dist.version}"


def config_dir(config: Config) -> Path | None:
    """The directory of ``config``'s file, where ``module:attr`` plugins are also looked for
    (pytest's rootdir for ``conftest.py``); None for the shipped default or a config built in
    code."""
    config_path = config.path
    if not config_path or config_path.startswith("<"):
        return None
    path = Path(config_path)
    if not path.is_file() or path.resolve() == default_config_path().resolve():
        return None
    return path.resolve().parent


def import_beside(mod_name: str, search: Path | None) -> ModuleType:
    """Import ``mod_name``; when its top-level module is not on ``sys.path`` but lies in
    ``search`` (the config file's directory), append that directory to ``sys.path`` -- for
    good: the module's own imports of its neighbours work later too -- and import it from
    there.  Appended, so it never shadows an installed module.  The one lookup rule of every
    ``module:attr`` a deployment names: ``[plugins] enabled`` and ``loopwarden run --tools``."""
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
    """Import the object a ``module:attr`` names; anything else was not found (a name)."""
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
        obj: Any = import_beside(mod_name, search)
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


def _find(
    name: str, eps: Mapping[str, list[metadata.EntryPoint]], search: Path | None = None
) -> tuple[Any, str, str]:
    """Import the object ``name`` refers to: (target, source, spec); a ``module:attr`` is
    also looked for in ``search`` (:func:`config_dir`)."""
    candidates = eps.get(name, [])
    listed = [f"{_dist_label(e)} ({e.value})" for e in candidates]
    if name in BUILTIN_PLUGINS:
        if candidates:
            raise PluginLoadError(
                "the name is built in and also declared as an entry point by "
                f"{', '.join(listed)}; rename that entry point (or set {ENV_NO_AUTOLOAD}=1 to "
                "ignore entry points)",
                plugin=name,
            )
        spec = BUILTIN_PLUGINS[name]
        return _import_spec(spec, name), "builtin", spec
    if len(candidates) > 1:
        raise PluginLoadError(
            "two installed distributions declare this entry point: "
            f"{' and '.join(listed)}; uninstall one",
            plugin=name,
        )
    if not candidates:
        return _import_spec(name, name, search), "module:attr", name
    ep = candidates[0]
    try:
        target = ep.load()
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        raise PluginLoadError(
            f"cannot load entry point {ep.value!r} of {_dist_label(ep)}: {_describe_exc(exc)}",
            plugin=name,
        ) from exc
    return target, f"entry point ({_dist_label(ep)})", ep.value


def unloaded_tables(config: Config) -> list[tuple[str, str]]:
    """``(table, distribution)`` for the ``[plugins.<name>]`` tables of installed plugins
    that ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` keeps from loading: not checked, not used."""
    eps = autoload_off_entry_points()
    return [(t, _dist_label(eps[t][0])) for t in config.plugins.tables() if t in eps]
