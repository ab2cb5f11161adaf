"""How :mod:`loopwarden.report` shows its analysis: the text report and the plot.

:func:`format_text` turns :func:`loopwarden.report.analyse`'s data into tables for people;
:func:`plot` draws tokens per step with matplotlib (an optional extra, imported only when a
plot is asked for).  Kept apart from the analysis because presentation changes for readers
while the analysed data is a contract (``loopwarden report --json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loopwarden.report.fields import QUANTILES, _num, _tokens


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
    unmeasured = report.get("unmeasured") or {}
    runs = report["runs"]
    for key, digits in (("steps", 1), ("tokens", 0), ("cost", 4)):
        stats = report[key]
        if key == "cost" and stats.get("max") is None and runs:
            lines.append(f"{key:<8}n/a: {_cost_unknown(report)}")
            continue
        lines.append(f"{key:<8}" + "".join(f"{_fmt(stats[c], digits):>10}" for c in cols))
    if report["cost"].get("max") is not None and unmeasured.get("cost"):
        lines.append(
            f"cost measured in {runs - unmeasured['cost']['runs']} of {runs} runs "
            f"(cost_budget was off in {unmeasured['cost']['runs']}: not in the cost row)"
        )
    unpriced = report.get("unpriced") or {}
    if unpriced.get("runs") and report["cost"].get("max") is not None:
        models = ", ".join(f"{m} ({n})" for m, n in (unpriced.get("models") or {}).items())
        lines.append(
            f"unpriced runs: {unpriced['runs']}, cost unknown (not in the cost row): {models}; "
            "declare their price in [plugins.cost_budget.prices]"
        )
    answers = report.get("ledger_answers") or []
    if answers:
        lines.append(
            "answered from the side-effect ledger, not run (declared side effects, same "
            "idempotency key): "
            + ", ".join(f"{a['tool']} {a['calls']}x ({a['source']}, {a['state']})" for a in answers)
        )
    lines.append("")
    off = (unmeasured.get("duplicate_calls") or {}).get("runs", 0)
    if report.get("duplicate_calls") is None:
        lines.append(f"duplicate calls: n/a (repeat_call was off in all {runs} runs)")
    else:
        measured = runs - off
        lines.append(
            f"duplicate calls: {report['duplicate_calls']} "
            f"({100 * report['duplicate_call_rate']:.1f}% of the tool calls of the "
            f"{measured} run{'s' if measured != 1 else ''} repeat_call measured); runs with "
            f"duplicates: {report['runs_with_duplicates']} "
            f"({100 * report['runs_with_duplicates_share']:.1f}%)"
            if off
            else f"duplicate calls: {report['duplicate_calls']} of {report['tool_calls']} tool "
            f"calls ({100 * report['duplicate_call_rate']:.1f}%); runs with duplicates: "
            f"{report['runs_with_duplicates']} "
            f"({100 * report['runs_with_duplicates_share']:.1f}%)"
        )
        if off:
            lines.append(f"  (repeat_call was off in {off} of {runs} runs: not counted)")
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
        effects = shadow.get("effects") or {}
        if effects:
            lines.append("  what else they would have changed (deadlines, delays, flags):")
            for label, count in effects.items():
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


def _cost_unknown(report: Mapping[str, Any]) -> str:
    """Why no run's cost is known: cost_budget off, no price for the model, or both."""
    why = []
    off = (report.get("unmeasured") or {}).get("cost") or {}
    if off.get("runs"):
        why.append(f"cost_budget was off in {off['runs']} run{'s' if off['runs'] != 1 else ''}")
    unpriced = report.get("unpriced") or {}
    if unpriced.get("runs"):
        models = ", ".join(f"{m} ({n})" for m, n in (unpriced.get("models") or {}).items())
        why.append(
            f"no price for the model of {unpriced['runs']} run"
            f"{'s' if unpriced['runs'] != 1 else ''}: {models}; declare it in "
            "[plugins.cost_budget.prices]"
        )
    return "; ".join(why) or "no run recorded a cost"


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
