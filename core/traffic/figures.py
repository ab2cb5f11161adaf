"""The figures of a replay: false positives on successful runs, catches on runaway runs.

:func:`summarize` aggregates :class:`loopwarden.traffic.replay.ReplayResult` values into the summary
``loopwarden replay --summary`` prints and ``bench/quality.py`` tracks.  Kept apart from the
replay engine: it only counts results, and its definitions (what a runaway run is, what a
false positive is) are read and changed on their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from loopwarden.reasons import BUDGET_REASONS

if TYPE_CHECKING:
    from loopwarden.traffic.replay import ReplayResult


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


#: the recorded terminations (``meta.termination_reason``) that mean "hit a step or error cap"
STEP_CAP_TERMINATIONS = ("max_steps", "too_many_errors")
#: a recording that made one call this many times in a row (:func:`repeat_streak`) ran away
RUNAWAY_REPEAT = 5
#: the figures :func:`summarize_by_source` gives per ``source`` (keys of :func:`summarize`)
BY_SOURCE_KEYS = (
    "trajectories",
    "successful",
    "successful_stopped_with_work_left",
    "successful_stopped_with_work_left_pct",
    "successful_warned",
    "successful_warned_pct",
    "runaway_runs",
    "runaway_runs_stopped",
    "identical_repeat_runs",
    "identical_repeat_runs_stopped",
    "step_cap_runs",
    "step_cap_runs_stopped",
    "stops_by_reason",
)
#: the label of trajectories without a ``source``
NO_SOURCE = "(no source)"


def _count(items: Iterable[str]) -> dict[str, int]:
    """Occurrences, most frequent first (ties by name)."""
    d: dict[str, int] = {}
    for x in items:
        d[x] = d.get(x, 0) + 1
    return dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))


def summarize(results: Iterable[ReplayResult]) -> dict[str, Any]:
    """The replay summary: false positives on successful runs, catches on runaway runs.

    * a successful run *stopped with tool work left* is one whose stop cut recorded tool calls
      of its own run (``stop_kind == "work_left"``); stops that only replaced the run's closing
      text, and terminal hand-offs, are counted apart;
    * a successful run is *warned* when any guard warned it (or skipped a call with a note);
      ``successful_warned_by_plugin`` counts the runs each plugin warned;
    * *runaway runs* ended at the source's step or error cap (:data:`STEP_CAP_TERMINATIONS`)
      or made one call :data:`RUNAWAY_REPEAT` or more times in a row (:func:`repeat_streak`);
      one is *stopped* when the guards ended it before its recorded end
      (:attr:`ReplayResult.ended_early`); ``runaway_runs_missed`` names the others;
    * ``repeat_runs`` counts the runs that made one call (name and canonical arguments)
      :data:`RUNAWAY_REPEAT`+ times in a row whatever it returned; ``identical_repeat_runs``
      only those where the call also got an identical observation each time
      (:func:`~loopwarden.traffic.trajectory.identical_repeat_streak`: nothing changed in between,
      so the repeats were a loop, not polling);
    * steps and recorded tokens saved are counted on the runaway runs that were stopped.

    The older figures follow: ``successful_stopped_early`` counts a stop that cut any recorded
    tool call of the whole conversation; *runs without an answer* are counted apart.
    """
    rs = list(results)
    successful = [r for r in rs if r.success is True]
    capped = [r for r in rs if r.source_termination in STEP_CAP_TERMINATIONS]
    repeated = [r for r in rs if r.repeat_streak >= RUNAWAY_REPEAT]
    identical = [r for r in rs if r.identical_repeat_streak >= RUNAWAY_REPEAT]
    no_answer = [r for r in rs if r.final_answer_present is False]
    runaway = {r.id: r for r in capped + repeated}
    work_left = [r for r in successful if r.stop_kind == "work_left"]
    closing = [r for r in successful if r.stop_kind == "closing_text"]
    hand_off = [r for r in successful if r.stop_kind == "hand_off"]
    fp = [r for r in successful if r.stop is not None and r.calls_cut > 0]
    fp_detectors = [r for r in fp if r.stop is not None and r.stop["reason"] not in BUDGET_REASONS]
    stopped_ok = [r for r in successful if r.stop is not None]
    warned_ok = [r for r in successful if r.first_warning is not None]
    caught = [r for r in runaway.values() if r.ended_early]
    caught_capped = [r for r in capped if r.ended_early]
    caught_repeated = [r for r in repeated if r.ended_early]
    caught_identical = [r for r in identical if r.ended_early]
    caught_no_answer = [r for r in no_answer if r.stop is not None]
    saved_steps = sum(r.steps_after_stop for r in caught)
    saved_tokens = sum(r.tokens_after_stop or 0 for r in caught)

    def reasons(items: list[ReplayResult]) -> dict[str, int]:
        return _count(r.stop["reason"] for r in items if r.stop is not None)

    return {
        "trajectories": len(rs),
        "successful": len(successful),
        "successful_stopped_with_work_left": len(work_left),
        "successful_stopped_with_work_left_pct": _pct(len(work_left), len(successful)),
        "successful_stopped_with_work_left_by_reason": reasons(work_left),
        "successful_stopped_closing_text_only": len(closing),
        "successful_stopped_at_hand_off": len(hand_off),
        "successful_warned": len(warned_ok),
        "successful_warned_pct": _pct(len(warned_ok), len(successful)),
        "successful_warned_by_plugin": _count(p for r in warned_ok for p in r.warned_by),
        "runaway_runs": len(runaway),
        "runaway_runs_stopped": len(caught),
        "runaway_runs_stopped_pct": _pct(len(caught), len(runaway)),
        "runaway_runs_successful": sum(1 for r in runaway.values() if r.success is True),
        "runaway_runs_missed": sorted(r.id for r in runaway.values() if not r.ended_early),
        "step_cap_runs": len(capped),
        "step_cap_runs_stopped": len(caught_capped),
        "step_cap_runs_stopped_pct": _pct(len(caught_capped), len(capped)),
        "repeat_runs": len(repeated),
        "repeat_runs_stopped": len(caught_repeated),
        "identical_repeat_runs": len(identical),
        "identical_repeat_runs_stopped": len(caught_identical),
        "identical_repeat_runs_stopped_pct": _pct(len(caught_identical), len(identical)),
        "runaway_stops_by_reason": reasons(caught),
        "steps_saved": saved_steps,
        "recorded_tokens_saved": saved_tokens,
        "stops_by_reason": reasons(rs),
        # the earlier figures, kept for comparison
        "successful_stopped_early": len(fp),
        "successful_stopped_early_pct": _pct(len(fp), len(successful)),
        "successful_stopped_early_by_detectors": len(fp_detectors),
        "successful_stopped_early_by_detectors_pct": _pct(len(fp_detectors), len(successful)),
        "successful_stopped_at_end": len(stopped_ok) - len(fp),
        "early_stops_of_successful_by_reason": reasons(fp),
        "runs_without_answer": len(no_answer),
        "runs_without_answer_stopped": len(caught_no_answer),
        "runs_without_answer_stopped_pct": _pct(len(caught_no_answer), len(no_answer)),
    }


def summarize_by_source(results: Iterable[ReplayResult]) -> dict[str, dict[str, Any]]:
    """The headline figures of :func:`summarize` (:data:`BY_SOURCE_KEYS`) for each recorded
    ``source``, sources in name order: one corpus mixes agents and benchmarks whose healthy
    runs differ, and a limit's false positives must be read per kind of run."""
    groups: dict[str, list[ReplayResult]] = {}
    for r in results:
        groups.setdefault(r.source if r.source is not None else NO_SOURCE, []).append(r)
    out = {}
    for source in sorted(groups):
        s = summarize(groups[source])
        out[source] = {k: s[k] for k in BY_SOURCE_KEYS}
    return out
