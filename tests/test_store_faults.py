"""The store under faults (issue 19: items 3, 4, 7, 8, 9, 11, 15, 16), on a real SQLite file and
a real redis-server.

Faults come from the hostile-world kit (``support.faults``): for Redis a TCP proxy that
forwards a command to the real server and loses its reply (a real fault); for SQLite a store
whose transaction commits and then raises the error a timeout would (simulated: SQLite has
no reply to lose).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.faults import faulty_store
from support.stores import deployment_for, make_store, pay_tool, split_url, write_scenario

from loopwarden.commands.cli import main as cli_main
from loopwarden.config import ConfigError, parse_config
from loopwarden.exceptions import StoreError
from loopwarden.store import Counter, SQLiteStore, open_store


def _effects(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n") if path.exists() else 0


def _observations(run: Any) -> list[str]:
    return [m["content"] for m in run.messages if m["role"] == "tool"]


# -- 3: a store error is no proof that nothing was written ----------------------------------------


@pytest.mark.parametrize("then_down", [False, True], ids=["reply-lost", "reply-lost-then-down"])
def test_a_claim_whose_reply_was_lost_does_not_block_the_side_effect(
    store_url: str, tmp_path: Path, then_down: bool
) -> None:
    """The claim reached the store, its reply did not: the run fails closed, and the next run
    executes the side effect -- not "being executed by another run" for 7 days."""
    effects, scenario = tmp_path / "effects.txt", str(write_scenario(tmp_path))
    with faulty_store(store_url) as fault:
        dep = deployment_for(
            fault.url,
            enabled=(),
            tools=[pay_tool(effects)],
            store={"timeout_s": fault.timeout_s, "namespace": fault.namespace},
        )
        fault.install(dep)
        fault.lose_next_reply(then_down=then_down)
        first = dep.run(scenario=scenario)
        assert _effects(effects) == 0
        assert "was not executed" in _observations(first)[0]  # fail closed
        assert [e["hook"] for e in first.record()["errors"]] == ["claiming a side effect"]
        fault.heal()  # then_down: the release failed too; it is retried at the next answer
        second = dep.run(scenario=scenario)
        dep.close()
    assert _effects(effects) == 1, _observations(second)
    assert second.tools_executed == 1
    # and the ledger holds the outcome for everyone else
    other = deployment_for(store_url, enabled=(), tools=[pay_tool(effects)])
    third = other.run(scenario=scenario)
    other.close()
    assert _effects(effects) == 1 and third.tools_executed == 0
    assert "by an earlier run" in _observations(third)[0]


def test_a_claim_found_with_our_own_owner_is_ours(store_url: str) -> None:
    """A claim written by a try whose reply was lost, and not released (the store went down):
    the same owner claiming again gets it; anyone else sees it in progress."""
    with faulty_store(store_url) as fault:
        store = fault.store()
        fault.lose_next_reply(then_down=True)
        with pytest.raises(StoreError):
            store.claim("pay:7", "run-1/call-1", 60)
        fault.heal()
        other = make_store(store_url)
        entry = other.claim("pay:7", "run-2/call-1", 60)  # not released yet: nobody answered
        assert entry is not None and entry.owner == "run-1/call-1"
        assert store.claim("pay:7", "run-1/call-1", 60) is None  # ours: go on and execute
        entry = other.claim("pay:7", "run-2/call-1", 60)
        assert entry is not None and (entry.state, entry.owner) == ("running", "run-1/call-1")
        store.finish("pay:7", "run-1/call-1", "done", {"content": "PAID", "ok": True}, 60)
        done = other.claim("pay:7", "run-2/call-1", 60)
        assert done is not None and done.state == "done"
        other.close()
        store.close()


@pytest.mark.parametrize("then_down", [False, True], ids=["reply-lost", "reply-lost-then-down"])
def test_a_reservation_whose_reply_was_lost_holds_no_budget(
    store_url: str, then_down: bool
) -> None:
    c = Counter("tenant", "acme", "day", "2026-12-01", (None, None, None, 1000, None))
    whole = (0, 1, 0, 1000, 0)
    with faulty_store(store_url) as fault:
        store = fault.store()
        fault.lose_next_reply(then_down=then_down)
        with pytest.raises(StoreError):
            store.reserve([c], whole, token="run-1:1", ttl_s=300)
        fault.heal()
        store.rows()  # the next answered call (then_down: the undo waited for it)
        other = make_store(store_url)
        assert other.reserve([c], whole, token="run-2:1", ttl_s=300).ok
        other.close()
        store.close()


# -- 4: an unreadable ledger entry ----------------------------------------------------------------


def _corrupt_ledger(store_url: str, text: bytes) -> int:
    """Overwrite the recorded result of every ledger entry with ``text``; returns how many."""
    base, ns = split_url(store_url)
    if base.startswith("sqlite"):
        with sqlite3.connect(base[len("sqlite:///") :]) as conn:
            n = conn.execute("UPDATE ledger SET result = ?", (text,)).rowcount
        conn.close()
        return n
    import redis

    r = redis.Redis.from_url(base)
    keys = list(r.scan_iter(match="{" + ns + "}:l:*"))
    for k in keys:
        r.hset(k, "result", text)
    r.close()
    return len(keys)


@pytest.mark.parametrize("text", [b'{"content": "PAID', b"[1, 2]", b"\xff\xfe"])
def test_a_corrupt_ledger_entry_is_may_have_taken_effect_never_a_crash(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, text: bytes
) -> None:
    effects, scenario = tmp_path / "effects.txt", str(write_scenario(tmp_path))
    dep = deployment_for(store_url, enabled=(), tools=[pay_tool(effects)])
    dep.run(scenario=scenario)
    assert _effects(effects) == 1
    assert _corrupt_ledger(store_url, text) == 1
    with caplog.at_level(logging.ERROR, logger="loopwarden.store"):
        run = dep.run(scenario=scenario)
    dep.close()
    record = run.record()
    assert record["termination"] != "error", record
    assert _effects(effects) == 1  # never executed again
    assert run.tools_executed == 0
    assert record["ledger_answers"][0]["state"] == "unknown"
    assert any("corrupt ledger entry" in e["error"] for e in record["errors"])
    assert "unreadable" in caplog.text


# -- 7: scope keys that cannot collide ------------------------------------------------------------


def test_scope_keys_are_escaped_so_two_scopes_never_share_an_entry(
    store_url: str, tmp_path: Path
) -> None:
    effects, scenario = tmp_path / "effects.txt", str(write_scenario(tmp_path))
    dep = deployment_for(store_url, enabled=(), tools=[pay_tool(effects)])
    first = dep.run(scenario=scenario, meta={"tenant": "a|user=b", "user": "c"})
    second = dep.run(scenario=scenario, meta={"tenant": "a", "user": "b|user=c"})
    dep.close()
    assert _effects(effects) == 2
    assert first.tools_executed == second.tools_executed == 1
    assert "PAID 7" in _observations(second)[0]


def test_plain_scope_keys_stay_as_before() -> None:
    from loopwarden.store import ledger_key

    key = 'pay_invoice:{"invoice":"7"}'
    assert ledger_key(key, []) == key  # unscoped: unchanged
    assert ledger_key(key, [("tenant", "acme"), ("user", "u-17")]) == f"tenant=acme|user=u-17|{key}"
    assert ledger_key(key, [("tenant", "a|user=b"), ("user", "c")]) != ledger_key(
        key, [("tenant", "a"), ("user", "b|user=c")]
    )
    assert ledger_key(key, [("tenant", "a%7C")]) != ledger_key(key, [("tenant", "a|")])


# -- 8: a ledger entry never lives shorter than its lease -----------------------------------------


def test_a_ledger_ttl_shorter_than_the_lease_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"ledger_ttl_s \(1 s\) is shorter than.*ledger_lease_s"):
        parse_config({"store": {"ledger_ttl_s": 1, "ledger_lease_s": 600}}, path="<test>")
    parse_config({"store": {"ledger_ttl_s": 600, "ledger_lease_s": 600}}, path="<test>")


# -- 9: expired counters are pruned as the store is written ---------------------------------------


def _expired_left(store_url: str, now: float) -> int:
    """Expired counters the store still holds: SQLite rows; Redis index members."""
    base, ns = split_url(store_url)
    if base.startswith("sqlite"):
        with sqlite3.connect(base[len("sqlite:///") :]) as conn:
            (n,) = conn.execute(
                "SELECT COUNT(*) FROM counters WHERE expires_at <= ?", (now,)
            ).fetchone()
        conn.close()
        return int(n)
    import redis

    r = redis.Redis.from_url(base)
    n = 0
    for k in r.scan_iter(match="{" + ns + "}:*"):
        kind = r.type(k)
        if kind == b"set":
            n += r.scard(k)
        elif kind == b"zset":
            n += r.zcount(k, "-inf", now)
    r.close()
    return n


def test_expired_run_counters_are_pruned_as_the_store_is_written(store_url: str) -> None:
    store = make_store(store_url)
    now = time.time()
    for i in range(300):  # 300 runs' "run" windows, ended a minute ago
        c = Counter("run", f"run-{i}", "run", "-", expires_at=now - 60)
        store.reserve([c], (1, 0, 0, 0, 0), token=f"t{i}", ttl_s=1, commit=True)
    day = Counter("tenant", "acme", "day", "2026-12-01", expires_at=now + 86400)
    for i in range(8):  # a few more writes: each prunes a bounded batch on its way
        store.reserve([day], (0, 1, 0, 10, 0), token=f"d{i}", ttl_s=60, commit=True)
    assert _expired_left(store_url, now) == 0
    assert [r.key for r in store.rows()] == ["acme"]
    store.close()


def test_no_expired_sqlite_counter_outlives_the_deployment(tmp_path: Path) -> None:
    """The round-4 finding (666 expired rows kept after 2,000 runs): rows that expire after
    the last write were never pruned -- nothing wrote again.  Runs with short-lived "run"
    windows, their counters expired, the deployment closed: no expired row is left."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    budgets = [{"scope": "tenant", "window": "run", "max_model_calls": 100}]
    plugins = {"spend_limits": {"budgets": budgets, "keep_runs_s": 0.05}}
    dep = deployment_for(url, plugins=plugins)
    for i in range(20):
        assert dep.run(scenario="refund", meta={"tenant": f"t{i}"}).record()["steps"] > 0
    time.sleep(0.2)  # past every counter's expiry (keep_runs_s after its run)
    assert _expired_left(url, time.time()) > 0  # the last runs' rows, expired, still there
    dep.close()
    assert _expired_left(url, time.time()) == 0


