"""Where the gateway keeps a conversation between two requests: the shared store.

A gateway worker holds no run state of its own.  After each request it writes the
conversation's *snapshot* -- the live run (its counters, verdicts, every plugin's ``run.stash``
and ``run.state``), the conversation's ledger and plugin state, the calls handed out and not
yet answered -- and the *aliases* that lead back to it (the tool-call ids it handed out, the
hash of the history the client will send next).  The next request, on any worker of any
process or host sharing the store, finds the conversation by one of those aliases and reads
the snapshot back: one round trip to find and read, one to write.

Three backends, chosen by ``[store] url`` like the budgets and the ledger: an in-process
dictionary (:class:`MemoryState`, the client wrapper's default), a table in the store's SQLite
file (:class:`SQLiteState`, every process on one host) and Redis (:class:`RedisState`, a
fleet).  Entries expire ``[gateway] state_ttl_s`` after their last write.

Snapshots are pickles (:func:`dump` / :func:`load`): plugin state is whatever Python values
plugins keep, and a pickle carries them all.  What belongs to the process -- the deployment,
the plugins, the stash keys, the clock, the tools, locks -- is written as a name and resolved
against the reading process's own objects (a reducer per type), so a snapshot holds only
data.  Large snapshots are compressed.
The store is trusted with it as it is trusted with the ledger: whoever can write the store
can change what the gateway runs, so keep it as private as the gateway's own memory
(docs/gateway.md).
"""

from __future__ import annotations

import copyreg
import io
import logging
import pickle
import sqlite3
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from loopwarden.exceptions import StoreError
from loopwarden.stash import StashKey

if TYPE_CHECKING:
    from loopwarden.config import StoreConfig

__all__ = [
    "MemoryState",
    "RedisState",
    "SQLiteState",
    "StateStore",
    "Symbols",
    "dump",
    "load",
    "open_state",
]

log = logging.getLogger("loopwarden.gateway")


class StateStore(Protocol):
    """Conversation snapshots and the aliases that find them."""

    def fetch(self, direct: str | None, aliases: Sequence[str]) -> tuple[str | None, bytes | None]:
        """The conversation ``direct`` names, else the one the first known alias leads to:
        its id and snapshot (None, None when nothing is known).  One round trip."""

    def save(self, conv: str, blob: bytes, aliases: Sequence[str], ttl_s: float) -> None:
        """Write the snapshot and point ``aliases`` at ``conv``.  One round trip."""

    def close(self) -> None:
        """Release connections."""


