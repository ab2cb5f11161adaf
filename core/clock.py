"""Clocks, cancel tokens, and waiting for work within a deadline.

Every run carries a clock, so limits measured in time (timeouts, backoffs, alert windows) are
tested by moving a :class:`FakeClock` instead of sleeping.

**Waiting for work that may never end** (:func:`await_within`, :func:`call_within`, the
:data:`WATCHDOG`).  Python cannot kill a thread, and a coroutine may swallow its cancellation.
These helpers therefore never wait for the work itself past its deadline: they run it apart
(a daemon thread, a separate task), wait for whichever comes first -- its end, the deadline,
the run's cancel token -- and *abandon* it otherwise.  Abandoned work keeps running until it ends by
itself; its result is discarded.  Limits: an abandoned thread holds whatever it holds (a
socket, a lock) until it returns; an abandoned task that swallows every cancellation keeps
running on its event loop, and ``asyncio.run()`` waits for it when the loop closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "DEADLINE_SLACK_S",
    "MAX_DURATION_S",
    "WATCHDOG",
    "CancelToken",
    "Clock",
    "Ending",
    "FakeClock",
    "SystemClock",
    "Watchdog",
    "await_in_task",
    "await_within",
    "bounded_seconds",
    "call_within",
]

#: the longest duration loopwarden accepts anywhere -- a timeout, a wait, a backoff, a
#: ``Retry-After``, a TTL: 1e9 s (about 31 years, "no limit" in practice).  Config tables
#: refuse more, and every wait is cut to it, so no timer overflows (``threading.TIMEOUT_MAX``
#: is about 9.2e9 s) and no watchdog dies of it
MAX_DURATION_S = 1e9


def bounded_seconds(seconds: float) -> float:
    """``seconds`` as a wait: at least 0, at most :data:`MAX_DURATION_S` (NaN: 0)."""
    if not seconds > 0:  # also NaN
        return 0.0
    return seconds if seconds < MAX_DURATION_S else MAX_DURATION_S


#: a call that ended this close to its deadline overran it (the loop, the timeout plugin and
#: the deadline waits all use this one figure)
DEADLINE_SLACK_S = 0.05


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock in seconds, with sleeps that a cancel token can cut short."""

    def now(self) -> float:
        """Monotonic seconds."""

    def sleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        """Sleep, returning early when ``cancel`` is set."""

    async def asleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        """Async sleep, returning early when ``cancel`` is set."""


class SystemClock:
    """The real monotonic clock."""

    #: monotonic seconds: ``time.monotonic`` itself, not a method wrapping it -- the loop and
    #: the guards read the clock several times a step, and each read is then one C call
    now = staticmethod(time.monotonic)

    def sleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        """Sleep, returning early when ``cancel`` is set."""
        seconds = bounded_seconds(seconds)
        if seconds <= 0:
            return
        if cancel is None:
            time.sleep(seconds)
        else:
            cancel.wait(seconds)

    async def asleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        """Async sleep, returning early when ``cancel`` is set."""
        seconds = bounded_seconds(seconds)
        if seconds <= 0:
            return
        if cancel is None:
            await asyncio.sleep(seconds)
            return
        end = time.monotonic() + seconds
        # Poll in short slices: a threading.Event cannot be awaited directly.
        while not cancel.cancelled:
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.01))


