"""The shared store: budgets and the side-effect ledger, shared across runs, processes, hosts.

One small interface (:class:`Store`), two real implementations, chosen by ``[store] url``:

``sqlite:///PATH``
    an embedded SQLite file (the default: ``store.sqlite3`` in the data directory,
    ``LOOPWARDEN_DATA_DIR``) -- nothing to start; shared by every process on the host.
    SQLAlchemy's convention: ``sqlite:///runs/store.db`` is relative to the working directory,
    ``sqlite:////var/lib/lw/store.db`` absolute.  Atomicity: ``BEGIN IMMEDIATE`` transactions.
``redis://HOST:PORT/DB`` (also ``rediss://``, ``unix://``)
    a Redis server, for many processes on many hosts, through the ``redis`` package (the
    optional extra ``loopwarden[redis]``, imported only here).  Atomicity: Lua scripts; every
    key carries the hash tag ``{namespace}``, so a Redis Cluster keeps them in one slot.

**Counters** hold what a scope spent in a window -- ``runs``, ``model_calls``, ``tool_calls``,
``tokens``, ``cost`` (integers; cost in units of :data:`COST_UNIT`) -- plus live
*reservations*: :meth:`Store.reserve` checks ``committed + reserved + amount <= limit`` for
every counter of a call and, only if all fit, records the reservation (or commits the amount at
once), atomically; :meth:`Store.settle` replaces a reservation with the real usage.  A
reservation expires after its TTL, so one of a process that died never leaks.

The **ledger** maps an idempotency key to ``running`` / ``done`` / ``unknown`` (may have taken
effect) and the recorded result: :meth:`Store.claim` is an atomic "insert if absent", so of two
workers racing on one key exactly one executes.

:class:`Shared` is a deployment's link to its store: opened on first use, with the
``on_store_error`` policy, and the ledger glue the loop calls.  Store calls are synchronous --
one round trip each, a fraction of a millisecond on an idle host (``bench/shared_budget.py``)
-- also inside async runs, where hooks are synchronous anyway.
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
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from loopwarden.exceptions import ConfigError, StoreError

if TYPE_CHECKING:
    from loopwarden.config import StoreConfig
    from loopwarden.events import ToolCall, ToolResult
    from loopwarden.run import Run

__all__ = [
    "COST_UNIT",
    "QUANTITIES",
    "Counter",
    "CounterRow",
    "LedgerEntry",
    "RedisStore",
    "Reserved",
    "SQLiteStore",
    "Shared",
    "Store",
    "cost_units",
    "default_store_url",
    "open_store",
    "redact_url",
]

log = logging.getLogger("loopwarden.store")

#: what a counter counts, in this order everywhere (amounts, limits, usage)
QUANTITIES: tuple[str, ...] = ("runs", "model_calls", "tool_calls", "tokens", "cost")
#: the cost counter's unit: a billionth of the currency (integers: exact and atomic in Redis)
COST_UNIT = Decimal("0.000000001")

Amounts = tuple[int, int, int, int, int]
LedgerState = Literal["running", "done", "unknown"]


def cost_units(amount: Decimal) -> int:
    """``amount`` in :data:`COST_UNIT` (rounded up: a reservation never under-counts)."""
    return int((amount / COST_UNIT).to_integral_value(rounding=ROUND_CEILING))


@dataclass(frozen=True, slots=True)
class Counter:
    """One budget's counter: what ``scope`` = ``key`` spent in ``window`` (``bucket``: which
    hour, day, month, run...), with the limits to check (None: unchecked) and when the counter
    may be forgotten (wall-clock seconds; None: never)."""

    scope: str
    key: str
    window: str
    bucket: str
    limits: tuple[int | None, ...] = (None,) * len(QUANTITIES)
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class Reserved:
    """The answer of :meth:`Store.reserve`.

    ``used`` is, per counter, what was committed plus reserved by live reservations *before*
    this one; ``refused`` is ``(counter index, quantity index)`` of the first limit the amount
    did not fit (nothing was reserved), None when it was reserved (or committed).
    """

    used: tuple[Amounts, ...]
    refused: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        return self.refused is None


@dataclass(frozen=True, slots=True)
class CounterRow:
    """A counter as ``loopwarden budgets`` shows it."""

    scope: str
    key: str
    window: str
    bucket: str
    committed: Amounts
    reserved: Amounts
    expires_at: float | None

    def as_dict(self) -> dict[str, Any]:
        spent = dict(zip(QUANTITIES, self.committed, strict=True))
        reserved = dict(zip(QUANTITIES, self.reserved, strict=True))
        spent["cost"] = float(Decimal(spent["cost"]) * COST_UNIT)  # type: ignore[assignment]
        reserved["cost"] = float(Decimal(reserved["cost"]) * COST_UNIT)  # type: ignore[assignment]
        return {
            "scope": self.scope,
            "key": self.key,
            "window": self.window,
            "bucket": self.bucket,
            "spent": spent,
            "reserved": reserved,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A side effect's entry in the ledger (``result``: ``content``, ``ok``, ``error``)."""

    key: str
    state: str
    owner: str
    started_at: float
    result: dict[str, Any] | None = None