def test_expired_counters_never_outnumber_live_work_after_close(store_url: str) -> None:
    """Issue 43, item 13: 2,000 runs with ``keep_runs_s = 1`` (two counters each: the run's
    and its conversation's), one more run after they expired, then ``close()``.  Main left
    1,440 expired SQLite rows (close pruned one bounded batch) and, on Redis, every expired
    member in the counter index -- a sorted set without a TTL -- plus each run's emptied
    reservation hash until its TTL.  What is left is the live run's, nothing of history."""
    store = make_store(store_url)
    start = time.time()
    now = [start]
    store.now = lambda: now[0]  # type: ignore[method-assign]
    for i in range(2000):
        counters = [
            Counter("tenant", f"t{i}", "run", f"run-{i}", expires_at=now[0] + 1),
            Counter("tenant", f"t{i}", "conversation", f"conv-{i}", expires_at=now[0] + 1),
        ]
        store.reserve(counters, (1, 0, 0, 0, 0), token=f"r{i}", ttl_s=60, commit=True)
        store.reserve(counters, (0, 1, 0, 50, 0), token=f"m{i}", ttl_s=60)
        store.settle(counters, f"m{i}", (0, 1, 0, 40, 0))
    now[0] = start + 2  # every counter above has expired
    last = [Counter("tenant", "last", "run", "run-last", expires_at=now[0] + 60)]
    store.reserve(last, (1, 0, 0, 0, 0), token="r-last", ttl_s=60, commit=True)
    store.reserve(last, (0, 1, 0, 50, 0), token="m-last", ttl_s=60)  # in flight at close
    store.close()
    assert _expired_left(store_url, now[0]) == 0
    base, ns = split_url(store_url)
    if base.startswith("sqlite"):
        with sqlite3.connect(base[len("sqlite:///") :]) as conn:
            rows = conn.execute("SELECT key FROM counters").fetchall()
            held = conn.execute("SELECT token FROM reservations").fetchall()
        conn.close()
        assert rows == [("last",)] and held == [("m-last",)]
        return
    import redis

    r = redis.Redis.from_url(base)
    try:
        index = "{" + ns + "}:cidx"
        assert r.zcard(index) == 1  # the live counter, listed
        assert 0 < r.ttl(index) <= 64  # and the index lives about as long as it does
        held = sorted(k.decode() for k in r.scan_iter(match="{" + ns + "}:h:*"))
        assert held == ["{" + ns + "}:h:tenant\x1flast\x1frun\x1frun-last"]  # in flight only
    finally:
        r.close()


