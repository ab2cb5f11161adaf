"""The shared store's interface, the same tests on a real SQLite file and a real redis-server."""

from __future__ import annotations

import multiprocessing
import time
from decimal import Decimal
from pathlib import Path

import pytest
from support.stores import make_store, split_url

from loopwarden.config import ConfigError
from loopwarden.exceptions import StoreError
from loopwarden.store import (
    QUANTITIES,
    Counter,
    SQLiteStore,
    cost_units,
    default_store_url,
    open_store,
    redact_url,
)


def counter(
    key: str = "acme",
    *,
    tokens: int | None = None,
    runs: int | None = None,
    window: str = "day",
    expires_at: float | None = None,
) -> Counter:
    return Counter(
        "tenant", key, window, "2026-11-30", (runs, None, None, tokens, None), expires_at
    )


def call(tokens: int) -> tuple[int, int, int, int, int]:
    return (0, 1, 0, tokens, 0)


def test_reserve_counts_live_reservations_and_refuses_past_a_limit(store_url: str) -> None:
    store = make_store(store_url)
    c = counter(tokens=1000)
    first = store.reserve([c], call(600), token="a", ttl_s=60)
    assert first.ok and first.used == ((0, 0, 0, 0, 0),)
    second = store.reserve([c], call(600), token="b", ttl_s=60)
    assert second.refused == (0, QUANTITIES.index("tokens"))
    assert second.used == ((0, 1, 0, 600, 0),)  # a's reservation counts
    store.settle([c], "a", call(350))  # the real usage replaces the reservation
    assert store.reserve([c], call(600), token="b", ttl_s=60).ok
    row = store.rows()[0]
    assert (row.committed, row.reserved) == ((0, 1, 0, 350, 0), (0, 1, 0, 600, 0))
    store.settle([c], "b", None)  # released: nothing counted
    assert store.rows()[0].reserved == (0, 0, 0, 0, 0)
    store.close()


def test_a_refusal_on_one_counter_reserves_nothing_on_the_others(store_url: str) -> None:
    store = make_store(store_url)
    roomy, tight = counter("acme", tokens=10_000), counter("u-17", tokens=100)
    res = store.reserve([roomy, tight], call(500), token="t", ttl_s=60)
    assert res.refused == (1, QUANTITIES.index("tokens"))
    assert store.rows() == []  # neither counter was touched
    store.close()


def test_commit_counts_at_once_and_checks_only_what_is_charged(store_url: str) -> None:
    store = make_store(store_url)
    c = counter(runs=2, tokens=100)
    for _ in range(2):
        assert store.reserve([c], (1, 0, 0, 0, 0), token="r", ttl_s=1, commit=True).ok
    assert store.reserve([c], (1, 0, 0, 0, 0), token="r", ttl_s=1, commit=True).refused == (
        0,
        QUANTITIES.index("runs"),
    )
    # runs are used up, but a model call of a run already started still fits
    assert store.reserve([c], call(50), token="m", ttl_s=60).ok
    store.close()


def test_a_reservation_expires_after_its_ttl(store_url: str) -> None:
    store = make_store(store_url)
    now = [1_000_000.0]
    store.now = lambda: now[0]  # type: ignore[method-assign]
    c = counter(tokens=1000)
    assert store.reserve([c], call(900), token="dead", ttl_s=30).ok
    assert not store.reserve([c], call(900), token="x", ttl_s=30).ok
    now[0] += 31  # the process that reserved died: its reservation no longer counts
    assert store.reserve([c], call(900), token="x", ttl_s=30).ok
    assert store.rows()[0].reserved == (0, 1, 0, 900, 0)
    store.close()


def test_rows_reset_and_expired_counters(store_url: str) -> None:
    store = make_store(store_url)
    store.reserve(
        [counter("acme"), counter("beta")], (1, 0, 0, 0, 0), token="r", ttl_s=1, commit=True
    )
    store.reserve(
        [counter("old", expires_at=time.time() - 1)],
        (1, 0, 0, 0, 0),
        token="r",
        ttl_s=1,
        commit=True,
    )
    assert [r.key for r in store.rows()] == ["acme", "beta"]
    assert store.reset("tenant", "acme") == 1
    assert store.reset("tenant", "nobody") == 0
    assert [(r.key, r.committed[0]) for r in store.rows()] == [("beta", 1)]
    store.close()


def test_cost_is_counted_exactly_in_integer_units(store_url: str) -> None:
    store = make_store(store_url)
    price = cost_units(Decimal("0.0000015"))
    c = Counter("tenant", "acme", "total", "total", (None, None, None, None, price * 3))
    for _ in range(3):
        assert store.reserve([c], (0, 0, 0, 0, price), token="c", ttl_s=1, commit=True).ok
    assert not store.reserve([c], (0, 0, 0, 0, 1), token="c", ttl_s=1, commit=True).ok
    assert store.rows()[0].as_dict()["spent"]["cost"] == pytest.approx(0.0000045)
    store.close()


