"""What a budget call costs the store: one round trip for a reserve, one for a settle.

Counted, never timed (speed is measured in ``bench/shared_budget.py``): on Redis each request
written to the server, on SQLite each transaction and each statement in it
(:mod:`loopwarden.testing.roundtrips`).  A real SQLite file and the real Redis.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from support.stores import make_store, split_url

from loopwarden.exceptions import StoreError
from loopwarden.store import Counter, RedisStore, Reserved, SQLiteStore, open_store
from loopwarden.testing.roundtrips import RoundTrips, count_round_trips


def _counters(n: int) -> list[Counter]:
    """``n`` counters of one call (a tenant's day, a user's day, ...), each with a limit."""
    return [
        Counter(f"scope{i}", "acme", "day", "2026-12-01", limits=(None, 1000, None, None, None))
        for i in range(n)
    ]


def _sqlite_shape(counts: RoundTrips) -> list[str]:
    """The statements of a SQLite call, by their first word."""
    return [s.split()[0].upper() for s in counts.statements]


@pytest.mark.parametrize("n", [1, 3])
def test_a_reserve_and_a_settle_are_one_round_trip_each(store_url: str, n: int) -> None:
    store = make_store(store_url)
    counters = _counters(n)
    store.reserve(counters, (0, 1, 0, 0, 0), token="warm", ttl_s=60)  # scripts loaded
    store.settle(counters, "warm", (0, 1, 0, 0, 0))
    with count_round_trips(store) as counts:
        for i in range(5):
            counts.reset()
            res = store.reserve(counters, (0, 1, 0, 100, 0), token=f"t{i}", ttl_s=60)
            assert res.ok and counts.round_trips == 1, counts
            reserve = _sqlite_shape(counts)
            counts.reset()
            store.settle(counters, f"t{i}", (0, 1, 0, 90, 0))
            assert counts.round_trips == 1, counts
            settle = _sqlite_shape(counts)
        counts.reset()
        refused = store.reserve(counters, (0, 5000, 0, 0, 0), token="big", ttl_s=60)
        assert refused.refused == (0, 1) and counts.round_trips == 1
        counts.reset()
        store.reserve(counters, (1, 0, 0, 0, 0), token="run", ttl_s=1, commit=True)
        assert counts.round_trips == 1
    if isinstance(store, SQLiteStore):
        # one transaction, no set-up statements: a SELECT of every counter at once, then a
        # write per counter (the counter rows exist: only the reservations are written)
        assert reserve == ["BEGIN", "SELECT", *["INSERT"] * n, "COMMIT"]
        assert settle == ["BEGIN", *["DELETE"] * n, *["INSERT"] * n, "COMMIT"]
    assert [r.committed[1] for r in store.rows()] == [6] * n
    store.close()


def test_a_sqlite_reserve_prunes_expired_rows_only_now_and_then(tmp_path: Path) -> None:
    """Pruning expired counters and reservations costs statements: every 8th write pays them,
    with 8 batches at once; expired reservations are never counted meanwhile."""
    store = SQLiteStore(tmp_path / "store.sqlite3")
    now = [1000.0]
    store.now = lambda: now[0]
    (c,) = _counters(1)
    store.reserve([c], (0, 600, 0, 0, 0), token="old", ttl_s=5)  # expires at 1005
    now[0] = 1010.0
    prunes = []
    with count_round_trips(store) as counts:
        for i in range(16):
            counts.reset()
            assert store.reserve([c], (0, 600, 0, 0, 0), token=f"t{i}", ttl_s=1).ok
            prunes.append(_sqlite_shape(counts).count("DELETE"))
            now[0] += 2  # each expired before the next
    assert sum(prunes) == 4 and prunes.count(2) == 2  # 2 of 16 writes prune both tables
    store.close()


def test_an_expired_sqlite_counter_not_pruned_yet_counts_nothing(tmp_path: Path) -> None:
    """Between prunes, a window's expired row may still be there: a reserve on it starts
    from nothing, and the row it leaves holds only the new window's spend."""
    store = SQLiteStore(tmp_path / "store.sqlite3")
    now = [1000.0]
    store.now = lambda: now[0]
    c = Counter("run", "r1", "run", "-", limits=(None, 5, None, None, None), expires_at=1001.0)
    assert store.reserve([c], (0, 5, 0, 0, 0), token="a", ttl_s=1, commit=True).ok  # prunes
    now[0] = 1002.0  # the row expired; the next write is not a pruning one
    c2 = Counter("run", "r1", "run", "-", limits=(None, 5, None, None, None), expires_at=2000.0)
    with count_round_trips(store) as counts:
        res = store.reserve([c2], (0, 5, 0, 0, 0), token="b", ttl_s=1, commit=True)
    assert res.ok and res.used == ((0, 0, 0, 0, 0),)
    assert "DELETE" in _sqlite_shape(counts)
    (row,) = store.rows()
    assert row.committed == (0, 5, 0, 0, 0) and row.expires_at == 2000.0
    store.close()


