"""``loopwarden breakers``: the circuit_breaker plugin's breakers in the shared store.

``loopwarden breakers [--json]`` lists every live breaker of the store (``[store] url``): its
tool or MCP server, scope, state (closed, open, half_open), since when it is open, what
opened it and how often it opened; ``loopwarden breakers reset NAME [--server] [--scope
tenant --key acme]`` forgets one (closed, its counts gone) -- after an upstream was fixed, so
that its tools are called again before ``open_s`` is over; the reset is recorded in the
store's change log (who, when, the breaker's state before), which ``loopwarden breakers log``
lists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from loopwarden.commands import add_config_argument
from loopwarden.commands._ops import add_by_argument, print_changes, print_table, when
from loopwarden.store.admin import Change


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=["show", "reset", "log"],
        default="show",
        help="show (default), reset NAME, or log",
    )
    parser.add_argument("name", nargs="?", help="with reset: the tool (or, --server, the server)")
    parser.add_argument(
        "--server", action="store_true", help="with reset: NAME is an MCP server, not a tool"
    )
    parser.add_argument(
        "--scope", default=None, help='with reset: the breaker\'s scope (default "deployment")'
    )
    parser.add_argument("--key", default=None, help="with reset: the scope's key (acme, ...)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_by_argument(parser)
    add_config_argument(parser)


def _describe(c: Change) -> str:
    t, old = c.target, c.old or {}
    return (
        f"{t.get('target')} {t.get('name')} ({t.get('scope')}={t.get('key')}): "
        f"was {old.get('state', 'absent')}"
    )


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.sanitize import escape_controls
    from loopwarden.store import Shared, operated, redact_url

    config = load_config(args.config)
    shared = Shared(config.store)
    try:
        store = shared.store
        if args.action == "reset":
            if not args.name:
                print(
                    "loopwarden breakers: reset needs NAME (breakers reset search_flights)",
                    file=sys.stderr,
                )
                return 2
            scope = args.scope or "deployment"
            key = args.key if args.key is not None else "*"
            target = "server" if args.server else "tool"
            ident = (scope, key, target, args.name)
            before = [
                v.as_dict()
                for v in store.breakers()
                if (v.scope, v.scope_key, v.target, v.name) == ident
            ]
            done = store.breaker_reset(ident)
            operated(store).log_change(
                "reset_breaker",
                {"scope": scope, "key": key, "target": target, "name": args.name},
                {"state": before[0]["state"], "opens": before[0]["opens"]} if before else None,
                None,
                by=args.by,
            )
            if args.json:
                print(json.dumps({"store": redact_url(shared.url), "reset": done}))
            else:
                print(f"reset {target} {args.name} ({scope}={key}): {'done' if done else 'none'}")
            return 0
        if args.action == "log":
            changes = [c for c in operated(store).changes(1000) if c.action == "reset_breaker"]
            print_changes(changes, args.json, redact_url(shared.url), _describe)
            return 0
        rows: list[dict[str, Any]] = [v.as_dict() for v in store.breakers()]
    finally:
        shared.close()
    if args.json:
        print(json.dumps({"store": redact_url(shared.url), "breakers": rows}, ensure_ascii=False))
        return 0
    print(f"store: {redact_url(shared.url)}")
    from loopwarden.host import ENV_EXTRA

    extra = [p.strip() for p in os.environ.get(ENV_EXTRA, "").split(",")]
    if "circuit_breaker" not in [*config.plugins.enabled, *extra]:
        where = config.path or "the config"
        print(
            f"circuit_breaker is not enabled in {where}: no run asks a breaker. Add it to "
            "[plugins] enabled (docs/defence-lines.md)."
        )
    if not rows:
        print("(no breakers)")
        return 0
    head = ["target", "name", "scope", "key", "state", "since", "tripped by", "opens"]
    table = [head]
    for r in rows:
        tripped = r["tripped"] or {}
        why = (
            f"{tripped.get('failures')} failures in {tripped.get('window_s'):g} s "
            f"({tripped.get('rule')}; {tripped.get('error') or '?'})"
            if tripped
            else "-"
        )
        cells = [
            escape_controls(str(r[c])) for c in ("target", "name", "scope", "scope_key", "state")
        ]
        table.append([*cells, when(r["since"]), why, str(r["opens"])])
    print_table(table)
    return 0
