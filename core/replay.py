"""Replay recorded real runs through the configured guards, without calling any model or tool.

A trajectory (DESIGN's JSONL format) is a conversation: a step without tool calls ends the
current run, and a ``user_reply`` after it starts the next run of the same conversation --
per-run limits start afresh, while the conversation's messages carry on (so context size
grows as it did).  Each recorded step is fed through the very same step machine that serves
live runs (:meth:`loopwarden.loop.Engine.machine`): the "model" answers with the recorded
turn and the "tools" with the recorded observations.  The replay of a trajectory ends at its
first stop that cut recorded work: what the agent did afterwards would not have happened.  A
stop that only replaced a run's closing text still gave the user an answer, so the
conversation goes on with the user's next message (``closing_stops`` counts those) -- unless
the stop was of the conversation as a whole (``max_turns``, or ``scope = "conversation"``
in its evidence).

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
declarations either, so tool natures are inferred from names
(:func:`infer_flags`) unless given (``loopwarden replay --tools FILE``).  Runs are priced as
the model the trajectory names (``model``, or ``meta.model``); :func:`replay_config` makes the
cost line count a model without a price as free, since a recorded run cannot be refused
before it starts.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict

from loopwarden import signals
from loopwarden.clock import FakeClock
from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, ToolResult, Usage
from loopwarden.exceptions import ConfigError
from loopwarden.fingerprint import canonical_arguments
from loopwarden.loop import CallModel, Engine
from loopwarden.reasons import BUDGET_REASONS
from loopwarden.run import Conversation, Run, RunOutcome
from loopwarden.sanitize import depth_exceeds, loads_arguments, loads_strict
from loopwarden.tokens import estimate_message
from loopwarden.tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.deployment import Deployment

__all__ = [
    "RUNAWAY_REPEAT",
    "ReplayEngine",
    "ReplayResult",
    "infer_flags",
    "iter_trajectories",
    "load_tool_flags",
    "recorded_tool",
    "repeat_streak",
    "replay_config",
    "replay_file",
    "replay_trajectory",
    "summarize",
]

#: Tool natures inferred from names when a recording does not declare them (override them
#: with ``flags``).  Lookups of stored records are read-only and deterministic (while nothing
#: writes to them); probes of live state -- a device's status, a speed test, the clock -- are
#: read-only but not deterministic (their answer may change between two identical calls);
#: toggles and restarts change the world but are legitimately repeated (on, then off), so they
#: are not idempotent side effects; every other tool is taken as a side effect, idempotent per
#: full arguments; a hand-off to a human is terminal.
LOOKUP_PREFIXES = (
    "get_",
    "find_",
    "search_",
    "list_",
    "query_",
    "lookup_",
    "read_",
    "fetch_",
    "calculate",
    "think",
)
PROBE = re.compile(
    r"^(check_|can_|run_|test_|ping_|measure_)|(status|usage|time|now|speed)"
    r"(_|$)",
    re.IGNORECASE,
)
REPEATABLE_ACTION = re.compile(r"^(toggle_|reboot_|restart_|reseat_|reset_|retry_)", re.IGNORECASE)
TERMINAL_NAMES = re.compile(r"(^|_)transfer_to_human", re.IGNORECASE)
FLAG_NAMES = ("read_only", "deterministic", "side_effect", "terminal")


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def infer_flags(name: str) -> dict[str, bool]:
    """A recorded tool's nature guessed from its name (see :data:`LOOKUP_PREFIXES`)."""
    lname = name.lower()
    terminal = bool(TERMINAL_NAMES.search(lname))
    if terminal:
        return {"read_only": False, "deterministic": False, "side_effect": True, "terminal": True}
    if PROBE.search(lname):
        return {"read_only": True, "deterministic": False, "side_effect": False, "terminal": False}
    if lname.startswith(LOOKUP_PREFIXES):
        return {"read_only": True, "deterministic": True, "side_effect": False, "terminal": False}
    if REPEATABLE_ACTION.search(lname):
        return {"read_only": False, "deterministic": False, "side_effect": False, "terminal": False}
    return {"read_only": False, "deterministic": False, "side_effect": True, "terminal": False}


