"""The shared driver: loopwarden's own step machine, advanced by a framework's agent loop.

An adapter does not re-implement the loop.  It runs :meth:`loopwarden.engine.loop.Engine.machine`
-- the generator that ``Deployment.run()`` and ``loopwarden replay`` drive -- in step with the
framework: when the framework is about to call its model, the machine is advanced to its next
model call (running ``on_start`` / ``before_model`` and their verdicts); the framework's answer
is sent in (``after_response``, the parse of the proposed calls); each tool call the framework
is about to execute is matched with the machine's next ``RunTool`` effect (``before_tool``: a
skip answers it without running the tool, a side effect already done is answered from the
ledger) and its result is sent back (``after_tool``).  So verdict resolution, the
warn -> soft stop -> hard stop ladder, the side-effect ledger, the run record, signals,
metrics and alerts are exactly those of loopwarden's own loop.

Before the machine's first step the run's model name (what the framework sends) goes through
the deployment's start-up check, as ``loopwarden run``'s model does
(``Deployment.check_model``: once per deployment and name, so never per step); a refused model
raises its :class:`~loopwarden.ConfigError` to the framework's caller.

The machine handles one tool call at a time, in the order the model proposed them.  A framework
that starts parallel calls at once has the later ones wait for the earlier ones here (a stop
after the first must keep the second from running).

:class:`GuardedRun` is thread-safe: sync frameworks run parallel tool calls in threads; async
ones wait on the event loop (:meth:`GuardedRun.atool`).

Why one module past 550 lines: :class:`GuardedRun` is one state machine of some 440 lines --
every method reads or advances the same generator under the same lock and condition (the
model turn, the queue of tool calls waiting their turn, the ends), and its invariants hold
only across all of them together.  What is not the machine lives apart: the framework-neutral
values the adapters exchange with it in :mod:`loopwarden.adapters._exchange` (re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from loopwarden.adapters._exchange import (
    MAX_CONVERSATIONS,
    NatureSpec,
    conversation_for,
    framework_tool,
    nature_tables,
    proposed,
    stop_info,
    structured_wrap_up,
    tool_result,
    usage,
)
from loopwarden.engine import execution
from loopwarden.engine.drivers import OFFLOAD_LIMIT, blocking_io, steps_on_loop
from loopwarden.engine.drivers import internal_error as _internal_error
from loopwarden.engine.loop import CallModel, Failed, RunTool
from loopwarden.events import ModelRequest, ModelResponse, ToolResult
from loopwarden.exceptions import GuardStopped
from loopwarden.models.tokens import estimate_message
from loopwarden.run import Conversation, Run, RunOutcome
from loopwarden.store import bridge
from loopwarden.tools import ToolRegistry

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment

__all__ = [
    "ENDED_BY_FRAMEWORK",
    "MAX_CONVERSATIONS",
    "Answer",
    "Execute",
    "GuardedRun",
    "NatureSpec",
    "conversation_for",
    "framework_tool",
    "nature_tables",
    "off_loop",
    "proposed",
    "stop_info",
    "structured_wrap_up",
    "tool_result",
    "usage",
]

#: the stop reason of a run that the framework ended while loopwarden expected more (its own
#: step limit, a usage limit, an exception that it handled by ending the run)
ENDED_BY_FRAMEWORK = "ended_by_framework"

T = TypeVar("T")

#: machine steps of adapter runs in worker threads at once, per event loop (more wait)
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


async def off_loop(
    run: Run | None, deployment: Deployment, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """Call ``fn`` -- a step of an adapter run, which may wait on the shared store (ledger
    claims, budget reservations, the record) -- from a framework's async hook without
    blocking the event loop: when the run may block on I/O
    (:func:`~loopwarden.engine.drivers.blocking_io`, so the adapter declares the
    framework's tools first; before a run exists, when the deployment has a shared store),
    in a daemon worker thread, or with ``[store] async_calls = "loop"`` on the loop with its
    store calls awaited (:mod:`loopwarden.store.bridge`); inline otherwise.  As ``Deployment.arun``
    does: at most :data:`~loopwarden.engine.drivers.OFFLOAD_LIMIT` steps in threads at once
    per event loop, and a cancelled caller lets the step finish (shielded) -- never two steps
    of a run at once."""
    if not (deployment.shared is not None if run is None else blocking_io(run)):
        return fn(*args, **kwargs)
    if kwargs:
        fn, args = functools.partial(fn, *args, **kwargs), ()
    if steps_on_loop(deployment):  # on the loop; its store calls awaited here (store.bridge)
        done, got = bridge.start(contextvars.copy_context(), fn, *args)
        out: T = got if done else await asyncio.shield(asyncio.ensure_future(bridge.finish(got)))
        return out
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(OFFLOAD_LIMIT)
    async with slots:
        value: T = await asyncio.shield(execution.daemon_thread(fn, *args, name="adapter-step"))
        return value


#: exceptions that mean the caller ended the run (recorded ``cancelled``, not as an error)
_CANCELLED = (asyncio.CancelledError, KeyboardInterrupt)


def cancellation(exc: BaseException | None) -> bool:
    """``exc`` is the caller's cancellation, or an error raised from one (its cause or context
    chain): a model transport that reports the cancelled request as a connection error, say --
    what the Agents SDK calls an abort-like error.  Such a run is ``cancelled``, whatever the
    framework raises."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _CANCELLED):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _ended_on(engine: Any, run: Run, error: BaseException) -> RunOutcome:
    """The outcome of a run an exception ended: ``cancelled`` for a cancellation (also one
    reported as another error), ``error`` otherwise."""
    outcome = _internal_error(engine, run, error)
    if outcome.termination != "cancelled" and cancellation(error):
        outcome.termination = "cancelled"
    return outcome


