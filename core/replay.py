"""Replay recorded real runs through the configured guards, without calling any model or tool.

A trajectory (DESIGN's JSONL format) is a conversation: a step without tool calls ends the
current run, and a ``user_reply`` after it starts the next run of the same conversation --
per-run limits start afresh, while the conversation's messages carry on (so context size
grows as it did).  Each recorded step is fed through the very same step machine that serves
live runs (:meth:`loopwarden.loop.Engine.machine`): the "model" answers with the recorded
turn and the "tools" with the recorded observations.

For each trajectory the replay reports (steps numbered from 1, as in the file) the first
warning, the stop (step, reason, plugin) -- or None when the guards let it run to its end --
and the recorded tokens spent after the stop (where usage is recorded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict

from loopwarden.events import ModelResponse, ProposedCall, ToolResult, Usage
from loopwarden.loop import CallModel, Engine
from loopwarden.run import Run, RunOutcome
from loopwarden.tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment

__all__ = ["ReplayResult", "iter_trajectories", "replay_file", "replay_trajectory", "summarize"]

#: tool-name prefixes taken as read-only, deterministic lookups when replaying real runs
READ_ONLY_PREFIXES = ("get_", "find_", "search_", "list_", "query_", "check_", "lookup_",
                      "read_", "fetch_", "calculate", "think")
TERMINAL_NAMES = re.compile(r"(^|_)transfer_to_human", re.IGNORECASE)


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def recorded_tool(name: str) -> Tool:
    """A stand-in declaration for a tool seen in a recording (flags inferred from its name)."""
    lname = name.lower()
    read_only = lname.startswith(READ_ONLY_PREFIXES)
    return Tool(
        name=name,
        func=lambda **kw: None,
        description=f"recorded tool {name}",
        args_model=_AnyArgs,
        read_only=read_only,
        deterministic=read_only,
        side_effect=not read_only,
        terminal=bool(TERMINAL_NAMES.search(lname)),
        idempotency_keys=None,
    )


@dataclass
class ReplayResult:
    """What the guards would have done to one recorded trajectory."""

    id: str
    steps: int
    success: bool | None
    first_warning: dict[str, Any] | None = None
    stop: dict[str, Any] | None = None
    tokens_after_stop: int | None = None
    steps_after_stop: int = 0
    recorded_tokens: int | None = None
    final_answer_present: bool | None = None
    source_termination: str | None = None
    runs: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "steps": self.steps,
            "success": self.success,
            "first_warning": self.first_warning,
            "stop": self.stop,
            "tokens_after_stop": self.tokens_after_stop,
            "steps_after_stop": self.steps_after_stop,
            "recorded_tokens": self.recorded_tokens,
            "final_answer_present": self.final_answer_present,
            "source_termination": self.source_termination,
            "runs": self.runs,
        }


def iter_trajectories(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, trajectory or None for an unreadable line) for each non-blank line."""
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                yield lineno, None
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("steps"), list):
                yield lineno, None
                continue
            yield lineno, obj


def _usage(step: dict[str, Any]) -> Usage | None:
    u = step.get("usage")
    if not isinstance(u, dict):
        return None
    return Usage(prompt=int(u.get("prompt_tokens") or 0),
                 completion=int(u.get("completion_tokens") or 0))


def _segments(steps: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, Any]], str | None]]:
    """Split a conversation into runs: (index of first step, steps, user message)."""
    out: list[tuple[int, list[dict[str, Any]], str | None]] = []
    start, current, user = 0, [], None
    for i, step in enumerate(steps):
        current.append(step)
        if not step.get("tool_calls"):
            out.append((start, current, user))
            user = step.get("user_reply")
            start, current = i + 1, []
    if current:
        out.append((start, current, user))
    return out


def replay_trajectory(deployment: Deployment, traj: dict[str, Any]) -> ReplayResult:
    """Feed one trajectory through the deployment's guards; see the module docstring."""
    steps: list[dict[str, Any]] = traj["steps"]
    result = ReplayResult(
        id=str(traj.get("id", "?")),
        steps=len(steps),
        success=traj.get("success"),
        final_answer_present=traj.get("final_answer_present"),
    )
    meta = traj.get("meta")
    if isinstance(meta, dict):
        result.source_termination = meta.get("termination_reason")
    usages = [_usage(s) for s in steps]
    if any(u is not None for u in usages):
        result.recorded_tokens = sum(u.total for u in usages if u is not None)
    names = {str(tc.get("name")) for s in steps for tc in s.get("tool_calls") or ()}
    tools = ToolRegistry(recorded_tool(n) for n in sorted(names))
    engine = deployment.engine
    history: list[dict[str, Any]] = []
    first_user = str(traj.get("user") or "(recorded conversation)")
    for offset, seg_steps, user in _segments(steps):
        run = Run(
            user if user is not None else first_user,
            deployment=deployment,
            tools=tools,
            clock=deployment.clock,
            limits=deployment.limits(None),
            scenario=result.id,
            estimator=deployment.estimator,
            model_name="replay",
        )
        if history:
            for m in history:
                run.add_message(m)
            run.add_message({"role": "user", "content": run.user})
        else:
            engine.start(run)
        result.runs += 1
        outcome = _drive_recorded(engine, run, seg_steps)
        history = run.messages
        result.records.append(run.record())
        _attribute(result, run, outcome, offset, steps, usages)
        if result.stop is not None:
            break
    return result


