"""``[store] async_calls = "loop"``: async runs await their store calls on the event loop.

The machine step of an async run that uses the store runs on the loop's own thread
(loopwarden.store.bridge); a store call inside it is I/O the driver awaits -- made on the
store's owner threads -- while other coroutines go on.  The default, ``"threads"``, runs
such steps in worker threads (tests/test_spend_faults.py, tests/test_offload.py).  Checked
against real stores: a real SQLite file, a real redis-server (behind a local TCP proxy that
can hold its replies).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.stores import deployment_for, make_store, split_url, store_table

from loopwarden import Deployment, hookimpl, signals
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine import drivers
from loopwarden.store import QUANTITIES, bridge
from loopwarden.testing.faults import GatedStore, install_store

TENANT_DAY = [{"scope": "tenant", "window": "day", "max_tokens": 10**6}]
LOOP = {"async_calls": "loop"}  # the opt-in; "threads" is the default
LOOP_THREAD = threading.get_ident  # asyncio.run() runs the loop on the calling thread


def _spent(url: str) -> tuple[int, ...]:
    store = make_store(url)
    try:
        rows = [r for r in store.rows() if (r.scope, r.key) == ("tenant", "acme")]
        return rows[0].committed if rows else (0,) * len(QUANTITIES)
    finally:
        store.close()


# -- the bridge itself -------------------------------------------------------------------------

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_a_step_waits_on_the_loop_gets_answers_and_errors_and_keeps_its_context() -> None:
    seen: list[Any] = []

    async def answer(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    async def fail() -> None:
        raise KeyError("gone")

    def step(n: int) -> str:
        seen.append(bridge.waiting())
        seen.append(bridge.wait(answer(n)))
        try:
            bridge.wait(fail())
        except KeyError as exc:
            seen.append(repr(exc))
        seen.append(VAR.get())
        VAR.set(f"set by step {n}")
        return "done"

    async def main() -> None:
        context = contextvars.copy_context()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        for n in (1, 2):
            done, value = bridge.start(context, step, n)
            assert not done  # it waited
            assert await bridge.finish(value) == "done"
        tick.cancel()
        assert ticks > 2  # the loop went on while the steps waited
        assert not bridge.waiting()  # outside a step: store calls block, as in sync runs
        # a step that never waits returns at once
        assert bridge.start(context, lambda: 7) == (True, 7)

    asyncio.run(main())
    assert seen[:4] == [True, 2, "KeyError('gone')", "unset"]
    assert seen[4:] == [True, 4, "KeyError('gone')", "set by step 1"]  # one context per run


# -- where the store's calls run ------------------------------------------------------------------


class _Threads:
    """Records the thread of each machine step (its signals) and of each store primitive."""

    def __init__(self) -> None:
        self.hooks: set[int] = set()
        self.primitives: set[int] = set()

    def step(self, *args: Any, **kwargs: Any) -> None:
        self.hooks.add(threading.get_ident())


def test_hooks_run_on_the_loop_and_the_store_does_its_io_without_blocking_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _Threads()
    dep = deployment_for(store_url, plugins={"spend_limits": {"budgets": TENANT_DAY}}, store=LOOP)
    dep.connect(signals.model_responded, threads.step)
    dep.connect(signals.step_finished, threads.step)
    store = dep.shared.store
    reserve = type(store)._reserve

    @functools.wraps(reserve)
    def recording(self: Any, *args: Any) -> Any:
        threads.primitives.add(threading.get_ident())
        return reserve(self, *args)

    monkeypatch.setattr(type(store), "_reserve", recording)

    async def main() -> Any:
        return await dep.arun(scenario="refund", meta={"tenant": "acme"}), LOOP_THREAD()

    run, loop_thread = asyncio.run(main())
    dep.close()
    assert run.outcome.termination == "final_answer"
    assert threads.hooks == {loop_thread}  # no worker thread for the machine's steps
    assert threads.primitives and loop_thread not in threads.primitives  # the store's threads
    assert _spent(store_url)[QUANTITIES.index("model_calls")] == run.step


def test_without_greenlet_async_runs_fall_back_to_worker_threads(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bridge, "_kit", False)  # as if greenlet were not installed
    monkeypatch.setattr(drivers, "_WARNED", False)
    assert not bridge.available()
    dep = deployment_for(store_url, plugins={"spend_limits": {"budgets": TENANT_DAY}}, store=LOOP)
    gated = install_store(dep, GatedStore)

    async def main() -> Any:
        task = asyncio.create_task(dep.arun(scenario="refund", meta={"tenant": "acme"}))
        await asyncio.sleep(0.05)
        gated.gate.set()  # opened from the loop: it was never blocked in the store
        return await task, LOOP_THREAD()

    run, loop_thread = asyncio.run(main())
    dep.close()
    assert run.outcome.termination == "final_answer" and gated.timeouts == 0
    assert gated.threads and loop_thread not in gated.threads
    assert "needs greenlet" in caplog.text  # said once, not per run


# -- a Redis server that answers late -----------------------------------------------------------


class HoldingProxy:
    """A TCP proxy in front of a real redis-server whose replies can be held back: while
    ``release`` is clear, each reply waits (``held`` counts them)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.release = threading.Event()
        self.release.set()
        self.held = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if replies and not self.release.is_set():
                    self.held += 1
                    self.release.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def close(self) -> None:
        self.release.set()
        self.server.close()


