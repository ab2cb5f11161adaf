"""Analysis of run-record files: what happened, and whether to raise a budget or fix the agent.

A guard that stops a run hides the real problem unless someone reads the records.  This module
reads a run-record JSONL file (what the ``run_record`` plugin writes; its fields are in
docs/contracts.md) and answers the field's question: do the tasks need a bigger budget, or is
the agent looping because of its prompt or its tool descriptions?

* :func:`read_records` / :func:`load_records` -- parse lines; a corrupt or truncated line is
  skipped and counted, never fatal;
* :func:`analyse` -- termination distribution, steps / tokens / cost percentiles (of priced
  runs: a run whose model had no price, ``cost_known: false``, is counted under ``unpriced``;
  one without ``cost_budget`` under ``unmeasured``, as are the duplicate calls of runs without
  ``repeat_call``: a measurement no plugin made is never shown as a 0),
  the calls answered from a record of their declared side effect instead of running
  (``ledger_answers``, per tool, source and state),
  duplicate-call and stall rates, the top repeated call signatures, the tools most involved,
  and advice;
* :func:`format_text` -- the human-readable report; :func:`plot` -- tokens per step across
  runs with guard firings marked (needs matplotlib and records written with
  ``steps_detail = true``).

Repeated signatures are read generically from each record's ``evidence`` (any mapping with a
``fingerprint`` or ``signature``, its ``tool``/``name`` and ``count``), and from the
``trajectory`` when a record carries one.

This module reads and analyses; how a record's fields are read lives in
:mod:`loopwarden.report.fields` and the text report and plot in
:mod:`loopwarden.report.render` (both re-exported here).

May import: the public vocabulary (reasons, sanitize) only -- it reads run-record files, never
a live run; the commands import it, the engine never does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.reasons import BUDGET_REASONS, ERROR_REASONS, LOOP_REASONS
from loopwarden.report.fields import (
    MEASURED_BY,
    _evidence_signatures,
    _evidence_tools,
    _num,
    _summary,
    _tokens,
    _trajectory_signatures,
    _unmeasured,
    _unpriced,
    percentile,
)
from loopwarden.report.fields import QUANTILES as QUANTILES
from loopwarden.report.render import format_text, plot
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
# Analysis
# ---------------------------------------------------------------------------------------------


@dataclass
class _Sig:
    label: str
    tool: str | None
    count: int = 0
    runs: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


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
    not_measured = {f: [r for r in records if _unmeasured(r, f)] for f in MEASURED_BY}
    unpriced = [r for r in records if _unpriced(r) and not _unmeasured(r, "cost")]
    cost = [_num(r.get("cost")) for r in records if not _unpriced(r) and not _unmeasured(r, "cost")]
    unpriced_models = Counter(str(r.get("model")) for r in unpriced)
    ledger = Counter(
        (str(a.get("tool")), str(a.get("source")), str(a.get("state")))
        for r in records
        for a in (r.get("ledger_answers") or ())
        if isinstance(a, Mapping)
    )
    tool_calls = sum(int(_num(r.get("tool_calls"))) for r in records)
    # duplicates are counted in the runs where repeat_call measured them, and only there
    dup_measured = [r for r in records if not _unmeasured(r, "duplicate_calls")]
    dup_tool_calls = sum(int(_num(r.get("tool_calls"))) for r in dup_measured)
    duplicates = sum(int(_num(r.get("duplicate_calls"))) for r in dup_measured)
    dup_runs = [r for r in dup_measured if _num(r.get("duplicate_calls")) > 0]
    dup_known = bool(dup_measured) or not records
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
        "unpriced": {
            "runs": len(unpriced),
            "models": dict(sorted(unpriced_models.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
        "ledger_answers": [
            {"tool": t, "source": src, "state": state, "calls": c}
            for (t, src, state), c in sorted(ledger.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "tool_calls": tool_calls,
        # null: no run measured them (repeat_call was off); else over the measured runs
        "duplicate_calls": duplicates if dup_known else None,
        "duplicate_call_rate": (duplicates / dup_tool_calls if dup_tool_calls else 0.0)
        if dup_known
        else None,
        "runs_with_duplicates": len(dup_runs) if dup_known else None,
        "runs_with_duplicates_share": (len(dup_runs) / len(dup_measured) if dup_measured else 0.0)
        if dup_known
        else None,
        # per measurement no plugin made: in how many runs, and which plugin makes it
        "unmeasured": {
            f: {"runs": len(rs), "plugin": MEASURED_BY[f]} for f, rs in not_measured.items() if rs
        },
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
    """What shadowed guards would have done: which runs they would have stopped, by what,
    and what else they would have changed (``shadow_effects``: a call's timeout or delay, the
    run's deadline, a spent retry), counted by plugin and effect."""
    shadowed = [
        r
        for r in records
        if r.get("mode") == "shadow" or r.get("shadow_stop") or r.get("shadow_effects")
    ]
    would = [r for r in shadowed if isinstance(r.get("shadow_stop"), dict)]
    by: Counter[str] = Counter(
        f"{r['shadow_stop'].get('plugin')}: {r['shadow_stop'].get('reason')}" for r in would
    )
    effects: Counter[str] = Counter()
    for r in shadowed:
        listed = r.get("shadow_effects")
        for e in listed if isinstance(listed, list) else ():
            if isinstance(e, Mapping):
                effects[f"{e.get('plugin')}: {e.get('effect')}"] += 1
    return {
        "runs": len(shadowed),
        "would_stop": len(would),
        "by": dict(sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))),
        "effects": dict(sorted(effects.items(), key=lambda kv: (-kv[1], kv[0]))),
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
        parts = [f"{report['stall_runs']} stalled"]
        if report.get("runs_with_duplicates") is not None:
            parts.insert(0, f"{report['runs_with_duplicates']} with duplicate calls")
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
