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

**Operations** (:mod:`loopwarden.store.admin`): an operator's limit override for one scope
key and window (:meth:`_Backend.set_limits`) is read by the store inside every reserve -- the
same transaction or script, no extra round trip -- so every process sees it at its next call;
ledger entries are listed and forgotten (:meth:`_Backend.ledger_rows`,
:meth:`_Backend.forget`); and every such change is appended to the store's change log
(:meth:`_Backend.changes`) with who made it, when, and the values before and after.

**Circuit breakers** (:mod:`loopwarden.store.breakers`) are one small document each --
state, when it opened, the half-open probe's holder, the window's calls and failures -- that
:meth:`Store.breaker_admit` and :meth:`Store.breaker_record` change in one atomic
read-modify-write (a closed breaker is only read on admit).

**Faults.** A store error is no proof that nothing was written (a reply lost after the server
applied the write): a failed claim is released by its owner and a failed reservation dropped
by its token -- at once, or at the next call the store answers (``_Backend``).  A ledger
entry the store cannot read is ``unknown`` (``LedgerEntry.corrupt`` says why).  Writes prune
a bounded batch of expired counters on their way.  ``timeout_s`` bounds one call (waits for
a lock or a free connection included).

**Cost.** A reserve is one round trip, a settle one: on Redis one ``EVALSHA`` of a cached
script, on SQLite one transaction of a few statements (``tests/test_store_round_trips.py``
counts them with :mod:`loopwarden.testing.roundtrips`).

:class:`Shared` is a deployment's link to its store: opened on first use, with the
``on_store_error`` policy, and the ledger glue the loop calls.  Store calls are synchronous --
one round trip each, a fraction of a millisecond on an idle host (``bench/shared_budget.py``)
-- also inside async runs, where hooks are synchronous anyway.

This module is the interface and the one import name; the two backends live in
:mod:`loopwarden.store.sqlite` and :mod:`loopwarden.store.redis` (re-exported here as
:class:`SQLiteStore` and :class:`RedisStore`, imported on first use).