class Store(Protocol):
    """What the budgets and the ledger need from a store (see the module docstring)."""

    url: str

    def reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        *,
        token: str,
        ttl_s: float,
        commit: bool = False,
    ) -> Reserved:
        """Atomically: if ``amount`` fits every counter's limits, reserve it under ``token``
        for ``ttl_s`` seconds (``commit``: count it at once instead)."""
        ...

    def settle(self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None) -> None:
        """Drop the reservation ``token``; count ``actual`` instead (None: nothing)."""
        ...

    def rows(self) -> list[CounterRow]:
        """Every live counter, with committed and live reserved amounts."""
        ...

    def reset(self, scope: str, key: str) -> int:
        """Forget every counter (and reservation) of ``scope`` = ``key``; returns how many."""
        ...

    def claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        """Atomically: record ``key`` as ``running`` by ``owner`` and return None -- or, when
        a live entry exists, return it untouched."""
        ...

    def finish(
        self,
        key: str,
        owner: str,
        state: LedgerState,
        result: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> None:
        """Record the outcome of ``owner``'s claim (ignored when the claim is not theirs)."""
        ...

    def release(self, key: str, owner: str) -> None:
        """Remove ``owner``'s claim (the call failed before taking effect)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def default_store_url() -> str:
    """``store.sqlite3`` in the data directory (``LOOPWARDEN_DATA_DIR`` overrides it)."""
    from loopwarden.paths import data_dir

    return "sqlite:///" + str(data_dir() / "store.sqlite3")


def redact_url(url: str) -> str:
    """``url`` without a password (for logs, evidence and the command line)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def open_store(url: str, *, namespace: str = "loopwarden", timeout_s: float = 5.0) -> Store:
    """The store for ``url`` (``sqlite:///PATH`` or ``redis://HOST:PORT/DB``)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise ConfigError(
                f"bad SQLite URL {url!r}",
                key="store.url",
                expected="sqlite:///relative/path or sqlite:////absolute/path",
            )
        return SQLiteStore(Path(url[len("sqlite:///") :]).expanduser(), timeout_s=timeout_s)
    if scheme in ("redis", "rediss", "unix"):
        return RedisStore(url, namespace=namespace, timeout_s=timeout_s)
    raise ConfigError(
        f"unsupported store URL {redact_url(url)!r}",
        key="store.url",
        expected="sqlite:///PATH or redis://HOST:PORT/DB",
    )


def _amounts(values: Sequence[Any]) -> Amounts:
    a = [int(v or 0) for v in values]
    return (a[0], a[1], a[2], a[3], a[4])


def _first_refused(
    used: Amounts, amount: Sequence[int], limits: Sequence[int | None]
) -> int | None:
    for q, (u, a, lim) in enumerate(zip(used, amount, limits, strict=True)):
        if lim is not None and a > 0 and u + a > lim:
            return q
    return None


# ---------------------------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------------------------

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
"""

_COLS = ", ".join(QUANTITIES)
_WHERE = "scope = ? AND key = ? AND window = ? AND bucket = ?"


def _ident(c: Counter) -> tuple[str, str, str, str]:
    return (c.scope, c.key, c.window, c.bucket)


class SQLiteStore:
    """The store in one SQLite file (WAL mode; ``BEGIN IMMEDIATE`` for every change)."""

    def __init__(self, path: Path, *, timeout_s: float = 5.0) -> None:
        self.path = path
        self.url = "sqlite:///" + str(path)
        self.now = time.time  #: the wall clock (tests may replace it)
        self._timeout = max(timeout_s, 1.0) * 6  # waiting for another writer's lock
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
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
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(
                    str(self.path),
                    timeout=self._timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SQL_SCHEMA)
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
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction (serialised across threads and processes)."""
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed", url=self.url)
            if os.getpid() != self._pid:  # a forked child: never share the parent's connection
                self._pid, self._conn = os.getpid(), self._connect()
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite store {self.path}: {exc}", url=self.url) from exc

    def _used(self, conn: sqlite3.Connection, c: Counter) -> Amounts:
        ident = _ident(c)
        row = conn.execute(f"SELECT {_COLS} FROM counters WHERE {_WHERE}", ident).fetchone()
        res = conn.execute(
            f"SELECT {', '.join(f'SUM({q})' for q in QUANTITIES)} FROM reservations WHERE {_WHERE}",
            ident,
        ).fetchone()
        return _amounts([(row[i] if row else 0) + (res[i] or 0) for i in range(len(QUANTITIES))])

    @staticmethod
    def _add(conn: sqlite3.Connection, c: Counter, amount: Sequence[int]) -> None:
        conn.execute(
            f"INSERT INTO counters (scope, key, window, bucket, {_COLS}, expires_at) "
            "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (scope, key, window, bucket) DO UPDATE SET "
            + ", ".join(f"{q} = {q} + excluded.{q}" for q in QUANTITIES)
            + ", expires_at = excluded.expires_at",
            (*_ident(c), *amount, c.expires_at),
        )

    def reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        *,
        token: str,
        ttl_s: float,
        commit: bool = False,
    ) -> Reserved:
        now = self.now()
        with self._tx() as conn:
            conn.execute("DELETE FROM reservations WHERE expires_at <= ?", (now,))
            used = tuple(self._used(conn, c) for c in counters)
            for i, c in enumerate(counters):
                q = _first_refused(used[i], amount, c.limits)
                if q is not None:
                    return Reserved(used, (i, q))
            for c in counters:
                if commit:
                    self._add(conn, c, amount)
                else:
                    self._add(conn, c, (0,) * len(QUANTITIES))  # the counter exists: listed
                    conn.execute(
                        "INSERT OR REPLACE INTO reservations (token, scope, key, window, bucket, "
                        f"{_COLS}, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (token, *_ident(c), *amount, now + ttl_s),
                    )
            return Reserved(used)

    def settle(self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None) -> None:
        with self._tx() as conn:
            for c in counters:
                conn.execute(
                    f"DELETE FROM reservations WHERE {_WHERE} AND token = ?", (*_ident(c), token)
                )
                if actual is not None:
                    self._add(conn, c, actual)

    def rows(self) -> list[CounterRow]:
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

    def reset(self, scope: str, key: str) -> int:
        with self._tx() as conn:
            conn.execute("DELETE FROM reservations WHERE scope = ? AND key = ?", (scope, key))
            return conn.execute(
                "DELETE FROM counters WHERE scope = ? AND key = ?", (scope, key)
            ).rowcount

    def claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        now = self.now()
        with self._tx() as conn:
            row = conn.execute(
                "SELECT state, owner, started_at, result FROM ledger "
                "WHERE key = ? AND expires_at > ?",
                (key, now),
            ).fetchone()
            if row is not None:
                return LedgerEntry(
                    key, row[0], row[1], row[2], json.loads(row[3]) if row[3] else None
                )
            conn.execute(
                "INSERT OR REPLACE INTO ledger (key, state, owner, started_at, result, "
                "expires_at) VALUES (?, 'running', ?, ?, NULL, ?)",
                (key, owner, now, now + ttl_s),
            )
            return None

    def finish(
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

    def release(self, key: str, owner: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM ledger WHERE key = ? AND owner = ?", (key, owner))

    def close(self) -> None:
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._conn.close()
            self._closed = True


# ---------------------------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------------------------

# KEYS: per counter, its hash and its reservations hash; then the index set.
# ARGV: now, ttl, commit, token, the 5 amounts, then per counter: expires_at (-1: never),
# scope, key, window, bucket, the 5 limits (-1: none).
_LUA_RESERVE = """
local Q = {'runs', 'model_calls', 'tool_calls', 'tokens', 'cost'}
local now = tonumber(ARGV[1]); local ttl = tonumber(ARGV[2])
local commit = ARGV[3] == '1'; local token = ARGV[4]
local amount = {}
for q = 1, 5 do amount[q] = tonumber(ARGV[4 + q]) end
local n = (#KEYS - 1) / 2
local index = KEYS[#KEYS]
local out = {0, 0}
local refused = false
for i = 1, n do
  local ck, rk = KEYS[2 * i - 1], KEYS[2 * i]
  local o = 9 + (i - 1) * 10
  local vals = redis.call('HMGET', ck, 'runs', 'model_calls', 'tool_calls', 'tokens', 'cost')
  local used = {}
  for q = 1, 5 do used[q] = tonumber(vals[q] or '0') or 0 end
  local res = redis.call('HGETALL', rk)
  for j = 1, #res, 2 do
    local p = {}
    for x in string.gmatch(res[j + 1], '[^,]+') do p[#p + 1] = tonumber(x) end
    if p[6] <= now then
      redis.call('HDEL', rk, res[j])
    else
      for q = 1, 5 do used[q] = used[q] + p[q] end
    end
  end
  for q = 1, 5 do out[#out + 1] = used[q] end  -- integer replies: exact to 2^53
  if not refused then
    for q = 1, 5 do
      local lim = tonumber(ARGV[o + 5 + q])
      if lim >= 0 and amount[q] > 0 and used[q] + amount[q] > lim then
        refused = true; out[1] = i; out[2] = q; break
      end
    end
  end
end
if refused then return out end
for i = 1, n do
  local ck, rk = KEYS[2 * i - 1], KEYS[2 * i]
  local o = 9 + (i - 1) * 10
  redis.call('HSET', ck, 'scope', ARGV[o + 2], 'key', ARGV[o + 3], 'window', ARGV[o + 4],
             'bucket', ARGV[o + 5])
  if commit then
    for q = 1, 5 do
      if amount[q] ~= 0 then redis.call('HINCRBY', ck, Q[q], ARGV[4 + q]) end
    end
  else
    redis.call('HSET', rk, token, table.concat({ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]},
               ',') .. ',' .. tostring(now + ttl))
    redis.call('EXPIRE', rk, math.ceil(ttl) + 1)
  end
  local exp = tonumber(ARGV[o + 1])
  if exp > 0 then redis.call('EXPIREAT', ck, math.ceil(exp)) end
  redis.call('SADD', index, ck)
end
return out
"""

# KEYS: per counter, its hash and its reservations hash; then the index set.
# ARGV: token, count (1/0), the 5 amounts, then per counter: expires_at, scope, key, window,
# bucket.
_LUA_SETTLE = """
local Q = {'runs', 'model_calls', 'tool_calls', 'tokens', 'cost'}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local ck, rk = KEYS[2 * i - 1], KEYS[2 * i]
  local o = 7 + (i - 1) * 5
  redis.call('HDEL', rk, ARGV[1])
  if ARGV[2] == '1' then
    redis.call('HSET', ck, 'scope', ARGV[o + 2], 'key', ARGV[o + 3], 'window', ARGV[o + 4],
               'bucket', ARGV[o + 5])
    for q = 1, 5 do
      if tonumber(ARGV[2 + q]) ~= 0 then redis.call('HINCRBY', ck, Q[q], ARGV[2 + q]) end
    end
    local exp = tonumber(ARGV[o + 1])
    if exp > 0 then redis.call('EXPIREAT', ck, math.ceil(exp)) end
    redis.call('SADD', KEYS[#KEYS], ck)
  end
end
return 1
"""

# KEYS: the entry.  ARGV: owner, now, ttl_ms.  Returns {} when claimed, else the entry.
_LUA_CLAIM = """
local e = redis.call('HGETALL', KEYS[1])
if #e > 0 then return e end
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1], 'started_at', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {}
"""

# KEYS: the entry.  ARGV: owner, state, result ('' for none), ttl_ms; state '' releases.
_LUA_FINISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]); return 1 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'result', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RedisStore:
    """The store on a Redis server (Lua scripts for every check-and-change)."""

    def __init__(self, url: str, *, namespace: str = "loopwarden", timeout_s: float = 5.0) -> None:
        try:
            import redis
        except ImportError:
            raise ConfigError(
                "a redis:// store needs the redis package: pip install 'loopwarden[redis]'",
                key="store.url",
            ) from None
        self.url = url
        self.now = time.time  #: the wall clock (tests may replace it)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._prefix = "{" + namespace + "}:"
        self._index = self._prefix + "counters"
        try:
            self._r = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
            self._reserve = self._r.register_script(_LUA_RESERVE)
            self._settle = self._r.register_script(_LUA_SETTLE)
            self._claim = self._r.register_script(_LUA_CLAIM)
            self._finish = self._r.register_script(_LUA_FINISH)
        except (ValueError, *self._errors) as exc:
            raise StoreError(
                f"cannot use the Redis store {redact_url(url)}: {exc}", url=redact_url(url)
            ) from exc

    @contextmanager
    def _errors_as_store_error(self) -> Iterator[None]:
        try:
            yield
        except self._errors as exc:
            raise StoreError(
                f"Redis store {redact_url(self.url)}: {exc}", url=redact_url(self.url)
            ) from exc

    def _keys(self, c: Counter) -> tuple[str, str]:
        ident = "\x1f".join(_ident(c))
        return self._prefix + "c:" + ident, self._prefix + "r:" + ident

    def reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        *,
        token: str,
        ttl_s: float,
        commit: bool = False,
    ) -> Reserved:
        keys: list[str] = []
        args: list[Any] = [
            repr(self.now()),
            repr(float(ttl_s)),
            "1" if commit else "0",
            token,
            *(int(a) for a in amount),
        ]
        for c in counters:
            keys.extend(self._keys(c))
            args.extend(
                [
                    repr(c.expires_at) if c.expires_at is not None else "-1",
                    *_ident(c),
                    *(-1 if lim is None else int(lim) for lim in c.limits),
                ]
            )
        keys.append(self._index)
        with self._errors_as_store_error():
            out = self._reserve(keys=keys, args=args)
        nums = [int(x) for x in out]
        used = tuple(_amounts(nums[2 + 5 * i : 7 + 5 * i]) for i in range(len(counters)))
        refused = (nums[0] - 1, nums[1] - 1) if nums[0] else None
        return Reserved(used, refused)

    def settle(self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None) -> None:
        keys: list[str] = []
        args: list[Any] = [
            token,
            "1" if actual is not None else "0",
            *(int(a) for a in (actual or (0,) * len(QUANTITIES))),
        ]
        for c in counters:
            keys.extend(self._keys(c))
            args.extend([repr(c.expires_at) if c.expires_at is not None else "-1", *_ident(c)])
        keys.append(self._index)
        with self._errors_as_store_error():
            self._settle(keys=keys, args=args)

    def rows(self) -> list[CounterRow]:
        now = self.now()
        out: list[CounterRow] = []
        with self._errors_as_store_error():
            names = sorted(
                n if isinstance(n, bytes) else str(n).encode()
                for n in self._r.smembers(self._index)
            )
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
                pipe.hgetall(name.replace(b"}:c:", b"}:r:", 1))
                pipe.ttl(name)
            got = pipe.execute()
            gone = []
            for n, name in enumerate(names):
                h, res, exp = got[3 * n], got[3 * n + 1], got[3 * n + 2]
                if not h:
                    gone.append(name)
                    continue
                reserved = [0] * len(QUANTITIES)
                for value in res.values():
                    parts = value.decode().split(",")
                    if float(parts[5]) > now:
                        for q in range(len(QUANTITIES)):
                            reserved[q] += int(parts[q])
                d = {k.decode(): v.decode() for k, v in h.items()}
                expires = float(round(now + exp)) if exp > 0 else None
                out.append(
                    CounterRow(
                        d["scope"],
                        d["key"],
                        d["window"],
                        d["bucket"],
                        _amounts([d.get(q, 0) for q in QUANTITIES]),
                        _amounts(reserved),
                        expires,
                    )
                )
            if gone:
                self._r.srem(self._index, *gone)
        out.sort(key=lambda r: (r.scope, r.key, r.window, r.bucket))
        return out

    def reset(self, scope: str, key: str) -> int:
        n = 0
        for row in self.rows():
            if row.scope == scope and row.key == key:
                c = Counter(row.scope, row.key, row.window, row.bucket)
                ck, rk = self._keys(c)
                with self._errors_as_store_error():
                    self._r.delete(ck, rk)
                    self._r.srem(self._index, ck)
                n += 1
        return n

    def _entry_key(self, key: str) -> str:
        return self._prefix + "l:" + key

    def claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        with self._errors_as_store_error():
            out = self._claim(
                keys=[self._entry_key(key)],
                args=[owner, repr(self.now()), max(1, int(ttl_s * 1000))],
            )
        if not out:
            return None
        d = {out[i].decode(): out[i + 1].decode() for i in range(0, len(out), 2)}
        result = json.loads(d["result"]) if d.get("result") else None
        return LedgerEntry(key, d["state"], d["owner"], float(d["started_at"]), result)

    def finish(
        self,
        key: str,
        owner: str,
        state: LedgerState,
        result: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> None:
        text = json.dumps(result, ensure_ascii=False) if result is not None else ""
        with self._errors_as_store_error():
            self._finish(
                keys=[self._entry_key(key)], args=[owner, state, text, max(1, int(ttl_s * 1000))]
            )

    def release(self, key: str, owner: str) -> None:
        with self._errors_as_store_error():
            self._finish(keys=[self._entry_key(key)], args=[owner, "", "", 1])

    def close(self) -> None:
        self._r.close()


# ---------------------------------------------------------------------------------------------
# A deployment's link to its store
# ---------------------------------------------------------------------------------------------


class Shared:
    """A deployment's store: opened on first use, with the ``on_store_error`` policy.

    Plugins reach it through ``run.shared`` (set for live runs by ``Deployment.prepare``;
    None in a replay, which must never charge budgets or consult the ledger).
    """

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.url = config.url or default_store_url()
        self.fail_open = config.on_store_error == "fail_open"
        self._store: Store | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> Store:
        """The store (opened now if needed; raises :class:`StoreError`)."""
        store = self._store
        if store is None:
            with self._lock:
                if self._store is None:
                    self._store = open_store(
                        self.url, namespace=self.config.namespace, timeout_s=self.config.timeout_s
                    )
                store = self._store
        return store

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    def failed(self, exc: StoreError, what: str, run: Run, plugin: str) -> bool:
        """Log a store failure and note it on the run; True when the policy lets it go on."""
        policy = self.config.on_store_error
        log.error(
            "store %s unavailable while %s (run %s): %s -- %s",
            redact_url(self.url),
            what,
            run.run_id,
            exc,
            "carrying on without it (fail_open)" if self.fail_open else "refusing (fail_closed)",
        )
        run.errors.append(
            {
                "plugin": plugin,
                "hook": what,
                "error": str(exc),
                "store": redact_url(self.url),
                "on_store_error": policy,
            }
        )
        return self.fail_open

    # -- the ledger (called by the loop) ---------------------------------------------------

    def _ledger_key(self, run: Run, key: str) -> str:
        scope = self.config.ledger_scope
        if not scope:
            return key
        return "|".join(f"{s}={run.meta.get(s, '')}" for s in scope) + "|" + key

    @staticmethod
    def _owner(run: Run, call: ToolCall) -> str:
        return f"{run.run_id}/{call.id}"

    def claim(self, run: Run, call: ToolCall) -> LedgerEntry | None:
        """Claim ``call``'s idempotency key: None means "execute it" (claimed, or the store
        failed under fail_open); otherwise the entry that stands in for the call (recorded by
        another run, in progress, or ``state = "unavailable"`` under fail_closed)."""
        key = call.idempotency_key
        if key is None or not self.config.ledger:
            return None
        try:
            return self.store.claim(
                self._ledger_key(run, key), self._owner(run, call), self.config.ledger_ttl_s
            )
        except StoreError as exc:
            if self.failed(exc, "claiming a side effect", run, "loopwarden"):
                return None
            return LedgerEntry(key, "unavailable", "", 0.0, {"content": str(exc)})

    def finish(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        """Record what the claimed call did: done, unknown (a timeout: may have taken effect),
        or nothing (a failure: the key is released, a later call may try again)."""
        key = call.idempotency_key
        if key is None or not self.config.ledger:
            return
        lkey, owner = self._ledger_key(run, key), self._owner(run, call)
        try:
            if result.ok:
                self.store.finish(
                    lkey, owner, "done", _result_data(result), self.config.ledger_ttl_s
                )
            elif result.error in ("timeout", "cancelled"):
                self.store.finish(
                    lkey, owner, "unknown", _result_data(result), self.config.ledger_ttl_s
                )
            else:
                self.store.release(lkey, owner)
        except StoreError as exc:
            # the entry stays "running": later callers see "may have taken effect" -- safe
            self.failed(exc, "recording a side effect", run, "loopwarden")

    def stale(self, entry: LedgerEntry) -> bool:
        """A ``running`` entry older than ``ledger_lease_s``: its worker probably died."""
        return time.time() - entry.started_at > self.config.ledger_lease_s


def _result_data(result: ToolResult) -> dict[str, Any]:
    return {"content": result.content, "ok": result.ok, "error": result.error}
