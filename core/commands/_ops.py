"""What the operations commands share (``budgets``, ``breakers``, ``ledger``, ``paths``): a
plain table, the time of day, the ``--by`` / ``--yes`` arguments, the confirmation of a change
that cannot be undone, and the store's change log as a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from loopwarden.sanitize import escape_controls


def add_by_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--by",
        default=None,
        help="who makes the change, for the store's change log (default: user@host)",
    )


def when(ts: float | None) -> str:
    """A wall-clock time in UTC, to the second ("-" for none)."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """``rows`` (the first is the head) in left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def cell(value: object) -> str:
    """A value from the store or a run's meta, on one line, escaped."""
    return escape_controls(str(value))


def confirmed(question: str, yes: bool) -> bool:
    """True with ``--yes``; else ask on the terminal.  Without a terminal (a script, a pipe)
    nothing is asked and the answer is no: the caller says to add ``--yes``."""
    if yes:
        return True
    if not sys.stdin.isatty():
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def print_changes(
    changes: Sequence[Any], as_json: bool, url: str, describe: Callable[[Any], str]
) -> None:
    """The change log: newest first, with when, who, what and ``describe(change)``."""
    if as_json:
        print(
            json.dumps({"store": url, "changes": [c.as_dict() for c in changes]}, default=str),
        )
        return
    print(f"store: {url}")
    if not changes:
        print("(no changes recorded)")
        return
    rows = [["when", "by", "action", "change"]]
    rows += [[when(c.at), cell(c.by), c.action, cell(describe(c))] for c in changes]
    print_table(rows)