@pytest.fixture
def held_redis(redis_server: str) -> Iterator[tuple[str, HoldingProxy]]:
    parts = urlsplit(redis_server)
    proxy = HoldingProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    ns = "lwtest-" + uuid.uuid4().hex[:12]
    yield f"redis://127.0.0.1:{proxy.port}{parts.path}#{ns}", proxy
    proxy.close()
    _drop("{" + ns + "}:*", redis_server)


def test_a_redis_reply_that_takes_long_leaves_the_loop_serving_others(
    held_redis: tuple[str, HoldingProxy],
) -> None:
    url, proxy = held_redis
    dep = deployment_for(
        url, plugins={"spend_limits": {"budgets": TENANT_DAY}}, store={**LOOP, "timeout_s": 30.0}
    )
    assert dep.shared.store  # connected (and the scripts loaded) before the replies are held

    async def main() -> Any:
        proxy.release.clear()
        task = asyncio.create_task(dep.arun(scenario="refund", meta={"tenant": "acme"}))
        while proxy.held == 0:  # the run's first reservation waits for its reply ...
            await asyncio.sleep(0.01)  # ... and this coroutine goes on meanwhile
        assert not task.done()
        proxy.release.set()
        return await task

    run = asyncio.run(main())
    dep.close()
    assert run.outcome.termination == "final_answer"
    assert _spent(url)[QUANTITIES.index("model_calls")] == run.step


def test_a_run_cancelled_while_redis_holds_its_reply_finishes_once_and_releases(
    held_redis: tuple[str, HoldingProxy],
) -> None:
    url, proxy = held_redis
    dep = deployment_for(
        url, plugins={"spend_limits": {"budgets": TENANT_DAY}}, store={**LOOP, "timeout_s": 30.0}
    )
    assert dep.shared.store
    finished: list[str] = []
    dep.connect(signals.run_stopped, lambda run, **kw: finished.append(kw["outcome"].termination))

    async def main() -> None:
        task = asyncio.create_task(dep.arun(scenario="refund", meta={"tenant": "acme"}))
        while not finished and _model_calls(dep) == 0:
            await asyncio.sleep(0.005)
        proxy.release.clear()  # the next store call waits ...
        while proxy.held == 0:
            await asyncio.sleep(0.005)
        task.cancel()  # ... and the run is cancelled meanwhile
        await asyncio.sleep(0.05)
        proxy.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    dep.close()
    assert finished == ["cancelled"]  # finished once, after its step got the store's answer
    store = make_store(url)
    rows = [r for r in store.rows() if r.key == "acme"]
    store.close()
    assert rows and rows[0].reserved == (0,) * len(QUANTITIES)  # nothing left held


