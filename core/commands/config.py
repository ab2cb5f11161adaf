"""``loopwarden config check [FILE]``, ``config show [--config FILE] [--json]`` and
``config schema [--config FILE]``.

``check`` validates the file, loads and orders its plugins (each plugin validates its own
``[plugins.<name>]`` table) and validates the tables of built-ins that are switched off; it
warns about a plugin both enabled and blocked (blocking wins), about a file that extends
nothing and enables few of the shipped guards (what it leaves out is off), and notes the tables
of installed plugins that ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` keeps from loading.
``show`` prints the effective config -- the file merged over those it ``extends``, every
setting's default filled in -- one ``key = value`` line each with the file and line it came
from (``built-in``: no file writes it); the text is itself a complete, valid config.
``schema`` prints a JSON Schema of the whole file for editors: the core tables plus the
settings of every built-in plugin and of the plugins the given config enables.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.host import PluginSet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate a config file and load its plugins")
    check.add_argument(
        "file",
        nargs="?",
        help="the config (default: --config, ./config.toml, or the shipped default)",
    )
    check.add_argument("--config", metavar="FILE", default=None, help=argparse.SUPPRESS)
    show = sub.add_parser(
        "show", help="print the effective config and the file and line each value came from"
    )
    show.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="the config (default: ./config.toml if present, else the shipped default)",
    )
    show.add_argument(
        "--json",
        action="store_true",
        help='one JSON object: "files" (the file, then each it extends), "config" (the '
        'effective values) and "sources" (dotted key -> "FILE:LINE" or "built-in")',
    )
    schema = sub.add_parser("schema", help="print a JSON Schema of the config file")
    schema.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="also describe the plugins this config enables (default: "
        "./config.toml if present, else the shipped default)",
    )
    schema.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        default=None,
        help="write the schema to FILE instead of stdout",
    )


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import blamed, find_config, load_config
    from loopwarden.host import (
        ENV_NO_AUTOLOAD,
        enabled_and_blocked,
        unloaded_tables,
    )

    if args.action == "check":
        config = load_config(args.file or args.config)
        with blamed(config):
            plugins, note = _check(config)
        if note is not None:
            print(f"loopwarden config: note: {note}", file=sys.stderr)
        for name, by in enabled_and_blocked(config):
            print(
                f"loopwarden config: warning: plugin {name!r} is enabled and blocked (by {by}): "
                "it is not loaded -- remove it from one of the two",
                file=sys.stderr,
            )
        for table, dist in unloaded_tables(config):
            print(
                f"loopwarden config: note: [plugins.{table}] configures the installed plugin "
                f"{table!r} ({dist}), which is not loaded while {ENV_NO_AUTOLOAD} is set: its "
                "table is not checked",
                file=sys.stderr,
            )
        few = few_guards(config)
        if few is not None:
            print(f"loopwarden config: warning: {few}", file=sys.stderr)
        print(f"{config.path}: OK ({len(plugins)} plugins: {', '.join(plugins.names)})")
        return 0
    if args.action == "show":
        print(show_text(args.config, as_json=args.json), end="")
        return 0
    text = schema_text(find_config(args.config))
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            print(
                f"loopwarden config: cannot write {args.output}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
    else:
        print(text, end="")
    return 0


def schema_text(config_path: str | Path | None) -> str:
    """The JSON Schema of a config file as text: the core tables, the built-in plugins' and
    those ``config_path`` enables (None: the built-ins only, as docs/config.schema.json)."""
    from loopwarden import demo
    from loopwarden.commands.schema import config_schema

    # the demo's [shop] table, which the core keeps as written: described as the demo checks it
    schema = config_schema(config_path, tables={"shop": demo.ShopConfig})
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _check(config: Config) -> tuple[PluginSet, str | None]:
    """Build the deployment as a run would -- plugins load (every table checked, a
    switched-off built-in's too) and connect (and are closed) -- and check what only a plugin
    can; the loaded plugins and a note about the model's price, if any."""
    from loopwarden import demo
    from loopwarden.deployment import Deployment

    demo.shop_config(config)  # the demo's [shop] table, which the core keeps as written
    with Deployment(config) as dep:
        plugins = dep.plugins
        # what a plugin can only find out about its surroundings
        dep.hooks.validate_config(config)
        note = None
        if config.model.provider == "openai":  # the live model must be acceptable too
            dep.check_model(config.model.name)
            from loopwarden.plugins.cost_budget import unpriced_note

            note = unpriced_note(dep, config.model.name)
    return plugins, note


def few_guards(config: Config) -> str | None:
    """A warning when ``config`` extends nothing and enables fewer than half of the plugins
    the shipped config enables: everything such a file leaves out is off (a short file that
    meant to change one limit switches off every guard but ``max_steps``).  None otherwise."""
    from loopwarden.config import default_config_path, load_config

    shipped = default_config_path()
    if config.extends is not None or (
        config.path is not None and Path(config.path).resolve() == shipped.resolve()
    ):
        return None
    from loopwarden.host import ESSENTIAL_PLUGINS

    wanted = load_config(shipped).plugins.enabled
    on = {*config.plugins.enabled, *ESSENTIAL_PLUGINS}  # loaded whether listed or not
    off = [name for name in wanted if name not in on]
    if len(off) * 2 <= len(wanted):
        return None
    return (
        f"{config.path or 'the config'} extends nothing and enables "
        f"{len(wanted) - len(off)} of the {len(wanted)} plugins the shipped config enables: "
        f"{', '.join(off)} are off. To change only some settings, start the file with "
        'extends = "defaults" and list what differs (docs/configuration.md)'
    )


def show_text(config_path: str | Path | None, *, as_json: bool = False) -> str:
    """``loopwarden config show``: the effective config of ``config_path`` (None: the file
    every command would read) as ``key = value  # FILE:LINE`` lines, or as JSON."""
    from loopwarden.config import find_config, layered_config, load_toml, parse_config
    from loopwarden.config.inherit import BUILT_IN
    from loopwarden.traffic.calibrate import _toml_key, _toml_value

    path = find_config(config_path)
    data = load_toml(path)
    config = parse_config(data, path=str(path))
    layered = layered_config(data, path=str(path))
    values = effective_values(config)
    sources: dict[str, str] = {}
    lines: list[str] = []
    for key, value in _leaves(values):
        origin = layered.origin(key) or _shipped_profile(key, layered.data)
        dotted = ".".join(_toml_key(k) for k in key)
        sources[dotted] = str(origin) if origin is not None else BUILT_IN
        lines.append(f"{dotted} = {_toml_value(value)}  # {sources[dotted]}")
    files = layered.files
    if as_json:
        body = {"files": files, "config": values, "sources": sources}
        return json.dumps(body, indent=2, ensure_ascii=False) + "\n"
    head = [
        f"# the effective config of {files[0]}"
        + (f", extending {' -> '.join(files[1:])}" if len(files) > 1 else ""),
        "# each value is followed by the file and line it came from; built-in: no file sets "
        "it (the setting's default)",
    ]
    return "\n".join([*head, *lines]) + "\n"


def effective_values(config: Config) -> dict[str, Any]:
    """Every value of ``config`` as JSON data, each plugin table with its plugin's defaults
    filled in (a table its plugin cannot validate, or of a plugin not found, as written)."""
    from pydantic import ValidationError

    from loopwarden.commands.schema import plugin_settings_models
    from loopwarden.exceptions import LoopwardenError

    values: dict[str, Any] = _plain(config.model_dump(by_alias=True, exclude_none=True))
    plugins: dict[str, Any] = values["plugins"]
    try:
        models = plugin_settings_models(config.path)
    except LoopwardenError:  # a plugin that cannot load: tables as written (check says why)
        models = {}
    for name, (model, _) in models.items():
        table = plugins.get(name)
        if model is None or (table is None and name not in config.plugins.enabled):
            continue
        written = dict(table or {})
        shadow = {"shadow": written.pop("shadow")} if "shadow" in written else {}
        try:
            full = _plain(
                model.model_validate(written).model_dump(by_alias=True, exclude_none=True)
            )
        except ValidationError:  # shown as written: config check names the problem
            continue
        plugins[name] = {**full, **shadow}
    return values


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as TOML and JSON write them: a decimal (a price, a cost) as a number, not the
    string pydantic's JSON mode makes of it; a set as a sorted list; anything else as text."""

    def convert(value: Any) -> Any:
        if isinstance(value, Decimal):
            return float(value)
        if isinstance(value, (set, frozenset)):
            return sorted(value, key=str)
        return str(value)

    out: dict[str, Any] = json.loads(json.dumps(values, default=convert, ensure_ascii=False))
    return out


def _leaves(node: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[Any, Any]]:
    """``(key path, value)`` for every value that is not a non-empty table."""
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, (*prefix, str(key)))
        else:
            yield (*prefix, str(key)), value


def _shipped_profile(key: tuple[str, ...], data: Mapping[str, Any]) -> Any:
    """Where a built-in profile no file in the chain writes comes from: the shipped file."""
    from loopwarden.config import default_config_path, layered_config, load_toml

    if key[0] != "profiles" or len(key) < 2 or key[1] in (data.get("profiles") or {}):
        return None
    shipped = default_config_path()
    return layered_config(load_toml(shipped), path=str(shipped)).origin(key)
