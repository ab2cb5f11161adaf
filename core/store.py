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

This module is the interface and the one import name; the two backends live in
:mod:`loopwarden._store_sqlite` and :mod:`loopwarden._store_redis` (re-exported here as
:class:`SQLiteStore` and :class:`RedisStore`, imported on first use).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from loopwarden.exceptions import ConfigError, StoreError

if TYPE_CHECKING:
    from loopwarden._store_redis import RedisStore
    from loopwarden._store_sqlite import SQLiteStore
    from loopwarden.config import StoreConfig
    from loopwarden.events import ToolCall, ToolResult
    from loopwarden.run import Run

__all__ = [
    "COST_UNIT",
    "DEFAULT_LEDGER_SCOPE",
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

#: the meta keys that scope the ledger when ``[store] ledger_scope`` is unset: a run that
#: names its tenant or user never gets another tenant's or user's recorded side effect
DEFAULT_LEDGER_SCOPE = ("tenant", "user")

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
        from loopwarden._store_sqlite import SQLiteStore

        return SQLiteStore(Path(url[len("sqlite:///") :]).expanduser(), timeout_s=timeout_s)
    if scheme in ("redis", "rediss", "unix"):
        from loopwarden._store_redis import RedisStore

        return RedisStore(url, namespace=namespace, timeout_s=timeout_s)
    raise ConfigError(
        f"unsupported store URL {redact_url(url)!r}",
        key="store.url",
        expected="sqlite:///PATH or redis://HOST:PORT/DB",
    )


# -- shared by the backends (loopwarden._store_sqlite, loopwarden._store_redis) ----------------


def _amounts(values: Sequence[Any]) -> Amounts:
    a = [int(v or 0) for v in values]
    return (a[0], a[1], a[2], a[3], a[4])


def _ident(c: Counter) -> tuple[str, str, str, str]:
    return (c.scope, c.key, c.window, c.bucket)


#: the backends, in modules of their own: imported on first use (``from loopwarden.store import
#: SQLiteStore`` works as ever), and they import the types above from here without a cycle
_BACKENDS = {"SQLiteStore": "loopwarden._store_sqlite", "RedisStore": "loopwarden._store_redis"}

if not TYPE_CHECKING:  # mypy sees the imports above; a typo stays a type error

    def __getattr__(name: str) -> Any:
        module = _BACKENDS.get(name)
        if module is None:
            raise AttributeError(f"module 'loopwarden.store' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


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
        if scope is None:  # the default: the tenant and the user, where the run names them
            scope = [s for s in DEFAULT_LEDGER_SCOPE if s in run.meta]
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
