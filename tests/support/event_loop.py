"""Event-loop probes for the hostile-world tests of async waiting: a counter of event-loop
passes (a deterministic measure of how soon a waiter wakes -- no clock involved) and work
that will not end or will not be cancelled, and a model whose calls all wake at once.
"""

from __future__ import annotations

import asyncio

from loopwarden import ModelRequest, ModelResponse, Usage

__all__ = ["LoopPasses", "Rendezvous", "stubborn"]


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


class Rendezvous:
    """An async model whose calls wait until ``n`` of them are waiting, then all answer
    "Done." in the same event-loop pass: ``n`` concurrent runs then resume together, each
    with a step to take -- the burst a pool of worker threads must absorb."""

    name = "scripted"

    def __init__(self, n: int) -> None:
        self.n = n
        self.waiting = 0
        self._all = asyncio.Event()

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        self.waiting += 1
        if self.waiting >= self.n:
            self._all.set()
        await self._all.wait()
        return ModelResponse(content="Done.", usage=Usage(prompt=100, completion=10))

    def complete(self, request: ModelRequest) -> ModelResponse:  # pragma: no cover
        raise AssertionError("an async run awaits acomplete")
