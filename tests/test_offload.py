"""Async runs that use the shared store advance their step machine off the event loop
(:mod:`loopwarden.engine.drivers`): how often a deployment is asked whether its hooks block, and
that a hung store call holds only its own run -- on a real SQLite file and a real
redis-server (``store_url``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.stores import deployment_for, store_table

from loopwarden import Deployment
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.plugins.spend_limits import SpendLimits
from loopwarden.testing.faults import GatedStore, install_store

TENANT_DAY = [{"scope": "tenant", "window": "day", "max_tokens": 10**6}]


class CountedSpendLimits(SpendLimits):
    """spend_limits, counting how often it is asked whether its hooks block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = 0

    @property
    def blocking_io(self) -> bool:
        self.asked += 1
        return bool(super().blocking_io)


def counted_deployment(url: str) -> Deployment:
    config = parse_config(
        {
            "store": store_table(url),
            "plugins": {"enabled": ["spend_limits"], "spend_limits": {"budgets": TENANT_DAY}},
        },
        path="<test>",
    )
    return Deployment(config, plugins={"spend_limits": CountedSpendLimits}, tools=shop_tools())


def test_a_deployment_is_asked_once_whether_its_hooks_block(store_url: str) -> None:
    dep = counted_deployment(store_url)
    plugin: CountedSpendLimits = dep.plugins.get("spend_limits")

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(dep.arun(scenario="refund", meta={"tenant": "acme"}) for _ in range(6))
        )

    runs = asyncio.run(main())
    dep.close()
    assert [r.outcome.termination for r in runs] == ["final_answer"] * 6
    assert plugin.asked == 1  # before: once per run, plugins scanned again each time


def test_a_hung_store_call_holds_its_own_run_only(store_url: str) -> None:
    # One run's reserve hangs in the store; another run on the same event loop still goes
    # through its steps (in a thread of its own), and only then does
    # the test open the gate.  Were both waiting for one thread, the gate's guard (10 s)
    # would fail the held call and count a timeout.
    held_dep = deployment_for(store_url, plugins={"spend_limits": {"budgets": TENANT_DAY}})
    free_dep = deployment_for(store_url, plugins={"spend_limits": {"budgets": TENANT_DAY}})

    async def main() -> tuple[Any, Any, GatedStore, bool]:
        loop = asyncio.get_running_loop()
        reached = asyncio.Event()
        gated = install_store(
            held_dep,
            lambda s: GatedStore(
                s, methods=("reserve",), on_enter=lambda _: loop.call_soon_threadsafe(reached.set)
            ),
        )
        held = asyncio.create_task(held_dep.arun(scenario="refund", meta={"tenant": "held"}))
        await asyncio.wait_for(reached.wait(), 30)
        free = await free_dep.arun(scenario="refund", meta={"tenant": "free"})
        still_held = not held.done()
        gated.gate.set()
        return await held, free, gated, still_held

    held, free, gated, still_held = asyncio.run(main())
    held_dep.close()
    free_dep.close()
    assert still_held and gated.timeouts == 0
    assert free.outcome.termination == "final_answer"
    assert held.outcome.termination == "final_answer"
