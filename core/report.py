"""Analysis of run-record files: what happened, and whether to raise a budget or fix the agent.

A guard that stops a run hides the real problem unless someone reads the records.  This module
reads a run-record JSONL file (what the ``run_record`` plugin writes, DESIGN's record fields)
and answers the field's question: do the tasks need a bigger budget, or is the agent looping
because of its prompt or its tool descriptions?

* :func:`read_records` / :func:`load_records` -- parse lines; a corrupt or truncated line is
  skipped and counted, never fatal;
* :func:`analyse` -- termination distribution, steps / tokens / cost percentiles,
  duplicate-call and stall rates, the top repeated call signatures, the tools most involved,
  and advice;
* :func:`format_text` -- the human-readable report; :func:`plot` -- tokens per step across
  runs with guard firings marked (needs matplotlib and records written with
  ``steps_detail = true``).

Repeated signatures are read generically from each record's ``evidence`` (any mapping with a
``fingerprint`` or ``signature``, its ``tool``/``name`` and ``count``), and from the
``trajectory`` when a record carries one.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.reasons import BUDGET_REASONS, ERROR_REASONS, LOOP_REASONS
from loopwarden.sanitize import loads_strict

__all__ = [
    "BUDGET_REASONS",
    "LOOP_REASONS",
    "STALL_REASONS",
    "Thresholds",
    "analyse",
    "format_text",
    "load_records",
    "percentile",
    "plot",
    "read_records",
]

#: stop reasons that mean "no progress" (a subset of the loop guards' LOOP_REASONS)
STALL_REASONS = ("no_progress", "stall")

QUANTILES = (50, 90, 95, 99)


@dataclass
class Loaded:
    """Records read from a file: the valid ones, and how many lines were skipped."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    #: line numbers (1-based) of the first skipped lines
    skipped_lines: list[int] = field(default_factory=list)


def read_records(lines: Iterable[str]) -> Loaded:
    """Parse JSONL lines; blank lines are ignored, corrupt ones skipped and counted.

    A line is corrupt when it is not strict JSON (:func:`loopwarden.sanitize.loads_strict`:
    no ``NaN``, no number beyond a float or of more than 30 digits, no nesting deeper than 100
    levels, no lone surrogate or undecodable byte), not an object, or has no ``termination``.
    """
    out = Loaded()
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            obj = loads_strict(text)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("termination"), str):
            out.skipped += 1
            if len(out.skipped_lines) < 20:
                out.skipped_lines.append(no)
            continue
        out.records.append(obj)
    return out


def load_records(path: str | Path) -> Loaded:
    """Read a run-record file (undecodable bytes make their line corrupt, not an error)."""
    with Path(path).open(encoding="utf-8", errors="surrogateescape") as fh:
        return read_records(fh)


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in QUANTILES}
    out["max"] = max(values) if values else None
    out["mean"] = sum(values) / len(values) if values else None
    return out


