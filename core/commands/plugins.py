"""``loopwarden plugins``: the enabled plugins in call order, their source and hooks."""

from __future__ import annotations

import argparse
import json

from loopwarden.commands import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_config_argument(parser)


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.pluginmanager import ESSENTIAL_PLUGINS, load_plugins

    config = load_config(args.config)
    plugins = load_plugins(config)
    rows = [
        {"position": i, "name": p.name, "source": p.source, "spec": p.spec, "hooks": p.hooks,
         "essential": p.name in ESSENTIAL_PLUGINS}
        for i, p in enumerate(plugins, 1)
    ]
    if args.json:
        print(json.dumps({"config": config.path, "plugins": rows}, ensure_ascii=False))
        return 0
    print(f"config: {config.path}")
    print(f"{'#':>2}  {'name':<16} {'source':<28} hooks")
    for r in rows:
        name = str(r["name"]) + (" *" if r["essential"] else "")
        print(f"{r['position']:>2}  {name:<16} {r['source']!s:<28} {', '.join(r['hooks'])}")  # type: ignore[arg-type]
    print("(* essential: can be configured, not disabled)")
    return 0
