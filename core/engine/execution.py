"""Tool execution: how the loop runs one tool call under its deadline, and the worker threads
that run blocking tools (the result each way a call can end: :mod:`loopwarden.engine.results`,
re-exported here).

The step machine (:mod:`loopwarden.engine.loop`) never calls a tool itself: it yields a ``RunTool``
effect, and the driver executes it here -- inline, on an event loop of its own, or in a reused
daemon worker thread that is abandoned at the deadline (Python cannot kill a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from loopwarden.clock import (
    CANCEL_GRACE_S,
    Ending,
    await_within,
    bounded_seconds,
    call_within,
)
from loopwarden.config import Texts
from loopwarden.engine.results import (
    cancelled_result,
    error_result,
    retry_after_of,
    safe_str,
    timeout_result,
    to_text,
    tool_result,
)
from loopwarden.events import IN_DOUBT, ToolCall, ToolResult

if TYPE_CHECKING:
    from loopwarden.clock import CancelToken
    from loopwarden.engine.effects import RunTool
    from loopwarden.run import Run

__all__ = [
    "cancelled_result",
    "daemon_thread",
    "error_result",
    "retry_after_of",
    "run_tool_async",
    "run_tool_sync",
    "safe_str",
    "timeout_result",
    "to_text",
    "tool_result",
]

log = logging.getLogger("loopwarden.loop")


class _HasTexts(Protocol):
    """What 0.1 passed instead of the texts: the engine (named by what is read off it, so
    that execution, below the loop, does not name the loop)."""

    @property
    def texts(self) -> Texts: ...


def run_tool_sync(t: Texts | _HasTexts, eff: RunTool, run: Run) -> ToolResult:
    """Execute ``eff`` for a synchronous run: inline, on an event loop of its own (an async
    tool), or in a worker thread under its deadline (a blocking tool) -- and, when the call
    carries a :class:`~loopwarden.events.RetryPlan`, again after a retryable failure.  ``t``
    is the run's :class:`~loopwarden.config.Texts` (or, as in 0.1, the
    :class:`~loopwarden.engine.loop.Engine`)."""
    if not isinstance(t, Texts):  # an Engine: the 0.1 signature
        t = t.texts
    call = eff.call
    if call.delay_s > 0:
        run.clock.sleep(call.delay_s, run.cancel)
    if run.cancel.is_set():  # cancelled before (or during the backoff): never started
        return cancelled_result(t, eff, started=False)
    end = None if call.timeout is None else run.clock.now() + call.timeout
    result = _attempt_sync(t, eff, run, end)
    if not _may_retry(call, result):
        return result
    retries = _Retries(call, run, end)
    while (wait := retries.next_wait(result)) is not None:
        run.clock.sleep(wait, run.cancel)
        if run.cancel.is_set():
            return cancelled_result(t, eff)
        result = _attempt_sync(t, eff, run, end)
    return retries.done(t, result)


def _attempt_sync(t: Texts, eff: RunTool, run: Run, end: float | None) -> ToolResult:
    """One execution of ``eff``, to end by ``end`` on the run's clock (None: no deadline)."""
    tool, ctx = eff.tool, eff.ctx
    started = run.clock.now()
    timeout = None if end is None else max(end - started, 0.0)
    if ctx.deadline is not None and end is not None:
        ctx.deadline = end
    if tool.is_async:
        # on an event loop of its own in a daemon thread: a coroutine that swallows its
        # cancellation at the deadline is abandoned there, not waited for
        try:
            ending, value = call_within(
                asyncio.run,
                _bounded(tool.invoke(eff.arguments, ctx), timeout, run.cancel),
                timeout=None if timeout is None else timeout + CANCEL_GRACE_S,
                cancel=run.cancel,
                name="tool-" + tool.name,
            )
        except Exception as exc:
            return error_result(t, eff, exc, run.clock.now() - started)
        if ending == "cancelled" or (ending == "ok" and value[0] == "cancelled"):
            return cancelled_result(t, eff)
        if ending == "timeout" or value[0] == "timeout":
            return timeout_result(t, eff.call, run.clock.now() - started)
        return tool_result(t, eff, value[1], started, run)
    if timeout is None or tool.context_param is not None:
        # No deadline, or a cooperative tool that honours ctx.deadline: run inline.
        try:
            value = tool.invoke(eff.arguments, ctx)
        except Exception as exc:
            return error_result(t, eff, exc, run.clock.now() - started)
        return tool_result(t, eff, value, started, run)
    # A blocking tool with a deadline: run it in a worker thread and stop waiting at the
    # deadline, or when the run is cancelled.  Python cannot kill the thread; its late
    # result is discarded.
    # a bare lock as the one-shot signal (held here, released by the result or the cancel
    # token): a threading.Event is a Condition, a dozen Python calls per call on both sides
    done = threading.Lock()
    done.acquire()
    wake = functools.partial(_wake, done)
    box: list[Any] = []

    def finished(ok: bool, payload: Any) -> None:
        box.append((ok, payload))
        wake()

    # a fresh context per call, as a new thread would have
    _WORKERS.submit(
        contextvars.Context(),
        tool.invoke,
        (eff.arguments, ctx),
        tool.name,
        finished,
        lambda: bool(box),
    )  # abandoned: the marker appended below
    remove = run.cancel.on_cancel(wake)
    try:
        done.acquire(timeout=bounded_seconds(timeout))
    finally:
        remove()
    if not box or box[0] is None:
        box.append(None)  # abandoned (if the result came just now, it is discarded)
        if run.cancel.is_set():
            return cancelled_result(t, eff)
        return timeout_result(t, eff.call, run.clock.now() - started)
    ok, payload = box[0]
    if not ok:
        return error_result(t, eff, payload, run.clock.now() - started)
    return tool_result(t, eff, payload, started, run)


