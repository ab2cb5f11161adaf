"""``loopwarden plugins``: the plugins in call order, where each came from, and its hooks.

The list is what a run would use: ``[plugins] enabled`` plus ``LOOPWARDEN_PLUGINS``, less the
blocked names (``[plugins] blocked``, ``LOOPWARDEN_BLOCK_PLUGINS``), which are shown apart and
never imported.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from loopwarden.commands import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_config_argument(parser)


def _blocked_rows(config: Any, blocked: list[str]) -> list[dict[str, str]]:
    return [
        {"name": n, "by": "config" if n in config.plugins.blocked else "LOOPWARDEN_BLOCK_PLUGINS"}
        for n in blocked
    ]


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.host import load_plugins, resolve_names

    config = load_config(args.config)
    plugins = load_plugins(config)
    rows = plugins.describe()
    blocked = _blocked_rows(config, resolve_names(config)[1])
    if args.json:
        print(
            json.dumps(
                {"config": config.path, "plugins": rows, "blocked": blocked}, ensure_ascii=False
            )
        )
        return 0
    width = max([len(str(r["name"])) + 2 for r in rows] + [6])
    swidth = max([len(str(r["source"])) for r in rows] + [6])
    print(f"config: {config.path}")
    print(f"{'#':>2}  {'name':<{width}} {'source':<{swidth}} hooks")
    for r in rows:
        name = str(r["name"]) + (" *" if r["essential"] else "")
        source = str(r["source"])
        hooks = ", ".join(r["hooks"]) or "(signals only)"
        print(f"{r['position']:>2}  {name:<{width}} {source:<{swidth}} {hooks}")
        if source.startswith("entry point") or source == "module:attr":
            print(f"{'':>2}  {'':<{width}} -> {r['spec']}")
    if blocked:
        print("blocked (never imported): " + ", ".join(f"{b['name']} ({b['by']})" for b in blocked))
    print("(* essential: can be configured, not disabled)")
    return 0