class FakeClock:
    """A clock that only moves when told to (or when something sleeps on it)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        """The fake time: where :meth:`advance` and the sleeps have moved it."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        """Advance the time by ``seconds`` at once (nothing waits)."""
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        """Advance the time by ``seconds`` and yield to the event loop once."""
        if seconds > 0:
            self.advance(seconds)
        await asyncio.sleep(0)


class CancelToken:
    """Cooperative cancellation for one run (thread-safe).

    The caller cancels a run with :meth:`cancel`; the loop checks it between steps, and tools
    that accept a ``ToolContext`` can wait on it.  A token may carry a deadline (the timeout
    plugin sets one per tool call): :meth:`wait` then returns at the deadline at the latest.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        #: why it was cancelled (the first :meth:`cancel`'s reason), None while it is not
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop as soon as it can."""
        if self.reason is None:
            self.reason = reason
        self._event.set()
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def on_cancel(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` (from the cancelling thread) when the token is cancelled -- at once
        when it already is.  Returns a function that removes ``fn`` again.  This is how a
        model call in flight is interrupted."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return functools.partial(self._remove, fn)  # no lambda frame per removal
        fn()
        return lambda: None

    def _remove(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._callbacks:
                self._callbacks.remove(fn)

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._event.is_set()

    def is_set(self) -> bool:
        """Whether the run was cancelled (a method, so type checkers never narrow it)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds passed; True when cancelled."""
        return self._event.wait(timeout)


# -- waiting within a deadline ------------------------------------------------------------------

log = logging.getLogger("loopwarden.watchdog")

#: how the wait ended: the work finished ("ok"), the deadline passed, or the run was cancelled
Ending = Literal["ok", "timeout", "cancelled"]

#: seconds a cancelled task gets to wind down (close its sockets) before it is abandoned
CANCEL_GRACE_S = 0.5


#: tasks can start eagerly (``asyncio.Task(..., eager_start=True)``, Python 3.12+)
_EAGER = sys.version_info >= (3, 12)
_EAGER_START: dict[str, Any] = {"eager_start": True}  # a keyword older stubs do not know


def call_within(
    fn: Callable[..., Any],
    *args: Any,
    timeout: float | None,
    cancel: CancelToken | None = None,
    name: str = "call",
) -> tuple[Ending, Any]:
    """Run ``fn(*args)`` in a daemon thread; wait at most ``timeout`` seconds, or until
    ``cancel`` is set.  ``("ok", value)``, or ``("timeout" | "cancelled", None)``; an exception
    from ``fn`` is raised here."""
    done = threading.Event()
    box: list[tuple[bool, Any]] = []
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box.append((True, context.run(fn, *args)))
        except BaseException as exc:  # handed to the waiter below
            box.append((False, exc))
        done.set()

    remove = cancel.on_cancel(done.set) if cancel is not None else None
    try:
        threading.Thread(target=target, name=f"loopwarden-{name}", daemon=True).start()
        done.wait(None if timeout is None else bounded_seconds(timeout))
    finally:
        if remove is not None:
            remove()
    if box:
        ok, payload = box[0]
        if not ok:
            raise payload
        return "ok", payload
    if cancel is not None and cancel.is_set():
        return "cancelled", None
    return "timeout", None


async def await_within(
    aw: Awaitable[Any], timeout: float | None, cancel: CancelToken | None = None
) -> tuple[Ending, Any]:
    """Await ``aw`` as a task of its own, at most ``timeout`` seconds or until ``cancel``.

    ``("ok", value)``, or ``("timeout" | "cancelled", None)`` after the task was cancelled
    (and given :data:`CANCEL_GRACE_S` to wind down; one that ignores the cancellation is
    abandoned).  An exception from ``aw`` is raised here; cancelling the caller cancels it.

    One future decides the race: the work's end settles it from inside its own task (a
    future given as ``aw`` -- a worker thread's -- *is* that future), and the deadline's timer
    or the cancel token cancels it.  The caller thus wakes one event-loop pass after the work
    ends, with no ``asyncio.wait`` machinery per call (this runs once per model and tool call
    of every async run).  On Python 3.12+ the work's task starts eagerly: work that ends
    without suspending (an instant model, a trivial async tool) costs no loop pass at all.
    """
    loop = asyncio.get_running_loop()
    when = None if timeout is None else loop.time() + bounded_seconds(timeout)
    if asyncio.isfuture(aw):
        race: asyncio.Future[Any] = aw
        task = race
    else:
        race = loop.create_future()
        if _EAGER and loop.get_task_factory() is None:
            # Python 3.12+: the task's first step runs now, in the task (its own context,
            # current_task() is the task): work that does not suspend ends here, no loop pass
            task = asyncio.Task(_feed(aw, race), loop=loop, **_EAGER_START)
        else:
            task = loop.create_task(_feed(aw, race))
    ended: list[Ending] = []  # why the race ended before the work: the timer or the token

    def end(why: Ending) -> None:
        if not race.done():
            ended.append(why)
            race.cancel()

    timer = None if when is None or race.done() else loop.call_at(when, end, "timeout")
    remove: Callable[[], None] | None = None
    if cancel is not None and not race.done():

        def wake() -> None:
            # a closed loop: nobody waits any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(end, "cancelled")

        remove = cancel.on_cancel(wake)
    try:
        try:
            return "ok", await race
        except asyncio.CancelledError:
            if not ended or _cancelling():
                raise  # the caller was cancelled (or the work cancelled itself)
    except BaseException:  # the caller was cancelled: so is the work
        task.cancel()
        if race.done() and not race.cancelled():
            race.exception()  # retrieved: nobody else will
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if remove is not None:
            remove()
    if task is not race:
        task.cancel()
        task.add_done_callback(_consume)
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    return ("cancelled" if cancel is not None and cancel.is_set() else "timeout"), None


async def _feed(aw: Awaitable[Any], race: asyncio.Future[Any]) -> None:
    """Await ``aw`` and settle ``race`` with its outcome (unless the race already ended)."""
    try:
        value = await aw
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit) as exc:
        if not race.done():
            if isinstance(exc, asyncio.CancelledError):
                race.cancel()
            else:
                race.set_exception(exc)
        raise
    except BaseException as exc:  # handed to the waiter through the race
        if not race.done():
            race.set_exception(exc)
        return
    if not race.done():
        race.set_result(value)


def _cancelling() -> bool:
    """Whether the current task has a cancellation request pending (Python 3.11+)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class Watchdog:
    """One daemon thread that calls ``fire()`` of every watch whose time has come.

    Each ``fire`` runs in a daemon thread of its own, so one that blocks delays no other
    watch.  :meth:`watch` returns a function that withdraws the watch (cheap; withdrawn
    entries are dropped lazily, and compacted when they dominate).
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [due (monotonic), sequence, fire or None]
        self._cond = threading.Condition()
        self._live = 0
        self._seq = 0
        self._thread: threading.Thread | None = None

    def watch(self, seconds: float, fire: Callable[[], None]) -> Callable[[], None]:
        """Call ``fire()`` in ``seconds`` (at most :data:`MAX_DURATION_S`) unless the
        returned function is called first."""
        with self._cond:
            self._seq += 1
            entry: list[Any] = [time.monotonic() + bounded_seconds(seconds), self._seq, fire]
            heapq.heappush(self._heap, entry)
            self._live += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="loopwarden-watchdog", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is entry:
                self._cond.notify()

        def withdraw() -> None:
            with self._cond:
                if entry[2] is None:
                    return
                entry[2] = None
                self._live -= 1
                if len(self._heap) > 64 and len(self._heap) > 4 * self._live:
                    self._heap = [e for e in self._heap if e[2] is not None]
                    heapq.heapify(self._heap)

        return withdraw

    def _loop(self) -> None:
        heap_pop = heapq.heappop
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heap_pop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    left = self._heap[0][0] - time.monotonic()
                    if left <= 0:
                        entry = heap_pop(self._heap)
                        fire, entry[2] = entry[2], None
                        self._live -= 1
                        break
                    self._cond.wait(min(left, MAX_DURATION_S))
            threading.Thread(
                target=_fire, args=(fire,), name="loopwarden-watchdog-fire", daemon=True
            ).start()


def _fire(fire: Callable[[], None]) -> None:
    try:
        fire()
    except Exception:
        log.exception("a watchdog action failed")


#: the process's watchdog (its thread starts with the first watch)
WATCHDOG = Watchdog()


# -- waiting in the caller's own task ---------------------------------------------------------
#
# A deadline and a cancel token for an awaitable that honours cancellation, in the caller's
# own task.
#
# `await_within` runs its work as a task of its own so that work
# that swallows its cancellation can be abandoned.  That costs a task and (before Python 3.12)
# two event-loop passes per call -- on every model call and, streamed, on every delta.  Work
# that is known to end when cancelled (the ``openai`` client over ``httpx``: its cancellation
# closes the connection) can instead run where it is awaited, with a timer (and the token's
# callback) that cancels the current task: no task, no loop pass.  A cancellation that is not
# ours (the caller's own task cancelled) still propagates; ours is taken back
# (``Task.uncancel``) and reported as the ending.  Python 3.10 has no ``uncancel``: there,
# and outside a task, `await_within` is used as before.


class _Race:
    """Who ended the wait first (the timer, the token) while the work still ran."""

    __slots__ = ("ended", "running", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.running = True
        self.ended: Ending | None = None

    def end(self, why: Ending) -> None:
        if self.running and self.ended is None:
            self.ended = why
            self.task.cancel()


async def await_in_task(
    aw: Awaitable[Any], timeout: float | None, cancel: CancelToken | None = None
) -> tuple[Ending, Any]:
    """Await ``aw`` here, at most ``timeout`` seconds or until ``cancel``: ``("ok", value)``
    or ``("timeout" | "cancelled", None)`` -- what :func:`await_within` answers, for work
    that honours cancellation.  An exception from ``aw`` is raised here (unless the deadline
    or the token ended the wait first: then the ending is answered, as ``await_within``
    does)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    if task is None or not hasattr(task, "uncancel"):  # Python 3.10, or not in a task
        return await await_within(aw, timeout, cancel)
    race = _Race(task)
    timer = (
        None
        if timeout is None
        else loop.call_at(loop.time() + bounded_seconds(timeout), race.end, "timeout")
    )
    remove = None
    if cancel is not None:

        def wake() -> None:  # from the cancelling thread
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(race.end, "cancelled")

        remove = cancel.on_cancel(wake)
    try:
        value = await aw
    except (Exception, asyncio.CancelledError):
        if race.ended is None:
            raise  # the work's own error, or the caller's task was cancelled
        if task.uncancel() > 0:
            raise  # the caller was cancelled as well: that one propagates
        return race.ended, None
    finally:
        race.running = False
        if timer is not None:
            timer.cancel()
        if remove is not None:
            remove()
    if race.ended is not None:  # the work ended anyway, after our cancel: take it back
        task.uncancel()
        return race.ended, None
    return "ok", value