async def run_tool_async(t: Texts | _HasTexts, eff: RunTool, run: Run) -> ToolResult:
    """Execute ``eff`` for an async run: awaited (an async tool) or in a daemon worker
    thread (a blocking tool), under its deadline, and retried as in :func:`run_tool_sync`.
    ``t`` as for :func:`run_tool_sync`."""
    if not isinstance(t, Texts):  # an Engine: the 0.1 signature
        t = t.texts
    call = eff.call
    if call.delay_s > 0:
        await run.clock.asleep(call.delay_s, run.cancel)
    if run.cancel.is_set():  # cancelled before (or during the backoff): never started
        return cancelled_result(t, eff, started=False)
    end = None if call.timeout is None else run.clock.now() + call.timeout
    result = await _attempt_async(t, eff, run, end)
    if not _may_retry(call, result):
        return result
    retries = _Retries(call, run, end)
    while (wait := retries.next_wait(result)) is not None:
        await run.clock.asleep(wait, run.cancel)
        if run.cancel.is_set():
            return cancelled_result(t, eff)
        result = await _attempt_async(t, eff, run, end)
    return retries.done(t, result)


async def _attempt_async(t: Texts, eff: RunTool, run: Run, end: float | None) -> ToolResult:
    """One execution of ``eff`` in an async run, to end by ``end`` (None: no deadline)."""
    tool, ctx = eff.tool, eff.ctx
    started = run.clock.now()
    timeout = None if end is None else max(end - started, 0.0)
    if ctx.deadline is not None and end is not None:
        ctx.deadline = end
    try:
        if tool.is_async:
            aw = tool.invoke(eff.arguments, ctx)
        else:
            aw = daemon_thread(tool.invoke, eff.arguments, ctx, name=tool.name)
        ending, value = await _bounded(aw, timeout, run.cancel)
    except Exception as exc:
        return error_result(t, eff, exc, run.clock.now() - started)
    if ending == "cancelled":
        return cancelled_result(t, eff)
    if ending == "timeout":
        return timeout_result(t, eff.call, run.clock.now() - started)
    return tool_result(t, eff, value, started, run)


# -- retries the runtime owns ------------------------------------------------------------------

_JITTER = random.Random()  # jitter only spreads retries out: no need for a seeded source