def _num(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _tokens(record: Mapping[str, Any]) -> float:
    t = record.get("tokens")
    if isinstance(t, Mapping):
        if "total" in t:
            return _num(t.get("total"))
        return _num(t.get("prompt")) + _num(t.get("completion"))
    return _num(t)


# ---------------------------------------------------------------------------------------------
# Repeated signatures
# ---------------------------------------------------------------------------------------------


@dataclass
class _Sig:
    label: str
    tool: str | None
    count: int = 0
    runs: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


# The standard evidence keys (docs/contracts.md) are the only ones read: ``count`` (how many
# times), ``fingerprint`` / ``signature`` / ``tool`` (the call involved) and ``signatures``
# (several calls, e.g. an oscillation's cycle).

Found = tuple[str, str, str | None, int]  # key, label, tool, count


def _tool_of(signature: str) -> str | None:
    for sep in (":", "("):
        if sep in signature:
            return signature.split(sep, 1)[0] or None
    return None


def _count_of(value: Mapping[str, Any]) -> int:
    raw = value.get("count")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw >= 1:
        return int(raw)
    return 1


def _evidence_signatures(value: Any, depth: int = 0) -> Iterator[Found]:
    """(key, label, tool, count) for every call signature named in ``value``.

    A mapping with ``fingerprint`` (the stable key) and/or ``signature`` (readable) names one
    call; a ``signatures`` list names several.
    """
    if depth > 4:
        return
    if isinstance(value, Mapping):
        fp, sg = value.get("fingerprint"), value.get("signature")
        key = fp if isinstance(fp, str) and fp else sg if isinstance(sg, str) and sg else None
        if key is not None:
            label = sg if isinstance(sg, str) and sg else key
            tool = value.get("tool")
            yield key, label, tool if isinstance(tool, str) else _tool_of(key), _count_of(value)
            return
        items = value.get("signatures")
        if isinstance(items, list) and items and all(isinstance(i, str) for i in items):
            count = _count_of(value)
            for item in dict.fromkeys(items):
                yield item, item, _tool_of(item), count
            return
        for v in value.values():
            yield from _evidence_signatures(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _evidence_signatures(v, depth + 1)


def _evidence_tools(value: Any, depth: int = 0) -> Iterator[str]:
    """Every ``tool`` named anywhere in ``value`` (e.g. a failure streak's failures)."""
    if depth > 4:
        return
    if isinstance(value, Mapping):
        tool = value.get("tool")
        if isinstance(tool, str) and tool:
            yield tool
        for v in value.values():
            yield from _evidence_tools(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _evidence_tools(v, depth + 1)


def _trajectory_signatures(trajectory: Any) -> Iterator[Found]:
    """Calls repeated with the same arguments within one recorded trajectory."""
    if not isinstance(trajectory, list):
        return
    seen: Counter[tuple[str, str]] = Counter()
    for step in trajectory:
        if not isinstance(step, Mapping):
            continue
        for call in step.get("tool_calls") or ():
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                continue
            args = call.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(ValueError):
                    args = json.loads(args)
            canon = json.dumps(args, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            seen[(call["name"], canon)] += 1
    for (name, canon), n in seen.items():
        if n > 1:
            sig = f"{name}({canon})"
            yield sig, sig, name, n


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """When a pattern is strong enough to advise on (shares of runs, 0..1)."""

    #: "mostly": more than this share of runs ended on a budget
    mostly: float = 0.5
    #: "few duplicates": at most this share of those runs repeated calls or stalled
    few: float = 0.1
    #: "many duplicates or stalls": at least this share of all runs
    many: float = 0.2
    #: how many signatures and tools to list
    top: int = 5


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def analyse(
    records: Sequence[Mapping[str, Any]], *, skipped: int = 0, thresholds: Thresholds = Thresholds()
) -> dict[str, Any]:
    """The report as JSON-able data (see the module docstring)."""
    n = len(records)
    th = thresholds
    terms = Counter(str(r.get("termination")) for r in records)
    stopped_by = Counter(str(r.get("stopped_by")) for r in records if r.get("stopped_by"))
    steps = [_num(r.get("steps")) for r in records]
    tokens = [_tokens(r) for r in records]
    cost = [_num(r.get("cost")) for r in records]
    tool_calls = sum(int(_num(r.get("tool_calls"))) for r in records)
    duplicates = sum(int(_num(r.get("duplicate_calls"))) for r in records)
    dup_runs = [r for r in records if _num(r.get("duplicate_calls")) > 0]
    stall_runs = [
        r
        for r in records
        if _num(r.get("stall_rounds")) > 0 or r.get("termination") in STALL_REASONS
    ]
    loop_stops = sum(terms[t] for t in LOOP_REASONS)

    sigs: dict[str, _Sig] = {}
    for r in records:
        found = list(_evidence_signatures(r.get("evidence")))
        if not found:
            found = list(_trajectory_signatures(r.get("trajectory")))
        seen_in_run: set[str] = set()
        for key, label, tool, count in found:
            entry = sigs.setdefault(key, _Sig(label, tool))
            entry.count += count
            if key not in seen_in_run:
                entry.runs += 1
                entry.reasons[str(r.get("termination"))] += 1
                seen_in_run.add(key)
    top = sorted(sigs.items(), key=lambda kv: (-kv[1].count, -kv[1].runs, kv[0]))[: th.top]
    tool_repeats: Counter[str] = Counter()
    tool_runs: Counter[str] = Counter()
    for entry in sigs.values():
        if entry.tool:
            tool_repeats[entry.tool] += entry.count
            tool_runs[entry.tool] += entry.runs
    tools = [
        {"tool": t, "calls": c, "runs": tool_runs[t]}
        for t, c in sorted(tool_repeats.items(), key=lambda kv: (-kv[1], kv[0]))[: th.top]
    ]

    report: dict[str, Any] = {
        "runs": n,
        "skipped_lines": skipped,
        "termination": [
            {"termination": t, "runs": c, "share": c / n}
            for t, c in sorted(terms.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "stopped_by": dict(sorted(stopped_by.items(), key=lambda kv: (-kv[1], kv[0]))),
        "steps": _summary(steps),
        "tokens": _summary(tokens),
        "cost": _summary(cost),
        "tool_calls": tool_calls,
        "duplicate_calls": duplicates,
        "duplicate_call_rate": duplicates / tool_calls if tool_calls else 0.0,
        "runs_with_duplicates": len(dup_runs),
        "runs_with_duplicates_share": len(dup_runs) / n if n else 0.0,
        "stall_runs": len(stall_runs),
        "stall_rate": len(stall_runs) / n if n else 0.0,
        "loop_stops": loop_stops,
        "top_signatures": [
            {
                "signature": e.label,
                "fingerprint": k,
                "tool": e.tool,
                "count": e.count,
                "runs": e.runs,
                "terminations": dict(e.reasons),
            }
            for k, e in top
        ],
        "tools": tools,
        "shadow": _shadow(records),
    }
    report["advice"] = advise(records, report, th)
    return report


_SHADOW_LISTED = 20  # would-be stops listed one by one


def _shadow(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What shadowed guards would have done: which runs they would have stopped, by what."""
    shadowed = [r for r in records if r.get("mode") == "shadow" or r.get("shadow_stop")]
    would = [r for r in shadowed if isinstance(r.get("shadow_stop"), dict)]
    by: Counter[str] = Counter(
        f"{r['shadow_stop'].get('plugin')}: {r['shadow_stop'].get('reason')}" for r in would
    )
    return {
        "runs": len(shadowed),
        "would_stop": len(would),
        "by": dict(sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))),
        "stops": [
            {
                "run_id": r.get("run_id"),
                "termination": r.get("termination"),
                **{k: r["shadow_stop"].get(k) for k in ("step", "plugin", "reason", "soft")},
            }
            for r in would[:_SHADOW_LISTED]
        ],
    }


def _loopish(r: Mapping[str, Any]) -> bool:
    return (
        _num(r.get("duplicate_calls")) > 0
        or _num(r.get("stall_rounds")) > 0
        or r.get("termination") in LOOP_REASONS
    )


def advise(
    records: Sequence[Mapping[str, Any]], report: Mapping[str, Any], th: Thresholds = Thresholds()
) -> list[dict[str, Any]]:
    """The field's advice, from the data: raise a budget, or fix the prompt and tools."""
    n = len(records)
    if n == 0:
        return []
    advice: list[dict[str, Any]] = []
    terms = Counter(str(r.get("termination")) for r in records)
    budget = [r for r in records if r.get("termination") in BUDGET_REASONS]
    budget_loopish = [r for r in budget if _loopish(r)]
    loopish = [r for r in records if _loopish(r)]
    tools = report.get("tools") or []
    tool_text = ", ".join(
        f"{t['tool']} ({t['calls']} call{'s' if t['calls'] != 1 else ''} "
        f"in {t['runs']} run{'s' if t['runs'] != 1 else ''})"
        for t in tools
    )

    if budget and len(budget) / n > th.mostly and len(budget_loopish) / len(budget) <= th.few:
        which = ", ".join(f"{t} {terms[t]}" for t in BUDGET_REASONS if terms[t])
        advice.append(
            {
                "kind": "raise_budget",
                "message": (
                    f"{len(budget)} of {n} runs ({_pct(len(budget) / n)}) ended on a budget "
                    f"({which}) and only {len(budget_loopish)} of them repeated calls or stalled: "
                    "the tasks need a bigger budget. Raise max_steps / max_tokens, or give these "
                    "tasks a larger profile."
                ),
            }
        )
    if len(loopish) / n >= th.many:
        parts = [
            f"{report['runs_with_duplicates']} with duplicate calls",
            f"{report['stall_runs']} stalled",
        ]
        if report.get("loop_stops"):
            parts.append(f"{report['loop_stops']} stopped by a loop guard")
        text = (
            f"{len(loopish)} of {n} runs ({_pct(len(loopish) / n)}) looped "
            f"({', '.join(parts)}): fix the prompt or the tool descriptions -- a bigger "
            "budget would only buy more repeats."
        )
        if tool_text:
            text += f" Tools most involved: {tool_text}."
        advice.append({"kind": "fix_prompt", "message": text, "tools": [t["tool"] for t in tools]})
    if terms["failure_streak"] and terms["failure_streak"] / n >= th.many:
        failing: Counter[str] = Counter()
        for r in records:
            if r.get("termination") == "failure_streak":
                failing.update(set(_evidence_tools(r.get("evidence"))))
        named = [t for t, _ in sorted(failing.items(), key=lambda kv: (-kv[1], kv[0]))][: th.top]
        text = (
            f"{terms['failure_streak']} of {n} runs stopped on failure streaks: a tool keeps "
            "failing -- check its availability and the retry policy."
        )
        if named:
            text += (
                " Tools failing: "
                + ", ".join(
                    f"{t} ({failing[t]} run{'s' if failing[t] != 1 else ''})" for t in named
                )
                + "."
            )
        advice.append({"kind": "check_tools", "message": text, "tools": named})
    errors = {t: terms[t] for t in ERROR_REASONS if terms[t]}
    if errors:
        which = ", ".join(f"{t} {c}" for t, c in errors.items())
        advice.append(
            {
                "kind": "errors",
                "message": (
                    f"{sum(errors.values())} of {n} runs ended on errors ({which}): check "
                    "the failing plugin or the model endpoint (see the records' evidence)."
                ),
            }
        )
    if not advice:
        done = terms["final_answer"] + terms["terminal_tool"]
        if done / n >= 1 - th.many:
            advice.append(
                {
                    "kind": "healthy",
                    "message": (
                        f"{done} of {n} runs ({_pct(done / n)}) finished by themselves "
                        "with few repeats: no change needed."
                    ),
                }
            )
        else:
            top = ", ".join(f"{t['termination']} {t['runs']}" for t in report["termination"][:3])
            advice.append(
                {
                    "kind": "mixed",
                    "message": (
                        f"No dominant pattern ({top}): read the records of the runs "
                        "stopped by guards before changing budgets or prompts."
                    ),
                }
            )
    return advice


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def format_text(report: Mapping[str, Any], source: str | None = None) -> str:
    """The report for people: tables, rates, signatures and advice."""
    lines: list[str] = []
    head = f"{report['runs']} run{'s' if report['runs'] != 1 else ''}"
    if source:
        head = f"{source}: {head}"
    if report.get("skipped_lines"):
        head += f" (skipped {report['skipped_lines']} corrupt line"
        head += "s)" if report["skipped_lines"] != 1 else ")"
    lines.append(head)
    lines.append("")
    lines.append(f"{'termination':<20} {'runs':>6} {'share':>7}")
    for row in report["termination"]:
        lines.append(f"{row['termination']:<20} {row['runs']:>6} {100 * row['share']:>6.1f}%")
    lines.append("")
    cols = [f"p{q}" for q in QUANTILES] + ["max", "mean"]
    lines.append(f"{'':<8}" + "".join(f"{c:>10}" for c in cols))
    for key, digits in (("steps", 1), ("tokens", 0), ("cost", 4)):
        stats = report[key]
        lines.append(f"{key:<8}" + "".join(f"{_fmt(stats[c], digits):>10}" for c in cols))
    lines.append("")
    lines.append(
        f"duplicate calls: {report['duplicate_calls']} of {report['tool_calls']} tool calls "
        f"({100 * report['duplicate_call_rate']:.1f}%); runs with duplicates: "
        f"{report['runs_with_duplicates']} ({100 * report['runs_with_duplicates_share']:.1f}%)"
    )
    lines.append(
        f"stalled runs: {report['stall_runs']} ({100 * report['stall_rate']:.1f}%); "
        f"stopped by a loop guard: {report['loop_stops']}"
    )
    if report["top_signatures"]:
        lines.append("")
        lines.append("top repeated signatures")
        lines.append(f"  {'calls':>5} {'runs':>4}  {'tool':<18} signature")
        for s in report["top_signatures"]:
            lines.append(
                f"  {s['count']:>5} {s['runs']:>4}  {s['tool'] or '-':<18} {s['signature']}"
            )
    shadow = report.get("shadow") or {}
    if shadow.get("runs"):
        lines.append("")
        lines.append(
            f"shadow mode: {shadow['runs']} run(s); guards would have stopped "
            f"{shadow['would_stop']}"
        )
        for label, count in shadow["by"].items():
            lines.append(f"  {count:>5}  {label}")
        for stop in shadow["stops"]:
            lines.append(
                f"  run {str(stop['run_id'])[:12]}: step {stop['step']} "
                f"{stop['plugin']} ({stop['reason']}{', soft' if stop['soft'] else ''}"
                f"); it ended {stop['termination']}"
            )
    lines.append("")
    lines.append("advice")
    for a in report["advice"]:
        lines.append(f"  - {a['message']}")
    return "\n".join(lines)


def plot(records: Sequence[Mapping[str, Any]], path: str | Path) -> str:
    """Draw tokens per step across runs, guard firings marked; return a note on what was drawn.

    Needs matplotlib (raises ImportError without it).  Records with ``steps_detail`` give one
    line per run (tokens of each model call); without any, one point per run (steps, tokens).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    detailed = [r for r in records if isinstance(r.get("steps_detail"), list) and r["steps_detail"]]
    try:
        if detailed:
            fig, (per_step, running) = plt.subplots(1, 2, figsize=(13, 5.5))
            for r in detailed:
                by_step = {
                    int(_num(s.get("step"))): _num(s.get("total"))
                    for s in r["steps_detail"]
                    if isinstance(s, Mapping)
                }
                xs = sorted(by_step)
                cumulative: dict[int, float] = {}
                total = 0.0
                for x in xs:
                    total += by_step[x]
                    cumulative[x] = total
                for ax, ys in ((per_step, by_step), (running, cumulative)):
                    ax.plot(xs, [ys[x] for x in xs], color="tab:blue", alpha=0.35, linewidth=1)
                for v in r.get("verdicts") or ():
                    if not isinstance(v, Mapping) or not xs:
                        continue
                    # A verdict at step s fired after s model calls: mark the call it followed
                    # (or the first call, for a pre-flight verdict).
                    x = max(int(_num(v.get("step"))), xs[0])
                    if x not in by_step:
                        continue
                    stop = v.get("kind") == "stop"
                    for ax, ys in ((per_step, by_step), (running, cumulative)):
                        ax.plot(
                            [x],
                            [ys[x]],
                            marker="X" if stop else "o",
                            color="tab:red" if stop else "tab:orange",
                            markersize=9 if stop else 5,
                            linestyle="none",
                        )
            per_step.set_ylabel("tokens of the call (prompt + completion)")
            per_step.set_title(f"Tokens per step across {len(detailed)} runs")
            running.set_ylabel("tokens spent so far")
            running.set_title("Cumulative tokens: each step re-sends the whole conversation")
            for ax in (per_step, running):
                ax.set_xlabel("step (model call)")
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
            per_step.legend(
                handles=[
                    Line2D([], [], color="tab:blue", alpha=0.6, label="one run"),
                    Line2D(
                        [],
                        [],
                        marker="o",
                        color="tab:orange",
                        linestyle="none",
                        label="guard warning / skip",
                    ),
                    Line2D(
                        [],
                        [],
                        marker="X",
                        color="tab:red",
                        linestyle="none",
                        markersize=9,
                        label="guard stop",
                    ),
                ],
                loc="lower right",
            )
            note = f"plotted tokens per step of {len(detailed)} runs"
        else:
            fig, ax = plt.subplots(figsize=(10, 5.5))
            for guarded in (False, True):
                pts = [
                    (_num(r.get("steps")), _tokens(r))
                    for r in records
                    if bool(r.get("stopped_by")) == guarded
                ]
                if pts:
                    ax.scatter(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="X" if guarded else "o",
                        color="tab:red" if guarded else "tab:blue",
                        label="stopped by a guard" if guarded else "finished",
                    )
            ax.set_xlabel("steps per run")
            ax.set_ylabel("tokens per run")
            ax.set_title(f"Tokens per run across {len(records)} runs")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(loc="upper left")
            note = (
                "the records carry no per-step tokens (enable [plugins.run_record] "
                "steps_detail = true): plotted tokens per run instead"
            )
        fig.tight_layout()
        fig.savefig(str(path), dpi=100)
    finally:
        plt.close("all")
    return note
