"""Load: each plugin the config names, found (:mod:`loopwarden.host.find`), configured from
its table and registered (:mod:`loopwarden.host.register`) -- :func:`load_plugins`.

Each ``[plugins.<name>]`` table is validated once, by :func:`settings_of`, the one answer to
"the settings of this plugin from this table" (also asked by ``loopwarden config schema`` and
the docs); a switched-off built-in's table too, so a typo in it fails before any run.  A table
that configures nothing fails naming it (``[plugins."mod:Cls"]`` beside ``[plugins.<name>]``,
or a table for no enabled, blocked, built-in or installed plugin).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from loopwarden.config import Config, blamed, validation_error
from loopwarden.exceptions import ConfigError, PluginLoadError
from loopwarden.host.find import (
    BUILTIN_PLUGINS,
    ENV_EXTRA,
    _describe_exc,
    _env_list,
    _find,
    _import_spec,
    _named,
    autoload_off_entry_points,
    config_dir,
    installed_entry_points,
    resolve_names,
)
from loopwarden.host.register import LoadedPlugin, PluginSet, register

# -- settings ------------------------------------------------------------------------------


def settings_of(
    target: Any, table: Mapping[str, Any] | None = None, name: str = "", path: str | None = None
) -> tuple[type[BaseModel] | None, BaseModel | None]:
    """The settings of plugin ``target`` from ``table`` (its ``[plugins.<name>]``, read from
    ``path``): the pydantic model it validates its table with (its ``Settings``, or None) and,
    when a table is given, that table validated.

    The one answer for loading, for checking the tables of switched-off built-ins, for
    ``loopwarden config schema`` and for the docs.  A table for a plugin without settings, or
    one its model refuses -- a validator raising anything counts -- is a
    :class:`ConfigError` at ``plugins.<name>``."""
    try:
        model = getattr(target, "Settings", None)
    except Exception as exc:  # an object whose attribute access raises
        raise PluginLoadError(f"reading its Settings failed: {_describe_exc(exc)}") from exc
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        model = None
    if table is None or (model is None and not table):
        return model, None
    key = f"plugins.{name}"
    if model is None:
        raise ConfigError(
            f"plugin {name!r} takes no settings, got {sorted(table)}", path=path, key=key
        )
    try:
        return model, model.model_validate(dict(table))
    except ValidationError as exc:
        raise validation_error(exc, path=path, prefix=key, model=model) from None
    except Exception as exc:  # a validator raising TypeError, KeyError, ... (not wrapped)
        raise ConfigError(
            f"the plugin's settings validator failed: {_describe_exc(exc)}", path=path, key=key
        ) from exc


def builtin_settings(*, skip_missing: bool = True) -> dict[str, type[BaseModel] | None]:
    """The settings model of every importable built-in plugin, in :data:`BUILTIN_PLUGINS` order.

    A built-in whose module does not exist (yet) is skipped when ``skip_missing``; any other
    import error propagates, so a broken plugin is never silently left out.
    """
    out: dict[str, type[BaseModel] | None] = {}
    for name, spec in BUILTIN_PLUGINS.items():
        mod_name, _, attr = spec.partition(":")
        try:
            out[name] = settings_of(getattr(importlib.import_module(mod_name), attr))[0]
        except ModuleNotFoundError as exc:
            if not (skip_missing and exc.name == mod_name):
                raise
    return out


def instantiate_plugin(
    name: str, target: Any, table: Mapping[str, Any], cfg_path: str | None = None
) -> tuple[Any, BaseModel | None]:
    """Build the plugin object ``name`` from ``target`` and its settings table.

    A class is constructed with its validated settings (``Settings``) and named ``name``.
    A module or object is used as it is: it may take settings through ``configure(settings)``;
    a table for an object that cannot take it is a :class:`ConfigError`.
    """
    settings = settings_of(target, table, name, cfg_path)[1]
    if inspect.isclass(target):
        cls: Any = target
        try:
            obj = cls(settings) if settings is not None else cls()
        except Exception as exc:
            raise PluginLoadError(
                f"cannot construct {target.__name__}: {exc}", plugin=name
            ) from exc
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


def check_tables(config: Config) -> list[str]:
    """Validate the ``[plugins.<name>]`` tables of built-ins that are not enabled (a typo in
    the table of a switched-off built-in fails before any run too); :func:`load_plugins` does
    it for every config.  Blocked plugins are never imported, so their tables are not
    checked.  Returns the names checked."""
    return _check_switched_off(config, *resolve_names(config))


def _check_switched_off(config: Config, names: list[str], blocked: list[str]) -> list[str]:
    tables = config.plugins.tables()
    off = [t for t in tables if t in BUILTIN_PLUGINS and t not in {*names, *blocked}]
    for name in off:
        settings_of(_import_spec(BUILTIN_PLUGINS[name], name), tables[name], name, config.path)
    return off


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
    name, a ready object is used as it is (a table for it is an error).  An error in a table
    that a parent file (``extends``) wrote names that file and line.
    """
    with blamed(config):
        return _load_plugins(config, extra, objects)


