"""The SQLite backend of :mod:`loopwarden.store`: one file, WAL mode, ``BEGIN IMMEDIATE``.

Split from :mod:`loopwarden.store` (which re-exports :class:`SQLiteStore` and opens it for a
``sqlite:///PATH`` URL): the store module holds the interface the budgets and the ledger are
written against; this module holds one implementation of it -- the schema, the SQL, the
transaction and fork handling.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from loopwarden.exceptions import StoreError
from loopwarden.paths import private_file
from loopwarden.store import (
    QUANTITIES,
    Amounts,
    Counter,
    CounterRow,
    LedgerEntry,
    LedgerState,
    Reserved,
    _amounts,
    _Backend,
    _DocUpdate,
    _entry,
    _ident,
)
from loopwarden.store.admin import CHANGES_KEPT, Change, LedgerRow, LimitOverride
from loopwarden.store.breakers import BreakerView

__all__ = ["SQLiteStore"]

log = logging.getLogger("loopwarden.store")


def _json(text: object) -> Any:
    """A stored JSON value (None for none, or for text that is not JSON)."""
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _first_refused(
    used: Amounts, amount: Sequence[int], limits: Sequence[int | None]
) -> int | None:
    for q, (u, a, lim) in enumerate(zip(used, amount, limits, strict=True)):
        if lim is not None and a > 0 and u + a > lim:
            return q
    return None


_SQL_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (
    scope TEXT NOT NULL, key TEXT NOT NULL, window TEXT NOT NULL, bucket TEXT NOT NULL,
    runs INTEGER NOT NULL DEFAULT 0, model_calls INTEGER NOT NULL DEFAULT 0,
    tool_calls INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    cost INTEGER NOT NULL DEFAULT 0, expires_at REAL,
    PRIMARY KEY (scope, key, window, bucket)
);
CREATE TABLE IF NOT EXISTS reservations (
    token TEXT NOT NULL, scope TEXT NOT NULL, key TEXT NOT NULL, window TEXT NOT NULL,
    bucket TEXT NOT NULL, runs INTEGER NOT NULL, model_calls INTEGER NOT NULL,
    tool_calls INTEGER NOT NULL, tokens INTEGER NOT NULL, cost INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (scope, key, window, bucket, token)
);
CREATE INDEX IF NOT EXISTS reservations_expiry ON reservations (expires_at);
CREATE INDEX IF NOT EXISTS counters_expiry ON counters (expires_at);
CREATE TABLE IF NOT EXISTS ledger (
    key TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT NOT NULL, started_at REAL NOT NULL,
    result TEXT, expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_expiry ON ledger (expires_at);
CREATE TABLE IF NOT EXISTS breakers (
    key TEXT PRIMARY KEY, doc TEXT NOT NULL, expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS breakers_expiry ON breakers (expires_at);
CREATE TABLE IF NOT EXISTS overrides (
    scope TEXT NOT NULL, key TEXT NOT NULL, window TEXT NOT NULL,
    runs INTEGER, model_calls INTEGER, tool_calls INTEGER, tokens INTEGER, cost INTEGER,
    set_at REAL NOT NULL, set_by TEXT NOT NULL,
    PRIMARY KEY (scope, key, window)
);
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, by TEXT NOT NULL,
    action TEXT NOT NULL, target TEXT NOT NULL, old TEXT, new TEXT
);
"""

#: expired rows a write deletes on its way (counters, reservations, ledger entries), on
#: average: pruning stays opportunistic and bounded -- a store never grows with the runs it
#: has seen, and no write pays for a large backlog at once
PRUNE_BATCH = 64
#: budget writes (reserve, settle) prune every this many, each up to this many batches: the
#: statements of a prune are not paid on every call of the hot path, the pace stays the same
PRUNE_EVERY = 8

#: the first and the longest pause between tries for the file's write lock (seconds, jittered):
#: SQLite's own busy handler sleeps 1, 2, 5, 10 ... 100 ms in turn, so one of 8 writers could
#: sleep tens of milliseconds past a lock that each holds for a fraction of one
LOCK_RETRY_S = (0.0002, 0.002)

