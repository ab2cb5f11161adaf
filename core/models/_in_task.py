"""A deadline and a cancel token for an awaitable that honours cancellation, in the caller's
own task.

:func:`loopwarden.clock.await_within` runs its work as a task of its own so that work
that swallows its cancellation can be abandoned.  That costs a task and (before Python 3.12)
two event-loop passes per call -- on every model call and, streamed, on every delta.  Work
that is known to end when cancelled (the ``openai`` client over ``httpx``: its cancellation
closes the connection) can instead run where it is awaited, with a timer (and the token's
callback) that cancels the current task: no task, no loop pass.  A cancellation that is not
ours (the caller's own task cancelled) still propagates; ours is taken back
(``Task.uncancel``) and reported as the ending.  Python 3.10 has no ``uncancel``: there,
and outside a task, :func:`await_within` is used as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from loopwarden.clock import Ending, await_within

if TYPE_CHECKING:
    from loopwarden.clock import CancelToken

__all__ = ["await_in_task"]


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
    timer = None if timeout is None else loop.call_at(loop.time() + timeout, race.end, "timeout")
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
