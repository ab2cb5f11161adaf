"""The drivers: run the step machine to its end, executing its effects.

:func:`drive` (sync) and :func:`adrive` (async) call the model for a ``CallModel`` effect and
execute a ``RunTool`` through :mod:`loopwarden.engine.execution`; the replay driver
(:mod:`loopwarden.traffic.replay`) and the framework adapters answer the same effects from a
recording or a framework's own loop.  A tool call goes from the driver to execution directly
(:func:`tool_runner`), through the engine only when an Engine subclass wraps it.  Each arms
the watchdog that ends a run still going past its deadline, and finishes the run whatever
happens.  Public through :mod:`loopwarden.engine.loop`.

**Store I/O never blocks the event loop.**  Between two effects the machine runs hooks, and
some of them wait on the network or the disk: the shared store's budget reservations
(``spend_limits``), the side-effect ledger's claims, the fleet's circuit breakers.  When a run
may do such I/O (:func:`blocking_io`; a deployment's plugins are asked once), :func:`adrive`
advances the machine -- the synchronous code between two effects, ``on_start`` and
``on_stop`` included -- so that the loop never waits, in one ``contextvars.Context`` per run:

* ``[store] async_calls = "threads"`` (the default): each such step runs in a reused daemon
  worker thread, at most :data:`OFFLOAD_LIMIT` at once per event loop -- one hand-off per
  step; the worker goes straight on after each store call;
* ``"loop"``: the step runs on the loop's thread as a step of :mod:`loopwarden.store.bridge`
  (it needs ``greenlet``, ``loopwarden[serving]``), and each store call it makes is I/O the
  driver awaits (made on the store's owner threads) while the loop serves other runs -- one
  hand-off per store call, and the answer waits for the loop to come back to the run.
  bench/README.md ("Serving, issue 35") measured it slower than threads at 20 and at 200
  concurrent conversations on 2 cores, so it is not the default.

A plugin whose hooks wait on the store, and on nothing else, says so with ``blocking_io =
"store"``; one whose hooks do other blocking I/O (a web service, a file) with ``blocking_io =
True``, and its runs' steps always run in worker threads.  Either way the hooks stay plain
synchronous functions.  Runs without such I/O, and every sync run, advance the machine
inline (no switch, no hop).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loopwarden.clock import DEADLINE_SLACK_S, WATCHDOG, await_in_task, await_within
from loopwarden.engine import execution
from loopwarden.engine.effects import CallModel, Effect, Failed, Machine, NotStarted, RunTool
from loopwarden.engine.loop import wraps_tools
from loopwarden.engine.outcomes import best_effort
from loopwarden.events import ModelRequest, ToolResult
from loopwarden.exceptions import ModelError
from loopwarden.run import Run, RunOutcome
from loopwarden.store import bridge

if TYPE_CHECKING:
    from loopwarden.engine.loop import Engine
    from loopwarden.models import Model

__all__ = ["abandon", "adrive", "atool_runner", "blocking_io", "drive", "tool_runner"]

log = logging.getLogger("loopwarden.loop")

WATCHDOG_SLACK_S = 1.0  # how long past its deadline a run may go before the watchdog ends it
#: machine steps one event loop runs in worker threads at once (more wait for a turn): bounds
#: the threads, and the store connections they hold (redis-py's pool refuses a 101st)
OFFLOAD_LIMIT = 32
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def drive(engine: Engine, run: Run, model: Model) -> RunOutcome:
    """Run the machine synchronously: call the model and the tools, finish the run."""
    gen = engine.machine(run)
    run_tool = tool_runner(engine)
    unwatch = _nothing
    try:
        eff: Effect = next(gen)
        unwatch = _watch(engine, run)
        while True:
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                abandon(gen, eff)
                return run.outcome
            if isinstance(eff, CallModel):
                try:
                    value: Any = model.complete(eff.request)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = run_tool(eff, run)
            eff = gen.send(value)
    except StopIteration as done:
        return engine.finish(run, done.value)
    except BaseException as exc:
        if run.outcome is None:
            engine.finish(run, internal_error(engine, run, exc))
        raise
    finally:
        unwatch()


def tool_runner(engine: Engine) -> Callable[[RunTool, Run], ToolResult]:
    """How a sync driver executes a ``RunTool``: :func:`~loopwarden.engine.execution.run_tool_sync`
    with the engine's texts, called directly -- or the engine's own ``run_tool_sync`` when an
    Engine subclass overrides it to wrap tool execution (see ``wraps_tools`` in the loop)."""
    if wraps_tools(engine):
        return engine.run_tool_sync
    return functools.partial(execution.run_tool_sync, engine.texts)


def atool_runner(engine: Engine) -> Callable[[RunTool, Run], Awaitable[ToolResult]]:
    """:func:`tool_runner` for async drivers (``run_tool_async``)."""
    if wraps_tools(engine, is_async=True):
        return engine.run_tool_async
    return functools.partial(execution.run_tool_async, engine.texts)


def blocking_io(run: Run) -> bool:
    """Whether ``run``'s hooks may block on I/O: it has a shared store, and a plugin of its
    deployment declares ``blocking_io`` (``"store"``: spend_limits with budgets,
    circuit_breaker) or one of its tools is a side effect that the store's ledger claims.
    The plugins' answer is asked once per deployment (its plugins are fixed when it is
    built); the tools, which a registry may gain, are looked at per run, and only with the
    ledger on."""
    shared = run.shared
    if shared is None:
        return False
    deployment = run.deployment
    if deployment is not None and deployment.plugins.blocking_io:
        return True
    tools = run.tools
    return bool(shared.config.ledger and tools is not None and any(t.side_effect for t in tools))


def steps_on_loop(deployment: Any) -> bool:
    """Whether the steps of ``deployment``'s runs that may block advance on the event loop,
    their store calls awaited (:mod:`loopwarden.store.bridge`): ``[store] async_calls =
    "loop"``, ``greenlet`` is installed (else a warning, once, and worker threads), and no
    plugin waits on I/O other than the store's."""
    if deployment is None or deployment.config.store.async_calls != "loop":
        return False
    if not bridge.available():
        global _WARNED
        if not _WARNED:
            _WARNED = True
            log.warning(
                '[store] async_calls = "loop" needs greenlet (pip install '
                "'loopwarden[serving]'): store-using steps run in worker threads instead"
            )
        return False
    return not deployment.plugins.other_io


