"""Store calls awaited on the event loop, from synchronous hooks.

The hooks that reach the shared store (``spend_limits``' reservations, the side-effect
ledger's claims, ``circuit_breaker``) are plain synchronous functions, and the machine that
calls them runs between two effects of the async driver.  By default an async run that uses
the store advances its machine in a worker thread, so that a store call never blocks the
event loop -- and pays a thread hand-off per step, and GIL traffic between the loop and the
worker for all the hooks' Python work.

Here the machine step runs on the event loop's own thread, in a greenlet (:func:`start`):
when a store call is made inside it, the store hands an awaitable to :func:`wait`, which
switches back to the driver; the driver awaits it on the loop (other runs go on meanwhile)
and switches back in with the answer or the error (:func:`finish`).  Only the store's own
work leaves the step: each call runs on one of the store's owner threads (:class:`Owner`),
with the blocking client -- for Redis that measured cheaper than ``redis.asyncio`` on the
loop (see :class:`loopwarden.store.redis.RedisStore`); SQLite has no async driver in the
standard library.  Steps that make no store call never wait and cost one greenlet switch.

Opt-in: ``[store] async_calls = "loop"`` (the default, ``"threads"``, runs such steps in
worker threads: measured faster on 2 cores, bench/README.md "Serving, issue 35" -- each store
call's answer waits here for the loop to come back to the run).  It needs the ``greenlet``
package (the extra ``loopwarden[serving]``, also in ``[redis]``); without it the drivers run
such steps in worker threads.  Sync runs never use it: their store calls block, as they
should.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["Owner", "available", "finish", "start", "wait", "waiting"]

T = TypeVar("T")

_kit: tuple[Any, type[Any]] | bool | None = None  # (greenlet.getcurrent, the Step class)


def _load() -> tuple[Any, type[Any]] | None:
    """``greenlet`` on first use (``import loopwarden`` never pays for it)."""
    global _kit
    if _kit is None:
        try:
            import greenlet
        except ImportError:
            _kit = False
        else:

            class Step(greenlet.greenlet):  # type: ignore[misc]
                """A machine step that may wait for the store on the event loop."""

            _kit = (greenlet.getcurrent, Step)
    return _kit if isinstance(_kit, tuple) else None


def available() -> bool:
    """Whether store calls can be awaited on the loop (``greenlet`` is installed)."""
    return _load() is not None


class _Wait:
    """What a step hands its driver: await this and switch back in with the outcome."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


def waiting() -> bool:
    """Whether the caller runs inside a step started by :func:`start` (store calls may wait)."""
    kit = _kit
    return bool(kit) and isinstance(kit[0](), kit[1])  # type: ignore[index]


def wait(awaitable: Awaitable[T]) -> T:
    """From synchronous code inside a step: await ``awaitable`` on the event loop and return
    its result (or raise its error) -- the other runs on the loop go on meanwhile.  Only
    valid where :func:`waiting` is true."""
    kit = _kit
    assert kit, "wait() outside a bridged step"
    return kit[0]().parent.switch(_Wait(awaitable))  # type: ignore[no-any-return,index]


def start(context: contextvars.Context, fn: Callable[..., T], *args: Any) -> tuple[bool, Any]:
    """Run ``fn(*args)`` in a new step (in ``context``) until it returns or first waits.

    Returns ``(True, result)`` when it returned (its errors propagate as they would inline),
    or ``(False, pending)`` when it waits for I/O: pass ``pending`` to :func:`finish`."""
    kit = _load()
    assert kit is not None
    step = kit[1](fn)
    step.gr_context = context
    value = step.switch(*args)
    if step.dead:
        return True, value
    return False, (step, value)


async def finish(pending: tuple[Any, Any]) -> Any:
    """Drive a step that waits: await each of its I/O on this loop, switch back in with the
    answer (or throw the error in), until the step returns; its return value, or its error."""
    step, value = pending
    while True:
        try:
            result = await value.awaitable
        except BaseException as exc:
            value = step.throw(exc)
        else:
            value = step.switch(result)
        if step.dead:
            return value


class Owner:
    """The threads that make a store's blocking calls for async runs, fed by one queue.

    For a store with no async driver (SQLite, a store of your own): a step awaits its calls
    here instead of blocking the loop, and only the store's own work leaves the loop's thread
    -- not the hooks' Python work.  One thread while one keeps up; another is started only
    when a call finds every thread busy (a store that is slow or stuck: calls wait out their
    timeouts side by side, not one after another), up to ``threads``.  Daemon threads: a
    store call in progress never keeps the interpreter from exiting (each is bounded by the
    store's own timeout anyway)."""

    def __init__(self, name: str, threads: int = 32) -> None:
        self._name = name
        self._threads = threads
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._started = 0
        self._idle = 0  # threads waiting for a call
        self._queued = 0  # calls not yet taken by a thread
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on an owner thread, as a future of the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._queued += 1
            start = self._queued > self._idle and self._started < self._threads
            if start:
                self._started += 1
                self._idle += 1
        self._queue.put((loop, future, fn, args))
        if start:
            name = f"{self._name}-{self._started}"
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

    def _work(self) -> None:
        get, lock = self._queue.get, self._lock
        while True:
            item = get()
            with lock:
                self._idle -= 1
                if item is not None:
                    self._queued -= 1
            if item is None:
                return
            loop, future, fn, args = item
            try:
                value, ok = fn(*args), True
            except BaseException as exc:
                value, ok = exc, False
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_settle, future, ok, value)
            with lock:
                self._idle += 1

    def close(self) -> None:
        """Let the threads end once the calls queued before are done (the stores make a new
        owner for later calls)."""
        with self._lock:
            for _ in range(self._started):
                self._queue.put(None)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
