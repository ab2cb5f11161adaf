"""loopwarden's guards in the OpenAI Agents SDK: ``LoopwardenRunner`` in place of ``Runner``.

::

    from agents import Agent
    from loopwarden import Deployment
    from loopwarden.adapters.openai_agents import LoopwardenRunner, guard_of

    runner = LoopwardenRunner(Deployment.from_config())
    result = await runner.run(agent, "Where is my order?")      # or run_sync / run_streamed
    guard = guard_of(result)      # the stop (termination, stopped_by, soft) and the run_id

Each run is one loopwarden run (same plugins, run records, signals, metrics and alerts as
``loopwarden run``).  The runner calls the SDK's own ``Runner.run`` (``run_streamed``) with a
per-run copy of the agent (``Agent.clone``) whose model, function tools, MCP servers' tools
and handoffs are wrapped -- and so is every agent it hands off to; every other argument
(``context``, ``max_turns``, ``hooks``, ``run_config``, ``session`` ...) is passed through.
Verdicts become:

* **warn** -- the note is appended to the model input of the next call, as a message of
  ``[run] warning_role`` (the SDK keeps no copy of it in its history);
* **skip** -- the wrapped tool returns the skip's observation without running the tool (so is
  a side effect already executed with the same idempotency key); a skipped handoff stays
  with the agent that asked;
* **soft stop** -- the next model call is made with no tools and no handoffs; its text is the
  final output (tool calls it proposes anyway are dropped);
* **hard stop** -- the model is not called: the wrapped model answers with the best-effort
  answer as an assistant message, which becomes the run's final output.

The SDK's extension points that only observe (``RunHooks``) or only filter the input
(``call_model_input_filter``) cannot remove tools or end a run with an answer, which is why the
model is wrapped: that is the one point that sees -- and may replace -- every model call.  The
SDK's own errors reach the caller as the SDK raises them: at ``max_turns`` the run raises
``MaxTurnsExceeded`` (or ends on your ``error_handlers`` answer), recorded as
``ended_by_framework``; so is a run a guardrail tripped (no final answer recorded).

A run that stops on interruptions (``needs_approval``) is recorded as paused
(``evidence.interrupted``); ``runner.run(agent, state)`` resumes its ``RunState`` in a new run
that adopts the interrupted answer (the state's agents must be the runner's copies:
``result.to_state()``, or ``RunState.from_string(runner.resumable(agent), text)``).

Limits: a hard stop's answer is text, so an agent with a structured ``output_type`` fails
its output validation on it; an agent used as a tool (``Agent.as_tool``) runs an SDK run of
its own, unguarded; a session's conversation lives in this process's memory.

Needs ``pip install 'loopwarden[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from agents import (
    Agent,
    FunctionTool,
    Handoff,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    RunContextWrapper,
    Runner,
    RunResult,
    RunResultStreaming,
    RunState,
    handoff,
)
from agents.models.interface import Model
from agents.run_error_handlers import RunErrorHandlerInput
from openai.types.responses import ResponseFunctionToolCall

from loopwarden import events
from loopwarden.adapters._agentswrappers import Invoke as Invoke
from loopwarden.adapters._agentswrappers import _GuardedModel, _items, _openai, _watch, _wrap_tool
from loopwarden.adapters._driver import (
    ENDED_BY_FRAMEWORK,
    Answer,
    GuardedRun,
    NatureSpec,
    conversation_for,
    nature_tables,
    proposed,
    stop_info,
    tool_result,
)
from loopwarden.adapters._exchange import model_url
from loopwarden.plugins.otel import AGENT_NAME
from loopwarden.run import Run, RunOutcome

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment

__all__ = ["LoopwardenRunner", "RunGuard", "guard_of"]


class RunGuard:
    """What loopwarden made of one SDK run: ``guard_of(result)`` (or ``result.loopwarden``,
    also on the exception a guarded run raises).

    ``stopped`` says whether a guard (a plugin) stopped the run; ``termination`` is the stop
    reason (``final_answer`` when the model finished by itself, ``ended_by_framework`` when
    the SDK ended it), ``stopped_by`` the plugin, ``soft`` whether the model was given the
    tool-less wrap-up turn; ``run_id`` links to the run record (``record()`` builds it).
    Read after the run: a streamed run's when its events are consumed."""

    def __init__(self, guarded: GuardedRun) -> None:
        self._guarded = guarded

    @property
    def run(self) -> Run:
        return self._guarded.run

    @property
    def run_id(self) -> str:
        return self._guarded.run.run_id

    @property
    def outcome(self) -> RunOutcome | None:
        """The run's outcome once it is recorded (None while the SDK's run goes on)."""
        return self._guarded.run.outcome

    @property
    def termination(self) -> str | None:
        o = self.outcome
        return o.termination if o is not None else None

    @property
    def stopped_by(self) -> str | None:
        o = self.outcome
        return o.stopped_by if o is not None else None

    @property
    def soft(self) -> bool:
        o = self.outcome
        return o.soft if o is not None else False

    @property
    def stopped(self) -> bool:
        """A guard stopped the run (not the model's own answer, not the SDK)."""
        return self.stopped_by is not None

    def info(self) -> dict[str, Any] | None:
        """The stop as a dict (``run_id``, ``termination``, ``stopped_by``, ``soft``,
        ``final_answer_present``: what the other adapters put in their results); None
        while the run is not recorded."""
        return stop_info(self._guarded) if self.outcome is not None else None

    def record(self) -> dict[str, Any]:
        """The run record (what ``run_record`` writes and ``run_stopped`` sends)."""
        return self._guarded.run.record()

    def __repr__(self) -> str:
        return (
            f"<RunGuard {self.run_id[:8]} termination={self.termination!r} "
            f"stopped_by={self.stopped_by!r} soft={self.soft}>"
        )