def test_expired_ledger_entries_are_pruned_sqlite(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite3")
    for i in range(200):
        assert store.claim(f"pay:{i}", "a", 0.001) is None
    time.sleep(0.01)  # past every entry's expiry
    for i in range(5):
        assert store.claim(f"new:{i}", "a", 60) is None
    store.close()
    with sqlite3.connect(tmp_path / "store.sqlite3") as conn:
        (n,) = conn.execute("SELECT COUNT(*) FROM ledger").fetchone()
    conn.close()
    assert n == 5


# -- 11: timeout_s bounds one store call ----------------------------------------------------------


def test_a_sqlite_lock_held_elsewhere_waits_timeout_s_not_six_times_it(tmp_path: Path) -> None:
    """Another connection holds the write lock: the call fails after about ``timeout_s``.

    A hang bound, not a speed measurement: main waited 6 x timeout_s (3 s here)."""
    path = tmp_path / "store.sqlite3"
    store = SQLiteStore(path, timeout_s=0.5)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a real write lock, held by a second connection
    try:
        start = time.monotonic()
        with pytest.raises(StoreError, match="locked"):
            store.claim("pay:7", "a", 60)
        waited = time.monotonic() - start
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert waited < 2.0  # timeout_s plus scheduling noise; 3.0 s before
    assert store.claim("pay:7", "a", 60) is None  # the lock is gone: the store works
    store.close()


# -- 15: no password from the store URL anywhere --------------------------------------------------


SECRET = "hunter2-Secret-Pw"


@pytest.mark.parametrize(
    "form", ["redis://127.0.0.1:{port}/1?password={pw}", "redis://user:{pw}@127.0.0.1:{port}/1"]
)
def test_a_redis_password_never_leaves_the_store(
    redis_server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    form: str,
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: the store is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = form.format(port=port, pw=SECRET)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[store]\nurl = "{url}"\ntimeout_s = 0.5\n'
        '[plugins]\nenabled = ["spend_limits"]\n'
        '[plugins.spend_limits]\nbudgets = [{ scope = "tenant", window = "day", max_runs = 9 }]\n',
        encoding="utf-8",
    )
    cli_main(
        ["run", "--scenario", "refund", "--meta", "tenant=acme", "--json", "--config", str(cfg)]
    )
    out, err = capsys.readouterr()
    assert "store_unavailable" in out  # the record says what happened ...
    assert SECRET not in out and SECRET not in err  # ... without the password
    assert "***" in out
    assert cli_main(["budgets", "--config", str(cfg)]) == 2  # the store is down: an error line
    out, err = capsys.readouterr()
    assert "***" in err and SECRET not in out + err
    with pytest.raises(StoreError) as info:
        open_store(url, timeout_s=0.5).claim("k", "o", 1)
    assert SECRET not in str(info.value) and SECRET not in str(info.value.url)


def test_loopwarden_budgets_masks_a_query_password(
    redis_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = split_url(redis_server)
    cfg = tmp_path / "config.toml"
    for extra in ("?password=", "?db=1&password="):
        cfg.write_text(
            f'[store]\nurl = "{base}{extra}{SECRET}"\nnamespace = "lwtest-budgets-pw"\n',
            encoding="utf-8",
        )
        for args in (["budgets"], ["budgets", "--json"]):
            cli_main([*args, "--config", str(cfg)])
            out, err = capsys.readouterr()
            assert SECRET not in out + err
            assert "password=***" in out


# -- 16: the store's file is owner-only -----------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_a_new_sqlite_store_is_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: 0644 files, 0755 directories
    try:
        path = tmp_path / "data" / "lw" / "store.sqlite3"
        store = SQLiteStore(path)
        store.claim("k", "o", 60)
        sides = list(path.parent.glob("store.sqlite3-*"))  # WAL, shared memory: while open
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in sides}
        store.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert modes and set(modes.values()) == {0o600}, modes


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_an_existing_store_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.touch(mode=0o640)
    os.chmod(path, 0o640)  # an operator's choice: shared with a group
    SQLiteStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
