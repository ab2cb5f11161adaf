"""A JSON Schema of ``config.toml``, for editors and CI (``loopwarden config schema``).

The schema is built from the same pydantic models that validate the file: the core tables
(:class:`~loopwarden.config.Config`) and, under ``plugins.<name>``, the ``Settings`` model of
every built-in plugin and -- given a config -- of every plugin that config enables (entry
points and ``module:attr`` included; blocked plugins are never imported, so never described).
Tables of plugins the schema does not know stay allowed: the plugin validates them when it
loads.  Editors that read JSON Schema (e.g. Even Better TOML / taplo with a ``#:schema``
directive) then complete and check the file as you type.

The schema checks shapes, types and bounds.  Rules across fields -- ``[run] profile`` must name
a defined profile, text templates must use known fields -- are checked by
``loopwarden config check`` only.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from loopwarden.config import Config, PluginsConfig, load_config
from loopwarden.host.find import (
    BUILTIN_PLUGINS,
    _find,
    _named,
    config_dir,
    installed_entry_points,
    resolve_names,
)
from loopwarden.host.load import builtin_settings, settings_of

__all__ = ["JSON_SCHEMA_DIALECT", "config_schema", "plugin_settings_models"]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def plugin_settings_models(
    config_path: str | Path | None = None,
) -> dict[str, tuple[type[BaseModel] | None, str]]:
    """``{name: (Settings model or None, description)}`` for the schema's ``plugins`` table.

    Every importable built-in (blocked ones excepted when a config is given), then the
    config's enabled plugins that are not built in, in config order.
    """
    out: dict[str, tuple[type[BaseModel] | None, str]] = {}
    blocked: list[str] = []
    names: list[str] = []
    search: Path | None = None  # where module:attr plugins are looked for besides sys.path
    if config_path is not None:
        config = load_config(config_path)
        names, blocked = resolve_names(config)
        search = config_dir(config)
    for name, model in builtin_settings().items():
        if name in blocked:
            continue
        target_doc = _doc_of(BUILTIN_PLUGINS[name])
        out[name] = (model, f"built-in plugin {name!r}" + (f": {target_doc}" if target_doc else ""))
    eps = installed_entry_points() if any(n not in BUILTIN_PLUGINS for n in names) else {}
    for ref in names:
        if ref in out or ref in BUILTIN_PLUGINS:
            continue
        target, source, spec = _find(ref, eps, search)
        name = _named(ref, target, source)  # its table is keyed by its one name, not "mod:Cls"
        doc = _summary(inspect.getdoc(target))
        out[name] = (
            settings_of(target)[0],
            f"plugin {name!r} ({source}: {spec})" + (f": {doc}" if doc else ""),
        )
    return out


def _summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ") if doc else ""


def _doc_of(spec: str) -> str:
    import importlib

    mod_name, _, attr = spec.partition(":")
    return _summary(inspect.getdoc(getattr(importlib.import_module(mod_name), attr)))


def config_schema(
    config_path: str | Path | None = None,
    tables: Mapping[str, type[BaseModel]] | None = None,
) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a whole config file.

    :param config_path: a config whose enabled plugins' settings are included besides the
        built-ins'; None for the built-ins only.
    :param tables: top-level tables the core keeps as written and another package validates,
        by name, with that package's model (``loopwarden config schema`` passes the demo's
        ``[shop]``).
    """
    plugins = plugin_settings_models(config_path)
    extra = dict(tables or {})
    models: list[type[BaseModel]] = [Config, *extra.values()]
    for model, _ in plugins.values():
        if model is not None and model not in models:
            models.append(model)
    refs, top = models_json_schema(
        [(m, "validation") for m in models], ref_template="#/$defs/{model}"
    )
    defs: dict[str, Any] = dict(top.get("$defs", {}))
    config_key = refs[(Config, "validation")]["$ref"].rsplit("/", 1)[-1]
    root = defs.pop(config_key)
    root["properties"].pop("path", None)
    for name, model in extra.items():
        root["properties"][name] = dict(refs[(model, "validation")])
    plugins_key = root["properties"]["plugins"].get("$ref", "").rsplit("/", 1)[-1]
    core_plugins = defs.pop(plugins_key, None) or PluginsConfig.model_json_schema()
    properties: dict[str, Any] = {}
    for key in ("enabled", "blocked", "enable", "disable"):
        prop = dict(core_plugins["properties"][key])
        prop["items"] = {"type": "string", "minLength": 1}
        properties[key] = prop
    properties["enabled"]["uniqueItems"] = True
    properties["enabled"]["description"] = (
        "Plugins in call order: built-in names, entry-point names (group "
        "'loopwarden.plugins') or 'module:attr'."
    )
    properties["blocked"]["description"] = (
        "Plugin names never to load (their modules are not even imported)."
    )
    for name, (model, description) in plugins.items():
        if model is None:
            properties[name] = {
                "type": "object",
                "additionalProperties": False,
                "maxProperties": 0,
                "description": description,
            }
        else:
            properties[name] = {
                "$ref": refs[(model, "validation")]["$ref"],
                "description": description,
            }
    root["properties"]["plugins"] = {
        "type": "object",
        "description": "[plugins]: enabled (call order), blocked, and one table per plugin.",
        "properties": properties,
        "additionalProperties": {"type": "object"},
    }
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        **root,
        "title": "loopwarden config.toml",
        "$defs": defs,
    }
