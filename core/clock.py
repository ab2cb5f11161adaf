"""Clocks and cancel tokens.

Every run carries a clock, so limits measured in time (timeouts, backoffs, alert windows) are
tested by moving a :class:`FakeClock` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["CancelToken", "Clock", "FakeClock", "SystemClock"]


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

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        if seconds <= 0:
            return
        if cancel is None:
            time.sleep(seconds)
        else:
            cancel.wait(seconds)

    async def asleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
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
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float, cancel: CancelToken | None = None) -> None:
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
                return lambda: self._remove(fn)
        fn()
        return lambda: None

    def _remove(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._callbacks:
                self._callbacks.remove(fn)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        """Whether the run was cancelled (a method, so type checkers never narrow it)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds passed; True when cancelled."""
        return self._event.wait(timeout)
