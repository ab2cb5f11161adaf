"""Replay recorded real runs through the configured guards, without calling any model or tool.

A trajectory (the JSONL format of docs/contracts.md) is a conversation: a step without tool
calls ends the current run, and a ``user_reply`` after it starts the next run of the same
conversation -- per-run limits start afresh, while the conversation's messages carry on (so
context size grows as it did).  Each recorded step is fed through the very same step machine
that serves live runs (:meth:`loopwarden.engine.loop.Engine.machine`): the "model" answers with the
recorded turn and the "tools" with the recorded observations.  The replay of a trajectory ends
at its first stop that cut recorded work: what the agent did afterwards would not have happened.
A stop that only replaced a run's closing text still gave the user an answer, so the
conversation goes on with the user's next message (``closing_stops`` counts those) -- unless the
stop was of the conversation as a whole (``max_turns``, or ``scope = "conversation"`` in its
evidence).

For each trajectory the replay reports (steps numbered from 1, as in the file) the first
warning, the stop (step, reason, plugin) -- or None when the guards let it run to its end --
the recorded tokens spent after the stop (where usage is recorded), and how many recorded tool
calls the stop cut off (``calls_cut``: a stop that cuts none ended the run where it ended
anyway, e.g. a hand-off tool stopping at the hand-off).  A stop is classified by what it cut
from its own run (``stop_kind``): ``work_left`` (recorded tool calls of that run never ran),
``closing_text`` (it only replaced the run's closing text) or ``hand_off`` (a terminal tool).

Request sizes are what the recording says.  Where a step has ``usage.prompt_tokens``, the
request that stands for it is sized at exactly that (the budget plugins see the real prompt,
system prompt and tool schemas included); a request without one is sized at the project's
estimate plus the gap measured at the last recorded step -- or, before any, plus what the
trajectory leaves out: ``system_prompt_tokens`` (``--system-prompt-tokens``) in place of the
configured system prompt, else nothing beyond the configured system prompt itself.  A step
without recorded usage is billed at those estimates, as a live model that reports no usage.

Recordings carry no timings, so time does not pass in a replay (runs share a
:class:`~loopwarden.FakeClock`; the timeout line never fires).  They carry no tool
declarations either: a tool's nature is what the deployment's ``[tools.<name>]`` tables and
``loopwarden replay --tools FILE`` declare, as for a framework's tools; an undeclared tool
asserts none (its name only weighs detectors, see :func:`recorded_tool`).  Runs are priced as
the model the trajectory names (``model``, or ``meta.model``); :func:`replay_config` makes the
cost line count a model without a price as free, since a recorded run cannot be refused
before it starts.

This module drives the engine over a trajectory; reading trajectory files lives in
:mod:`loopwarden.traffic.trajectory`, tool natures in :mod:`loopwarden.tools.recorded`
and the summary figures in :mod:`loopwarden.traffic.figures` (their public names are
re-exported here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from loopwarden import signals
from loopwarden.clock import FakeClock
from loopwarden.engine.calls import ModelTurn
from loopwarden.engine.loop import CallModel, Engine
from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, ToolResult, Usage
from loopwarden.exceptions import ConfigError
from loopwarden.models.tokens import estimate_message
from loopwarden.run import Conversation, Run, RunOutcome
from loopwarden.stash import StashKey
from loopwarden.tools import ToolRegistry
from loopwarden.tools.recorded import (
    FLAG_NAMES,
    LOOKUP_PREFIXES,
    PROBE,
    REPEATABLE_ACTION,
    TERMINAL_NAMES,
    infer_flags,
    recorded_tool,
)
from loopwarden.traffic.figures import (
    RUNAWAY_REPEAT,
    STEP_CAP_TERMINATIONS,
    summarize,
    summarize_by_source,
)
from loopwarden.traffic.trajectory import (
    _calls,
    _model_name,
    _recorded_prompt,
    _segments,
    _usage,
    identical_repeat_streak,
    iter_trajectories,
    read_lines,
    repeat_streak,
)

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.deployment import Deployment

__all__ = [
    "FLAG_NAMES",
    "LOOKUP_PREFIXES",
    "PROBE",
    "REPEATABLE_ACTION",
    "RUNAWAY_REPEAT",
    "STEP_CAP_TERMINATIONS",
    "TERMINAL_NAMES",
    "ReplayEngine",
    "ReplayResult",
    "identical_repeat_streak",
    "infer_flags",
    "iter_trajectories",
    "load_tool_flags",
    "read_lines",
    "recorded_tool",
    "repeat_streak",
    "replay_config",
    "replay_file",
    "replay_trajectory",
    "summarize",
    "summarize_by_source",
]


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
    calls_cut: int = 0
    calls_cut_in_run: int = 0
    stop_kind: str | None = None
    closing_stops: int = 0
    warned_by: list[str] = field(default_factory=list)
    repeat_streak: int = 0
    identical_repeat_streak: int = 0
    tool_calls: int = 0
    recorded_tokens: int | None = None
    final_answer_present: bool | None = None
    source_termination: str | None = None
    model: str | None = None
    runs: int = 0
    source: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ended_early(self) -> bool:
        """Whether the guards ended the conversation before its recorded end."""
        return self.stop is not None and (self.calls_cut > 0 or self.steps_after_stop > 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "steps": self.steps,
            "success": self.success,
            "first_warning": self.first_warning,
            "stop": self.stop,
            "tokens_after_stop": self.tokens_after_stop,
            "steps_after_stop": self.steps_after_stop,
            "calls_cut": self.calls_cut,
            "calls_cut_in_run": self.calls_cut_in_run,
            "stop_kind": self.stop_kind,
            "closing_stops": self.closing_stops,
            "warned_by": self.warned_by,
            "repeat_streak": self.repeat_streak,
            "identical_repeat_streak": self.identical_repeat_streak,
            "tool_calls": self.tool_calls,
            "recorded_tokens": self.recorded_tokens,
            "final_answer_present": self.final_answer_present,
            "source_termination": self.source_termination,
            "model": self.model,
            "runs": self.runs,
            "source": self.source,
        }


def replay_config(config: Config, *, observers: bool = False) -> Config:
    """``config`` adjusted for replay: an enabled ``cost_budget`` counts a recorded model
    without a price as free (it can neither refuse nor price a run that already happened),
    and, unless ``observers``, pure observers are left out (see
    :func:`loopwarden.traffic.offline.without_observers`: no alerts or logs for runs that are
    history)."""
    if not observers:
        from loopwarden.traffic.offline import without_observers

        config, _ = without_observers(config)
    if "cost_budget" not in config.plugins.enabled:
        return config
    data = config.plugins.model_dump()
    table = dict(data.get("cost_budget") or {})
    table["unknown_model"] = "free"
    data["cost_budget"] = table
    return config.model_copy(update={"plugins": config.plugins.model_validate(data)})


@dataclass(slots=True)
class _Prompts:
    """Request sizing for one replayed trajectory (see :class:`ReplayEngine`)."""

    offset: int  # tokens the estimate misses: measured at the last recorded step
    recorded: list[int | None] = field(default_factory=list)  # this run's, by step index


#: the replay's request sizing for a run (in ``run.stash``: core state stays out of the
#: plugins' ``run.state`` namespace)
_PROMPTS = StashKey["_Prompts"]()


class _ReplayTurn(ModelTurn):
    """The model turn with request sizes from the recording (see :class:`ReplayEngine`)."""

    __slots__ = ()

    def request(self, run: Run, final: bool) -> ModelRequest:
        request = super().request(run, final)
        if not final:  # a final request was sized by make_final
            self._size(run, request)
        return request

    def make_final(self, run: Run, request: ModelRequest) -> None:
        super().make_final(run, request)
        self._size(run, request)

    @staticmethod
    def _size(run: Run, request: ModelRequest) -> None:
        p: _Prompts | None = run.stash.get(_PROMPTS, None)
        if p is None:
            return
        idx = run.step  # 0-based index of the recorded turn this request stands for
        recorded = p.recorded[idx] if idx < len(p.recorded) and not request.final else None
        if recorded is not None:
            p.offset = recorded - request.estimated_tokens
            request.estimated_tokens = recorded
        else:
            request.estimated_tokens = max(0, request.estimated_tokens + p.offset)


class ReplayEngine(Engine):
    """The deployment's engine with request sizes from the recording (module doc): the very
    same step machine, only ``estimated_tokens`` is set from ``usage.prompt_tokens``."""

    model_turn_type = _ReplayTurn


def replay_trajectory(
    deployment: Deployment,
    traj: dict[str, Any],
    flags: Mapping[str, Mapping[str, bool]] | None = None,
    carry: Iterable[str] = (),
    *,
    system_prompt_tokens: int | None = None,
) -> ReplayResult:
    """Feed one trajectory through the deployment's guards; see the module docstring.

    ``flags`` declares tool natures by name, over the deployment's ``[tools.<name>]`` tables;
    an undeclared tool asserts no nature (its name only weighs detectors, see
    :func:`recorded_tool`).
    ``system_prompt_tokens`` is the size of the system prompt (policy text, tool schemas) the
    recording leaves out; it stands in for the configured system prompt until a step with
    recorded usage says how large the prompt really was.
    The trajectory is one :class:`~loopwarden.Conversation`: messages and conversation-scoped
    plugin state carry on from run to run.  ``carry`` (an experiment) also hands the named
    plugins' *per-run* state on to the next run.
    """
    carried = tuple(carry)
    steps: list[dict[str, Any]] = traj["steps"]
    result = ReplayResult(
        id=str(traj.get("id", "?")),
        steps=len(steps),
        success=traj.get("success"),
        final_answer_present=traj.get("final_answer_present"),
        model=_model_name(traj),
        source=str(traj["source"]) if traj.get("source") is not None else None,
    )
    meta = traj.get("meta")
    if isinstance(meta, dict):
        result.source_termination = meta.get("termination_reason")
    usages = [_usage(s) for s in steps]
    if any(u is not None for u in usages):
        result.recorded_tokens = sum(u.total for u in usages if u is not None)
    result.tool_calls = sum(len(_calls(s)) for s in steps)
    result.repeat_streak = repeat_streak(steps)
    result.identical_repeat_streak = identical_repeat_streak(steps)
    names = {str(tc.get("name")) for s in steps for tc in _calls(s)}
    # natures: the deployment's [tools.<name>] tables, then ``flags`` (replay --tools)
    declared: dict[str, Mapping[str, Any]] = {
        name: t.model_dump(exclude_none=True) for name, t in deployment.config.tools.items()
    }
    declared.update(flags or {})
    tools = ToolRegistry(recorded_tool(n, declared.get(n)) for n in sorted(names))
    engine = ReplayEngine(deployment.hooks, deployment.config.run)
    # results the gateway would judge failed by their text: failed here too
    errors = [re.compile(p) for p in deployment.config.gateway.tool_error_patterns]
    prompts = _Prompts(offset=_system_prompt_gap(deployment, system_prompt_tokens))
    conversation = Conversation(result.id)
    first_user = str(traj.get("user") or "(recorded conversation)")
    reached = 0
    state: dict[str, Any] = {}
    clock = FakeClock()  # recordings carry no timings: time does not pass in a replay
    segments = _segments(steps)
    first_closing: dict[str, Any] | None = None
    for k, (offset, seg_steps, user) in enumerate(segments):
        run = Run(
            user if user is not None else first_user,
            deployment=deployment,
            tools=tools,
            clock=clock,
            limits=deployment.limits(None),
            scenario=result.id,
            estimator=deployment.estimator,
            model_name=result.model,
            conversation=conversation,
        )
        engine.start(run)  # the conversation's messages so far, then this user message
        for name in carried:
            if name in state:
                run.state[name] = state[name]
        prompts.recorded = [_recorded_prompt(s) for s in seg_steps]
        run.stash[_PROMPTS] = prompts
        result.runs += 1
        outcome, n = _drive_recorded(engine, run, seg_steps, errors)
        reached += n
        state = run.state
        result.records.append(run.record())
        _attribute(result, run, outcome, offset, steps, usages)
        for entry in run.verdicts:
            if entry["kind"] in ("warn", "skip") and entry["plugin"] not in result.warned_by:
                result.warned_by.append(entry["plugin"])
        if result.stop is not None:
            cut = sum(len(_calls(s)) for s in seg_steps) - n
            kind = (
                "hand_off"
                if result.stop["reason"] == "terminal_tool"
                else "work_left"
                if cut > 0
                else "closing_text"
            )
            if kind == "closing_text" and k + 1 < len(segments) and not _ends_conversation(outcome):
                # The stop only replaced this run's closing text: the user still got an
                # answer, so the conversation goes on with their next message.
                result.closing_stops += 1
                first_closing = first_closing or result.stop
                result.stop = None
                continue
            result.calls_cut_in_run, result.stop_kind = cut, kind
            break
    if result.stop is not None:
        result.calls_cut = result.tool_calls - reached
    elif first_closing is not None:  # the conversation ran to its end past those stops
        result.stop, result.stop_kind = first_closing, "closing_text"
        result.steps_after_stop = 0
        result.tokens_after_stop = 0 if result.recorded_tokens is not None else None
    return result


def _ends_conversation(outcome: RunOutcome) -> bool:
    """A stop of the conversation as a whole (``max_turns``, or ``scope = "conversation"`` in
    its evidence): no later run of it would go ahead either."""
    return outcome.termination == "max_turns" or outcome.evidence.get("scope") == "conversation"


def _system_prompt_gap(deployment: Deployment, system_prompt_tokens: int | None) -> int:
    """What the estimate of a first request misses: the recording's left-out system prompt
    in place of the configured one (0 when no size is given)."""
    if system_prompt_tokens is None:
        return 0
    text = deployment.config.run.system_prompt
    configured = (
        estimate_message({"role": "system", "content": text}, deployment.estimator) if text else 0
    )
    return system_prompt_tokens - configured


def _drive_recorded(
    engine: Engine,
    run: Run,
    seg: list[dict[str, Any]],
    errors: Sequence[re.Pattern[str]] = (),
) -> tuple[RunOutcome, int]:
    """Play one run of recorded steps; returns its outcome and how many of the recorded tool
    calls reached their hooks (executed, skipped or refused as invalid -- not cut by a stop)."""
    reached = [0]

    def count(sender: Any, **_: Any) -> None:
        reached[0] += 1

    gen = engine.machine(run)
    with signals.tool_finished.connected_to(count, sender=run):
        try:
            eff = next(gen)
            while True:
                if isinstance(eff, CallModel):
                    idx = run.step  # 0-based index of the recorded turn this call stands for
                    if eff.request.final or idx >= len(seg):
                        # a turn the recording does not hold: billed at the estimates
                        value: Any = ModelResponse(content=None, usage=None)
                    else:
                        step = seg[idx]
                        content = step.get("content")
                        value = ModelResponse(
                            content=content if isinstance(content, str) else None,
                            tool_calls=[
                                ProposedCall(
                                    name=str(tc.get("name")),
                                    arguments=tc["arguments"]
                                    if isinstance(tc.get("arguments"), str)
                                    else json.dumps(tc.get("arguments") or {}, ensure_ascii=False),
                                )
                                for tc in _calls(step)
                            ],
                            usage=_usage(step),  # None: billed at the estimates
                        )
                else:  # RunTool: the recorded observation stands in for the tool
                    step = seg[eff.call.step - 1]
                    obs = step.get("observations") or []
                    errs = step.get("observation_is_error") or []
                    i = eff.call.index
                    text = str(obs[i]) if i < len(obs) else "(no observation recorded)"
                    is_err = bool(errs[i]) if i < len(errs) and errs[i] is not None else False
                    is_err = is_err or any(p.search(text[:500]) for p in errors)
                    value = ToolResult(
                        content=text, ok=not is_err, error="tool_error" if is_err else None
                    )
                eff = gen.send(value)
        except StopIteration as done:
            outcome = cast(RunOutcome, done.value)
    return engine.finish(run, outcome), reached[0]


def _file_step(offset: int, entry: dict[str, Any]) -> int:
    # before_model verdicts concern the call about to be made (step + 1); the others the
    # step whose response or tools triggered them.
    local = int(entry["step"]) + (1 if entry["hook"] in ("before_model", "on_start") else 0)
    return offset + max(local, 1)


def _attribute(
    result: ReplayResult,
    run: Run,
    outcome: RunOutcome,
    offset: int,
    steps: list[dict[str, Any]],
    usages: list[Usage | None],
) -> None:
    if result.first_warning is None:
        for entry in run.verdicts:
            if entry["kind"] in ("warn", "skip"):
                result.first_warning = {
                    "step": _file_step(offset, entry),
                    "plugin": entry["plugin"],
                }
                break
    if outcome.stopped_by is None:
        return  # the recorded run ended by itself (or ran out of recorded steps)
    stop_entry = next(
        (
            e
            for e in run.verdicts
            if e["kind"] == "stop"
            and e["plugin"] == outcome.stopped_by
            and e.get("reason") == outcome.termination
        ),
        None,
    )
    step = _file_step(offset, stop_entry) if stop_entry else offset + max(run.step, 1)
    step = min(step, len(steps))
    result.stop = {
        "step": step,
        "reason": outcome.termination,
        "plugin": outcome.stopped_by,
        "soft": outcome.soft,
        "hook": stop_entry["hook"] if stop_entry else None,
    }
    after = usages[step:]
    result.steps_after_stop = len(steps) - step
    if result.recorded_tokens is not None:
        result.tokens_after_stop = sum(u.total for u in after if u is not None)


def replay_file(
    deployment: Deployment,
    path: str | Path,
    flags: Mapping[str, Mapping[str, bool]] | None = None,
    carry: Iterable[str] = (),
    *,
    system_prompt_tokens: int | None = None,
) -> tuple[list[ReplayResult], int]:
    """Replay every trajectory in a JSONL file (plain or gzip-compressed); returns the
    results and the unreadable lines."""
    results, bad = [], 0
    carry = tuple(carry)
    for _lineno, traj in iter_trajectories(path):
        if traj is None:
            bad += 1
            continue
        results.append(
            replay_trajectory(
                deployment, traj, flags, carry, system_prompt_tokens=system_prompt_tokens
            )
        )
    return results, bad


def load_tool_flags(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read declared tool natures from a TOML file: its ``[tools.NAME]`` tables, the shape of
    ``config.toml``'s (:class:`loopwarden.config.ToolNature`), so a deployment's config file
    serves as well; other tables are ignored."""
    from pydantic import ValidationError

    from loopwarden.config import ToolNature, load_toml, validation_error

    p = Path(path)
    data = load_toml(p)
    tools = data.get("tools")
    if not isinstance(tools, dict):
        raise ConfigError("needs [tools.NAME] tables", path=p, key="tools")
    out: dict[str, dict[str, Any]] = {}
    for name, table in tools.items():
        if not isinstance(table, dict):
            raise ConfigError("must be a table", path=p, key=f"tools.{name}")
        try:
            nature = ToolNature.model_validate(table)
        except ValidationError as exc:
            raise validation_error(exc, path=str(p), prefix=f"tools.{name}") from None
        out[str(name)] = nature.model_dump(exclude_none=True)
    return out