class MemoryState:
    """Snapshots in this process (the client wrapper's default): the most recent
    ``max_entries`` conversations and aliases."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, key: str, now: float) -> Any:
        hit = self._data.get(key)
        if hit is None:
            return None
        if hit[0] < now:
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return hit[1]

    def fetch(self, direct: str | None, aliases: Sequence[str]) -> tuple[str | None, bytes | None]:
        now = time.time()
        with self._lock:
            conv = direct
            if conv is None:
                for a in aliases:
                    conv = self._get("a:" + a, now)
                    if conv is not None:
                        break
            if conv is None:
                return None, None
            return conv, self._get("c:" + conv, now)

    def save(self, conv: str, blob: bytes, aliases: Sequence[str], ttl_s: float) -> None:
        until = time.time() + ttl_s
        with self._lock:
            self._data["c:" + conv] = (until, blob)
            self._data.move_to_end("c:" + conv)
            for a in aliases:
                self._data["a:" + a] = (until, conv)
                self._data.move_to_end("a:" + a)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            self._data.clear()


class SQLiteState:
    """Snapshots in a table of the store's SQLite file (shared by the processes of a host)."""

    _SCHEMA = (
        "CREATE TABLE IF NOT EXISTS lw_gateway ("
        "key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL NOT NULL)"
    )

    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._writes = 0

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(self._SCHEMA)
            self._local.db = db
        return db

    def fetch(self, direct: str | None, aliases: Sequence[str]) -> tuple[str | None, bytes | None]:
        now = time.time()
        try:
            db = self._db()
            conv = direct
            if conv is None and aliases:
                keys = ["a:" + a for a in aliases]
                marks = ",".join("?" * len(keys))
                rows = dict(
                    db.execute(
                        "SELECT key, value FROM lw_gateway "
                        f"WHERE key IN ({marks}) AND expires >= ?",
                        (*keys, now),
                    ).fetchall()
                )
                for k in keys:
                    if k in rows:
                        v = rows[k]
                        conv = v.decode() if isinstance(v, bytes) else str(v)
                        break
            if conv is None:
                return None, None
            row = db.execute(
                "SELECT value FROM lw_gateway WHERE key = ? AND expires >= ?", ("c:" + conv, now)
            ).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"gateway state: {exc}") from exc
        return conv, (bytes(row[0]) if row is not None else None)

    def save(self, conv: str, blob: bytes, aliases: Sequence[str], ttl_s: float) -> None:
        now = time.time()
        until = now + ttl_s
        rows = [("c:" + conv, blob, until)] + [("a:" + a, conv.encode(), until) for a in aliases]
        try:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT OR REPLACE INTO lw_gateway (key, value, expires) VALUES (?, ?, ?)",
                    rows,
                )
                self._writes += 1
                if self._writes % 256 == 0:  # a bounded prune of expired entries now and then
                    db.execute(
                        "DELETE FROM lw_gateway WHERE key IN (SELECT key FROM lw_gateway "
                        "WHERE expires < ? LIMIT 512)",
                        (now,),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"gateway state: {exc}") from exc

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


#: one round trip: the conversation's id (direct, else the first alias that leads to one) and
#: its snapshot
_FETCH = """
local conv = ARGV[1]
if conv == '' then
  conv = false
  for i = 2, #KEYS do
    local v = redis.call('GET', KEYS[i])
    if v then conv = v break end
  end
end
if not conv then return {false, false} end
return {conv, redis.call('GET', ARGV[2] .. conv)}
"""


