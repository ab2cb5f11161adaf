"""The drivers: run the step machine to its end, executing its effects.

:func:`drive` (sync) and :func:`adrive` (async) call the model for a ``CallModel`` effect and
execute a ``RunTool`` through :mod:`loopwarden.execution`; the replay driver
(:mod:`loopwarden.replay`) and the framework adapters answer the same effects from a recording
or a framework's own loop.  Each arms the watchdog that ends a run still going past its
deadline, and finishes the run whatever happens.  Public through :mod:`loopwarden.loop`.

**Store I/O never blocks the event loop.**  Between two effects the machine runs hooks, and
some of them wait on the network or the disk: the shared store's budget reservations
(``spend_limits``) and the side-effect ledger's claims.  When a run may do such I/O
(:func:`blocking_io`, asked of a deployment's plugins once), :func:`adrive` advances the
machine -- the synchronous code between two effects, ``on_start`` and ``on_stop`` included --
in the event loop's machine threads, one step at a time and in one ``contextvars.Context``
per run, while the event loop serves other runs; the model and the tools are still awaited on
the loop.  The steps queue for one daemon thread, which takes them in turn and hands the
results back in batches (one loop wake-up for all the steps finished meanwhile): a thread per
step cost each step a thread hand-off and GIL traffic with the loop.  When the threads are
held -- every one in a step for :data:`OFFLOAD_STALE_S` while steps wait: a slow or hung
store -- each waiting step gets a thread of its own, up to :data:`OFFLOAD_LIMIT` per loop, so
a hung store call holds only its own run (:class:`_MachineThreads`).  A plugin whose hooks do
blocking I/O says so with a true ``blocking_io`` attribute; its hooks stay plain synchronous
functions.  Runs without such I/O, and every sync run, advance the machine inline as before
(no thread hop).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loopwarden import execution
from loopwarden._deadline import DEADLINE_SLACK_S, WATCHDOG, await_within
from loopwarden._effects import CallModel, Effect, Failed, Machine
from loopwarden._outcomes import best_effort
from loopwarden.events import ModelRequest
from loopwarden.exceptions import ModelError
from loopwarden.run import Run, RunOutcome

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment
    from loopwarden.loop import Engine
    from loopwarden.models import Model

__all__ = ["adrive", "blocking_io", "drive"]

log = logging.getLogger("loopwarden.loop")

WATCHDOG_SLACK_S = 1.0  # how long past its deadline a run may go before the watchdog ends it
#: machine threads per event loop, so machine steps at once (more wait for a turn): bounds the
#: threads, and the store connections they hold (redis-py's pool refuses a 101st)
OFFLOAD_LIMIT = 32
#: how long the oldest waiting step may wait, with every machine thread in one step as long,
#: before each waiting step gets a thread (the store is slow or hung), up to OFFLOAD_LIMIT
OFFLOAD_STALE_S = 0.05
#: how long the oldest waiting step may wait, whatever the threads do, before one more starts
OFFLOAD_BACKLOG_S = 0.25


def drive(engine: Engine, run: Run, model: Model) -> RunOutcome:
    """Run the machine synchronously: call the model and the tools, finish the run."""
    gen = engine.machine(run)
    run_tool = engine.run_tool_sync  # an Engine subclass may wrap tool execution
    unwatch = _nothing
    try:
        eff: Effect = next(gen)
        unwatch = _watch(engine, run)
        while True:
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                gen.close()
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


def blocking_io(run: Run) -> bool:
    """Whether ``run``'s hooks may block on I/O: it has a shared store, and a plugin of its
    deployment declares ``blocking_io`` (spend_limits with budgets) or one of its tools is a
    side effect that the store's ledger claims.  The plugins' answer is asked once per
    deployment (its plugins are fixed when it is built); the tools, which a registry may
    gain, are looked at per run, and only with the ledger on."""
    shared = run.shared
    if shared is None:
        return False
    deployment = run.deployment
    if deployment is not None:
        declared = _DECLARED.get(deployment)
        if declared is None:
            declared = _DECLARED[deployment] = any(
                getattr(p.obj, "blocking_io", False) is True for p in deployment.plugins
            )
        if declared:
            return True
    tools = run.tools
    return bool(shared.config.ledger and tools is not None and any(t.side_effect for t in tools))


#: per deployment: whether one of its plugins declares ``blocking_io``
_DECLARED: weakref.WeakKeyDictionary[Deployment, bool] = weakref.WeakKeyDictionary()


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


class _MachineThreads:
    """The daemon threads that advance one event loop's offloaded machine steps.

    Steps wait in one FIFO queue.  One thread takes them in turn while they finish promptly:
    a step is short, and one thread fed by a queue costs less CPU than a hand-off to a thread
    per step (each wake-up is a lock hand-off and GIL traffic with the loop).  More threads
    start when steps wait too long (see :meth:`_check`), up to :data:`OFFLOAD_LIMIT`: one hung
    store call holds one run, never the others.  Results go back in batches: one loop wake-up
    delivers every step finished meanwhile.  A thread idle for ``idle_s`` seconds ends; the
    pool holds its loop weakly.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float = 10.0) -> None:
        self.idle_s = idle_s
        self._loop = weakref.ref(loop)  # the threads never keep a closed loop alive
        self._cond = threading.Condition(threading.Lock())
        self._jobs: collections.deque[_Job] = collections.deque()
        self._threads = 0  # started and not ended
        self._idle = 0  # waiting for a step
        self._done: list[tuple[asyncio.Future[Any], bool, Any]] = []  # not yet delivered
        self._watch: asyncio.TimerHandle | None = None
        self._running: dict[int, float] = {}  # per busy thread: when its step started

    def submit(self, context: contextvars.Context, fn: Callable[..., Any], *args: Any) -> Any:
        """Queue ``context.run(fn, *args)``; return a future for its value (loop thread)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._cond:
            self._jobs.append((time.monotonic(), context, fn, args, future))
            if self._idle > len(self._jobs) - 1:
                self._cond.notify()
            elif self._threads == 0:
                self._start(1)
        if self._watch is None:
            self._watch = loop.call_later(OFFLOAD_STALE_S, self._check)
        return future

    def _check(self) -> None:
        """Start threads when steps wait: one for each waiting step when the oldest has waited,
        and every thread has been in its step, for :data:`OFFLOAD_STALE_S` (the threads are
        held: a slow or hung store); one more when the oldest has waited
        :data:`OFFLOAD_BACKLOG_S` (the steps come faster than the threads finish them).  A
        step slowed only by the event loop's own work for the GIL starts none: more threads
        would not help that, and each costs CPU in hand-offs."""
        self._watch = None
        with self._cond:
            if not self._jobs:
                return
            now = time.monotonic()
            since, waited = now - OFFLOAD_STALE_S, self._jobs[0][0]
            if self._idle == 0 and waited <= since:
                room = OFFLOAD_LIMIT - self._threads
                if all(started <= since for started in self._running.values()):
                    self._start(min(len(self._jobs), room))  # held: one per waiting step
                elif waited <= now - OFFLOAD_BACKLOG_S:
                    self._start(min(1, room))  # draining too slowly: one more
        loop = self._loop()
        if loop is not None:
            self._watch = loop.call_later(OFFLOAD_STALE_S, self._check)

    def _start(self, n: int) -> None:  # under the lock
        """Start ``n`` threads: the loop starts the first, each starts the next (starting a
        thread waits for it to run, which under load can take a GIL switch interval)."""
        if n > 0:
            self._threads += n
            if not self._spawn(n):
                self._threads -= n

    def _spawn(self, n: int) -> bool:
        """Start a thread that starts ``n - 1`` more; False when none could start."""
        name = f"loopwarden-machine-{next(_NAMES)}"
        try:
            threading.Thread(target=self._serve, args=(n - 1,), name=name, daemon=True).start()
        except RuntimeError:  # the process may start no more: the running threads serve on
            log.warning("could not start a machine thread; %d wait for the others", n)
            return False
        return True

    def _serve(self, more: int) -> None:
        if more and not self._spawn(more):
            with self._cond:
                self._threads -= more
        cond, jobs, me = self._cond, self._jobs, threading.get_ident()
        while True:
            with cond:
                while not jobs:
                    self._idle += 1
                    woken = cond.wait(self.idle_s)
                    self._idle -= 1
                    if not woken and not jobs:
                        self._threads -= 1
                        return
                _, context, fn, args, future = jobs.popleft()
                self._running[me] = time.monotonic()
            try:
                result: tuple[bool, Any] = (True, context.run(fn, *args))
            except BaseException as exc:  # delivered to the run that waits for the step
                result = (False, exc)
            del context, fn, args
            self._deliver(future, *result)
            del future, result

    def _deliver(self, future: asyncio.Future[Any], ok: bool, payload: Any) -> None:
        with self._cond:
            del self._running[threading.get_ident()]
            self._done.append((future, ok, payload))
            first = len(self._done) == 1
        loop = self._loop()
        if first and loop is not None:  # later ones ride on the wake-up already asked for
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._hand_back)

    def _hand_back(self) -> None:
        with self._cond:
            done, self._done = self._done, []
        for future, ok, payload in done:
            if future.done():
                continue
            if ok:
                future.set_result(payload)
            else:
                future.set_exception(payload)


_Job = tuple[float, contextvars.Context, Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]
_NAMES = itertools.count(1)
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _MachineThreads] = (
    weakref.WeakKeyDictionary()
)


def machine_threads(loop: asyncio.AbstractEventLoop) -> _MachineThreads:
    """The running event loop's machine threads (made on first use)."""
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _MachineThreads(loop)
    return pool