May import: the lowest layer only (exceptions, paths, redaction) and its own backends; never
the engine, a deployment, a run or a plugin (import-linter: "the store imports nothing of the
engine").  The engine, the budget plugins and the commands import it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from loopwarden.events import IN_DOUBT
from loopwarden.exceptions import ConfigError, StoreError
from loopwarden.redaction import redact_url
from loopwarden.store import breakers as _breakers
from loopwarden.store import bridge
from loopwarden.store.admin import (
    Change,
    LedgerRow,
    LimitOverride,
    limits_dict,
    limits_tuple,
    operator_name,
)
from loopwarden.store.breakers import BreakerRule, BreakerView, Ident, breaker_key

if TYPE_CHECKING:
    from loopwarden.config import StoreConfig
    from loopwarden.events import ToolCall, ToolResult
    from loopwarden.run import Run
    from loopwarden.store.redis import RedisStore
    from loopwarden.store.sqlite import SQLiteStore

__all__ = [
    "COST_UNIT",
    "DEFAULT_LEDGER_SCOPE",
    "QUANTITIES",
    "BreakerRule",
    "BreakerView",
    "Change",
    "Counter",
    "CounterRow",
    "LedgerEntry",
    "LedgerRow",
    "LimitOverride",
    "OperatedStore",
    "RedisStore",
    "Reserved",
    "SQLiteStore",
    "Shared",
    "Store",
    "cost_units",
    "default_store_url",
    "ledger_key",
    "open_store",
    "operated",
    "redact_url",
]

log = logging.getLogger("loopwarden.store")
_T = TypeVar("_T")

#: what a counter counts, in this order everywhere (amounts, limits, usage)
QUANTITIES: tuple[str, ...] = ("runs", "model_calls", "tool_calls", "tokens", "cost")
#: the cost counter's unit: a billionth of the currency (integers: exact and atomic in Redis)
COST_UNIT = Decimal("0.000000001")

#: the meta keys that scope the ledger when ``[store] ledger_scope`` is unset: a run that
#: names its tenant or user never gets another tenant's or user's recorded side effect
DEFAULT_LEDGER_SCOPE = ("tenant", "user")

Amounts = tuple[int, int, int, int, int]
#: a breaker's atomic change: (its document or None, now) -> (the document to write or None,
#: the answer)
_DocUpdate = Callable[[dict[str, Any] | None, float], tuple[dict[str, Any] | None, BreakerView]]
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
    this one (``reserved`` is the reserved part); ``refused`` is ``(counter index, quantity
    index)`` of the first limit the amount did not fit (nothing was reserved), None when it
    was reserved (or committed).
    """

    used: tuple[Amounts, ...]
    refused: tuple[int, int] | None = None
    #: per counter, the part of ``used`` held by live reservations (None: the store does
    #: not say)
    reserved: tuple[Amounts, ...] | None = None
    #: per counter, the limits checked: the counter's own, or where an operator set one
    #: (:meth:`_Backend.set_limits`), the override's (None: the counters' own)
    limits: tuple[tuple[int | None, ...], ...] | None = None

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
    """A side effect's entry in the ledger (``result``: ``content``, ``ok``, ``error``).

    ``corrupt`` says what was wrong with an entry the store could not read (a result that is
    not JSON, an unknown state): such an entry is reported as ``unknown`` -- may have taken
    effect -- and never lets the side effect run again.
    """

    key: str
    state: str
    owner: str
    started_at: float
    result: dict[str, Any] | None = None
    corrupt: str | None = None


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
        a live entry exists, return it untouched (None when it is ``owner``'s own running
        claim: written by a try whose reply was lost)."""
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
        """Remove ``owner``'s claim while it is ``running`` (the call failed before taking
        effect); a recorded outcome stays."""
        ...

    def breaker_admit(
        self,
        ident: Ident,
        rule: BreakerRule,
        owner: str,
        *,
        source: str = _breakers.ANONYMOUS,
        lease_s: float | None = None,
    ) -> BreakerView:
        """Atomically: may ``owner`` (a call from ``source``) call the breaker's dependency
        now (``allows``)?  An open breaker past ``open_s`` gives exactly one caller the
        half-open probe, held for ``probe_timeout_s`` or ``lease_s`` (the call's own
        deadline), whichever is longer; a source whose probe just failed waits ``open_s``."""
        ...

    def breaker_record(
        self,
        ident: Ident,
        rule: BreakerRule,
        owner: str,
        *,
        failed: bool,
        source: str,
        weight: int = 1,
        error: str | None = None,
    ) -> BreakerView:
        """Atomically: count a call's outcome (``failed``: a transient failure from
        ``source``); opens the breaker when ``rule`` trips, closes or reopens it on the
        probe's outcome (``changed`` says which)."""
        ...

    def breakers(self) -> list[BreakerView]:
        """Every live breaker."""
        ...

    def breaker_reset(self, ident: Ident) -> bool:
        """Forget a breaker (closed, its counts gone); True when it existed."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class OperatedStore(Store, Protocol):
    """A store an operator can inspect and change (both built-in backends): limit overrides,
    ledger entries, the change log (see :class:`_Backend` for each method)."""

    def set_limits(
        self,
        scope: str,
        key: str,
        window: str,
        limits: Mapping[str, int | None],
        *,
        by: str | None = None,
    ) -> tuple[LimitOverride | None, LimitOverride | None]: ...

    def clear_limits(
        self, scope: str, key: str, window: str, *, by: str | None = None
    ) -> LimitOverride | None: ...

    def overrides(self) -> list[LimitOverride]: ...

    def log_change(
        self,
        action: str,
        target: Mapping[str, Any],
        old: Any = None,
        new: Any = None,
        *,
        by: str | None = None,
    ) -> Change: ...

    def changes(self, limit: int = 100) -> list[Change]: ...

    def ledger_rows(self) -> list[LedgerRow]: ...

    def forget(
        self, keys: Sequence[str], *, by: str | None = None, running: bool = False
    ) -> dict[str, str]: ...


def operated(store: Store) -> OperatedStore:
    """``store`` as an :class:`OperatedStore`; a store of your own without those methods is
    a :class:`StoreError` naming what is missing."""
    missing = [m for m in ("set_limits", "ledger_rows", "changes") if not hasattr(store, m)]
    if missing:
        raise StoreError(
            f"the store {type(store).__name__} has no {', '.join(missing)}: overrides, ledger "
            "listing and the change log need one of the built-in stores (SQLite, Redis)",
            url=redact_url(store.url),
        )
    return store  # type: ignore[return-value]


def default_store_url() -> str:
    """``store.sqlite3`` in the data directory (``LOOPWARDEN_DATA_DIR`` overrides it)."""
    from loopwarden.paths import data_dir

    return "sqlite:///" + str(data_dir() / "store.sqlite3")


def open_store(
    url: str, *, namespace: str = "loopwarden", timeout_s: float = 5.0, max_connections: int = 64
) -> Store:
    """The store for ``url`` (``sqlite:///PATH`` or ``redis://HOST:PORT/DB``;
    ``max_connections`` sizes a Redis store's connection pool)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise ConfigError(
                f"bad SQLite URL {url!r}",
                key="store.url",
                expected="sqlite:///relative/path or sqlite:////absolute/path",
            )
        from loopwarden.store.sqlite import SQLiteStore

        return SQLiteStore(Path(url[len("sqlite:///") :]).expanduser(), timeout_s=timeout_s)
    if scheme in ("redis", "rediss", "unix"):
        from loopwarden.store.redis import RedisStore

        return RedisStore(
            url, namespace=namespace, timeout_s=timeout_s, max_connections=max_connections
        )
    raise ConfigError(
        f"unsupported store URL {redact_url(url)!r}",
        key="store.url",
        expected="sqlite:///PATH or redis://HOST:PORT/DB",
    )


# -- shared by the backends (loopwarden.store.sqlite, loopwarden.store.redis) ----------------


def _amounts(values: Sequence[Any]) -> Amounts:
    a = [int(v or 0) for v in values]
    return (a[0], a[1], a[2], a[3], a[4])


def _ident(c: Counter) -> tuple[str, str, str, str]:
    return (c.scope, c.key, c.window, c.bucket)


def _parse_result(text: object) -> tuple[dict[str, Any] | None, str | None]:
    """A ledger entry's stored result: ``(result, None)``, or ``(None, what is wrong)``."""
    if text is None or text in ("", b""):
        return None, None
    if not isinstance(text, (str, bytes)):
        return None, f"the recorded result is a {type(text).__name__}, not text"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, f"the recorded result is not JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"the recorded result is a JSON {type(value).__name__}, not an object"
    return value, None


def _entry(key: str, state: str, owner: str, started_at: object, result: object) -> LedgerEntry:
    """A ledger entry from a store's row; an unreadable one is ``unknown`` and ``corrupt``."""
    data, corrupt = _parse_result(result)
    if state not in ("running", "done", "unknown"):
        corrupt = corrupt or f"unknown state {state[:40]!r}"
    try:
        started = float(started_at)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        started, corrupt = 0.0, corrupt or "no start time"
    if corrupt is not None:
        return LedgerEntry(key, "unknown", owner, started, None, corrupt)
    return LedgerEntry(key, state, owner, started, data)


def _readable(change: Change) -> Change:
    """A limit change's ``old`` / ``new`` (store units) in the units people use."""
    if change.action not in ("set_limits", "clear_limits"):
        return change
    return dataclasses.replace(
        change,
        old=limits_dict(limits_tuple(change.old or None)),
        new=limits_dict(limits_tuple(change.new or None)),
    )


class _Doubts:
    """Writes a store error left in doubt, and how to undo each (thread-safe).

    A store error is no proof that nothing was written: a reply that timed out may follow a
    write the server applied.  Such a write is undone at once, best effort; when the store
    fails again, the undo is remembered and retried at the next successful contact.
    """

    #: more undos than this are not remembered (logged): a store down for long
    LIMIT = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._undo: dict[tuple[str, ...], Callable[[], None]] = {}

    def __bool__(self) -> bool:
        return bool(self._undo)

    def undo(self, ident: tuple[str, ...], fn: Callable[[], None]) -> None:
        try:
            fn()
        except StoreError as exc:
            with self._lock:
                if len(self._undo) < self.LIMIT:
                    self._undo[ident] = fn
                    return
            log.error("store: cannot undo %s (%s); too many undos pending", ident[0], exc)

    def forget(self, ident: tuple[str, ...]) -> None:
        """Drop a remembered undo: the write in doubt is being made again, on purpose."""
        if self._undo:
            with self._lock:
                self._undo.pop(ident, None)

    def drain(self) -> set[tuple[str, ...]]:
        """Retry the remembered undos (stopping at the first failure); returns those done."""
        with self._lock:
            items = list(self._undo.items())
        done: set[tuple[str, ...]] = set()
        for ident, fn in items:
            try:
                fn()
            except StoreError:
                break
            with self._lock:
                self._undo.pop(ident, None)
            done.add(ident)
        return done


class _Backend:
    """What both backends share: the public :class:`Store` methods, around the backend's
    primitives (``_claim``, ``_reserve``...), reconciling the writes a store error left in
    doubt (:class:`_Doubts`).

    * a claim that failed is released by its owner (only while still ``running``); a claim
      found later that carries the caller's own owner is the caller's -- written by a try
      whose reply was lost -- and reported claimed;
    * a reservation that failed is dropped by its token (a commit is not undone: counted
      twice at worst, never under-counted).
    """

    url: str
    #: the wall clock (each backend sets it; tests may replace it)
    now: Callable[[], float]
    #: threads that make this store's calls for async runs at most (started as needed)
    _owner_threads = 32

    def __init__(self) -> None:
        self._doubts = _Doubts()
        self._owner: bridge.Owner | None = None

    def _io(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``: a primitive's blocking call, or -- inside an async run's step
        (:mod:`loopwarden.store.bridge`) -- the same call on an owner thread of the store,
        awaited on the event loop so that the loop never blocks on the store."""
        if bridge.waiting():
            owner = self._owner
            if owner is None:
                name = f"loopwarden-store-{type(self).__name__}"
                owner = self._owner = bridge.Owner(name, self._owner_threads)
            return bridge.wait(owner.call(fn, *args))
        return fn(*args)

    def _close_owner(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.close()

    # -- the backend's primitives ----------------------------------------------------------

    def _reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        token: str,
        ttl_s: float,
        commit: bool,
    ) -> Reserved:
        raise NotImplementedError

    def _settle(
        self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None
    ) -> None:
        raise NotImplementedError

    def _rows(self) -> list[CounterRow]:
        raise NotImplementedError

    def _reset(self, scope: str, key: str) -> int:
        raise NotImplementedError

    def _claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        raise NotImplementedError

    def _finish(
        self,
        key: str,
        owner: str,
        state: LedgerState,
        result: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> None:
        raise NotImplementedError

    def _release(self, key: str, owner: str) -> None:
        raise NotImplementedError

    def _update_doc(self, key: str, fn: _DocUpdate) -> BreakerView:
        """Apply ``fn(document or None, now)`` to breaker ``key`` atomically: it returns the
        document to write (None: leave it) and the answer.  ``now`` is the store's time
        (:meth:`_shared_now`), read in the same round trip where the store has a clock."""
        raise NotImplementedError

    def _shared_now(self) -> float:
        """The time of state shared by hosts (breakers): the store's own clock where it has
        one (Redis ``TIME``), else this host's -- one host's file (SQLite)."""
        raise NotImplementedError

    def _docs(self) -> list[tuple[str, dict[str, Any]]]:
        """Every live breaker document, by key."""
        raise NotImplementedError

    def _drop_doc(self, key: str) -> bool:
        raise NotImplementedError

    def _overrides(self) -> list[LimitOverride]:
        """Every limit override."""
        raise NotImplementedError

    def _set_override(
        self,
        target: tuple[str, str, str],
        updates: Mapping[int, int | None],
        by: str,
        action: str,
        now: float,
    ) -> tuple[LimitOverride | None, LimitOverride | None]:
        """Atomically: apply ``updates`` (quantity index -> limit, None: back to the config's)
        to the override of ``target`` (scope, key, window), append the change to the log
        (unless there was no override before nor after); returns the override before and
        after (None: none)."""
        raise NotImplementedError

    def _log(self, change: Change) -> None:
        """Append ``change`` to the change log (keeping the last ``CHANGES_KEPT``)."""
        raise NotImplementedError

    def _changes(self, limit: int) -> list[Change]:
        """The last ``limit`` changes, newest first (``old`` / ``new`` as stored)."""
        raise NotImplementedError

    def _ledger_rows(self) -> list[LedgerRow]:
        """Every live ledger entry."""
        raise NotImplementedError

    def _forget(self, key: str, by: str, running: bool, now: float) -> str:
        """Atomically: remove ledger entry ``key`` and log it -- unless it is ``running`` and
        ``running`` is False.  Returns ``forgotten``, ``running`` or ``absent``."""
        raise NotImplementedError

    # -- the Store interface ---------------------------------------------------------------

    def _answered(self) -> set[tuple[str, ...]]:
        """The store answered: retry the undos left pending."""
        return self._doubts.drain() if self._doubts else set()

    def reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        *,
        token: str,
        ttl_s: float,
        commit: bool = False,
    ) -> Reserved:
        counters = tuple(counters)
        self._doubts.forget(("reserve", token))
        try:
            out = self._io(self._reserve, counters, amount, token, ttl_s, commit)
        except StoreError:
            if not commit:
                self._doubts.undo(
                    ("reserve", token), lambda: self._io(self._settle, counters, token, None)
                )
            raise
        self._answered()
        return out

    def settle(self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None) -> None:
        self._io(self._settle, counters, token, actual)
        self._answered()

    def rows(self) -> list[CounterRow]:
        out = self._io(self._rows)
        self._answered()
        return out

    def reset(self, scope: str, key: str) -> int:
        n = self._io(self._reset, scope, key)
        self._answered()
        return n

    def claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        self._doubts.forget(("claim", key, owner))  # claimed again: the claim is wanted now
        for attempt in range(2):
            try:
                entry = self._claim_or_undo(key, owner, ttl_s)
            except StoreError:
                self._doubts.undo(
                    ("claim", key, owner), lambda: self._io(self._release, key, owner)
                )
                raise
            undone = self._answered()
            if entry is None or entry.state != "running":
                return entry
            if entry.owner == owner:
                return None  # ours: an earlier try of this very claim was written
            if attempt or ("claim", key, entry.owner) not in undone:
                return entry
            # the entry was a claim of ours left in doubt, released just now: claim again
        return None  # pragma: no cover - the loop returns

    def finish(
        self,
        key: str,
        owner: str,
        state: LedgerState,
        result: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> None:
        self._io(self._finish, key, owner, state, result, ttl_s)
        self._answered()

    def _claim_or_undo(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        """``_claim``, released again when the caller is interrupted meanwhile -- a cancelled
        task, a ``KeyboardInterrupt``: nobody will run the call.  Made on an owner thread
        (an async run's step), the claim may still be on its way when the caller goes: the
        one of the two that comes second (the claim's thread, or the caller) releases it."""
        lock = threading.Lock()
        claimed = gone = False

        def attempt() -> LedgerEntry | None:
            nonlocal claimed
            entry = self._claim(key, owner, ttl_s)
            with lock:
                claimed = entry is None
                late = gone
            if late and claimed:
                self._release(key, owner)
            return entry

        bridged = bridge.waiting()
        try:
            return self._io(attempt)
        except StoreError:
            raise
        except BaseException:
            with lock:
                gone = True
                ours = claimed
            if ours or not bridged:  # done (or made inline, so over): release it now
                self._doubts.undo(
                    ("claim", key, owner), lambda: self._io(self._release, key, owner)
                )
            raise

    def release(self, key: str, owner: str) -> None:
        try:
            self._io(self._release, key, owner)
        except StoreError:
            # the claim stays "running" meanwhile: released at the store's next answer
            self._doubts.undo(("claim", key, owner), lambda: self._io(self._release, key, owner))
            raise
        self._answered()

    def breaker_admit(
        self,
        ident: Ident,
        rule: BreakerRule,
        owner: str,
        *,
        source: str = _breakers.ANONYMOUS,
        lease_s: float | None = None,
    ) -> BreakerView:
        key = breaker_key(ident)
        out = self._io(
            self._update_doc,
            key,
            lambda doc, now: _breakers.admit(
                key, ident, doc, rule, owner, now, source=source, lease_s=lease_s
            ),
        )
        self._answered()
        return out

    def breaker_record(
        self,
        ident: Ident,
        rule: BreakerRule,
        owner: str,
        *,
        failed: bool,
        source: str,
        weight: int = 1,
        error: str | None = None,
    ) -> BreakerView:
        key = breaker_key(ident)
        out = self._io(
            self._update_doc,
            key,
            lambda doc, now: _breakers.record(
                key,
                ident,
                doc,
                rule,
                owner,
                failed=failed,
                source=source,
                weight=weight,
                error=error,
                now=now,
            ),
        )
        self._answered()
        return out

    def breakers(self) -> list[BreakerView]:
        now = self._io(self._shared_now)
        out = [_breakers.view(key, doc, None, now) for key, doc in self._io(self._docs)]
        self._answered()
        return sorted(out, key=lambda v: (v.scope, v.scope_key, v.target, v.name))

    def breaker_reset(self, ident: Ident) -> bool:
        done = self._io(self._drop_doc, breaker_key(ident))
        self._answered()
        return done

    # -- operations: limit overrides, the ledger, the change log ---------------------------

    def set_limits(
        self,
        scope: str,
        key: str,
        window: str,
        limits: Mapping[str, int | None],
        *,
        by: str | None = None,
    ) -> tuple[LimitOverride | None, LimitOverride | None]:
        """Override the limits of ``scope`` = ``key`` in ``window`` for every process on
        this store, from its next reserve: ``limits`` maps a quantity (``runs``,
        ``model_calls``, ``tool_calls``, ``tokens``, ``cost``) to a limit in store units
        (cost: :func:`cost_units`), or to None to hand that quantity back to the config;
        quantities not named keep their override.  Logged as a change by ``by`` (default:
        ``user@host``).  Returns the override before and after (None: none)."""
        updates: dict[int, int | None] = {}
        for name, value in limits.items():
            if name not in QUANTITIES:
                raise ValueError(f"unknown quantity {name!r} (one of {', '.join(QUANTITIES)})")
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"a limit is a positive whole number of units, not {value!r}")
            updates[QUANTITIES.index(name)] = None if value is None else int(value)
        if not updates:
            raise ValueError("set_limits needs at least one quantity")
        return self._changed_override((scope, key, window), updates, by, "set_limits")

    def clear_limits(
        self, scope: str, key: str, window: str, *, by: str | None = None
    ) -> LimitOverride | None:
        """Remove the override of ``scope`` = ``key`` in ``window``: the config's limits
        apply again from the next reserve.  Logged; returns the override removed (None:
        there was none)."""
        updates: dict[int, int | None] = dict.fromkeys(range(len(QUANTITIES)))
        return self._changed_override((scope, key, window), updates, by, "clear_limits")[0]

    def _changed_override(
        self,
        target: tuple[str, str, str],
        updates: Mapping[int, int | None],
        by: str | None,
        action: str,
    ) -> tuple[LimitOverride | None, LimitOverride | None]:
        out = self._io(
            self._set_override, target, updates, by or operator_name(), action, self.now()
        )
        self._answered()
        return out

    def overrides(self) -> list[LimitOverride]:
        """Every limit override, by scope, key and window."""
        out = self._io(self._overrides)
        self._answered()
        return sorted(out, key=lambda o: (o.scope, o.key, o.window))

    def log_change(
        self,
        action: str,
        target: Mapping[str, Any],
        old: Any = None,
        new: Any = None,
        *,
        by: str | None = None,
    ) -> Change:
        """Append an operator's change to the store's change log (``by``: default
        ``user@host``); values must be JSON."""
        change = Change(self.now(), by or operator_name(), action, dict(target), old, new)
        self._io(self._log, change)
        self._answered()
        return change

    def changes(self, limit: int = 100) -> list[Change]:
        """The last ``limit`` changes, newest first; a limit change's ``old`` and ``new`` in
        the units people use (cost in the currency)."""
        out = self._io(self._changes, limit)
        self._answered()
        return [_readable(c) for c in out]

    def ledger_rows(self) -> list[LedgerRow]:
        """Every live entry of the side-effect ledger, oldest first."""
        out = self._io(self._ledger_rows)
        self._answered()
        return sorted(out, key=lambda r: (r.started_at, r.key))

    def forget(
        self, keys: Sequence[str], *, by: str | None = None, running: bool = False
    ) -> dict[str, str]:
        """Remove ledger entries by their stored key (:attr:`LedgerRow.key`), each logged as
        a change: a later call with the same idempotency key executes again.  An entry still
        ``running`` (a call in progress, or whose worker died) is kept unless ``running``:
        forgetting it while the call runs lets a second one run too.  Returns per key
        ``forgotten``, ``running`` (kept) or ``absent``."""
        who = by or operator_name()
        out = {k: self._io(self._forget, k, who, running, self.now()) for k in dict.fromkeys(keys)}
        self._answered()
        return out


#: the backends, in modules of their own: imported on first use (``from loopwarden.store import
#: SQLiteStore`` works as ever), and they import the types above from here without a cycle
_BACKENDS = {"SQLiteStore": "loopwarden.store.sqlite", "RedisStore": "loopwarden.store.redis"}

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


class _OffLoop:
    """A store with no I/O of its own on the event loop, seen from an async run's step: each
    method call runs on an owner thread of the deployment and is awaited (:func:`bridge.wait`)."""

    def __init__(self, store: Store, owner: bridge.Owner) -> None:
        self._store, self._owner = store, owner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        owner = self._owner

        def call(*args: Any, **kwargs: Any) -> Any:
            return bridge.wait(owner.call(functools.partial(attr, *args, **kwargs)))

        return call


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
        self._offloader: bridge.Owner | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> Store:
        """The store (opened now if needed; raises :class:`StoreError`).

        Inside an async run's step (:mod:`loopwarden.store.bridge`) the built-in backends
        await their own I/O; any other store (a wrapper, a store of your own) is seen through
        :class:`_OffLoop`, each of its calls made on an owner thread and awaited, so that no
        store ever blocks the event loop."""
        store = self._store
        waiting = bridge.waiting()
        if store is None:
            # connecting (and creating the tables) off the loop, too
            store = (
                bridge.wait(self._offload_owner().call(self._opened)) if waiting else self._opened()
            )
        if not waiting or isinstance(store, _Backend):
            return store
        return _OffLoop(store, self._offload_owner())

    def _opened(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = open_store(
                    self.url,
                    namespace=self.config.namespace,
                    timeout_s=self.config.timeout_s,
                    max_connections=self.config.max_connections,
                )
            return self._store

    def _offload_owner(self) -> bridge.Owner:
        owner = self._offloader
        if owner is None:
            with self._lock:
                if self._offloader is None:
                    self._offloader = bridge.Owner("loopwarden-store")
                owner = self._offloader
        return owner

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
            owner, self._offloader = self._offloader, None
        if owner is not None:
            owner.close()
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
        return ledger_key(key, [(s, str(run.meta.get(s, ""))) for s in scope])

    @property
    def _ledger_ttl(self) -> float:
        # an entry lives at least the lease (the config refuses less; a StoreConfig built
        # around the validation still gets it): a worker killed after the effect is never
        # followed by a second execution while its claim should read "in progress"
        return max(self.config.ledger_ttl_s, self.config.ledger_lease_s)

    @staticmethod
    def _owner(run: Run, call: ToolCall) -> str:
        return f"{run.run_id}/{call.id}"

    def claim(self, run: Run, call: ToolCall) -> LedgerEntry | None:
        """Claim ``call``'s idempotency key: None means "execute it" (claimed, or the store
        failed under fail_open); otherwise the entry that stands in for the call (recorded by
        another run, in progress, or ``state = "unavailable"`` under fail_closed).

        A claim that failed may still have been written (a reply that timed out): the store
        releases it by its owner, now or once it answers again.  An entry the store could not
        read stands in as ``unknown`` (may have taken effect), logged and noted on the run.
        """
        key = call.idempotency_key
        if key is None or not self.config.ledger:
            return None
        try:
            entry = self.store.claim(
                self._ledger_key(run, key), self._owner(run, call), self._ledger_ttl
            )
        except StoreError as exc:
            if self.failed(exc, "claiming a side effect", run, "loopwarden"):
                return None
            return LedgerEntry(key, "unavailable", "", 0.0, {"content": str(exc)})
        if entry is not None and entry.corrupt is not None:
            log.error(
                "store %s: the ledger entry of %s is unreadable (%s): reported as "
                '"may have taken effect", not executed again (run %s)',
                redact_url(self.url),
                call.name,
                entry.corrupt,
                run.run_id,
            )
            run.errors.append(
                {
                    "plugin": "loopwarden",
                    "hook": "claiming a side effect",
                    "error": f"corrupt ledger entry: {entry.corrupt}",
                    "store": redact_url(self.url),
                    "tool": call.name,
                    "call_id": call.id,
                }
            )
        return entry

    def finish(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        """Record what the claimed call did: done, unknown (a timeout, a cancellation, a tool
        or server that died mid-call: may have taken effect), or nothing (a failure the tool
        reported, or a cancellation before the tool started: the key is released, a later
        call may try again)."""
        key = call.idempotency_key
        if key is None or not self.config.ledger:
            return
        lkey, owner = self._ledger_key(run, key), self._owner(run, call)
        try:
            if result.ok:
                self.store.finish(lkey, owner, "done", _result_data(result), self._ledger_ttl)
            elif result.error in IN_DOUBT and result.attempts:
                self.store.finish(lkey, owner, "unknown", _result_data(result), self._ledger_ttl)
            else:
                self.store.release(lkey, owner)
        except StoreError as exc:
            # the entry stays "running": later callers see "may have taken effect" -- safe
            self.failed(exc, "recording a side effect", run, "loopwarden")

    def release(self, run: Run, call: ToolCall) -> None:
        """Release the claim of a call whose tool never started (the run was cancelled
        between the claim and the call): the key is free again, nothing was executed.  A
        store that fails is asked again at its next answer (:class:`_Doubts`)."""
        key = call.idempotency_key
        if key is None or not self.config.ledger:
            return
        try:
            self.store.release(self._ledger_key(run, key), self._owner(run, call))
        except StoreError as exc:
            self.failed(exc, "releasing a side effect that never started", run, "loopwarden")

    def stale(self, entry: LedgerEntry) -> bool:
        """A ``running`` entry older than ``ledger_lease_s``: its worker probably died."""
        return time.time() - entry.started_at > self.config.ledger_lease_s


def _escape(text: str, chars: str) -> str:
    """``text`` with ``%`` and each of ``chars`` percent-encoded (``%`` first: reversible)."""
    out = text.replace("%", "%25")
    for ch in chars:
        out = out.replace(ch, f"%{ord(ch):02X}")
    return out


def ledger_key(key: str, scope: Sequence[tuple[str, str]]) -> str:
    """The store key of idempotency key ``key`` within ``scope`` (``(meta key, value)`` pairs).

    ``name=value|name=value|key``, each name and value escaped (``%``, ``|``, ``=``, and ``:``
    in names, percent-encoded), so two scopes never share a key: tenant ``a|user=b`` + user
    ``c`` is not tenant ``a`` + user ``b|user=c``.  The idempotency key follows unescaped
    (``tool:arguments``): its first ``|``-separated part has a ``:`` before any ``=``, where
    a scope part has an escaped name, so no ``:``.  No scope: the key itself, as ever; names
    and values without ``%``, ``|``, ``=`` (``:`` in names) give the same key as before.
    """
    if not scope:
        return key
    return "|".join(f"{_escape(s, '|=:')}={_escape(v, '|=')}" for s, v in scope) + "|" + key


def _result_data(result: ToolResult) -> dict[str, Any]:
    return {"content": result.content, "ok": result.ok, "error": result.error}
