"""Derive default limits from recorded real runs: the distributions of healthy turns, and p99s.

Usage::

    python bench/derive_defaults.py FILE [FILE ...] [--by domain|source|file] [--json]

Reads one or several trajectory or run-record JSONL files (plain or ``.jsonl.gz``) as one
corpus and prints (Markdown) the distribution -- n, p50, p90, p99, max -- of every statistic
of :data:`loopwarden.calibrate.METRICS` over the *successful* runs, per group and for all runs,
then every limit of :data:`loopwarden.calibrate.LIMITS` proposed (p99 x margin, rounded up)
from all runs together and from each group alone.  Groups: ``file`` -- the file a run came
from, one kind of agent per file (customer service, coding); the default with several files
-- ``domain`` (``meta.domain``, else the last part of ``source``; the default with one file)
or ``source``.  A p99 needs 100 values (:data:`loopwarden.calibrate.MIN_RUNS`): with fewer
nothing is proposed, as ``loopwarden calibrate`` refuses.  The numbers in
``docs/defaults.md`` are this script's output on the project's recorded runs; the same code
serves ``loopwarden calibrate``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopwarden.calibrate import (
    GROUPINGS,
    LIMITS,
    MARGIN,
    METRICS,
    MIN_RUNS,
    PERCENTILE,
    Stats,
    distribution,
    load_stats,
    percentile,
    propose,
    propose_limit,
)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:,.1f}"


def derive(stats: Stats, margin: float = MARGIN, min_runs: int = MIN_RUNS) -> dict[str, Any]:
    """Every metric's distribution per group and overall, and every limit proposed from all
    runs (``limits["all"]``) and from each group's runs alone (``limits[group]``); a limit
    with fewer than ``min_runs`` values is None."""
    groups: list[str | None] = [*stats.groups(), None]
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name, metric in METRICS.items():
        table[name] = {}
        for g in groups:
            values = metric.values(stats.only(g))
            d = distribution(values)
            d["proposed"] = (
                propose(values, tokens=metric.tokens, margin=margin)
                if len(values) >= min_runs
                else None
            )
            table[name][g or "all"] = d
    limits: dict[str, dict[str, dict[str, Any]]] = {}
    for g in [None, *stats.groups()]:
        part = stats.only(g)
        rows: dict[str, dict[str, Any]] = {}
        for lim in LIMITS:  # plus_key: the settings' defaults
            value, n = propose_limit(lim, part, {}, margin=margin, min_runs=min_runs)
            rows[lim.key] = {
                "metric": lim.metric,
                "plus": lim.plus_key,
                "n": n,
                "p99": percentile(METRICS[lim.metric].values(part), PERCENTILE),
                "proposed": value,
            }
        limits[g or "all"] = rows
    return {
        "successful_conversations": len(stats.conversations),
        "turns": len(stats.turns),
        "unsuccessful": stats.unsuccessful,
        "conversations_by_group": {g: len(stats.only(g).conversations) for g in stats.groups()},
        "margin": margin,
        "min_runs": min_runs,
        "table": table,
        "limits": limits,
    }


def markdown(result: dict[str, Any], by: str) -> str:
    groups = result["conversations_by_group"]
    lines = [
        f"Healthy runs: {result['successful_conversations']} successful conversations "
        f"({', '.join(f'{g} {n}' for g, n in groups.items())}), {result['turns']} user turns "
        f"({result['unsuccessful']} unsuccessful left out); proposed = p99 x "
        f"{result['margin']:g}, rounded up (tokens to a thousand), only from "
        f"{result['min_runs']}+ values.",
        "",
        f"| statistic | {by} | n | p50 | p90 | p99 | max | proposed |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, rows in result["table"].items():
        for group, d in rows.items():
            label = METRICS[name].label if group == next(iter(rows)) else ""
            lines.append(
                f"| {label} | {group} | {d['n']} | {_fmt(d['p50'])} | "
                f"{_fmt(d['p90'])} | {_fmt(d['p99'])} | {_fmt(d['max'])} | "
                f"{_fmt(d['proposed'])} |"
            )
    cols = list(result["limits"])
    lines += [
        "",
        "Proposed limits (p99, n values) from all runs and from each group alone "
        "(profile keys: a `[profiles.<name>]` table):",
        "",
        "| config key | from | " + " | ".join(cols) + " |",
        "|---|---|" + "--:|" * len(cols),
    ]
    for key in result["limits"]["all"]:
        first = result["limits"]["all"][key]
        extra = f" + {first['plus'].rsplit('.', 1)[-1]}" if first["plus"] else ""
        cells = []
        for g in cols:
            d = result["limits"][g][key]
            if d["proposed"] is None:
                cells.append(f"- (n {d['n']})" if d["n"] else "-")
            else:
                cells.append(f"**{_fmt(d['proposed'])}** (p99 {_fmt(d['p99'])}, n {d['n']})")
        lines.append(
            f"| `{key}` | {METRICS[first['metric']].label}{extra} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/derive_defaults.py", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "file", type=Path, nargs="+", help="trajectory or run-record JSONL (.jsonl or .jsonl.gz)"
    )
    parser.add_argument(
        "--by",
        choices=GROUPINGS,
        default=None,
        help="group the runs by domain (meta.domain), by source, or by input file (one kind "
        "of agent per file); default: file with several files, else domain",
    )
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument(
        "--min-runs",
        type=int,
        default=MIN_RUNS,
        metavar="N",
        help=f"propose a limit only from N+ values (default {MIN_RUNS})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from loopwarden.exceptions import LoopwardenError

    by = args.by or ("file" if len(args.file) > 1 else "domain")
    try:
        stats = load_stats(args.file, by=by)
    except LoopwardenError as exc:
        print(f"bench/derive_defaults.py: error: {exc}", file=sys.stderr)
        return 2
    result = {
        "by": by,
        "files": [str(p) for p in args.file],
        **derive(stats, args.margin, args.min_runs),
    }
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(result) if args.json else markdown(result, by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