def test_a_sqlite_writer_retries_the_write_lock_itself_with_short_pauses(
    tmp_path: Path,
) -> None:
    """Another connection holds the file's write lock: the store tries ``BEGIN IMMEDIATE``
    again and again (short pauses, within ``timeout_s``) rather than sleeping in SQLite's busy
    handler, whose pauses grow to 100 ms; once the lock is free, the call goes through."""
    path = tmp_path / "store.sqlite3"
    store = SQLiteStore(path, timeout_s=30.0)
    (c,) = _counters(1)
    store.reserve([c], (0, 1, 0, 0, 0), token="warm", ttl_s=60)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a real write lock, held by a second connection
    tries = threading.Semaphore(0)
    outcome: list[object] = []
    with count_round_trips(store) as counts:

        def trace(sql: str) -> None:  # every thread's statements: the call runs in another
            counts.statements.append(sql)
            if sql.startswith("BEGIN"):
                tries.release()

        store._conn.set_trace_callback(trace)

        def call() -> None:
            try:
                outcome.append(store.reserve([c], (0, 1, 0, 0, 0), token="t", ttl_s=60))
            except StoreError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=call)
        worker.start()
        try:
            for _ in range(5):  # five tries while the lock is held: retried by the store
                assert tries.acquire(timeout=20), "the store did not try the lock again"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        worker.join(timeout=30)
    (res,) = outcome
    assert isinstance(res, Reserved) and res.ok
    assert _sqlite_shape(counts).count("COMMIT") == 1
    store.close()


def _redis_store(store_url: str, query: str, timeout_s: float = 5.0) -> RedisStore:
    base, ns = split_url(store_url)
    store = open_store(base + query, namespace=ns, timeout_s=timeout_s)
    assert isinstance(store, RedisStore)
    return store


@pytest.mark.parametrize("store_url", ["redis"], indirect=True)
def test_more_threads_than_redis_connections_wait_for_one(store_url: str) -> None:
    """Eight threads on a store of two connections: every call waits its turn and succeeds
    (redis-py's plain pool refused the third concurrent call: "Too many connections")."""
    store = _redis_store(store_url, "?max_connections=2")
    (c,) = _counters(1)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(w: int) -> None:
        barrier.wait()
        for i in range(25):
            try:
                store.reserve([c], (0, 1, 0, 0, 0), token=f"{w}:{i}", ttl_s=60)
                store.settle([c], f"{w}:{i}", (0, 1, 0, 0, 0))
            except StoreError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    (row,) = store.rows()
    assert row.committed[1] == 200 and row.reserved == (0, 0, 0, 0, 0)
    store.close()


@pytest.mark.parametrize("store_url", ["redis"], indirect=True)
def test_a_redis_pool_busy_for_timeout_s_is_a_store_error(store_url: str) -> None:
    """Every connection held elsewhere: the call gives up after ``timeout_s`` with a store
    error (a bound on the wait, not a speed measurement)."""
    store = _redis_store(store_url, "?max_connections=1", timeout_s=0.2)
    pool = store._r.connection_pool
    held = pool.get_connection()
    try:
        with pytest.raises(StoreError, match="No connection available"):
            store.reserve(_counters(1), (0, 1, 0, 0, 0), token="t", ttl_s=60)
    finally:
        pool.release(held)
    assert store.reserve(_counters(1), (0, 1, 0, 0, 0), token="t", ttl_s=60).ok
    store.close()
