"""Hostile-world models: a model that takes its time, on the real clock.

A :class:`~loopwarden.FakeClock` makes a *tool*'s slowness free (``delay_s`` in a scenario);
what a slow *model* call meets is real time -- the async driver's request timeout and the sync
watchdog wait on the wall clock -- so a test of either needs a model that really is slow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any


class SlowModel:
    """Wraps a model (e.g. :class:`~loopwarden.testing.ScriptedModel`): call ``n`` first waits
    ``delays[n]`` real seconds (the last entry repeats), then answers as the inner model does.
    ``complete`` sleeps, ``acomplete`` awaits: both block the way a slow endpoint does."""

    def __init__(self, inner: Any, delays: Sequence[float]) -> None:
        self.inner = inner
        self.delays = list(delays) or [0.0]
        self.name = getattr(inner, "name", "scripted")
        self.calls = 0

    def _delay(self) -> float:
        d = self.delays[min(self.calls, len(self.delays) - 1)]
        self.calls += 1
        return d

    def complete(self, request: Any) -> Any:
        time.sleep(self._delay())
        return self.inner.complete(request)

    async def acomplete(self, request: Any) -> Any:
        await asyncio.sleep(self._delay())
        return self.inner.complete(request)
