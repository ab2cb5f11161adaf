"""``loopwarden config check [FILE]`` and ``loopwarden config schema``."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate a config file and load its plugins")
    check.add_argument("file", nargs="?", help="the config (default: --config, ./config.toml, "
                                               "or the shipped default)")
    check.add_argument("--config", metavar="FILE", default=None, help=argparse.SUPPRESS)
    schema = sub.add_parser("schema", help="print a JSON Schema of the config file")
    schema.add_argument("--config", metavar="FILE", default=None,
                        help="include the settings of the plugins this config enables")


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.pluginmanager import load_plugins

    if args.action == "check":
        config = load_config(args.file or args.config)
        plugins = load_plugins(config)
        print(f"{config.path}: OK ({len(plugins)} plugins: {', '.join(plugins.names)})")
        return 0
    from loopwarden.schema import config_schema

    print(json.dumps(config_schema(args.config), indent=2, ensure_ascii=False))
    return 0