def recorded_tool(name: str, flags: Mapping[str, Any] | None = None) -> Tool:
    """A stand-in declaration for a tool seen in a recording (or run by a framework): its
    nature from ``flags`` -- a ``[tools.<name>]`` table: the booleans of :data:`FLAG_NAMES`,
    ``retryable`` and ``idempotency_keys`` -- the rest inferred from its name
    (:func:`infer_flags`)."""
    nature = infer_flags(name)
    flags = flags or {}
    declared = {k: bool(v) for k, v in flags.items() if k in FLAG_NAMES and v is not None}
    # a declared nature is consistent: read-only means no side effect, and the reverse
    if declared.get("read_only") and "side_effect" not in declared:
        declared["side_effect"] = False
    if declared.get("side_effect") and "read_only" not in declared:
        declared["read_only"] = False
    nature.update(declared)
    keys = flags.get("idempotency_keys")
    return Tool(
        name=name,
        func=lambda **kw: None,
        description=f"recorded tool {name}",
        args_model=_AnyArgs,
        read_only=nature["read_only"],
        deterministic=nature["deterministic"],
        side_effect=nature["side_effect"],
        terminal=nature["terminal"],
        retryable=(Exception,) if flags.get("retryable") else (),
        idempotency_keys=tuple(keys) if keys is not None else None,
    )


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
    tool_calls: int = 0
    recorded_tokens: int | None = None
    final_answer_present: bool | None = None
    source_termination: str | None = None
    model: str | None = None
    runs: int = 0
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
            "tool_calls": self.tool_calls,
            "recorded_tokens": self.recorded_tokens,
            "final_answer_present": self.final_answer_present,
            "source_termination": self.source_termination,
            "model": self.model,
            "runs": self.runs,
        }


def replay_config(config: Config, *, observers: bool = False) -> Config:
    """``config`` adjusted for replay: an enabled ``cost_budget`` counts a recorded model
    without a price as free (it can neither refuse nor price a run that already happened),
    and, unless ``observers``, pure observers are left out (see
    :func:`loopwarden.offline.without_observers`: no alerts or logs for runs that are
    history)."""
    if not observers:
        from loopwarden.offline import without_observers

        config, _ = without_observers(config)
    if "cost_budget" not in config.plugins.enabled:
        return config
    data = config.plugins.model_dump()
    table = dict(data.get("cost_budget") or {})
    table["unknown_model"] = "free"
    data["cost_budget"] = table
    return config.model_copy(update={"plugins": config.plugins.model_validate(data)})


def iter_trajectories(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, trajectory or None for an unreadable line) for each non-blank line.

    Unreadable: not strict JSON (see :func:`loopwarden.sanitize.loads_strict` -- ``NaN``,
    ``1e999``, huge integers, deep nesting, lone surrogates, undecodable bytes), or not the
    trajectory shape."""
    with Path(path).open(encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = loads_strict(line)
            except ValueError:
                yield lineno, None
                continue
            if not _well_formed(obj):
                yield lineno, None
                continue
            yield lineno, obj


def _well_formed(obj: Any) -> bool:
    """The shape replay relies on: steps are objects whose lists are lists (a bad line is
    counted as unreadable, never a crash that loses the whole file)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("steps"), list):
        return False
    for step in obj["steps"]:
        if not isinstance(step, dict):
            return False
        for key in ("tool_calls", "observations", "observation_is_error"):
            value = step.get(key)
            if value is not None and not isinstance(value, list):
                return False
        if not all(isinstance(tc, dict) for tc in step.get("tool_calls") or ()):
            return False
        usage = step.get("usage")
        if usage is not None and not isinstance(usage, dict):
            return False
    return True


def _usage(step: dict[str, Any]) -> Usage | None:
    u = step.get("usage")
    if not isinstance(u, dict):
        return None
    try:  # negative counts are recording errors: clamped, never subtracted from a total
        return Usage(
            prompt=max(0, int(u.get("prompt_tokens") or 0)),
            completion=max(0, int(u.get("completion_tokens") or 0)),
        )
    except (TypeError, ValueError):
        return None


def _recorded_prompt(step: dict[str, Any]) -> int | None:
    """The step's recorded ``usage.prompt_tokens``; None when absent or not a positive count."""
    u = step.get("usage")
    if not isinstance(u, dict):
        return None
    try:
        n = int(u.get("prompt_tokens") or 0)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _calls(step: dict[str, Any]) -> list[dict[str, Any]]:
    tcs = step.get("tool_calls")
    return [tc for tc in tcs if isinstance(tc, dict)] if isinstance(tcs, list) else []


def _signature(tc: dict[str, Any]) -> str:
    """A recorded call's name and canonical arguments (volatile keys left out)."""
    args = tc.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = loads_arguments(args)  # depth-bounded: a hostile line cannot recurse
    if depth_exceeds(args):
        return f"{tc.get('name')}:<too deep>"
    return f"{tc.get('name')}:{canonical_arguments(args)}"