def _load_plugins(
    config: Config, extra: Iterable[str], objects: Mapping[str, Any] | None
) -> PluginSet:
    objects = dict(objects or {})
    enabled, path = config.plugins.enabled, config.path
    extra = [*extra, *[n for n in objects if n not in enabled]]
    names, blocked = resolve_names(config, extra)
    tables = config.plugins.tables()
    eps = installed_entry_points()
    search = config_dir(config)
    loaded: list[LoadedPlugin] = []
    refs: dict[str, str] = {}  # plugin name -> the reference that enabled it

    def where(ref: str) -> str:  # the key (or environment variable) that named ``ref``
        if ref in enabled:
            return f"plugins.enabled[{enabled.index(ref)}]"
        return ENV_EXTRA if ref in _env_list(ENV_EXTRA) else "plugins.enabled"

    def claim(name: str, ref: str) -> None:  # a second plugin of one name fails
        if name in refs:
            first = refs[name]
            how = "" if (first, ref) == (name, name) else f" (enabled as {first!r} and {ref!r})"
            raise PluginLoadError(
                f"two plugins are named {name!r}{how}; a name belongs to one plugin -- remove "
                "one, or give one another name",
                plugin=name,
            ).located(path, where(ref))
        refs[name] = ref

    for ref in names:
        if ref in objects:
            claim(ref, ref)
            loaded.append(_from_code(ref, objects[ref], tables.get(ref, {}), path))
            continue
        try:
            target, source, spec = _find(ref, eps, search)
            name = _named(ref, target, source)
            claim(name, ref)
            if name != ref and ref in tables:
                raise ConfigError(
                    f"configures nothing: the plugin {ref!r} is named {name!r}, so its settings "
                    f"go in [plugins.{name}]",
                    path=path,
                    key=f'plugins."{ref}"',
                )
            obj, settings = instantiate_plugin(name, target, tables.get(name, {}), path)
        except PluginLoadError as exc:
            if exc.plugin is None:
                exc = PluginLoadError(exc.reason, plugin=ref)
            raise exc.located(path, where(ref)) from exc.__cause__
        except ConfigError:
            raise
        except Exception as exc:  # plugin code raising while it is looked at or configured
            raise PluginLoadError(f"loading failed: {_describe_exc(exc)}", plugin=ref).located(
                path, where(ref)
            ) from exc
        loaded.append(LoadedPlugin(name, source, spec, obj, settings))
    # a table must configure something: a loaded or blocked plugin, a built-in (checked while
    # switched off) or an installed entry point (checked once enabled; not imported while
    # off), also one LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD keeps from loading (see unloaded_tables)
    known = {*refs, *blocked, *BUILTIN_PLUGINS, *eps, *autoload_off_entry_points()}
    for tname in tables:
        if tname not in known:
            close = difflib.get_close_matches(tname, sorted(known), n=1)
            raise ConfigError(
                "configures nothing: no enabled, blocked, built-in or installed plugin has this "
                f"name (loaded: {', '.join(refs)})"
                + (f"; did you mean [plugins.{close[0]}]?" if close else ""),
                path=path,
                key=f"plugins.{tname}" if ":" not in tname else f'plugins."{tname}"',
            )
    _check_switched_off(config, names, blocked)
    try:
        return register(loaded)
    except PluginLoadError as exc:
        if exc.path is not None or exc.plugin is None:
            raise
        raise exc.located(path, where(exc.plugin)) from exc.__cause__
    except Exception as exc:  # a plugin object whose attributes raise while registered
        raise PluginLoadError(
            f"registering the plugins failed: {_describe_exc(exc)}",
            path=path,
            key="plugins.enabled",
        ) from exc


def _from_code(name: str, obj: Any, table: Mapping[str, Any], path: str | None) -> LoadedPlugin:
    """A plugin built in code: a class is constructed with its table, an object used as it is."""
    if inspect.isclass(obj):
        inst, settings = instantiate_plugin(name, obj, table, path)
        qualname = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"
        return LoadedPlugin(name, "object", qualname, inst, settings)
    if table:
        raise ConfigError(
            "settings given for a plugin object built in code (pass its class instead)",
            path=path,
            key=f"plugins.{name}",
        )
    if not isinstance(obj, ModuleType):
        _set_name(obj, name)
    return LoadedPlugin(name, "object", repr(obj), obj, getattr(obj, "settings", None))