def _drive_recorded(engine: Engine, run: Run, seg: list[dict[str, Any]]) -> RunOutcome:
    gen = engine.machine(run)
    try:
        eff = next(gen)
        while True:
            if isinstance(eff, CallModel):
                idx = run.step  # 0-based index of the recorded turn this call stands for
                if eff.request.final or idx >= len(seg):
                    value: Any = ModelResponse(content=None, usage=Usage())
                else:
                    step = seg[idx]
                    value = ModelResponse(
                        content=step.get("content"),
                        tool_calls=[
                            ProposedCall(
                                name=str(tc.get("name")),
                                arguments=tc["arguments"] if isinstance(tc.get("arguments"), str)
                                else json.dumps(tc.get("arguments") or {}, ensure_ascii=False),
                            )
                            for tc in step.get("tool_calls") or ()
                        ],
                        usage=_usage(step) or Usage(),
                    )
            else:  # RunTool: the recorded observation stands in for the tool
                step = seg[eff.call.step - 1]
                obs = step.get("observations") or []
                errs = step.get("observation_is_error") or []
                i = eff.call.index
                text = str(obs[i]) if i < len(obs) else "(no observation recorded)"
                is_err = bool(errs[i]) if i < len(errs) and errs[i] is not None else False
                value = ToolResult(content=text, ok=not is_err,
                                   error="tool_error" if is_err else None)
            eff = gen.send(value)
    except StopIteration as done:
        outcome = cast(RunOutcome, done.value)
    return engine.finish(run, outcome)


def _file_step(offset: int, entry: dict[str, Any]) -> int:
    # before_model verdicts concern the call about to be made (step + 1); the others the
    # step whose response or tools triggered them.
    local = int(entry["step"]) + (1 if entry["hook"] in ("before_model", "on_start") else 0)
    return offset + max(local, 1)


def _attribute(result: ReplayResult, run: Run, outcome: RunOutcome, offset: int,
               steps: list[dict[str, Any]], usages: list[Usage | None]) -> None:
    if result.first_warning is None:
        for entry in run.verdicts:
            if entry["kind"] in ("warn", "skip"):
                result.first_warning = {"step": _file_step(offset, entry),
                                        "plugin": entry["plugin"]}
                break
    if outcome.termination in ("final_answer", "terminal_tool") and outcome.stopped_by is None:
        return
    if outcome.termination == "final_answer":
        return
    stop_entry = next(
        (e for e in run.verdicts if e["kind"] == "stop" and e["plugin"] == outcome.stopped_by
         and e.get("reason") == outcome.termination),
        None,
    )
    step = _file_step(offset, stop_entry) if stop_entry else offset + max(run.step, 1)
    step = min(step, len(steps))
    result.stop = {"step": step, "reason": outcome.termination, "plugin": outcome.stopped_by,
                   "soft": outcome.soft}
    after = usages[step:]
    result.steps_after_stop = len(steps) - step
    if any(u is not None for u in after) or result.recorded_tokens is not None:
        result.tokens_after_stop = sum(u.total for u in after if u is not None)


def replay_file(deployment: Deployment, path: str | Path) -> tuple[list[ReplayResult], int]:
    """Replay every trajectory in a JSONL file; returns the results and the unreadable lines."""
    results, bad = [], 0
    for _lineno, traj in iter_trajectories(path):
        if traj is None:
            bad += 1
            continue
        results.append(replay_trajectory(deployment, traj))
    return results, bad


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def summarize(results: Iterable[ReplayResult]) -> dict[str, Any]:
    """The replay summary: false positives on successful runs, catches on runaway runs."""
    rs = list(results)
    successful = [r for r in rs if r.success is True]
    capped = [r for r in rs if r.source_termination in ("max_steps", "too_many_errors")]
    no_answer = [r for r in rs if r.final_answer_present is False]
    runaway = {r.id: r for r in capped + no_answer}
    # a stop on the very last recorded step ends the run where it ended anyway
    fp = [r for r in successful if r.stop is not None and r.stop["step"] < r.steps]
    warned_ok = [r for r in successful if r.first_warning is not None]
    caught = [r for r in runaway.values() if r.stop is not None]
    caught_capped = [r for r in capped if r.stop is not None]
    saved_steps = sum(r.steps_after_stop for r in caught)
    saved_tokens = sum(r.tokens_after_stop or 0 for r in caught)
    by_reason: dict[str, int] = {}
    for r in rs:
        if r.stop is not None:
            by_reason[r.stop["reason"]] = by_reason.get(r.stop["reason"], 0) + 1
    return {
        "trajectories": len(rs),
        "successful": len(successful),
        "successful_stopped_early": len(fp),
        "successful_stopped_early_pct": _pct(len(fp), len(successful)),
        "successful_warned": len(warned_ok),
        "successful_warned_pct": _pct(len(warned_ok), len(successful)),
        "step_cap_runs": len(capped),
        "step_cap_runs_stopped": len(caught_capped),
        "step_cap_runs_stopped_pct": _pct(len(caught_capped), len(capped)),
        "runs_without_answer": len(no_answer),
        "runaway_runs": len(runaway),
        "runaway_runs_stopped": len(caught),
        "steps_saved": saved_steps,
        "recorded_tokens_saved": saved_tokens,
        "stops_by_reason": dict(sorted(by_reason.items(), key=lambda kv: -kv[1])),
    }
