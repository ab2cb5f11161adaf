"""A run cancelled while its side-effect claim waits on a busy store never loses the effect.

Issue 43, item 2.  An async run claims a side effect's idempotency key in the shared ledger
while another connection holds the SQLite file's write lock (a real file, a real second
connection), and is cancelled meanwhile -- its task cancelled, or its cancel token set.  The
claim goes through once the lock is free, but the tool never starts: the claim must be released
(main left it ``running``: a retry was answered "in progress", then "may have taken effect",
and the payment was never made).  Both ``[store] async_calls`` modes: the step in a worker
thread ("threads") and on the loop, its store call on an owner thread ("loop").
"""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from support.stores import deployment_for, pay_tool, write_scenario

from loopwarden import CancelToken, signals
from loopwarden.store import SQLiteStore, bridge

MODES = ("threads", "loop")


def _busy_store(tmp_path: Path, mode: str) -> tuple[Any, threading.Event, sqlite3.Connection]:
    """A deployment paying invoices through the ledger on a SQLite file whose write lock a
    second connection holds; the event is set once the run's claim is waiting for it."""
    write_scenario(tmp_path)
    path = tmp_path / "store.sqlite3"
    dep = deployment_for(
        f"sqlite:///{path}",
        enabled=(),
        tools=[pay_tool(tmp_path / "effects.txt")],
        store={"async_calls": mode, "timeout_s": 10.0},
    )
    store = dep.shared.store  # opened, its tables made, before the lock is taken
    assert isinstance(store, SQLiteStore)
    waiting = threading.Event()
    claim = store._claim

    def claim_seen(*args: Any) -> Any:
        waiting.set()
        return claim(*args)

    store._claim = claim_seen  # type: ignore[method-assign]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a real write lock, held by another connection
    return dep, waiting, holder


def _retry_pays(dep: Any, tmp_path: Path) -> None:
    """The same payment asked again: executed now, exactly once."""
    retry = dep.run(scenario=str(tmp_path / "pay.toml"))
    observations = [m["content"] for m in retry.messages if m["role"] == "tool"]
    assert observations == ["PAID 7"], observations  # not "in progress", not "may have ..."
    effects = (tmp_path / "effects.txt").read_text(encoding="utf-8").split()
    assert effects[::2] == ["7"]  # one payment: the retry's


@pytest.mark.parametrize("mode", MODES)
def test_a_task_cancelled_while_its_claim_waits_leaves_the_key_free(
    tmp_path: Path, mode: str
) -> None:
    dep, waiting, holder = _busy_store(tmp_path, mode)
    ended: list[str] = []
    dep.connect(signals.run_stopped, lambda run, **kw: ended.append(kw["outcome"].termination))

    async def main() -> None:
        task = asyncio.create_task(dep.arun(scenario=str(tmp_path / "pay.toml")))
        while not waiting.is_set():  # the claim waits for the lock ...
            await asyncio.sleep(0.005)
        task.cancel()  # ... the run is cancelled meanwhile ...
        await asyncio.sleep(0.05)
        holder.execute("ROLLBACK")  # ... and then the lock is free: the claim goes through
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        assert ended == ["cancelled"]
        assert not (tmp_path / "effects.txt").exists()  # the cancelled run paid nothing
        _retry_pays(dep, tmp_path)
    finally:
        holder.close()
        dep.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_cancel_token_set_while_the_claim_waits_never_starts_the_tool(
    tmp_path: Path, mode: str
) -> None:
    dep, waiting, holder = _busy_store(tmp_path, mode)
    cancel = CancelToken()

    async def main() -> Any:
        task = asyncio.create_task(dep.arun(scenario=str(tmp_path / "pay.toml"), cancel=cancel))
        while not waiting.is_set():
            await asyncio.sleep(0.005)
        cancel.cancel("client left")
        await asyncio.sleep(0.05)
        holder.execute("ROLLBACK")
        return await task

    try:
        run = asyncio.run(main())
        assert run.outcome.termination == "cancelled"
        assert run.tools_executed == 0
        assert not (tmp_path / "effects.txt").exists()  # never started ...
        assert run.conversation.side_effects == {}  # ... so nothing to answer a repeat from
        _retry_pays(dep, tmp_path)
    finally:
        holder.close()
        dep.close()