def _wake(done: threading.Lock) -> None:
    """Release ``done`` to wake its waiter; the second of two wakers (the result and the
    cancel token) finds it released already."""
    # not contextlib.suppress: this runs in the worker for every call, and suppress is three
    # Python calls
    try:  # noqa: SIM105
        done.release()
    except RuntimeError:  # release unlocked lock
        pass


def _may_retry(call: ToolCall, result: ToolResult) -> bool:
    """Whether ``result`` is a failure the runtime may retry under ``call``'s plan.

    Only a failure flagged retryable (a 429, a 5xx, a reset connection, a read-only call's
    timeout) -- never a semantic one; only a tool whose nature is declared; a side effect only
    under its declared idempotency keys (the service can then deduplicate), and never after
    a timeout, a cancellation or a death mid-call (its outcome is unknown: ``IN_DOUBT``).
    """
    plan = call.retry
    if plan is None or plan.attempts < 2 or result.ok or not result.retryable:
        return False
    if result.error == "cancelled" or (result.error in IN_DOUBT and not plan.timeouts):
        return False
    tool = call.tool
    if tool is None or not tool.declared:
        return False
    return not call.side_effect or (
        tool.idempotency_keys is not None and result.error not in IN_DOUBT
    )


class _Retries:
    """The attempts of one call the runtime retries: when to try again, and what it took."""

    __slots__ = ("attempts", "call", "end", "errors", "plan", "run", "waited")

    def __init__(self, call: ToolCall, run: Run, end: float | None) -> None:
        assert call.retry is not None
        self.call, self.run, self.plan, self.end = call, run, call.retry, end
        self.attempts = 1
        self.errors: list[str] = []  # the error kind of each failed attempt
        self.waited = 0.0

    def next_wait(self, result: ToolResult) -> float | None:
        """After an attempt: the wait before the next one, or None to stop -- the attempt
        succeeded or failed for good, the plan's attempts are spent, or the retry would not
        start within the call's time (``end``), its ``Retry-After`` included."""
        if result.ok:
            return None
        self.errors.append(result.error or "error")
        plan = self.plan
        if not result.retryable or result.error == "cancelled":
            return None
        if result.error in IN_DOUBT and (self.call.side_effect or not plan.timeouts):
            return None  # a side effect that may have happened is never tried again
        if self.attempts >= plan.attempts:
            return None
        if result.retry_after is not None:
            if result.retry_after > plan.max_backoff_s:
                return None  # the service asks for more patience than the plan has
            wait = result.retry_after
        else:
            wait = plan.wait(self.attempts, _JITTER.random())
        if self.end is not None and self.run.clock.now() + wait >= self.end:
            return None
        self.waited += wait
        self.attempts += 1
        return wait

    def done(self, t: Texts, result: ToolResult) -> ToolResult:
        """The one observation the model sees: the last attempt's, saying what it took."""
        if self.attempts < 2:
            return result
        answer = result.content  # the tool's own output: what detectors compare
        template = t.tool_retried_ok if result.ok else t.tool_retried_failed
        result.content = template.format(
            content=result.content, name=self.call.name, attempts=self.attempts
        )
        result._answer = answer
        result.attempts = self.attempts
        self.run.tool_retries.append(
            {
                "step": self.call.step,
                "tool": self.call.name,
                "call_id": self.call.id,
                "attempts": self.attempts,
                "errors": list(self.errors),
                "waited_s": round(self.waited, 6),
                "ok": result.ok,
            }
        )
        return result


# -- worker threads ----------------------------------------------------------------------------


Finished = Callable[[bool, Any], None]


