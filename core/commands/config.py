"""``loopwarden config check [FILE]`` and ``loopwarden config schema [--config FILE]``.

``check`` validates the file, loads and orders its plugins (each plugin validates its own
``[plugins.<name>]`` table) and validates the tables of built-ins that are switched off; it
warns about a plugin both enabled and blocked (blocking wins) and notes the tables of
installed plugins that ``LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD`` keeps from loading.
``schema`` prints a JSON Schema of the whole file for editors: the core tables plus the
settings of every built-in plugin and of the plugins the given config enables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate a config file and load its plugins")
    check.add_argument(
        "file",
        nargs="?",
        help="the config (default: --config, ./config.toml, or the shipped default)",
    )
    check.add_argument("--config", metavar="FILE", default=None, help=argparse.SUPPRESS)
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
    from loopwarden.config import find_config, load_config
    from loopwarden.deployment import Deployment
    from loopwarden.host import (
        ENV_NO_AUTOLOAD,
        enabled_and_blocked,
        unloaded_tables,
    )

    if args.action == "check":
        from loopwarden import demo

        config = load_config(args.file or args.config)
        demo.shop_config(config)  # the demo's [shop] table, which the core keeps as written
        # a deployment, as a run would build it: plugins load (every table checked, a
        # switched-off built-in's too) and connect (and are closed)
        with Deployment(config) as dep:
            plugins = dep.plugins
            # what a plugin can only find out about its surroundings
            dep.hooks.validate_config(config)
            note = None
            if config.model.provider == "openai":  # the live model must be acceptable too
                dep.check_model(config.model.name)
                from loopwarden.plugins.cost_budget import unpriced_note

                note = unpriced_note(dep, config.model.name)
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
        print(f"{config.path}: OK ({len(plugins)} plugins: {', '.join(plugins.names)})")
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