_ATTR = "loopwarden"
#: the attribute of a guarded agent copy naming its :class:`_RunState`
_STATE = "_loopwarden_state"
#: the attribute of a guarded agent copy naming the agent it copies
_ORIGINAL = "_loopwarden_original"


def guard_of(result_or_error: object) -> RunGuard | None:
    """The :class:`RunGuard` of a guarded run's result (``RunResult``,
    ``RunResultStreaming``) or of the exception it raised; None for anything else."""
    guard = getattr(result_or_error, _ATTR, None)
    return guard if isinstance(guard, RunGuard) else None


def _attach(obj: object, guard: RunGuard) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # an object without a __dict__
        vars(obj)[_ATTR] = guard


class _RunState:
    """One guarded SDK run: its :class:`GuardedRun` and the guarded copies of its agents."""

    def __init__(self, runner: LoopwardenRunner, guarded: GuardedRun, run_config: RunConfig):
        self.runner = runner
        self.guarded = guarded
        self.run_config = run_config  # the caller's (its model, if any, is every agent's)
        self.guard = RunGuard(guarded)
        self._copies: dict[int, Agent[Any]] = {}  # id(agent) -> its guarded copy
        self._own: set[int] = set()  # ids of the copies
        #: the handoff call of the model's last answer that the SDK will carry out
        self.transfers: list[str] = []
        #: the interrupted run this run resumes, until its open calls are adopted
        self.resuming: RunState[Any, Any] | None = None
        #: the SDK error a handler of the caller's answered (``error_handlers``), if any
        self.handled: tuple[str, BaseException] | None = None

    def noted(self, kind: str, handler: Any) -> Any:
        """The caller's ``error_handlers`` entry ``handler``, noting that it answered (the run
        then ends on the handler's output instead of the SDK's exception)."""

        async def note(data: RunErrorHandlerInput[Any]) -> Any:
            out = handler(data)
            if inspect.isawaitable(out):
                out = await out
            if out is not None:
                self.handled = (kind, data.error)
            return out

        return note

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The per-run guarded copy of ``agent`` (made once per run: handoffs may go back)."""
        if id(agent) in self._own:
            return agent
        # another run's copy (``result.last_agent`` carried into the next run): guard the
        # agent it copies -- its wrappers answer for that run, which is over
        agent = vars(agent).get(_ORIGINAL, agent)
        done = self._copies.get(id(agent))
        if done is not None:
            return done
        copy_ = agent.clone(
            model=_GuardedModel(self.runner._model(agent, self.run_config), self),
            tools=[_wrap_tool(t, self) if isinstance(t, FunctionTool) else t for t in agent.tools],
            handoffs=[],
        )
        self._copies[id(agent)] = copy_
        self._own.add(id(copy_))
        # a RunState keeps the copy it stopped on (the SDK binds approvals to that very
        # object): resuming it retargets this state to the resuming run
        vars(copy_).update({_STATE: self, _ORIGINAL: agent})
        copy_.handoffs = [self._handoff(copy_, h) for h in agent.handoffs]
        if agent.mcp_servers:
            for server in agent.mcp_servers:
                _watch(server)
            fetch = copy_.get_mcp_tools

            async def get_mcp_tools(run_context: RunContextWrapper[Any]) -> list[Any]:
                tools = await fetch(run_context)
                return [_wrap_tool(t, self) if isinstance(t, FunctionTool) else t for t in tools]

            object.__setattr__(copy_, "get_mcp_tools", get_mcp_tools)
        return copy_

    def _handoff(self, source: Agent[Any], item: Any) -> Any:
        """A handoff of ``source`` that goes through ``before_tool`` / ``after_tool`` and
        hands off to the guarded copy of its agent (a refused one stays with ``source``)."""
        if not isinstance(item, (Agent, Handoff)):
            return item
        h: Handoff[Any, Any] = handoff(item) if isinstance(item, Agent) else item
        inner = h.on_invoke_handoff

        async def invoke(ctx: RunContextWrapper[Any], input_json: str) -> Agent[Any]:
            guarded = self.guarded
            call_id = self.transfers.pop(0) if self.transfers else None
            if call_id is not None:
                decision = await guarded.atool(call_id)
                if isinstance(decision, Answer):
                    guarded.adaptations.append(
                        f"handoff {h.tool_name} ({call_id}) was not carried out: {decision.text}"
                    )
                    return source
            try:
                target = await inner(ctx, input_json)
            except BaseException as exc:
                if call_id is not None:
                    await guarded.off_loop(guarded.tool_done, call_id, tool_result(None, error=exc))
                raise
            if call_id is not None:
                result = tool_result(h.get_transfer_message(target))
                await guarded.off_loop(guarded.tool_done, call_id, result)
            guarded.run.meta["agents"].append(getattr(target, "name", "?"))
            return self.agent(target) if isinstance(target, Agent) else target

        return dataclasses.replace(h, on_invoke_handoff=invoke)

    def retarget(self, guarded: GuardedRun, run_config: RunConfig) -> None:
        """Guard a new run with this state's agent copies: the run that resumes an
        interrupted ``RunState`` whose agents are these copies (the SDK resumes with the very
        agent objects it stopped on, and binds approvals to them)."""
        self.guarded = guarded
        self.guard = RunGuard(guarded)
        self.run_config = run_config
        self.transfers = []

    def ended(self, result: RunResult | RunResultStreaming) -> None:
        """The SDK's run returned ``result``: record loopwarden's run (paused or over; ended
        by a handler of the caller's: what that handler answered)."""
        self.paused(result)
        if self.handled is not None:
            kind, error = self.handled
            output = result.final_output
            self.guarded.end_by_framework(
                f"{kind}: {type(error).__name__}: {error} (answered by the caller's handler)",
                output if isinstance(output, str) or output is None else repr(output),
                handled=kind,
            )
        self.end(None)

    def paused(self, result: RunResult | RunResultStreaming) -> None:
        """The SDK's run ended on interruptions (tool calls waiting for approval): recorded
        ``ended_by_framework`` with the waiting calls' ids in ``evidence.interrupted``, the
        calls not run (their side-effect keys stay free for the run that resumes it)."""
        interruptions = getattr(result, "interruptions", None)
        if interruptions:
            ids = [getattr(i.raw_item, "call_id", None) for i in interruptions]
            self.guarded.end_by_framework(
                "paused: the calls wait for approval (resume the RunState)",
                None,
                interrupted=[i for i in ids if i is not None],
            )

    def end(self, error: BaseException | None) -> None:
        """The SDK's run is over (``error``: what it raised): record loopwarden's run."""
        guarded = self.guarded
        if isinstance(error, (InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered)):
            kind = "input" if isinstance(error, InputGuardrailTripwireTriggered) else "output"
            name = error.guardrail_result.guardrail.get_name()
            guarded.overrule(
                RunOutcome(
                    termination=ENDED_BY_FRAMEWORK,
                    evidence={
                        "detail": f"{kind} guardrail {name!r} tripped: the SDK raised "
                        f"{type(error).__name__}, no answer was given",
                        "guardrail": name,
                    },
                )
            )
        elif isinstance(error, MaxTurnsExceeded):  # the SDK's own limit: raised as it is
            guarded.end_by_framework(f"max_turns: {error}", None, raised=type(error).__name__)
            guarded.finish()
        elif error is not None:
            guarded.finish(error)
        else:
            guarded.finish(detail="the agent ended before loopwarden's run did")
        if error is not None:
            _attach(error, self.guard)


class LoopwardenRunner:
    """``Runner.run`` / ``run_sync`` / ``run_streamed`` with loopwarden's plugins guarding
    every agent of the run.

    ``tools`` adds tool natures to the deployment's ``[tools.<name>]`` tables (function
    tools and MCP servers' tools alike); ``model_name`` prices the run for ``cost_budget``
    (default: the starting agent's model name); ``profile`` and ``meta`` are those of
    ``Deployment.run``.  Each result says what loopwarden made of its run:
    ``guard_of(result)`` (:class:`RunGuard`).  :attr:`last_run` is the loopwarden run of the
    latest run started in the calling task or thread.

    A ``session`` (any SDK session with a ``session_id``) is one loopwarden conversation:
    its runs share conversation-scoped plugin state (``conversation_limits``) -- the
    deployment's conversation of that id (``conversation_for``), its runs one after another.
    """

    def __init__(
        self,
        deployment: Deployment,
        *,
        tools: NatureSpec | None = None,
        model_name: str | None = None,
        profile: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.deployment = deployment
        self.natures = nature_tables(tools)
        self.model_name = model_name
        self.profile = profile
        self.meta = dict(meta or {})
        self._last: ContextVar[Run | None] = ContextVar(f"loopwarden_last_run_{id(self)}")

    @property
    def last_run(self) -> Run | None:
        """The loopwarden run of the latest run started in this task or thread (concurrent
        runs in other tasks or threads do not change it; ``guard_of(result)`` is exact)."""
        return self._last.get(None)

    def _model(self, agent: Agent[Any], run_config: RunConfig) -> Model:
        chosen = run_config.model if run_config.model is not None else agent.model
        if isinstance(chosen, Model):
            return chosen
        return run_config.model_provider.get_model(chosen)

    def _start(
        self, agent: Agent[Any], input: Any, kwargs: dict[str, Any]
    ) -> tuple[_RunState, Agent[Any], dict[str, Any]]:
        """A guarded run of ``agent``: its state, the guarded starting agent, and the SDK
        runner's keyword arguments."""
        agent = vars(agent).get(_ORIGINAL, agent)  # another run's copy: the agent it copies
        resuming = input if isinstance(input, RunState) else None
        holder: _RunState | None = None
        resumed_from: str | None = None
        if resuming is not None:
            holder = vars(resuming._current_agent or agent).get(_STATE)
            if not isinstance(holder, _RunState):
                raise TypeError(
                    "LoopwardenRunner resumes a RunState whose agents are its own guarded "
                    "copies: result.to_state() of a guarded run, or RunState.from_string("
                    "runner.resumable(agent), text) for a state saved elsewhere"
                )
            if holder.guarded.run.outcome is not None:  # not a resumable() placeholder
                resumed_from = holder.guarded.run.run_id
        run_config = kwargs.pop("run_config", None) or RunConfig()
        if isinstance(run_config, dict):
            run_config = RunConfig(**run_config)
        inner = self._model(agent, run_config)
        items = _openai(_items(input if resuming is None else resuming._original_input))
        user = next((m["content"] for m in reversed(items) if m["role"] == "user"), "")
        name = self.model_name or getattr(inner, "model", None)
        key = getattr(kwargs.get("session"), "session_id", None)
        conversation = conversation_for(self.deployment, key) if isinstance(key, str) else None
        history = [*conversation.messages, *items] if conversation is not None else items
        meta = dict(self.meta)
        meta.setdefault(AGENT_NAME, agent.name)
        if isinstance(resumed_from, str):
            meta["resumed_from"] = resumed_from
        guarded = GuardedRun(
            self.deployment,
            user=user,
            history=history,
            natures=self.natures,
            model_name=name if isinstance(name, str) else None,
            meta=meta,
            profile=self.profile,
            conversation=conversation,
            adapter="openai_agents",
        )
        guarded.run.model_url = model_url(inner)
        guarded.hold_end = True  # output guardrails may still reject the final answer
        current = agent if resuming is None else resuming._current_agent or agent
        guarded.run.meta["agents"] = [current.name]  # the record's meta: who ran, in order
        if holder is None:
            state = _RunState(self, guarded, run_config)
        else:
            state = holder
            state.retarget(guarded, run_config)
        self._last.set(guarded.run)
        state.resuming = resuming  # adopted by run() (off the event loop) / run_streamed()
        handlers = kwargs.pop("error_handlers", None)
        if handlers:  # the caller's own answers to the SDK's errors: noted for the record
            kwargs["error_handlers"] = {k: state.noted(k, h) for k, h in handlers.items()}
        kwargs["run_config"] = dataclasses.replace(run_config, model=None)
        return state, state.agent(agent), kwargs

    def resumable(self, agent: Agent[Any]) -> Agent[Any]:
        """A guarded copy of ``agent`` to restore a saved ``RunState`` against
        (``RunState.from_string(runner.resumable(agent), text)``), so that the SDK's
        approvals bind to it and :meth:`run` can guard the resumed run -- in another process
        than the one that saved it.  It is not a run: only the resumed run is recorded."""
        placeholder = GuardedRun(self.deployment, user="", adapter="openai_agents")
        return _RunState(self, placeholder, RunConfig()).agent(agent)

    @staticmethod
    def _adopt(guarded: GuardedRun, resuming: RunState[Any, Any]) -> None:
        """A run resuming an interrupted ``RunState``: the answer whose calls wait for
        approval is the run's first model answer (no tokens: the interrupted run paid for
        it), so the approved calls go through the guards and the side-effect ledger like any
        other (a rejected one is recorded as not run by the framework)."""
        calls = [
            proposed(raw.name, raw.arguments, raw.call_id)
            for item in resuming.get_interruptions()
            if isinstance(raw := item.raw_item, ResponseFunctionToolCall)
        ]
        if not calls:
            return
        for c in calls:
            guarded.declare(c.name)
        if guarded.model_turn() is not None:
            guarded.model_done(events.ModelResponse(content=None, tool_calls=calls))

    async def run(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """Run ``agent`` on ``input`` (or resume an interrupted run's ``RunState``) with the
        SDK's ``Runner.run``, guarded."""
        state, wrapped, kwargs = self._start(agent, input, kwargs)
        if state.resuming is not None:
            await state.guarded.off_loop(self._adopt, state.guarded, state.resuming)
        try:
            result = await Runner.run(wrapped, input, **kwargs)
        except BaseException as exc:
            await state.guarded.off_loop(state.end, exc)
            raise
        await state.guarded.off_loop(state.ended, result)
        _attach(result, state.guard)
        return result

    def run_sync(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """:meth:`run` from sync code (not from inside a running event loop)."""
        started: list[Run | None] = []

        async def run() -> RunResult:
            try:
                return await self.run(agent, input, **kwargs)
            finally:
                started.append(self.last_run)

        try:
            return asyncio.run(run())
        finally:
            if started:  # asyncio.run ran it in a copy of this thread's context
                self._last.set(started[0])

    def run_streamed(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResultStreaming:
        """``Runner.run_streamed``, guarded: consume ``result.stream_events()`` as usual;
        the run is recorded when the SDK's run ends."""
        state, wrapped, kwargs = self._start(agent, input, kwargs)
        if state.resuming is not None:
            self._adopt(state.guarded, state.resuming)
        try:
            result = Runner.run_streamed(wrapped, input, **kwargs)
        except BaseException as exc:
            state.end(exc)
            raise
        _attach(result, state.guard)
        task = result.run_loop_task
        if task is None:  # pragma: no cover - the SDK always starts one
            state.end(None)
            return result

        def ended(t: asyncio.Task[Any]) -> None:
            # before stream_events() returns: it awaits this task after its last event
            error: BaseException | None = getattr(result, "_stored_exception", None)
            if error is None:
                error = asyncio.CancelledError() if t.cancelled() else t.exception()
            if error is None:
                state.paused(result)
            state.end(error)

        task.add_done_callback(ended)
        return result