_COLS = ", ".join(QUANTITIES)
_SUMS = ", ".join(f"SUM({q})" for q in QUANTITIES)
_WHERE = "scope = ? AND key = ? AND window = ? AND bucket = ?"
#: counters one ``SELECT`` reads (each is two arms of a ``UNION ALL``; SQLite allows 500)
_USED_CHUNK = 100
#: count an amount into a counter (created if absent)
_SQL_ADD = (
    f"INSERT INTO counters (scope, key, window, bucket, {_COLS}, expires_at) "
    "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (scope, key, window, bucket) DO UPDATE SET "
    + ", ".join(f"{q} = {q} + excluded.{q}" for q in QUANTITIES)
    + ", expires_at = excluded.expires_at"
)
#: create a counter, or move its expiry (a reservation's counter is listed by ``rows``)
_SQL_TOUCH = (
    "INSERT INTO counters (scope, key, window, bucket, expires_at) VALUES (?,?,?,?,?) "
    "ON CONFLICT (scope, key, window, bucket) DO UPDATE SET expires_at = excluded.expires_at"
)
_SQL_HOLD = (
    f"INSERT OR REPLACE INTO reservations (token, scope, key, window, bucket, {_COLS}, "
    "expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_SQL_DROP = f"DELETE FROM reservations WHERE {_WHERE} AND token = ?"


@lru_cache(maxsize=32)
def _used_sql(n: int) -> str:
    """One ``SELECT`` of ``n`` counters' rows, live reservations and limit overrides, tagged
    by counter index and kind (0: the counter, with its expiry; 1: the sum of its live
    reservations; 2: an operator's override of its limits)."""
    return " UNION ALL ".join(
        f"SELECT {i}, 0, {_COLS}, expires_at FROM counters WHERE {_WHERE} UNION ALL "
        f"SELECT {i}, 1, {_SUMS}, NULL FROM reservations WHERE {_WHERE} AND expires_at > ? "
        f"UNION ALL SELECT {i}, 2, {_COLS}, NULL FROM overrides "
        "WHERE scope = ? AND key = ? AND window = ?"
        for i in range(n)
    )


def _effective(limits: Sequence[int | None], over: Sequence[Any] | None) -> tuple[int | None, ...]:
    """A counter's limits with an override's (its non-NULL columns) in their place."""
    if over is None:
        return tuple(limits)
    return tuple(o if o is not None else c for c, o in zip(limits, over, strict=True))


def _override(row: Sequence[Any]) -> LimitOverride:
    """An override from ``scope, key, window, <quantities>, set_at, set_by``."""
    n = len(QUANTITIES)
    limits = tuple(None if v is None else int(v) for v in row[3 : 3 + n])
    return LimitOverride(
        str(row[0]), str(row[1]), str(row[2]), limits, float(row[3 + n]), str(row[4 + n])
    )


def _units(o: LimitOverride | None) -> dict[str, int] | None:
    """An override's limits as the change log keeps them (store units, by quantity)."""
    if o is None:
        return None
    return {q: v for q, v in zip(QUANTITIES, o.limits, strict=True) if v is not None}


@dataclass(frozen=True, slots=True)
class _Used:
    """What one reserve's ``SELECT`` found (see :meth:`SQLiteStore._used`)."""

    used: tuple[Amounts, ...]
    reserved: tuple[Amounts, ...]
    limits: tuple[tuple[int | None, ...], ...]
    touch: list[bool]
    stale: list[int]


class SQLiteStore(_Backend):
    """The store in one SQLite file (WAL mode; ``BEGIN IMMEDIATE`` for every change).

    ``timeout_s`` bounds one store call: waiting for this process's other threads, for
    another process's write lock (tried again in short pauses, :meth:`_locked`) and the
    retries of opening a new file, all together.  A new file is created owner-only (0600),
    in owner-only directories where it creates them (0700).
    """

    def __init__(self, path: Path, *, timeout_s: float = 5.0) -> None:
        super().__init__()
        self.path = path
        self.url = "sqlite:///" + str(path)
        self.now = time.time  #: the wall clock (tests may replace it)
        self._timeout = timeout_s  # one call's whole wait, lock included
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._writes = 0  # budget writes by this process: every PRUNE_EVERY-th prunes
        self._conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        # Switching a new file to WAL takes an exclusive lock without waiting on the busy
        # handler: processes that open the store at once can get "database is locked" at
        # once.  Retry the set-up with a short jittered backoff, within the lock timeout.
        deadline = time.monotonic() + self._timeout
        delay = 0.01
        while True:
            conn: sqlite3.Connection | None = None
            try:
                private_file(self.path)  # owner-only, before SQLite creates it 0644
                conn = sqlite3.connect(
                    str(self.path),
                    timeout=self._timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SQL_SCHEMA)
                # from now on the store waits for the write lock itself (_locked): within
                # timeout_s, with short pauses instead of SQLite's growing ones
                conn.execute("PRAGMA busy_timeout = 0")
                return conn
            except sqlite3.OperationalError as exc:
                if conn is not None:
                    conn.close()
                busy = "locked" in str(exc) or "busy" in str(exc)
                if not busy or time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"cannot open the SQLite store {self.path}: {exc}", url=self.url
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)
            except (sqlite3.Error, OSError) as exc:
                if conn is not None:
                    conn.close()
                raise StoreError(
                    f"cannot open the SQLite store {self.path}: {exc}", url=self.url
                ) from exc

    @contextmanager
    def _held(self, deadline: float) -> Iterator[sqlite3.Connection]:
        """This process's connection, for this thread alone (waiting until ``deadline`` for
        the other threads); a forked child opens its own.  SQLite errors become
        :class:`StoreError`."""
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise StoreError(
                f"SQLite store {self.path}: busy (other calls of this process held it "
                f"for {self._timeout:g} s)",
                url=self.url,
            )
        try:
            if self._closed:
                raise StoreError("the store is closed", url=self.url)
            if os.getpid() != self._pid:  # a forked child: never share the parent's connection
                self._pid, self._conn = os.getpid(), self._connect()
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite store {self.path}: {exc}", url=self.url) from exc
        finally:
            self._lock.release()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction (serialised across threads and processes),
        waiting at most ``timeout_s`` in all for the thread lock and the file's write lock."""
        deadline = time.monotonic() + self._timeout
        with self._held(deadline) as conn:
            self._locked(conn, "BEGIN IMMEDIATE", deadline)
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            self._locked(conn, "COMMIT", deadline)

    @staticmethod
    def _locked(conn: sqlite3.Connection, sql: str, deadline: float) -> None:
        """Run ``sql`` (``BEGIN IMMEDIATE``, ``COMMIT``), trying again while the file is
        locked by another connection, until ``deadline`` (then SQLite's error stands)."""
        delay = LOCK_RETRY_S[0]
        while True:
            try:
                conn.execute(sql)
                return
            except sqlite3.OperationalError as exc:
                busy = "locked" in str(exc) or "busy" in str(exc)
                left = deadline - time.monotonic()
                if not busy or left <= 0:
                    raise
            time.sleep(min(delay * (0.5 + random.random()), left))
            delay = min(delay * 2, LOCK_RETRY_S[1])

    @staticmethod
    def _used(conn: sqlite3.Connection, counters: Sequence[Counter], now: float) -> _Used:
        """Per counter: committed plus live reserved amounts (and the reserved part), its
        limits (an operator's override in place of the counter's), and whether its row must
        be written to be listed (absent, or with another expiry) -- one ``SELECT`` (per
        :data:`_USED_CHUNK` counters); and which counters have an expired row not pruned
        yet (it counts nothing: the caller deletes it before writing)."""
        sums = [[0] * len(QUANTITIES) for _ in counters]
        held = [[0] * len(QUANTITIES) for _ in counters]
        over: list[Sequence[Any] | None] = [None] * len(counters)
        touch = [True] * len(counters)
        stale: list[int] = []
        for start in range(0, len(counters), _USED_CHUNK):
            chunk = counters[start : start + _USED_CHUNK]
            args: list[Any] = []
            for c in chunk:
                ident = _ident(c)
                args += [*ident, *ident, now, c.scope, c.key, c.window]
            for row in conn.execute(_used_sql(len(chunk)), args):
                i = start + row[0]
                if row[1] == 2:
                    over[i] = row[2:7]
                    continue
                if row[1] == 0:
                    if row[7] is not None and row[7] <= now:
                        stale.append(i)
                        continue
                    touch[i] = row[7] != counters[i].expires_at
                for acc in (sums[i], held[i]) if row[1] == 1 else (sums[i],):
                    for q in range(len(QUANTITIES)):
                        acc[q] += row[2 + q] or 0
        limits = tuple(_effective(c.limits, o) for c, o in zip(counters, over, strict=True))
        return _Used(
            tuple(_amounts(a) for a in sums),
            tuple(_amounts(a) for a in held),
            limits,
            touch,
            stale,
        )

    def _prune_due(self, conn: sqlite3.Connection, now: float) -> None:
        """Every :data:`PRUNE_EVERY`-th budget write: delete expired reservations and
        counters, up to ``PRUNE_EVERY`` x :data:`PRUNE_BATCH` rows each."""
        self._writes += 1
        if self._writes % PRUNE_EVERY == 1:  # the first write of a process prunes, too
            self._prune(conn, "reservations", now, PRUNE_BATCH * PRUNE_EVERY)
            self._prune(conn, "counters", now, PRUNE_BATCH * PRUNE_EVERY)

    @staticmethod
    def _prune(conn: sqlite3.Connection, table: str, now: float, limit: int = PRUNE_BATCH) -> int:
        """Delete up to ``limit`` expired rows of ``table`` (by its expiry index); how many."""
        return conn.execute(
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
            "WHERE expires_at <= ? LIMIT ?)",
            (now, limit),
        ).rowcount

    def _prune_all(self) -> None:
        """Delete every expired row of every table, :data:`PRUNE_BATCH` x
        :data:`PRUNE_EVERY` rows per transaction, until none is left or ``timeout_s`` has
        passed."""
        deadline = time.monotonic() + self._timeout
        batch = PRUNE_BATCH * PRUNE_EVERY
        for table in ("reservations", "counters", "ledger", "breakers"):
            while time.monotonic() < deadline:
                with self._tx() as conn:
                    if self._prune(conn, table, self.now(), batch) < batch:
                        break

    def _reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        token: str,
        ttl_s: float,
        commit: bool,
    ) -> Reserved:
        # one transaction: a SELECT of what every counter holds, then the writes (one
        # statement per counter and kind); expired reservations are not counted (the SELECT
        # skips them) and are pruned with expired counters every PRUNE_EVERY writes
        now = self.now()
        with self._tx() as conn:
            self._prune_due(conn, now)
            u = self._used(conn, counters, now)
            used, touch, stale = u.used, u.touch, u.stale
            for i in range(len(counters)):
                q = _first_refused(used[i], amount, u.limits[i])
                if q is not None:
                    return Reserved(used, (i, q), u.reserved, u.limits)
            if stale:  # an expired window's row, not pruned yet: it starts from nothing
                conn.executemany(
                    f"DELETE FROM counters WHERE {_WHERE}", [_ident(counters[i]) for i in stale]
                )
            if commit:
                conn.executemany(_SQL_ADD, [(*_ident(c), *amount, c.expires_at) for c in counters])
            else:
                touched = [
                    (*_ident(c), c.expires_at) for c, t in zip(counters, touch, strict=True) if t
                ]
                if touched:  # the counter exists (with its expiry): listed by rows()
                    conn.executemany(_SQL_TOUCH, touched)
                conn.executemany(
                    _SQL_HOLD, [(token, *_ident(c), *amount, now + ttl_s) for c in counters]
                )
            return Reserved(used, None, u.reserved, u.limits)

    def _settle(
        self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None
    ) -> None:
        with self._tx() as conn:
            conn.executemany(_SQL_DROP, [(*_ident(c), token) for c in counters])
            if actual is not None:
                conn.executemany(_SQL_ADD, [(*_ident(c), *actual, c.expires_at) for c in counters])

    def _rows(self) -> list[CounterRow]:
        now = self.now()
        with self._tx() as conn:
            conn.execute("DELETE FROM reservations WHERE expires_at <= ?", (now,))
            conn.execute("DELETE FROM counters WHERE expires_at <= ?", (now,))
            rows = conn.execute(
                f"SELECT scope, key, window, bucket, {_COLS}, expires_at FROM counters "
                "ORDER BY scope, key, window, bucket"
            ).fetchall()
            reserved = {
                tuple(r[:4]): _amounts(r[4:])
                for r in conn.execute(
                    "SELECT scope, key, window, bucket, "
                    f"{', '.join(f'SUM({q})' for q in QUANTITIES)} FROM reservations "
                    "GROUP BY scope, key, window, bucket"
                )
            }
        return [
            CounterRow(
                r[0],
                r[1],
                r[2],
                r[3],
                _amounts(r[4:9]),
                reserved.get(tuple(r[:4]), (0, 0, 0, 0, 0)),
                r[9],
            )
            for r in rows
        ]

    def _reset(self, scope: str, key: str) -> int:
        with self._tx() as conn:
            conn.execute("DELETE FROM reservations WHERE scope = ? AND key = ?", (scope, key))
            return conn.execute(
                "DELETE FROM counters WHERE scope = ? AND key = ?", (scope, key)
            ).rowcount

    def _claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        now = self.now()
        with self._tx() as conn:
            row = conn.execute(
                "SELECT state, owner, started_at, result FROM ledger "
                "WHERE key = ? AND expires_at > ?",
                (key, now),
            ).fetchone()
            if row is not None:
                return _entry(key, str(row[0]), str(row[1]), row[2], row[3])
            self._prune(conn, "ledger", now)
            conn.execute(
                "INSERT OR REPLACE INTO ledger (key, state, owner, started_at, result, "
                "expires_at) VALUES (?, 'running', ?, ?, NULL, ?)",
                (key, owner, now, now + ttl_s),
            )
            return None

    def _finish(
        self,
        key: str,
        owner: str,
        state: LedgerState,
        result: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> None:
        text = json.dumps(result, ensure_ascii=False) if result is not None else None
        with self._tx() as conn:
            conn.execute(
                "UPDATE ledger SET state = ?, result = ?, expires_at = ? "
                "WHERE key = ? AND owner = ?",
                (state, text, self.now() + ttl_s, key, owner),
            )

    def _release(self, key: str, owner: str) -> None:
        with self._tx() as conn:  # a recorded outcome is never released
            conn.execute(
                "DELETE FROM ledger WHERE key = ? AND owner = ? AND state = 'running'",
                (key, owner),
            )

    # -- circuit breakers ------------------------------------------------------------------

    @staticmethod
    def _doc(conn: sqlite3.Connection, key: str, now: float) -> dict[str, Any] | None:
        row = conn.execute(
            "SELECT doc FROM breakers WHERE key = ? AND expires_at > ?", (key, now)
        ).fetchone()
        if row is None:
            return None
        try:
            doc = json.loads(row[0])
        except ValueError:
            return None  # unreadable: starts afresh (a breaker fails open)
        return doc if isinstance(doc, dict) else None

    def _update_doc(self, key: str, fn: _DocUpdate) -> BreakerView:
        # read first without the write lock: a closed breaker's admit changes nothing, and
        # every tool call of every process asks; only a change takes BEGIN IMMEDIATE and
        # decides again on what it reads under the lock
        now = self.now()
        with self._held(time.monotonic() + self._timeout) as conn:
            new, out = fn(self._doc(conn, key, now), now)
        if new is None:
            return out
        with self._tx() as conn:
            now = self.now()
            new, out = fn(self._doc(conn, key, now), now)
            if new is not None:
                self._prune(conn, "breakers", now)  # breakers nobody touched for keep_s
                conn.execute(
                    "INSERT OR REPLACE INTO breakers (key, doc, expires_at) VALUES (?, ?, ?)",
                    (key, json.dumps(new), float(new.get("expires_at") or now)),
                )
        return out

    def _shared_now(self) -> float:
        # one file on one host: every process that shares it reads the same clock
        return self.now()

    def _docs(self) -> list[tuple[str, dict[str, Any]]]:
        now = self.now()
        with self._tx() as conn:
            conn.execute("DELETE FROM breakers WHERE expires_at <= ?", (now,))
            keys = [r[0] for r in conn.execute("SELECT key FROM breakers ORDER BY key")]
            out = []
            for key in keys:
                doc = self._doc(conn, key, now)
                if doc is not None:
                    out.append((str(key), doc))
        return out

    def _drop_doc(self, key: str) -> bool:
        with self._tx() as conn:
            return conn.execute("DELETE FROM breakers WHERE key = ?", (key,)).rowcount > 0

    # -- operations --------------------------------------------------------------------------

    _OVERRIDE_COLS = f"scope, key, window, {_COLS}, set_at, set_by"

    def _overrides(self) -> list[LimitOverride]:
        with self._tx() as conn:
            rows = conn.execute(f"SELECT {self._OVERRIDE_COLS} FROM overrides").fetchall()
        return [_override(r) for r in rows]

    def _set_override(
        self,
        target: tuple[str, str, str],
        updates: Mapping[int, int | None],
        by: str,
        action: str,
        now: float,
    ) -> tuple[LimitOverride | None, LimitOverride | None]:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT {self._OVERRIDE_COLS} FROM overrides "
                "WHERE scope = ? AND key = ? AND window = ?",
                target,
            ).fetchone()
            old = _override(row) if row is not None else None
            limits = list(old.limits if old is not None else (None,) * len(QUANTITIES))
            for q, v in updates.items():
                limits[q] = v
            new: LimitOverride | None = None
            if any(v is not None for v in limits):
                new = LimitOverride(*target, tuple(limits), now, by)
                conn.execute(
                    f"INSERT OR REPLACE INTO overrides ({self._OVERRIDE_COLS}) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (*target, *limits, now, by),
                )
            else:
                conn.execute(
                    "DELETE FROM overrides WHERE scope = ? AND key = ? AND window = ?", target
                )
            scope, key, window = target
            if old is not None or new is not None:
                target_doc = {"scope": scope, "key": key, "window": window}
                self._append(conn, Change(now, by, action, target_doc, _units(old), _units(new)))
        return old, new

    @staticmethod
    def _append(conn: sqlite3.Connection, change: Change) -> None:
        """Append ``change`` to the log, dropping what falls past :data:`CHANGES_KEPT`."""
        cur = conn.execute(
            "INSERT INTO changes (at, by, action, target, old, new) VALUES (?,?,?,?,?,?)",
            (
                change.at,
                change.by,
                change.action,
                json.dumps(change.target, ensure_ascii=False),
                json.dumps(change.old, ensure_ascii=False),
                json.dumps(change.new, ensure_ascii=False),
            ),
        )
        if cur.lastrowid is not None and cur.lastrowid > CHANGES_KEPT:
            conn.execute("DELETE FROM changes WHERE id <= ?", (cur.lastrowid - CHANGES_KEPT,))

    def _log(self, change: Change) -> None:
        with self._tx() as conn:
            self._append(conn, change)

    def _changes(self, limit: int) -> list[Change]:
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT at, by, action, target, old, new FROM changes ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            Change(float(r[0]), str(r[1]), str(r[2]), _json(r[3]) or {}, _json(r[4]), _json(r[5]))
            for r in rows
        ]

    def _ledger_rows(self) -> list[LedgerRow]:
        now = self.now()
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT key, state, owner, started_at, result, expires_at FROM ledger "
                "WHERE expires_at > ?",
                (now,),
            ).fetchall()
        out = []
        for r in rows:
            e = _entry(str(r[0]), str(r[1]), str(r[2]), r[3], r[4])
            out.append(
                LedgerRow(e.key, e.state, e.owner, e.started_at, float(r[5]), e.result, e.corrupt)
            )
        return out

    def _forget(self, key: str, by: str, running: bool, now: float) -> str:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT state, owner, started_at FROM ledger WHERE key = ? AND expires_at > ?",
                (key, now),
            ).fetchone()
            if row is None:
                return "absent"
            if row[0] == "running" and not running:
                return "running"
            conn.execute("DELETE FROM ledger WHERE key = ?", (key,))
            old = {"state": row[0], "owner": row[1], "started_at": row[2]}
            self._append(conn, Change(now, by, "forget_ledger", {"key": key}, old, None))
        return "forgotten"

    def close(self) -> None:
        """Prune every expired row, then close: a store that is no longer written keeps
        nothing that has expired, however many runs it saw.  A batch of rows per
        transaction, so other writers go in between; all of it within ``timeout_s``."""
        if not self._closed and self._pid == os.getpid():
            try:
                self._prune_all()
            except StoreError as exc:  # busy or broken: closing goes on, the rows wait
                log.warning("SQLite store %s: pruning at close failed: %s", self.path, exc)
        self._close_owner()
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._conn.close()
            self._closed = True