_WARNED = False


class _Done:
    """The machine returned: its (not yet finished) outcome."""

    __slots__ = ("outcome",)

    def __init__(self, outcome: RunOutcome) -> None:
        self.outcome = outcome


def _step(gen: Machine, value: Any) -> Effect | _Done:
    """Advance the machine to its next effect (StopIteration cannot cross a Future)."""
    try:
        return gen.send(value)
    except StopIteration as done:
        return _Done(done.value)


class _Stepper:
    """Advances one async run's machine: inline, or -- when the run may block on I/O (see
    :func:`blocking_io`) -- so that the event loop never waits for a store: on the loop, its
    store calls awaited (:mod:`loopwarden.store.bridge`), or in a worker thread when
    ``greenlet`` is not installed."""

    def __init__(self, engine: Engine, run: Run, gen: Machine) -> None:
        self.engine, self.run, self.gen = engine, run, gen
        self.context = contextvars.copy_context() if blocking_io(run) else None
        self.on_loop = self.context is not None and steps_on_loop(run.deployment)
        self.busy: asyncio.Future[Any] | None = None  # a step still waiting for its I/O
        #: the effect the machine waits at and the driver has not started yet: set by the
        #: step itself (in its thread or on the loop), so also when the run was cancelled
        #: while the step ran; cleared by the driver as it starts the effect
        self.parked: Effect | None = None

    def _advance(self, value: Any) -> Effect | _Done:
        eff = _step(self.gen, value)
        self.parked = None if isinstance(eff, _Done) else eff
        return eff

    def _abandon(self) -> None:
        parked, self.parked = self.parked, None
        abandon(self.gen, parked)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        context = self.context
        if context is None:
            return fn(*args)
        if self.on_loop:
            # on the loop's thread; the store calls it makes are awaited here (store.bridge)
            done, value = bridge.start(context, fn, *args)
            if done:
                return value
            # shielded: a cancelled run still lets the step reach its next effect (the
            # store's timeout bounds it) before the run is finished
            waiting: asyncio.Future[Any] = asyncio.ensure_future(bridge.finish(value))
            self.busy = waiting
            return await asyncio.shield(waiting)
        loop = asyncio.get_running_loop()
        slots = _SLOTS.get(loop)
        if slots is None:
            slots = _SLOTS[loop] = asyncio.Semaphore(OFFLOAD_LIMIT)
        async with slots:
            busy = self.busy = execution.daemon_thread(context.run, fn, *args, name="machine")
            # shielded: a cancelled run still lets the step reach its next effect (the store's
            # timeout bounds it) before the run is finished -- never two threads in one machine
            return await asyncio.shield(busy)

    async def step(self, value: Any) -> Effect | _Done:
        return await self.call(self._advance, value)  # type: ignore[no-any-return]

    async def abandon(self) -> None:
        """After a cancellation (the step done, see :meth:`settle`): release what the
        machine claimed for a call that never started, off the loop like any step."""
        if isinstance(self.parked, RunTool):
            await self.call(self._abandon)

    async def finish(self, outcome: RunOutcome) -> RunOutcome:
        return await self.call(self.engine.finish, self.run, outcome)  # type: ignore[no-any-return]

    async def settle(self) -> None:
        """Wait for a step still running in its thread (after a cancellation)."""
        busy = self.busy
        if busy is not None and not busy.done():
            await asyncio.wait({busy})


