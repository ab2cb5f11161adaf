"""Derive default limits from recorded real runs: the distributions of healthy turns, and p99s.

Usage::

    python bench/derive_defaults.py real-trajectories.jsonl [--by domain|source] [--json]

Prints (Markdown) the distribution -- n, p50, p90, p99, max -- of every statistic of
:data:`loopwarden.calibrate.METRICS` over the *successful* runs, per group and for all runs,
then the limits ``loopwarden calibrate`` proposes from them (p99 x margin, rounded up).  The
numbers in ``docs/defaults.md`` are this script's output on the project's recorded runs; the
same code serves ``loopwarden calibrate``.
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
    LIMITS,
    MARGIN,
    METRICS,
    PERCENTILE,
    Stats,
    distribution,
    load_stats,
    percentile,
    propose,
    propose_all,
)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:,.1f}"


def derive(stats: Stats, margin: float = MARGIN) -> dict[str, Any]:
    """Every metric's distribution per group and overall, and the proposed limits."""
    groups: list[str | None] = [*stats.groups(), None]
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name, metric in METRICS.items():
        table[name] = {}
        for g in groups:
            values = metric.values(stats.only(g))
            d = distribution(values)
            d["proposed"] = propose(values, tokens=metric.tokens, margin=margin)
            table[name][g or "all"] = d
    limits: dict[str, dict[str, Any]] = {}
    for lim, value in propose_all(stats, {}, margin=margin):  # plus: the settings' defaults
        limits[lim.key] = {
            "metric": lim.metric,
            "plus": lim.plus_key,
            "proposed": value,
            "p99": percentile(METRICS[lim.metric].values(stats), PERCENTILE),
        }
    for lim in LIMITS:
        if not lim.profile:
            continue
        metric = METRICS[lim.metric]
        for g in stats.groups():
            values = metric.values(stats.only(g))
            limits[f"profiles.{g}.{lim.key}"] = {
                "metric": lim.metric,
                "plus": None,
                "p99": percentile(values, PERCENTILE),
                "proposed": propose(values, tokens=metric.tokens, margin=margin),
            }
    return {
        "successful_conversations": len(stats.conversations),
        "turns": len(stats.turns),
        "unsuccessful": stats.unsuccessful,
        "margin": margin,
        "table": table,
        "limits": limits,
    }


def markdown(result: dict[str, Any], by: str) -> str:
    lines = [
        f"Healthy runs: {result['successful_conversations']} successful conversations, "
        f"{result['turns']} user turns ({result['unsuccessful']} unsuccessful left out); "
        f"proposed = p99 x {result['margin']:g}, rounded up (tokens to a thousand).",
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
    lines += ["", "| config key | from | p99 | proposed |", "|---|---|--:|--:|"]
    for key, d in result["limits"].items():
        extra = f" + {d['plus'].rsplit('.', 1)[-1]}" if d["plus"] else ""
        lines.append(
            f"| `{key}` | {METRICS[d['metric']].label}{extra} | {_fmt(d['p99'])} | "
            f"{_fmt(d['proposed'])} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/derive_defaults.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("file", type=Path, help="trajectory or run-record JSONL")
    parser.add_argument(
        "--by",
        choices=("domain", "source"),
        default="domain",
        help="group the runs by domain (meta.domain) or by source",
    )
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from loopwarden.exceptions import LoopwardenError

    try:
        stats = load_stats(args.file, by=args.by)
    except LoopwardenError as exc:
        print(f"bench/derive_defaults.py: error: {exc}", file=sys.stderr)
        return 2
    result = derive(stats, args.margin)
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(result) if args.json else markdown(result, args.by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
