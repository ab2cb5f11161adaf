"""Derive default limits from recorded real runs: the distributions of healthy turns, and p99s.

Usage::

    python bench/derive_defaults.py FILE [FILE ...] [--by domain|source|file] [--json]

Reads one or several trajectory or run-record JSONL files (plain or ``.jsonl.gz``) as one
corpus and prints (Markdown) the distribution -- n, p50, p90, p99, max -- of every statistic
of :data:`loopwarden.traffic.calibrate.METRICS` over the *successful* runs, per group and for
all runs,
then every limit of :data:`loopwarden.traffic.calibrate.LIMITS` proposed (p99 x margin, rounded up)
from all runs together and from each group alone.  Groups: ``file`` -- the file a run came
from, one kind of agent per file (customer service, coding); the default with several files
-- ``domain`` (``meta.domain``, else the last part of ``source``; the default with one file)
or ``source``.  A p99 needs 100 values (:data:`loopwarden.traffic.calibrate.MIN_RUNS`): with fewer
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

from loopwarden.traffic.calibrate import (
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
        "shipped": shipped(limits, list(stats.groups())),
        "successful_conversations": len(stats.conversations),
        "turns": len(stats.turns),
        "unsuccessful": stats.unsuccessful,
        "conversations_by_group": {g: len(stats.only(g).conversations) for g in stats.groups()},
        "margin": margin,
        "min_runs": min_runs,
        "table": table,
        "limits": limits,
    }


#: a per-run cap and the same quantity over a whole conversation: a task that its agent spreads
#: over several turns (a coding agent that answers its own format errors as user messages) must
#: fit one run of an agent that does it in one turn
WHOLE_TASK = {
    "plugins.max_steps.max_steps": "plugins.conversation_limits.max_model_calls",
    "plugins.tool_calls.max_tool_calls": "plugins.conversation_limits.max_tool_calls",
    "plugins.token_budget.max_total_tokens": "plugins.conversation_limits.max_tokens",
}

#: shipped values that are not the derived ones, and why
NOT_DERIVED = {
    "plugins.conversation_limits.max_turns": "kept at 40: the derived 20 warns (at its 0.8) "
    "5 of 30 healthy telecom conversations, whose user turns run to 25",
    "plugins.token_budget.max_context": "follows the model's window (context_fraction 0.8): "
    "healthy requests stay far below any current window",
    "plugins.tool_calls.max_tool_calls": "unset: a per-run cap on calls cannot serve agents "
    "that make one call a turn and agents that fan out 17 a turn; max_steps x "
    "tool_calls.max_per_turn (22: the widest healthy turn, 17, x 1.25) bounds a run",
    "plugins.conversation_limits.max_tool_calls": "unset: max_model_calls x "
    "tool_calls.max_per_turn bounds a conversation's calls (see tool_calls.max_tool_calls)",
}


def shipped(limits: dict[str, dict[str, dict[str, Any]]], groups: list[str]) -> dict[str, Any]:
    """The shipped defaults: for each key the largest of the kinds' proposals (each kind of
    agent keeps the default unchanged), a per-run cap at least its whole-task quantity."""
    out: dict[str, Any] = {}
    for key in limits["all"]:
        if not key.startswith("plugins."):
            continue  # a profile's key: profiles are proposed per group
        if key in NOT_DERIVED:
            out[key] = NOT_DERIVED[key]
            continue
        values = []
        for g in groups:
            for k in (key, WHOLE_TASK.get(key)):
                if k is not None and limits[g][k]["proposed"] is not None:
                    values.append(limits[g][k]["proposed"])
        out[key] = max(values) if values else None
    return out


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
    lines += [
        "",
        "Shipped defaults (config.toml): per key the largest of the groups' proposals, a "
        "per-run cap at least its whole-task (per-conversation) quantity:",
        "",
        "| config key | shipped |",
        "|---|--:|",
    ]
    for key, value in result["shipped"].items():
        cell = value if isinstance(value, str) else f"**{_fmt(value)}**"
        lines.append(f"| `{key}` | {cell} |")
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
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare the shipped defaults derived here with the shipped config.toml; exit 1 "
        "on a difference",
    )
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
    if args.check:
        return check(result["shipped"])
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(result) if args.json else markdown(result, by))
    return 0


def check(derived: dict[str, Any]) -> int:
    """Print, per derived key, the shipped config's value beside the derived one."""
    from loopwarden.config import default_config_path, load_toml

    data = load_toml(default_config_path())
    bad = 0
    for key, value in derived.items():
        if isinstance(value, str):
            continue
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        ok = node == value
        bad += not ok
        print(f"{'ok' if ok else 'DIFFERS'}  {key} = {node} (derived {value})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