class RedisState:
    """Snapshots in Redis (a fleet of gateway processes and hosts)."""

    def __init__(self, url: str, namespace: str = "loopwarden", timeout_s: float = 5.0) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - the redis extra is missing
            raise StoreError(
                "a redis:// store needs the redis package: pip install 'loopwarden[redis]'"
            ) from exc
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        # the store's hash tag: a Redis Cluster keeps a deployment's keys in one slot
        self.prefix = "{" + namespace + "}:gw:"
        self._fetch = self._client.register_script(_FETCH)

    def fetch(self, direct: str | None, aliases: Sequence[str]) -> tuple[str | None, bytes | None]:
        p = self.prefix
        try:
            if direct is not None:
                got: Any = self._client.get(p + "c:" + direct)
                return direct, (bytes(got) if got is not None else None)
            if not aliases:
                return None, None
            conv, blob = self._fetch(
                keys=[p + "c:", *(p + "a:" + a for a in aliases)], args=["", p + "c:"]
            )
        except Exception as exc:
            raise StoreError(f"gateway state: {type(exc).__name__}: {exc}") from exc
        if not conv:
            return None, None
        text = conv.decode() if isinstance(conv, bytes) else str(conv)
        return text, (bytes(blob) if blob else None)

    def save(self, conv: str, blob: bytes, aliases: Sequence[str], ttl_s: float) -> None:
        p = self.prefix
        ms = max(1, int(ttl_s * 1000))
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.set(p + "c:" + conv, blob, px=ms)
            for a in aliases:
                pipe.set(p + "a:" + a, conv, px=ms)
            pipe.execute()
        except Exception as exc:
            raise StoreError(f"gateway state: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._client.close()


def open_state(config: StoreConfig, *, memory: bool = False) -> StateStore:
    """The state backend for ``[store]``: Redis or the SQLite file it names (the default
    store's file when unset); ``memory`` keeps state in this process instead."""
    if memory:
        return MemoryState()
    from loopwarden.store import default_store_url

    url = config.url or default_store_url()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisState(url, config.namespace, config.timeout_s)
    if url.startswith("sqlite:///"):
        return SQLiteState(url[len("sqlite:///") :], config.timeout_s)
    raise StoreError(f"gateway state: unsupported store url scheme in {url.split(':', 1)[0]!r}")


# -- snapshots ---------------------------------------------------------------------------


class Symbols:
    """The process's own objects a snapshot names instead of holding: by identity on the way
    out, by name on the way in.  Built once per deployment."""

    def __init__(
        self, named: Mapping[str, object], kinds: Mapping[type, tuple[str, Callable[[], object]]]
    ) -> None:
        self._by_id: dict[int, str] = {}
        self._by_name: dict[str, object] = {}
        for name, obj in named.items():
            self._by_id.setdefault(id(obj), name)
            self._by_name[name] = obj
        #: the types whose objects may be named (their pickling goes through a reducer)
        self.types: set[type] = {type(obj) for obj in named.values()} | set(kinds)
        #: objects of these types are written as a kind's name and made new on reading
        self._kinds = {t: name for t, (name, _) in kinds.items()}
        self._fresh = {name: make for name, make in kinds.values()}

    def name_of(self, obj: object) -> str | None:
        name = self._by_id.get(id(obj))
        if name is not None:
            return name
        kind = self._kinds.get(type(obj))
        return "new:" + kind if kind is not None else None

    def resolve(self, name: str) -> object:
        if name.startswith("new:"):
            return self._fresh[name[4:]]()
        try:
            return self._by_name[name]
        except KeyError:
            raise pickle.UnpicklingError(f"unknown object {name!r} in a snapshot") from None

    @staticmethod
    def collect(owner: str, obj: object, into: dict[str, object]) -> None:
        """Name every :class:`StashKey` an object holds in its attributes (a plugin's keys)."""
        for attr, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
            if isinstance(value, StashKey):
                into.setdefault(f"{owner}.{attr}", value)


#: the names a snapshot being read resolves against (set by :func:`load`, per thread)
_reading = threading.local()


def _named(name: str) -> object:
    """A process object a snapshot names (the unpickler calls this for each one)."""
    extra: Mapping[str, object] = _reading.extra
    if name in extra:
        return extra[name]
    symbols: Symbols = _reading.symbols
    return symbols.resolve(name)


class _Pickler(pickle.Pickler):
    """Names the process's own objects by a reducer per type (C-level dispatch for every
    other object: no Python call per object pickled)."""

    def __init__(self, file: io.BytesIO, symbols: Symbols, extra: Mapping[int, str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        table = dict(copyreg.dispatch_table)

        def reduce(obj: Any) -> Any:
            name = extra.get(id(obj)) or symbols.name_of(obj)
            if name is not None:
                return _named, (name,)
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)

        for t in symbols.types:
            table[t] = reduce
        self.dispatch_table = table


def dump(value: object, symbols: Symbols, extra: Mapping[int, str] | None = None) -> bytes:
    """``value`` as a snapshot: the process's own objects (``symbols``, and ``extra`` -- id
    to name -- for this request's) written by name; compressed when large."""
    buf = io.BytesIO()
    _Pickler(buf, symbols, extra or {}).dump(value)
    raw = buf.getvalue()
    if len(raw) > _COMPRESS_FROM:
        return b"Z" + zlib.compress(raw, 1)
    return b"P" + raw


def load(blob: bytes, symbols: Symbols, extra: Mapping[str, object] | None = None) -> Any:
    """A snapshot read back, names resolved against this process's objects (``extra``: name
    to object, for this request's)."""
    kind, raw = blob[:1], blob[1:]
    if kind == b"Z":
        raw = zlib.decompress(raw)
    elif kind != b"P":
        raise pickle.UnpicklingError("not a loopwarden gateway snapshot")
    _reading.symbols, _reading.extra = symbols, extra or {}
    try:
        return pickle.loads(raw)
    finally:
        _reading.symbols = _reading.extra = None


#: snapshots larger than this are compressed (zlib, its fastest level)
_COMPRESS_FROM = 4096