async def adrive(engine: Engine, run: Run, model: Model) -> RunOutcome:
    """Run the machine asynchronously (models with ``acomplete`` are awaited; a run whose
    hooks may block on I/O advances its machine off the event loop, see the module doc)."""
    gen = engine.machine(run)
    stepper = _Stepper(engine, run, gen)
    inline = stepper.context is None  # no I/O in its hooks: steps run here, as before
    run_tool_async = atool_runner(engine)
    acomplete = getattr(model, "acomplete", None)
    in_task = acomplete is not None and getattr(model, "ends_when_cancelled", False) is True
    unwatch = _nothing
    try:
        eff = _step(gen, None) if inline else await stepper.step(None)
        unwatch = _watch(engine, run)
        while not isinstance(eff, _Done):
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                if inline:
                    abandon(gen, eff)
                else:
                    await stepper.call(abandon, gen, eff)
                return run.outcome
            stepper.parked = None  # started now: a cancel from here on hits it in flight
            if isinstance(eff, CallModel):
                try:
                    if acomplete is not None:
                        aw: Awaitable[Any] = acomplete(eff.request)
                    else:
                        # a sync model in an async run: a daemon worker, so that a hung call
                        # never keeps asyncio.run() from exiting
                        aw = execution.daemon_thread(model.complete, eff.request, name="model")
                    value = await _model_within(aw, eff.request, run, in_task)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = await run_tool_async(eff, run)
            eff = _step(gen, value) if inline else await stepper.step(value)
        return engine.finish(run, eff.outcome) if inline else await stepper.finish(eff.outcome)
    except BaseException as exc:
        await stepper.settle()
        await stepper.abandon()
        if run.outcome is None:
            await stepper.finish(internal_error(engine, run, exc))
        raise
    finally:
        unwatch()


def abandon(gen: Machine, unstarted: Effect | None) -> None:
    """Close the machine, which waits at ``unstarted`` -- an effect its driver will never
    start (the run was cancelled, ended by the watchdog, or its stream's consumer left).  A
    tool call is thrown :class:`NotStarted` first, so that the tool turn releases its ledger
    claim: the side effect was never made."""
    if isinstance(unstarted, RunTool):
        with contextlib.suppress(NotStarted, StopIteration):
            gen.throw(NotStarted())
    gen.close()


def internal_error(engine: Engine, run: Run, exc: BaseException) -> RunOutcome:
    """The outcome of a run the machine itself failed in (or that was interrupted)."""
    kind = "cancelled" if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else "error"
    text = engine.redact(run, f"{type(exc).__name__}: {execution.safe_str(exc)}")
    return RunOutcome(termination=kind, evidence={"error": text}, error=text)


async def _model_within(
    aw: Awaitable[Any], request: ModelRequest, run: Run, in_task: bool = False
) -> Any:
    """Await a model call, abandoning it when ``request.timeout`` passes or the run is
    cancelled (a watchdog for any async model, the built-in client bounds itself too).
    ``in_task``: the model ends when cancelled (``ends_when_cancelled``), so the call is
    bounded in this task, without a task of its own.  The value is whatever the model
    returned: the machine checks it."""
    if request.timeout is None:
        return await aw
    within = await_in_task if in_task else await_within
    ending, value = await within(aw, request.timeout + DEADLINE_SLACK_S, run.cancel)
    if ending == "ok":
        return value
    if ending == "cancelled":
        raise ModelError("the run was cancelled during the model call", kind="cancelled")
    raise ModelError(f"the model did not answer within {request.timeout:.3f}s", kind="timeout")


def _watch(engine: Engine, run: Run) -> Callable[[], None]:
    """Have the watchdog end ``run`` shortly after ``run.deadline`` unless it ended itself."""
    if run.deadline is None:
        return _nothing
    seconds = max(0.0, run.deadline - run.clock.now()) + WATCHDOG_SLACK_S

    def fire() -> None:
        if run.outcome is None:
            log.error(
                "run %s passed its deadline by %.1fs without reaching a check (a hook, "
                "tool or model call blocks): the watchdog ends it",
                run.run_id,
                WATCHDOG_SLACK_S,
            )
            engine.finish(
                run,
                RunOutcome(
                    termination="timeout",
                    evidence={
                        "watchdog": True,
                        "elapsed_s": round(run.elapsed, 3),
                        "deadline_s": round(run.deadline - run.started_at, 3)
                        if run.deadline is not None
                        else None,
                    },
                    final_answer=best_effort(engine.settings, run),
                ),
            )

    return WATCHDOG.watch(seconds, fire)


def _nothing() -> None:
    pass
