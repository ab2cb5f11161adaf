"""``loopwarden ledger``: the side-effect ledger in the shared store -- list, forget, log.

A declared side effect (``apply_refund``) runs once per idempotency key: the store remembers
each key executed (``[store] ledger_ttl_s``, a week by default) and answers a later call with
the same key from the ledger instead of running it again -- across runs, processes and hosts.

``loopwarden ledger [--json] [--tool NAME] [--scope tenant=acme]`` lists the entries: their
scope (the meta values that prefix the key, ``[store] ledger_scope``), tool, idempotency key,
state (``done``; ``running``: in progress, or its worker died; ``unknown``: may have taken
effect) and result.  ``loopwarden ledger forget KEY... | --tool NAME | --scope K=V | --all``
removes entries so that the same call executes again: it lists what it would remove and asks
(``--yes`` for scripts), keeps ``running`` entries unless ``--running`` (forgetting a call in
progress lets a second one run beside it), and records each removal in the store's change
log, which ``loopwarden ledger log`` lists.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from loopwarden.commands import add_config_argument
from loopwarden.commands._ops import (
    add_by_argument,
    cell,
    confirmed,
    print_changes,
    print_table,
    when,
)
from loopwarden.store.admin import Change, LedgerRow

if TYPE_CHECKING:
    from loopwarden.store import OperatedStore

#: how much of a recorded result the table shows
RESULT_CHARS = 48


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=["show", "forget", "log"],
        default="show",
        help="show (default), forget KEY... / --tool / --scope / --all, or log",
    )
    parser.add_argument("keys", nargs="*", metavar="KEY", help="with forget: entries' keys")
    parser.add_argument("--tool", default=None, help="only the entries of this tool")
    parser.add_argument(
        "--scope",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="only the entries of this scope (tenant=acme; repeatable)",
    )
    parser.add_argument("--all", action="store_true", help="with forget: every entry")
    parser.add_argument(
        "--running",
        action="store_true",
        help="with forget: running entries too (a call in progress may then run twice)",
    )
    parser.add_argument("--yes", action="store_true", help="with forget: do not ask")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_by_argument(parser)
    add_config_argument(parser)


def _scope_filter(items: list[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            return None
        out[name] = value
    return out


def _selected(
    rows: list[LedgerRow], args: argparse.Namespace, scope: dict[str, str]
) -> list[LedgerRow]:
    keys = set(args.keys)
    return [
        r
        for r in rows
        if (not keys or r.key in keys)
        and (args.tool is None or r.tool == args.tool)
        and all(dict(r.scope).get(k) == v for k, v in scope.items())
    ]


def _result(r: LedgerRow) -> str:
    if r.corrupt:
        return f"unreadable: {r.corrupt}"
    if r.result is None:
        return "-"
    text = str(r.result.get("content", ""))
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 1] + "…"


def _print_rows(rows: list[LedgerRow]) -> None:
    table = [["key", "state", "started", "expires", "result"]]
    for r in rows:
        table.append(
            [cell(r.key), r.state, when(r.started_at), when(r.expires_at), cell(_result(r))]
        )
    print_table(table)


def _describe(c: Change) -> str:
    old = c.old or {}
    return f"{c.target.get('key')} (was {old.get('state', '?')}, by run {old.get('owner', '?')})"


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.store import Shared, operated, redact_url

    scope = _scope_filter(args.scope)
    if scope is None:
        print("loopwarden ledger: --scope takes NAME=VALUE (tenant=acme)", file=sys.stderr)
        return 2
    if args.action != "forget" and (args.keys or args.all or args.running or args.yes):
        print(
            "loopwarden ledger: KEY, --all, --running and --yes go with forget",
            file=sys.stderr,
        )
        return 2
    if args.action == "forget" and not (args.keys or args.tool or scope or args.all):
        print(
            "loopwarden ledger: forget needs KEY..., --tool NAME, --scope NAME=VALUE or --all "
            "(`loopwarden ledger` lists the keys)",
            file=sys.stderr,
        )
        return 2
    config = load_config(args.config)
    shared = Shared(config.store)
    url = redact_url(shared.url)
    try:
        store = operated(shared.store)
        if args.action == "log":
            changes = [c for c in store.changes(1000) if c.action == "forget_ledger"]
            print_changes(changes, args.json, url, _describe)
            return 0
        rows = _selected(store.ledger_rows(), args, scope)
        if args.action == "show":
            if args.json:
                print(
                    json.dumps(
                        {"store": url, "entries": [r.as_dict() for r in rows]},
                        ensure_ascii=False,
                    )
                )
                return 0
            print(f"store: {url}")
            if not config.store.ledger:
                print("[store] ledger = false: no side effect is recorded.")
            if not rows:
                print("(no ledger entries)")
                return 0
            _print_rows(rows)
            return 0
        return _forget(store, rows, args, url)
    finally:
        shared.close()


def _forget(store: OperatedStore, rows: list[LedgerRow], args: argparse.Namespace, url: str) -> int:
    missing = sorted(set(args.keys) - {r.key for r in rows})
    running = [r for r in rows if r.state == "running" and not args.running]
    chosen = [r for r in rows if r not in running]
    if not args.json:
        print(f"store: {url}")
        for key in missing:
            print(f"no entry {cell(key)}")
        for r in running:
            print(f"kept (running; --running to forget it): {cell(r.key)}")
    if not chosen:
        if args.json:
            print(
                json.dumps(
                    {
                        "store": url,
                        "forgotten": [],
                        "kept_running": [r.key for r in running],
                        "absent": missing,
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print("nothing to forget")
        return 1 if missing or running else 0
    if not args.json:
        print(f"{len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'} to forget:")
        _print_rows(chosen)
    question = (
        f"Forget {len(chosen)} ledger entr{'y' if len(chosen) == 1 else 'ies'}? The same "
        "calls will then execute again."
    )
    if not confirmed(question, args.yes):
        print(
            "loopwarden ledger: nothing forgotten (confirm on a terminal, or add --yes)",
            file=sys.stderr,
        )
        return 1
    done = store.forget([r.key for r in chosen], by=args.by, running=args.running)
    forgotten = [k for k, v in done.items() if v == "forgotten"]
    if args.json:
        print(
            json.dumps(
                {
                    "store": url,
                    "forgotten": forgotten,
                    "kept_running": [r.key for r in running]
                    + [k for k, v in done.items() if v == "running"],
                    "absent": missing + [k for k, v in done.items() if v == "absent"],
                },
                ensure_ascii=False,
            )
        )
    else:
        for key, outcome in done.items():
            print(f"{outcome}: {cell(key)}")
    return 0