def test_the_ledger_claims_once_and_records_the_outcome(store_url: str) -> None:
    store = make_store(store_url)
    assert store.claim("apply_refund:88231", "run-a", 60) is None
    running = store.claim("apply_refund:88231", "run-b", 60)
    assert running is not None and (running.state, running.owner) == ("running", "run-a")
    store.finish("apply_refund:88231", "run-b", "done", {"content": "forged"}, 60)  # not b's
    store.finish("apply_refund:88231", "run-a", "done", {"content": "RF1", "ok": True}, 60)
    done = store.claim("apply_refund:88231", "run-c", 60)
    assert (
        done is not None and done.state == "done" and done.result == {"content": "RF1", "ok": True}
    )
    assert store.claim("other", "run-a", 60) is None
    store.release("other", "run-a")  # a failure: the key may run again
    assert store.claim("other", "run-b", 60) is None
    store.close()


def test_a_ledger_entry_expires_after_its_ttl(store_url: str) -> None:
    store = make_store(store_url)
    assert store.claim("k", "a", 0.2) is None
    assert store.claim("k", "b", 0.2) is not None
    time.sleep(0.35)
    assert store.claim("k", "b", 0.2) is None
    store.close()


def _claim_worker(url: str, key: str, owner: str, start: float) -> bool:
    store = make_store(url)
    while time.time() < start:
        time.sleep(0.001)
    won = store.claim(key, owner, 60) is None
    store.close()
    return won


def _reserve_worker(url: str, start: float) -> int:
    """Reserve-then-commit 100-token calls until refused; returns how many were granted."""
    store = make_store(url)
    c = counter(tokens=5000)
    while time.time() < start:
        time.sleep(0.001)
    granted = 0
    while store.reserve([c], call(100), token=f"t{granted}-{id(store)}", ttl_s=60).ok:
        store.settle([c], f"t{granted}-{id(store)}", call(100))
        granted += 1
    store.close()
    return granted


@pytest.mark.slow
def test_processes_racing_on_one_key_one_wins(store_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 2.0  # all spawned by then, then they race
    with ctx.Pool(6) as pool:
        won = pool.starmap(
            _claim_worker, [(store_url, "apply_refund:88231", f"w{i}", start) for i in range(6)]
        )
    assert sum(won) == 1


@pytest.mark.slow
def test_processes_racing_on_one_budget_never_pass_it(store_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 2.0
    with ctx.Pool(6) as pool:
        granted = pool.starmap(_reserve_worker, [(store_url, start)] * 6)
    assert sum(granted) == 50  # 5000 tokens / 100 per call, however they interleave
    store = make_store(store_url)
    assert store.rows()[0].committed[QUANTITIES.index("tokens")] == 5000
    store.close()


def test_urls(tmp_path: object) -> None:
    assert default_store_url().startswith("sqlite:///")
    assert default_store_url().endswith("store.sqlite3")
    with pytest.raises(ConfigError, match="expected sqlite:///"):
        open_store("sqlite://relative.db")
    with pytest.raises(ConfigError, match="unsupported store URL 'mysql://u:\\*\\*\\*@h/db'"):
        open_store("mysql://u:secret@h/db")
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://u:pw@h/0") == "redis://u:***@h/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_an_unusable_sqlite_path_is_a_store_error(tmp_path: pytest.TempPathFactory) -> None:
    blocker = tmp_path / "file"  # type: ignore[operator]
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot open the SQLite store"):
        SQLiteStore(blocker / "store.sqlite3")


def test_an_unreachable_redis_is_a_store_error(redis_server: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_store(f"redis://127.0.0.1:{port}/0", timeout_s=0.5)
    with pytest.raises(StoreError, match="Redis store"):
        store.claim("k", "o", 1)
    base, _ = split_url(redis_server)
    assert make_store(base) is not None


def test_the_redis_extra_packs_and_parses_in_c(redis_server: str) -> None:
    """``loopwarden[redis]`` brings hiredis: redis-py then packs each command and parses each
    reply in C (about a third less client CPU per store call than its pure-Python parser)."""
    import redis.connection
    import redis.utils

    assert redis.utils.HIREDIS_AVAILABLE
    assert "Hiredis" in redis.connection.DefaultParser.__name__


def test_large_amounts_stay_exact(store_url: str) -> None:
    store = make_store(store_url)
    big = 10**15 + 7  # past Lua's 14-digit number formatting
    c = Counter("tenant", "acme", "month", "2026-11", (None,) * 5)
    store.reserve([c], (0, 0, 0, 0, big), token="a", ttl_s=1, commit=True)
    res = store.reserve([c], (0, 0, 0, 0, 1), token="b", ttl_s=60)
    assert res.used[0][QUANTITIES.index("cost")] == big
    assert store.rows()[0].reserved[QUANTITIES.index("cost")] == 1
    store.close()


def _open_store(path: str, barrier: object, results: object) -> None:
    from loopwarden.store import SQLiteStore

    barrier.wait()  # type: ignore[attr-defined]
    try:
        SQLiteStore(Path(path)).close()
        results.put("ok")  # type: ignore[attr-defined]
    except Exception as exc:
        results.put(repr(exc))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_processes_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Switching a new file to WAL does not wait on SQLite's busy handler: workers that open
    the store at the same moment used to fail with "database is locked"."""
    ctx = multiprocessing.get_context("spawn")
    outcomes: list[str] = []
    for i in range(6):
        barrier, results = ctx.Barrier(6), ctx.Queue()
        path = str(tmp_path / f"store-{i}.sqlite3")
        procs = [ctx.Process(target=_open_store, args=(path, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes += [results.get(timeout=10) for _ in procs]
    assert outcomes == ["ok"] * 36