#: seconds a tool call waits for an earlier call that no framework wrapper has started; then
#: the earlier one is taken as never coming (see :meth:`GuardedRun.tool`)
GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class Execute:
    """Run the tool (the machine reached this call and let it through)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class Answer:
    """Do not run the tool: answer it with ``text`` (a skip's observation, a side effect's
    earlier result, a refusal of invalid arguments, or "not executed: the run is stopping")."""

    text: str


class GuardedRun:
    """One framework run, guarded by a deployment's plugins through its step machine."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        user: str,
        history: Iterable[Mapping[str, Any]] = (),
        tools: ToolRegistry | None = None,
        natures: NatureSpec | None = None,
        model_name: str | None = None,
        meta: dict[str, Any] | None = None,
        profile: str | None = None,
        run_id: str | None = None,
        conversation: Conversation | None = None,
        adapter: str = "adapter",
    ) -> None:
        self.deployment = deployment
        self.engine = deployment.engine
        self.adapter = adapter
        declared: dict[str, dict[str, Any]] = {
            name: t.model_dump(exclude_none=True) for name, t in deployment.config.tools.items()
        }
        for name, spec in (natures or {}).items():
            declared[name] = {**declared.get(name, {}), **dict(spec)}
        self._declared = declared
        self.run = Run(
            user,
            deployment=deployment,
            tools=tools if tools is not None else ToolRegistry(),
            clock=deployment.clock,
            limits=deployment.limits(profile),
            run_id=run_id,
            estimator=deployment.estimator,
            model_name=model_name,
            meta=dict(meta or {}, adapter=adapter),
            conversation=conversation,
        )
        # a live run: shared budgets, and the side-effect ledger across runs and processes
        self.run.shared = deployment.shared
        for m in history:
            self.run.add_message(dict(m))
        if not self.run.messages or self.run.messages[-1].get("role") != "user":
            self.run.add_message({"role": "user", "content": user})
        self._gen = self.engine.machine(self.run)
        self._eff: CallModel | RunTool | None = None
        self._started = False
        self._system_seen = False
        self._model_error: BaseException | None = None
        self.outcome: RunOutcome | None = None
        self._answered: dict[str, str] = {}  # tool call id -> the machine's own observation
        self._seen = 0  # messages of run.messages already scanned for tool answers
        self._claimed: set[str] = set()
        self._preset: dict[str, ToolResult] = {}  # calls the framework refused before running
        self._cond = threading.Condition(threading.RLock())
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        #: what the adapter did where the framework could not follow a verdict exactly;
        #: written into the outcome's evidence under "adapter"
        self.adaptations: list[str] = []
        #: calls the framework (or its provider) ran outside the guards -- hosted tools run on
        #: the provider's side during the model call: written under "hosted_tools"
        self.unguarded: list[dict[str, Any]] = []
        self._refused = False  # the deployment refused the model: the run never started
        #: finish the run (on_stop, the record, ``run_stopped``) only at :meth:`finish`, not
        #: when the machine ends: for frameworks that may still overturn the machine's ending
        #: after its last model call (the Agents SDK's output guardrails); see :meth:`overrule`
        self.hold_end = False
        self._held: RunOutcome | None = None

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """:func:`off_loop` for a step of this run (``guarded.model_turn`` ...)."""
        return await off_loop(self.run, self.deployment, fn, *args, **kwargs)

    # -- tools ---------------------------------------------------------------------------

    def declare(
        self, name: str, description: str = "", parameters: Mapping[str, Any] | None = None
    ) -> None:
        """Make a framework tool known (before the model may call it)."""
        reg = self.run.tools
        if reg is not None and name not in reg:
            reg.add(framework_tool(name, description, parameters, self._declared.get(name)))

    def system(self, text: str | None) -> None:
        """The framework's system prompt (or instructions), counted in token estimates from
        now on; once per run (frameworks add it to each request, not to their history)."""
        if not text or self._system_seen:
            return
        self._system_seen = True
        run = self.run
        if run.messages and run.messages[0].get("role") == "system":
            return
        message = {"role": "system", "content": text}
        run.messages.insert(0, message)
        run.context_tokens += estimate_message(message, run.estimator)
        self._seen += 1

    # -- the machine ---------------------------------------------------------------------

    def _send(self, value: Any) -> None:
        self._step(value)
        self._presets()

    def _presets(self) -> None:
        # calls the framework already refused answer themselves when the machine reaches them
        while isinstance(self._eff, RunTool) and self._eff.call.id in self._preset:
            self._send_not_run(self._preset.pop(self._eff.call.id))

    def _step(self, value: Any) -> None:
        try:
            self._eff = self._gen.send(value) if self._started else next(self._gen)
            self._started = True
        except StopIteration as done:
            self._eff = None
            self._end(done.value)
        except BaseException as exc:
            self._eff = None
            if self.outcome is None:
                self._end(_internal_error(self.engine, self.run, exc))
            raise
        finally:
            self._scan()
            self._wake()

    def _end(self, outcome: RunOutcome) -> None:
        if self.hold_end:
            self._held = self.outcome = outcome  # finished at finish()
            return
        self._finish_run(outcome)

    def _finish_run(self, outcome: RunOutcome) -> None:
        if self.adaptations:
            outcome.evidence = {**outcome.evidence, "adapter": list(self.adaptations)}
        if self.unguarded:
            outcome.evidence = {**outcome.evidence, "hosted_tools": list(self.unguarded)}
        self.outcome = self.engine.finish(self.run, outcome)

    def _scan(self) -> None:
        msgs = self.run.messages
        for m in msgs[self._seen :]:
            if m.get("role") == "tool":
                self._answered[str(m.get("tool_call_id"))] = str(m.get("content"))
        self._seen = len(msgs)

    def _wake(self) -> None:
        self._cond.notify_all()
        waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits
                loop.call_soon_threadsafe(event.set)

    def _not_run(self, reason: str) -> ToolResult:
        """The result for a call the framework did not run: a failure that may be tried
        again (so a side effect's key is not taken as done)."""
        return ToolResult(
            content=self.engine.texts.not_executed.format(reason=reason),
            ok=False,
            error="invalid_arguments",
            retryable=True,
        )

    def _send_not_run(self, result: ToolResult) -> None:
        self._step(result)
        self.run.tools_executed -= 1  # the machine counted the effect; nothing ran

    def _drain(self) -> None:
        """Tools the machine expected but the framework never ran (it moved on to its model):
        answered as not executed, so the transcripts stay aligned."""
        while isinstance(self._eff, RunTool):
            call = self._eff.call
            self.adaptations.append(f"{call.name} ({call.id}) was not run by the framework")
            self._claimed.add(call.id)
            self._send_not_run(self._not_run("not run by the framework"))

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def refused(self) -> bool:
        """The deployment refused the run's model at start-up (the run never started)."""
        return self._refused

    def model_turn(self) -> ModelRequest | None:
        """Advance to the next model call: its request (``notes`` to inject, ``final`` for
        the tool-less wrap-up turn), or None when the run has ended (then answer with
        :attr:`final_answer`).  Calling it again before the response is sent is harmless."""
        with self._cond:
            if self._refused:
                return None
            if self.outcome is None and not self._started:
                self._check_model()
                self._send(None)
            self._drain()
            if isinstance(self._eff, CallModel):
                return self._eff.request
            return None

    def _check_model(self) -> None:
        """The start-up checks ``loopwarden run`` makes (``Deployment.check_model``: the
        ``validate_model`` hook), for the model the framework names -- once per deployment
        and model name, before the run's first hook.  A refused model (``cost_budget``'s
        ``unknown_model = "error"``) raises its :class:`ConfigError` to the framework's
        caller, and the run is dropped without a record: it never started."""
        name = self.run.model_name
        if not name:
            return
        try:
            self.deployment.check_model(name)
        except BaseException:
            self._refused = True
            self._gen.close()
            raise

    def model_failed(self, error: BaseException) -> None:
        """The model call raised ``error``.  Frameworks may retry it (a retry policy, a
        fallback model), so the run goes on; if the exception ends the framework's run,
        :meth:`finish` records it as ``model_error``."""
        with self._cond:
            self._model_error = error

    def model_done(self, response: ModelResponse | BaseException) -> None:
        """Send the framework model's answer (or the exception it raised) to the machine."""
        with self._cond:
            if not isinstance(self._eff, CallModel):
                return  # the run ended meanwhile (or the framework called twice)
            # the last answer's calls are settled: call ids are matched within one answer
            # (some providers number them afresh in every answer: call_0, call_1 ...)
            self._answered.clear()
            self._claimed.clear()
            self._preset.clear()
            self._send(Failed(response) if isinstance(response, BaseException) else response)

    @property
    def replaced(self) -> bool:
        """The model's last answer must not stand as it is: the run ended on it by a guard
        (a soft stop's wrap-up, whose tool calls are dropped, or a hard stop) -- answer with
        :attr:`final_answer` and no tool calls."""
        o = self.outcome
        return o is not None and o.termination != "final_answer"

    @property
    def final_answer(self) -> str:
        o = self.outcome
        if o is not None and o.final_answer is not None:
            return o.final_answer
        return self.engine.settings.fallback_answer

    def _decide(self, call_id: str) -> Execute | Answer | None:
        if call_id in self._answered:
            self._claimed.add(call_id)
            return Answer(self._answered[call_id])
        eff = self._eff
        if isinstance(eff, RunTool):
            if eff.call.id == call_id:
                if call_id in self._claimed:
                    return Answer(
                        self.engine.texts.not_executed.format(reason="this call is already running")
                    )
                self._claimed.add(call_id)
                return Execute(call_id)
            return None  # an earlier call is still on its way: wait for it
        self.adaptations.append(f"call {call_id} was not proposed in the model's last answer")
        return Answer(self.engine.texts.not_executed.format(reason="unknown call"))

    def _abandon(self, waited_for: str) -> None:
        """An earlier call that no framework wrapper has claimed in :data:`GRACE_S`: taken as
        never coming (refused before execution, or run out of order) -- answered as not run,
        so the later calls go on.  Should it come after all, it gets that answer too."""
        eff = self._eff
        if (
            isinstance(eff, RunTool)
            and eff.call.id == waited_for
            and waited_for not in self._claimed
        ):
            self.not_run(waited_for, "not run by the framework")

    def _blocking(self) -> str | None:
        eff = self._eff
        if isinstance(eff, RunTool) and eff.call.id not in self._claimed:
            return eff.call.id
        return None

    def tool(self, call_id: str) -> Execute | Answer:
        """What to do with the framework's tool call ``call_id`` (waits for earlier calls)."""
        with self._cond:
            while True:
                decision = self._decide(call_id)
                if decision is not None:
                    return decision
                blocking = self._blocking()
                if not self._cond.wait(GRACE_S) and blocking is not None:
                    self._abandon(blocking)

    async def atool(self, call_id: str) -> Execute | Answer:
        """:meth:`tool` for async frameworks: waits on the event loop."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                decision = self._decide(call_id)
                if decision is not None:
                    return decision
                blocking = self._blocking()
                event = asyncio.Event()
                self._waiters.append((loop, event))
            try:
                await asyncio.wait_for(event.wait(), GRACE_S)
            except asyncio.TimeoutError:
                if blocking is not None:
                    with self._cond:
                        self._abandon(blocking)

    def not_run(self, call_id: str, reason: str) -> None:
        """The framework will not run ``call_id`` (it refused the arguments, say): the machine
        gets a not-executed result for it, now or when it reaches the call."""
        with self._cond:
            if call_id in self._answered or call_id in self._claimed:
                return
            self.adaptations.append(f"call {call_id} was not run by the framework: {reason}")
            result = self._not_run(reason)
            eff = self._eff
            if isinstance(eff, RunTool) and eff.call.id == call_id:
                self._claimed.add(call_id)
                self._send_not_run(result)
                self._presets()
            else:
                self._preset[call_id] = result

    def release(self, call_id: str) -> None:
        """The framework paused the call before it finished (an interrupt): it may come again."""
        with self._cond:
            self._claimed.discard(call_id)

    def tool_done(self, call_id: str, result: ToolResult) -> None:
        """Send the result of an executed tool call."""
        with self._cond:
            eff = self._eff
            if isinstance(eff, RunTool) and eff.call.id == call_id:
                self._send(result)

    def finish(self, error: BaseException | None = None, *, detail: str | None = None) -> None:
        """The framework's run is over: finish loopwarden's run if the machine has not
        (``ended_by_framework``, or ``error`` when ``error`` is given)."""
        with self._cond:
            if self._refused:
                return  # refused at start-up: no run to finish
            if (
                error is not None
                and error is self._model_error
                and not cancellation(error)  # a cancellation is the caller's
                and isinstance(self._eff, CallModel)
            ):
                self._send(Failed(error))  # the machine's own model_error outcome
            if self._held is not None:  # the machine's held ending stands, unless the
                held, self._held = self._held, None  # framework raised after it
                if error is not None and error is not self._model_error:
                    held = _ended_on(self.engine, self.run, error)
                self._finish_run(held)
                self._wake()
                return
            if self.outcome is not None:
                return
            if error is None:
                self._unrun(detail or "the framework ended the run")
                if self.finished:  # a verdict on the unrun call ended it
                    return
            self._gen.close()
            self._eff = None
            if error is not None:
                outcome = _ended_on(self.engine, self.run, error)
            else:
                outcome = RunOutcome(
                    termination=ENDED_BY_FRAMEWORK,
                    evidence={"detail": detail or "the framework ended the run"},
                    final_answer=self.run.best_answer or self.engine.settings.fallback_answer,
                    final_answer_present=self.run.best_answer is not None,
                )
            self._finish_run(outcome)  # the framework's run is over: nothing left to hold
            self._wake()

    def end_by_framework(self, detail: str, answer: str | None, **evidence: Any) -> None:
        """The framework ended the run (``ended_by_framework``) and its caller received
        ``answer`` (None: no answer, an exception): the record says what the caller got, not
        loopwarden's fallback text.  ``evidence`` adds keys next to ``detail``.  No effect on
        a run that already ended.  Calls of the last answer that the framework never started
        are answered as not run first (a side effect's claim is released)."""
        self._conclude(
            detail,
            RunOutcome(
                termination=ENDED_BY_FRAMEWORK,
                evidence={"detail": detail, **evidence},
                final_answer=answer,
                final_answer_present=False,
            ),
        )

    def answered(self, text: str | None) -> None:
        """The framework ended the run on the model's own answer ``text`` after running the
        tool calls proposed beside it (pydantic-ai's output tool called together with function
        tools): ``final_answer``, as if the model had answered alone.  No effect on a run that
        already ended (a verdict on one of those calls stands)."""
        self._conclude(
            "the framework ended the run on the model's answer",
            RunOutcome(
                termination="final_answer", final_answer=text, final_answer_present=text is not None
            ),
        )

    def _conclude(self, detail: str, outcome: RunOutcome) -> None:
        """End a run the framework ended with ``outcome``, unless it has ended: the calls of the
        last answer the framework never started are answered as not run first."""
        with self._cond:
            if self._refused or self.outcome is not None:
                return
            self._unrun(detail)
            if self.finished:  # a verdict on the unrun call ended it
                return
            self._gen.close()
            self._eff = None
            self._end(outcome)
            self._wake()

    def _unrun(self, detail: str) -> None:
        """The calls of the last answer that the framework never started, answered as not
        run (a side effect's claim is released: the call may come again in another run)."""
        while isinstance(self._eff, RunTool) and self._eff.call.id not in self._claimed:
            self.adaptations.append(f"{self._eff.call.name} was not run: {detail}")
            self._claimed.add(self._eff.call.id)
            self._send_not_run(self._not_run("the framework ended the run"))

    def stopped_error(self) -> GuardStopped:
        """The run's stop as the :class:`~loopwarden.exceptions.GuardStopped` to raise where
        the framework needs a structured output that the stop did not give."""
        o = self.outcome
        return GuardStopped(
            run_id=self.run.run_id,
            termination=o.termination if o is not None else ENDED_BY_FRAMEWORK,
            stopped_by=o.stopped_by if o is not None else None,
            soft=bool(o and o.soft),
            final_answer=self.final_answer,
        )

    @property
    def expects_tool(self) -> bool:
        """The machine waits for the result of a tool call of the model's last answer."""
        return isinstance(self._eff, RunTool)

    def overrule(self, outcome: RunOutcome) -> None:
        """End the run with ``outcome`` instead of the machine's ending that :attr:`hold_end`
        holds (or, when the machine has not ended, instead of ``ended_by_framework``): the
        framework overturned it after the last model call -- a guardrail rejected the final
        answer, say.  A run already finished is left as it is."""
        with self._cond:
            if self._refused or (self.outcome is not None and self._held is None):
                return
            self._held = None
            self._gen.close()
            self._eff = None
            self._finish_run(outcome)
            self._wake()