def _model_calls(dep: Any) -> int:
    store = dep.shared._store
    return 0 if store is None else sum(r.committed[1] for r in store.rows())


# -- the connection pool ---------------------------------------------------------------------------


def test_the_redis_pool_is_sized_in_the_config_and_waits_instead_of_failing(
    redis_server: str,
) -> None:
    url = f"{redis_server}#lwtest-pool"
    base, _ = split_url(url)
    _drop("{lwtest-pool}:*", base)
    dep = deployment_for(
        url, plugins={"spend_limits": {"budgets": TENANT_DAY}}, store={**LOOP, "max_connections": 2}
    )
    store: Any = dep.shared.store
    assert store._r.connection_pool.max_connections == 2

    async def main() -> list[Any]:
        runs = [dep.arun(scenario="refund", meta={"tenant": "acme"}) for _ in range(30)]
        return await asyncio.gather(*runs)

    runs = asyncio.run(main())
    dep.close()
    assert {r.outcome.termination for r in runs} == {"final_answer"}  # none "Too many"
    assert _spent(url)[QUANTITIES.index("runs")] == 30
    _drop("{lwtest-pool}:*", base)


def _drop(pattern: str, url: str) -> None:
    import redis

    r = redis.Redis.from_url(url)
    for key in r.scan_iter(match=pattern):
        r.delete(key)
    r.close()


class _OtherIO:
    """A plugin whose hook waits on I/O that is not the store's (declared ``blocking_io``)."""

    blocking_io = True

    def __init__(self) -> None:
        self.threads: set[int] = set()

    @hookimpl
    def before_model(self, run: Any, request: Any) -> None:
        self.threads.add(threading.get_ident())


def test_a_plugin_with_other_blocking_io_keeps_its_hooks_off_the_loop(store_url: str) -> None:
    other = _OtherIO()
    config = parse_config(
        {
            "store": store_table(store_url, **LOOP),
            "plugins": {
                "enabled": ["spend_limits", "other_io"],
                "spend_limits": {"budgets": TENANT_DAY},
            },
        },
        path="<test>",
    )
    dep = Deployment(config, tools=shop_tools(), plugins={"other_io": other})

    async def main() -> Any:
        return await dep.arun(scenario="refund", meta={"tenant": "acme"}), LOOP_THREAD()

    run, loop_thread = asyncio.run(main())
    dep.close()
    assert run.outcome.termination == "final_answer"
    assert other.threads and loop_thread not in other.threads  # a worker thread, as before


def test_calls_to_a_stuck_store_wait_side_by_side_not_one_after_another(store_url: str) -> None:
    dep = deployment_for(store_url, plugins={"spend_limits": {"budgets": TENANT_DAY}}, store=LOOP)
    gated = install_store(dep, GatedStore)  # any store of one's own: each call on a thread

    async def main() -> list[Any]:
        tasks = [
            asyncio.create_task(dep.arun(scenario="refund", meta={"tenant": "acme"}))
            for _ in range(20)
        ]
        while len(gated.entered) < 20:  # every run's first reservation is held at once ...
            await asyncio.sleep(0.01)
        gated.gate.set()  # ... and only then let go
        return await asyncio.gather(*tasks)

    runs = asyncio.run(main())
    dep.close()
    assert gated.timeouts == 0
    assert {r.outcome.termination for r in runs} == {"final_answer"}
    assert len(gated.threads) >= 20


def test_by_default_store_using_steps_run_in_worker_threads(store_url: str) -> None:
    threads = _Threads()
    dep = deployment_for(store_url, plugins={"spend_limits": {"budgets": TENANT_DAY}})
    dep.connect(signals.step_finished, threads.step)

    async def main() -> Any:
        return await dep.arun(scenario="refund", meta={"tenant": "acme"}), LOOP_THREAD()

    run, loop_thread = asyncio.run(main())
    dep.close()
    assert dep.config.store.async_calls == "threads"
    assert run.outcome.termination == "final_answer"
    assert threads.hooks and loop_thread not in threads.hooks