class _Stepper:
    """Advances one async run's machine: inline, or -- when the run may block on I/O (see
    :func:`blocking_io`) -- in the event loop's machine threads, so the event loop never
    waits for a store."""

    def __init__(self, engine: Engine, run: Run, gen: Machine) -> None:
        self.engine, self.run, self.gen = engine, run, gen
        self.context = contextvars.copy_context() if blocking_io(run) else None
        self.busy: asyncio.Future[Any] | None = None  # a step running in a machine thread

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        context = self.context
        if context is None:
            return fn(*args)
        pool = machine_threads(asyncio.get_running_loop())
        busy = self.busy = pool.submit(context, fn, *args)
        # shielded: a cancelled run still lets the step reach its next effect (the store's
        # timeout bounds it) before the run is finished -- never two threads in one machine
        return await asyncio.shield(busy)

    async def step(self, value: Any) -> Effect | _Done:
        return await self.call(_step, self.gen, value)  # type: ignore[no-any-return]

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
    run_tool_async = engine.run_tool_async  # an Engine subclass may wrap tool execution
    acomplete = getattr(model, "acomplete", None)
    unwatch = _nothing
    try:
        eff = _step(gen, None) if inline else await stepper.step(None)
        unwatch = _watch(engine, run)
        while not isinstance(eff, _Done):
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                gen.close()
                return run.outcome
            if isinstance(eff, CallModel):
                try:
                    if acomplete is not None:
                        aw: Awaitable[Any] = acomplete(eff.request)
                    else:
                        # a sync model in an async run: a daemon worker, so that a hung call
                        # never keeps asyncio.run() from exiting
                        aw = execution.daemon_thread(model.complete, eff.request, name="model")
                    value = await _model_within(aw, eff.request, run)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = await run_tool_async(eff, run)
            eff = _step(gen, value) if inline else await stepper.step(value)
        return engine.finish(run, eff.outcome) if inline else await stepper.finish(eff.outcome)
    except BaseException as exc:
        await stepper.settle()
        if run.outcome is None:
            await stepper.finish(internal_error(engine, run, exc))
        raise
    finally:
        unwatch()


def internal_error(engine: Engine, run: Run, exc: BaseException) -> RunOutcome:
    """The outcome of a run the machine itself failed in (or that was interrupted)."""
    kind = "cancelled" if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else "error"
    text = engine.redact(run, f"{type(exc).__name__}: {execution.safe_str(exc)}")
    return RunOutcome(termination=kind, evidence={"error": text}, error=text)


async def _model_within(aw: Awaitable[Any], request: ModelRequest, run: Run) -> Any:
    """Await a model call, abandoning it when ``request.timeout`` passes or the run is
    cancelled (a watchdog for any async model, the built-in client bounds itself too).
    The value is whatever the model returned: the machine checks it."""
    if request.timeout is None:
        return await aw
    ending, value = await await_within(aw, request.timeout + DEADLINE_SLACK_S, run.cancel)
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
