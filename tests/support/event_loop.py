"""Event-loop probes for the hostile-world tests of async waiting: a counter of event-loop
passes (a deterministic measure of how soon a waiter wakes -- no clock involved) and work
that will not end or will not be cancelled.
"""

from __future__ import annotations

import asyncio

__all__ = ["LoopPasses", "stubborn"]


class LoopPasses:
    """Counts the event loop's passes while it is open: a callback that re-schedules itself
    with ``call_soon`` runs once per pass.  ``start()`` before the awaited work, ``stop()``
    right after it; ``count`` is then the passes the wait took."""

    def __init__(self) -> None:
        self.count = 0
        self._on = False

    def start(self) -> None:
        self._on = True
        asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> int:
        self._on = False
        return self.count

    def _tick(self) -> None:
        if self._on:
            self.count += 1
            asyncio.get_running_loop().call_soon(self._tick)


async def stubborn(seen: list[str], passes: int = 50) -> None:
    """Work that swallows every cancellation and goes on for ``passes`` sleeps of 2 ms (so at
    least 0.1 s by the loop's clock): the kind a deadline must abandon instead of waiting for.
    Appends "cancelled" to ``seen`` at each cancellation, "finished" at its end."""
    for _ in range(passes):
        try:
            await asyncio.sleep(0.002)
        except asyncio.CancelledError:
            seen.append("cancelled")
    seen.append("finished")