def test_a_claim_whose_caller_is_cancelled_on_its_way_is_released_when_it_lands(
    tmp_path: Path,
) -> None:
    """The cancel hits the claim itself: the step waiting on the loop for its store call is
    cancelled (``async_calls = "loop"``) while the claim, on the store's owner thread, waits
    for the lock.  The claim lands after its caller has gone -- and is released there."""
    path = tmp_path / "store.sqlite3"
    store = SQLiteStore(path, timeout_s=10.0)
    waiting, released = threading.Event(), threading.Event()
    claim, release = store._claim, store._release

    def claim_seen(*args: Any) -> Any:
        waiting.set()
        return claim(*args)

    def release_seen(*args: Any) -> None:
        release(*args)
        released.set()

    store._claim = claim_seen  # type: ignore[method-assign]
    store._release = release_seen  # type: ignore[method-assign]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    async def main() -> None:
        done, pending = bridge.start(contextvars.copy_context(), store.claim, "pay:7", "r/c", 60)
        assert not done  # the claim waits on an owner thread
        finishing = asyncio.ensure_future(bridge.finish(pending))
        while not waiting.is_set():
            await asyncio.sleep(0.005)
        finishing.cancel()  # thrown into the step, at its store call
        with pytest.raises(asyncio.CancelledError):
            await finishing
        holder.execute("ROLLBACK")  # now the claim goes through, its caller gone

    try:
        asyncio.run(main())
        assert released.wait(10)  # released by the thread that landed it
        assert store.claim("pay:7", "another/c", 60) is None  # the key is free
    finally:
        holder.close()
        store.close()


@pytest.mark.parametrize("mode", ("sync", *MODES))
def test_a_stream_left_after_the_claim_and_before_the_call_leaves_the_key_free(
    tmp_path: Path, mode: str
) -> None:
    """The consumer of a stream stops at the proposed payment -- the step that claimed it is
    done, the call not started: the claim is released, and the payment asked again is made."""
    write_scenario(tmp_path)
    dep = deployment_for(
        f"sqlite:///{tmp_path / 'store.sqlite3'}",
        enabled=(),
        tools=[pay_tool(tmp_path / "effects.txt")],
        store={"async_calls": "threads" if mode == "sync" else mode},
    )
    kinds: list[str] = []
    scenario = str(tmp_path / "pay.toml")

    async def consume() -> None:
        events = dep.astream(scenario=scenario)
        async for event in events:
            kinds.append(type(event).__name__)
            if type(event).__name__ == "ToolCallProposed":
                break
        await events.aclose()  # type: ignore[attr-defined]

    try:
        if mode == "sync":
            events = dep.stream(scenario=scenario)
            for event in events:
                kinds.append(type(event).__name__)
                if type(event).__name__ == "ToolCallProposed":
                    break
            events.close()  # type: ignore[attr-defined]
        else:
            asyncio.run(consume())
        assert kinds[-1] == "ToolCallProposed"
        assert not (tmp_path / "effects.txt").exists()
        _retry_pays(dep, tmp_path)
    finally:
        dep.close()


@pytest.mark.parametrize("mode", ("sync", *MODES))
def test_a_run_the_watchdog_ends_while_its_claim_waits_leaves_the_key_free(
    tmp_path: Path, mode: str
) -> None:
    """The run's time runs out while its claim waits for the lock: the watchdog ends the run
    (``timeout``); the claim lands afterwards and the machine, never resumed to pay, releases
    it."""
    write_scenario(tmp_path)
    path = tmp_path / "store.sqlite3"
    dep = deployment_for(
        f"sqlite:///{path}",
        enabled=("timeout",),
        plugins={"timeout": {"max_seconds": 0.2, "grace_s": 0.0}},
        tools=[pay_tool(tmp_path / "effects.txt")],
        store={"async_calls": "threads" if mode == "sync" else mode, "timeout_s": 30.0},
    )
    assert dep.shared.store
    ended = threading.Event()
    dep.connect(signals.run_stopped, lambda run, **kw: ended.set())
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")

    def free_when_ended() -> None:
        ended.wait(30)  # the watchdog ended the run while the claim waited ...
        holder.execute("ROLLBACK")  # ... and then the lock is free: the claim lands

    freer = threading.Thread(target=free_when_ended)
    freer.start()
    try:
        scenario = str(tmp_path / "pay.toml")
        run = (
            dep.run(scenario=scenario)
            if mode == "sync"
            else asyncio.run(dep.arun(scenario=scenario))
        )
        freer.join(30)
        assert run.outcome.termination == "timeout"
        assert not (tmp_path / "effects.txt").exists()
        # asked again without the short time limit: paid now, exactly once
        again = deployment_for(
            f"sqlite:///{path}", enabled=(), tools=[pay_tool(tmp_path / "effects.txt")]
        )
        try:
            _retry_pays(again, tmp_path)
        finally:
            again.close()
    finally:
        holder.close()
        dep.close()