class _Worker:
    """One daemon thread of :class:`_ToolThreads`: runs the jobs handed to it, one at a time."""

    __slots__ = ("_job", "_pool", "_ready", "thread")

    def __init__(self, pool: _ToolThreads) -> None:
        self._pool = pool
        self._ready = threading.Lock()  # released when a job is handed over
        self._ready.acquire()
        self._job: _Job | None = None
        self.thread = threading.Thread(target=self._loop, name=_IDLE_NAME, daemon=True)

    def give(self, job: _Job) -> None:
        self._job = job
        self._ready.release()

    def _loop(self) -> None:
        pool, thread = self._pool, self.thread
        while True:
            if not self._ready.acquire(timeout=pool.idle_s):
                if pool.retire(self):
                    return
                continue  # handed a job just now: it is on its way
            job, self._job = self._job, None
            if job is None:
                continue
            context, fn, args, name, finished, abandoned = job
            thread.name = "loopwarden-tool-" + name
            try:
                result: tuple[bool, Any] = (True, context.run(fn, *args))
            except BaseException as exc:  # delivered to whoever waits for the tool
                result = (False, exc)
            del job, context, fn, args  # hold nothing of the call while idle
            reuse = not abandoned()
            if reuse:  # idle again before the waiter wakes: its next call finds this thread
                thread.name = _IDLE_NAME
                pool.rest(self)
            try:
                finished(*result)
            except BaseException:
                log.exception("delivering the result of tool %r failed", name)
            if not reuse:  # the waiter gave up at its deadline: end, as a lone thread would
                return
            del finished, abandoned, result


_Job = tuple[
    contextvars.Context, Callable[..., Any], tuple[Any, ...], str, Finished, Callable[[], bool]
]
_IDLE_NAME = "loopwarden-worker-idle"


class _ToolThreads:
    """Daemon threads that run blocking tools under a deadline, reused across calls.

    Starting a thread costs far more than a trivial tool call; an idle worker takes the next
    call instead.  A worker whose call was abandoned at its deadline keeps running the tool
    (Python cannot kill a thread) and ends when the tool returns; the next call gets another
    thread.  Workers idle for ``idle_s`` seconds end.  While it runs a tool a worker is named
    ``loopwarden-tool-<tool>``, and each call runs in the ``contextvars.Context`` it is
    given; thread-local state that a tool keeps may outlive a call.
    """

    def __init__(self, idle_s: float = 10.0) -> None:
        self.idle_s = idle_s
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def submit(
        self,
        context: contextvars.Context,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        name: str,
        finished: Finished,
        abandoned: Callable[[], bool],
    ) -> None:
        """Run ``context.run(fn, *args)`` in a worker thread, then ``finished(True, value)``
        or ``finished(False, exception)`` there.  ``abandoned()`` (asked when the tool
        returned) says whether the waiter gave up meanwhile: that thread then ends."""
        job: _Job = (context, fn, args, name, finished, abandoned)
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(self)
            worker.give(job)
            worker.thread.start()
        else:
            worker.give(job)

    def rest(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def retire(self, worker: _Worker) -> bool:
        """An idle worker timed out: True when it may end (it was not just handed a job)."""
        with self._lock:
            if worker in self._idle:
                self._idle.remove(worker)
                return True
            return False


_WORKERS = _ToolThreads()


def daemon_thread(fn: Any, *args: Any, name: str) -> asyncio.Future[Any]:
    """Run a blocking tool in a daemon worker thread; return a future for its value.

    Not ``asyncio.to_thread``: an abandoned (timed-out) tool would keep a worker of the
    event loop's default executor, and ``asyncio.run()`` waits for those at exit -- a hung
    tool would hang the program.  A late value finds the future cancelled and is dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(ok: bool, payload: Any) -> None:
        if future.done():  # cancelled at the deadline: the late result is discarded
            return
        if ok:
            future.set_result(payload)
        else:
            future.set_exception(payload)

    def finished(ok: bool, payload: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits any more
            loop.call_soon_threadsafe(deliver, ok, payload)

    _WORKERS.submit(context, fn, args, name, finished, future.done)
    return future


async def _bounded(
    aw: Awaitable[Any], timeout: float | None, cancel: CancelToken | None = None
) -> tuple[Ending, Any]:
    """Await a tool within ``timeout`` (and until ``cancel``): ``("ok", value)``, else
    ``("timeout" | "cancelled", None)``.  A tool that swallows its cancellation is abandoned
    (see :mod:`loopwarden.clock`).  A ``TimeoutError`` the tool raises itself (a socket
    read timing out) is its own error, not the loop's deadline, and propagates as such."""
    if timeout is None and cancel is None:
        return "ok", await aw
    return await await_within(aw, timeout, cancel)