def repeat_streak(steps: Iterable[dict[str, Any]]) -> int:
    """The most times one call (tool name and canonical arguments) was made in a row in a
    recording: consecutive tool calls, parallel ones included; text turns in between do not
    break the streak (a conversation that repeats one lookup turn after turn), a different
    call does."""
    best = streak = 0
    last: str | None = None
    for step in steps:
        for tc in _calls(step):
            sig = _signature(tc)
            streak = streak + 1 if sig == last else 1
            last = sig
            best = max(best, streak)
    return best


@dataclass(slots=True)
class _Prompts:
    """Request sizing for one replayed trajectory (see :class:`ReplayEngine`)."""

    offset: int  # tokens the estimate misses: measured at the last recorded step
    recorded: list[int | None] = field(default_factory=list)  # this run's, by step index


_PROMPTS = "_replay_prompts"  # the run.state slot of the sizing (private to the replay)


class ReplayEngine(Engine):
    """The deployment's engine with request sizes from the recording (module doc): the very
    same step machine, only ``estimated_tokens`` is set from ``usage.prompt_tokens``."""

    def _request(self, run: Run, final: bool) -> ModelRequest:
        request = super()._request(run, final)
        if not final:  # a final request was sized by _make_final
            self._size(run, request)
        return request

    def _make_final(self, run: Run, request: ModelRequest) -> None:
        super()._make_final(run, request)
        self._size(run, request)

    @staticmethod
    def _size(run: Run, request: ModelRequest) -> None:
        p: _Prompts | None = run.state.get(_PROMPTS)
        if p is None:
            return
        idx = run.step  # 0-based index of the recorded turn this request stands for
        recorded = p.recorded[idx] if idx < len(p.recorded) and not request.final else None
        if recorded is not None:
            p.offset = recorded - request.estimated_tokens
            request.estimated_tokens = recorded
        else:
            request.estimated_tokens = max(0, request.estimated_tokens + p.offset)


def _segments(steps: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, Any]], str | None]]:
    """Split a conversation into runs: (index of first step, steps, user message)."""
    out: list[tuple[int, list[dict[str, Any]], str | None]] = []
    start, current, user = 0, [], None
    for i, step in enumerate(steps):
        current.append(step)
        if not _calls(step):
            out.append((start, current, user))
            reply = step.get("user_reply")
            user = reply if isinstance(reply, str) else None
            start, current = i + 1, []
    if current:
        out.append((start, current, user))
    return out


def _model_name(traj: dict[str, Any]) -> str:
    meta = traj.get("meta")
    name = traj.get("model") or (meta.get("model") if isinstance(meta, dict) else None)
    return str(name) if name else "replay"


def replay_trajectory(
    deployment: Deployment,
    traj: dict[str, Any],
    flags: Mapping[str, Mapping[str, bool]] | None = None,
    carry: Iterable[str] = (),
    *,
    system_prompt_tokens: int | None = None,
) -> ReplayResult:
    """Feed one trajectory through the deployment's guards; see the module docstring.

    ``flags`` declares tool natures by name (the rest are inferred, see :func:`infer_flags`).
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
    )
    meta = traj.get("meta")
    if isinstance(meta, dict):
        result.source_termination = meta.get("termination_reason")
    usages = [_usage(s) for s in steps]
    if any(u is not None for u in usages):
        result.recorded_tokens = sum(u.total for u in usages if u is not None)
    result.tool_calls = sum(len(_calls(s)) for s in steps)
    result.repeat_streak = repeat_streak(steps)
    names = {str(tc.get("name")) for s in steps for tc in _calls(s)}
    declared = flags or {}
    tools = ToolRegistry(recorded_tool(n, declared.get(n)) for n in sorted(names))
    engine = ReplayEngine(deployment.hooks, deployment.config.run)
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
        run.state[_PROMPTS] = prompts
        result.runs += 1
        outcome, n = _drive_recorded(engine, run, seg_steps)
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


def _drive_recorded(engine: Engine, run: Run, seg: list[dict[str, Any]]) -> tuple[RunOutcome, int]:
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
    """Replay every trajectory in a JSONL file; returns the results and the unreadable lines."""
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


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


#: the recorded terminations (``meta.termination_reason``) that mean "hit a step or error cap"
STEP_CAP_TERMINATIONS = ("max_steps", "too_many_errors")
#: a recording that made one call this many times in a row (:func:`repeat_streak`) ran away
RUNAWAY_REPEAT = 5


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
    * steps and recorded tokens saved are counted on the runaway runs that were stopped.

    The older figures follow: ``successful_stopped_early`` counts a stop that cut any recorded
    tool call of the whole conversation; *runs without an answer* are counted apart.
    """
    rs = list(results)
    successful = [r for r in rs if r.success is True]
    capped = [r for r in rs if r.source_termination in STEP_CAP_TERMINATIONS]
    repeated = [r for r in rs if r.repeat_streak >= RUNAWAY_REPEAT]
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
