"""The console's index of a run-record file: one SQLite row per record, built by byte offset.

The records file (JSONL, what the ``run_record`` plugin appends) can hold 100,000 runs and
more; reading it whole for every page would make each page wait.  The index keeps, per valid
record, its byte offset and length in the file and the fields the runs page filters and sorts
on (time, termination, guard, tenant, conversation, model), each with a SQLite index.  A page
is a query; one run is read by seeking to its stored offset.

* **Incremental.** :meth:`RecordIndex.refresh` reads only the bytes appended since the last
  pass, and only whole lines (a record being written is picked up on the next pass).
* **Rebuilt when the file is not the one indexed**: another inode, a file shorter than what was
  indexed (truncated), or different first bytes (rewritten in place) -- a rotated log starts
  afresh.
* **Keyed by the records file's path**: the index lives in the data directory (or where the
  caller says) under a name derived from the file's absolute path, so two records files never
  share an index.
* **Read-only towards the records**: the file is opened for reading only; a run's path never
  waits on the console.

Lines are judged as :func:`loopwarden.report.read_records` judges them (strict JSON objects with
a ``termination``); the others are counted as skipped, never fatal.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from loopwarden.paths import data_dir, ensure_private_dir, private_file
from loopwarden.sanitize import loads_strict

__all__ = ["FILTERS", "Filters", "IndexedRun", "RecordIndex", "index_path", "record_time"]

#: the index's layout version: an index written by another version is rebuilt
SCHEMA = 1
#: bytes of the file's start remembered to notice a file rewritten in place
_HEAD = 4096
#: bytes read per chunk while indexing
_CHUNK = 4 * 1024 * 1024
#: the filters of the runs page and ``/api/runs``, each a column of the index
FILTERS = ("termination", "guard", "tenant", "conversation", "model")
#: record fields that may carry the run's time (epoch seconds or ISO 8601), first found wins
TIME_FIELDS = ("ended_at", "finished_at", "started_at", "timestamp", "time", "ts")

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    ts REAL NOT NULL,
    ts_exact INTEGER NOT NULL,
    termination TEXT NOT NULL,
    guard TEXT,
    tenant TEXT,
    conversation TEXT,
    model TEXT,
    scenario TEXT,
    steps INTEGER,
    tokens INTEGER,
    cost REAL,
    mode TEXT,
    would_stop TEXT,
    search TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_ts ON runs (ts);
CREATE INDEX IF NOT EXISTS runs_termination ON runs (termination);
CREATE INDEX IF NOT EXISTS runs_guard ON runs (guard);
CREATE INDEX IF NOT EXISTS runs_tenant ON runs (tenant);
CREATE INDEX IF NOT EXISTS runs_conversation ON runs (conversation);
CREATE INDEX IF NOT EXISTS runs_model ON runs (model);
CREATE INDEX IF NOT EXISTS runs_run_id ON runs (run_id);
"""

_COLUMNS = (
    "seq, run_id, ts, ts_exact, termination, guard, tenant, conversation, model, scenario, "
    "steps, tokens, cost, mode, would_stop"
)


def index_path(records: Path, directory: Path | None = None) -> Path:
    """Where the index of ``records`` lives: ``console/index-<hash of its absolute path>``
    in the data directory (or ``directory``)."""
    key = hashlib.sha256(str(records.expanduser().resolve()).encode()).hexdigest()[:20]
    return (directory or data_dir() / "console") / f"index-{key}.sqlite3"


def record_time(record: Mapping[str, Any]) -> float | None:
    """The run's time from the first of :data:`TIME_FIELDS` it carries (epoch seconds, or an
    ISO 8601 text -- without a zone read as UTC), else None."""
    for name in TIME_FIELDS:
        value = record.get(name)
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
        if isinstance(value, str) and value:
            try:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=timezone.utc)
            return parsed.timestamp()
    return None


def _text(value: Any, limit: int = 200) -> str | None:
    """A short text column: strings as they are (cut), other scalars as text, else None."""
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)[:limit]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _row(record: Mapping[str, Any], offset: int, length: int, ts: float) -> tuple[Any, ...]:
    """The index columns of one record (``ts``: its time when it carries none)."""
    given = record.get("meta")
    meta: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    tokens = record.get("tokens")
    total = _num(tokens.get("total")) if isinstance(tokens, Mapping) else None
    shadow = record.get("shadow_stop")
    would = _text(shadow.get("plugin")) if isinstance(shadow, Mapping) else None
    known = record_time(record)
    run_id = _text(record.get("run_id")) or f"@{offset}"
    evidence = record.get("evidence")
    signature = evidence.get("signature") if isinstance(evidence, Mapping) else None
    search = " ".join(
        s
        for s in (
            run_id,
            _text(record.get("scenario")),
            _text(signature),
            _text(record.get("final_answer"), 300),
            _text(meta.get("user")),
        )
        if s
    ).lower()
    steps = _num(record.get("steps"))
    return (
        offset,
        length,
        run_id,
        known if known is not None else ts,
        int(known is not None),
        str(record["termination"])[:200],
        _text(record.get("stopped_by")),
        _text(meta.get("tenant")),
        _text(record.get("conversation_id") or meta.get("conversation")),
        _text(record.get("model")),
        _text(record.get("scenario")),
        int(steps) if steps is not None else None,
        int(total) if total is not None else None,
        _num(record.get("cost")),
        _text(record.get("mode")),
        would,
        search,
    )


@dataclass(frozen=True)
class IndexedRun:
    """One run as the index holds it (``id``: its record id -- the ``run_id``, or
    ``@<offset>`` for a record without one)."""

    seq: int
    id: str
    ts: float
    ts_exact: bool
    termination: str
    guard: str | None
    tenant: str | None
    conversation: str | None
    model: str | None
    scenario: str | None
    steps: int | None
    tokens: int | None
    cost: float | None
    mode: str | None
    would_stop: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "seq": self.seq,
            "time": self.ts,
            "time_exact": self.ts_exact,
            "termination": self.termination,
            "guard": self.guard,
            "tenant": self.tenant,
            "conversation": self.conversation,
            "model": self.model,
            "scenario": self.scenario,
            "steps": self.steps,
            "tokens": self.tokens,
            "cost": self.cost,
            "mode": self.mode,
            "would_stop": self.would_stop,
        }


def _run(row: Sequence[Any]) -> IndexedRun:
    return IndexedRun(
        seq=row[0],
        id=row[1],
        ts=row[2],
        ts_exact=bool(row[3]),
        termination=row[4],
        guard=row[5],
        tenant=row[6],
        conversation=row[7],
        model=row[8],
        scenario=row[9],
        steps=row[10],
        tokens=row[11],
        cost=row[12],
        mode=row[13],
        would_stop=row[14],
    )


@dataclass
class Filters:
    """What the runs page asks for: exact filters, a time range, a search text."""

    termination: str | None = None
    guard: str | None = None
    tenant: str | None = None
    conversation: str | None = None
    model: str | None = None
    since: float | None = None
    until: float | None = None
    q: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for name in FILTERS:
            value = getattr(self, name)
            if value:
                clauses.append(f"{name} = ?")
                params.append(value)
        if self.since is not None:
            clauses.append("ts >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("ts < ?")
            params.append(self.until)
        if self.q:
            clauses.append("instr(search, ?) > 0")
            params.append(self.q.lower())
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


@dataclass
class Page:
    """One page of runs, newest first, and how many match in all."""

    runs: list[IndexedRun]
    total: int
    page: int
    size: int

    @property
    def has_next(self) -> bool:
        return (self.page + 1) * self.size < self.total


@dataclass
class _State:
    inode: tuple[int, int] = (0, 0)
    offset: int = 0
    head: str = ""
    skipped: int = 0
    extra: dict[str, str] = field(default_factory=dict)


class RecordIndex:
    """The SQLite index of one records file (see the module docstring).

    Thread-safe: one connection, used under a lock (the console's server answers requests on
    threads; each query is short).
    """

    def __init__(self, records: Path, index_file: Path | None = None) -> None:
        self.records = records
        self.path = index_file or index_path(records)
        ensure_private_dir(self.path.parent)
        private_file(self.path)
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._open()

    # -- the index's own bookkeeping ---------------------------------------------------------

    def _open(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA:
            self._db.executescript("DROP TABLE IF EXISTS runs; DROP TABLE IF EXISTS meta;")
            self._db.executescript(_DDL)
            self._db.execute(f"PRAGMA user_version = {SCHEMA}")
        self._db.executescript(_DDL)
        self._state = self._load_state()

    def _load_state(self) -> _State:
        values = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        if values.get("records") != str(self.records.resolve()):
            return _State()
        dev, _, ino = values.get("inode", "0:0").partition(":")
        return _State(
            inode=(int(dev or 0), int(ino or 0)),
            offset=int(values.get("offset", "0")),
            head=values.get("head", ""),
            skipped=int(values.get("skipped", "0")),
        )

    def _save_state(self) -> None:
        s = self._state
        rows = {
            "records": str(self.records.resolve()),
            "inode": f"{s.inode[0]}:{s.inode[1]}",
            "offset": str(s.offset),
            "head": s.head,
            "skipped": str(s.skipped),
        }
        self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows.items())

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def progress(self) -> tuple[int, int]:
        """(bytes of the records file indexed, its size): how far a first pass has got."""
        try:
            size = os.stat(self.records).st_size
        except OSError:
            size = 0
        return min(self._state.offset, size), size

    # -- building ----------------------------------------------------------------------------

    def refresh(self) -> int:
        """Index what was appended since the last pass (rebuilding when the file is another
        one, or shorter); returns how many records were added.

        Lines are parsed outside the lock and stored a chunk at a time, each chunk its own
        transaction: pages keep answering while a large file is indexed."""
        with self._refreshing:
            added = 0
            while True:
                with self._lock:
                    start = self._prepare()
                if start is None:
                    return added
                offset, fallback = start
                data = self._read_lines(offset)
                if not data:
                    return added  # only a partial line so far: the next pass takes it
                rows, skipped = _parse(data, offset, fallback)
                with self._lock:
                    if self._state.offset != offset:  # rebuilt meanwhile: start over
                        continue
                    self._store(rows, skipped, offset + len(data))
                added += len(rows)

    def _prepare(self) -> tuple[int, float] | None:
        """Under the lock: rebuild when the file is another one; None when nothing is new,
        else (the offset to read from, the fallback time of its records)."""
        try:
            st = os.stat(self.records)
        except FileNotFoundError:
            if self._state.offset:
                self._reset(_State())
            return None
        inode = (st.st_dev, st.st_ino)
        s = self._state
        if s.offset and (inode != s.inode or st.st_size < s.offset or self._head_changed(s)):
            self._reset(_State())
            s = self._state
        if st.st_size == s.offset:
            return None
        size = min(_HEAD, st.st_size)
        if not s.head.endswith(f":{size}"):  # new, or the start has grown: remember more
            with self.records.open("rb") as fh:
                s.head = f"{hashlib.sha256(fh.read(size)).hexdigest()}:{size}"
        s.inode = inode
        return s.offset, st.st_mtime

    def _read_lines(self, offset: int) -> bytes:
        """Whole lines from ``offset``: about one chunk (more when one line is longer)."""
        with self.records.open("rb") as fh:
            fh.seek(offset)
            data = fh.read(_CHUNK)
            while data and b"\n" not in data[-1:]:
                end = data.rfind(b"\n")
                if end >= 0:
                    return data[: end + 1]
                more = fh.read(_CHUNK)
                if not more:
                    return b""  # a line still being written
                data += more
            return data

    def _store(self, rows: list[tuple[Any, ...]], skipped: int, offset: int) -> None:
        self._db.execute("BEGIN")
        try:
            self._db.executemany(
                "INSERT INTO runs (offset, length, run_id, ts, ts_exact, termination, guard, "
                "tenant, conversation, model, scenario, steps, tokens, cost, mode, would_stop, "
                "search) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            self._state.skipped += skipped
            self._state.offset = offset
            self._save_state()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            self._state = self._load_state()
            raise

    def _head_changed(self, s: _State) -> bool:
        digest, _, size = s.head.partition(":")
        if not size:
            return False
        with self.records.open("rb") as fh:
            return hashlib.sha256(fh.read(int(size))).hexdigest() != digest

    def _reset(self, state: _State) -> None:
        self._db.execute("BEGIN")
        self._db.execute("DELETE FROM runs")
        self._state = state
        self._save_state()
        self._db.execute("COMMIT")

    # -- reading -----------------------------------------------------------------------------

    @property
    def skipped(self) -> int:
        """Lines of the file that are not valid records (corrupt, truncated, no termination)."""
        return self._state.skipped

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    def page(self, filters: Filters, page: int = 0, size: int = 50) -> Page:
        """Runs matching ``filters``, newest first, page ``page`` (from 0) of ``size``."""
        where, params = filters.where()
        with self._lock:
            total = self._db.execute(f"SELECT COUNT(*) FROM runs{where}", params).fetchone()[0]
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM runs{where} ORDER BY seq DESC LIMIT ? OFFSET ?",
                [*params, size, page * size],
            ).fetchall()
        return Page([_run(r) for r in rows], int(total), page, size)

    def after(self, cursor: int, limit: int = 200) -> list[IndexedRun]:
        """Runs indexed after ``cursor`` (a run's ``seq``), oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE seq > ? ORDER BY seq LIMIT ?",
                (cursor, limit),
            ).fetchall()
        return [_run(r) for r in rows]

    def cursor(self) -> int:
        """The newest run's ``seq`` (0 when there is none)."""
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()[0])

    def find(self, run_id: str) -> IndexedRun | None:
        """The run with this record id (the latest, if the id was recorded twice)."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                (run_id,),
            ).fetchone()
        return _run(row) if row else None

    def load(self, run_id: str) -> tuple[IndexedRun, dict[str, Any]] | None:
        """The run with this record id and its whole record, read at its stored offset."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS}, offset, length FROM runs WHERE run_id = ? "
                "ORDER BY seq DESC LIMIT 1",
                (run_id,),
            ).fetchone()
        if row is None:
            return None
        with self.records.open("rb") as fh:
            fh.seek(row[-2])
            raw = fh.read(row[-1])
        try:
            record = loads_strict(raw.decode("utf-8", errors="surrogateescape"))
        except ValueError:
            return None  # the file changed under the index: the next refresh rebuilds it
        if not isinstance(record, dict):
            return None
        return _run(row), record

    def values(self, column: str, limit: int = 200) -> list[str]:
        """The distinct values of a filter column, most frequent first."""
        if column not in FILTERS:
            raise ValueError(f"not a filter column: {column}")
        with self._lock:
            rows = self._db.execute(
                f"SELECT {column}, COUNT(*) AS n FROM runs WHERE {column} IS NOT NULL "
                f"GROUP BY {column} ORDER BY n DESC, {column} LIMIT ?",
                (limit,),
            ).fetchall()
        return [r[0] for r in rows]

    def terminations(self) -> dict[str, int]:
        """Runs per termination (what ``loopwarden report`` counts), most first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT termination, COUNT(*) AS n FROM runs GROUP BY termination "
                "ORDER BY n DESC, termination"
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def over_time(self, buckets: int = 24) -> tuple[str, list[float], dict[str, list[int]]]:
        """Runs per termination in ``buckets`` equal slices from the first run to the last:
        the axis (``"time"``, or ``"order"`` -- the order written -- when no record carries
        its time), the slices' starts, and per termination its count in each slice."""
        with self._lock:
            timed = self._db.execute("SELECT 1 FROM runs WHERE ts_exact = 1 LIMIT 1").fetchone()
            axis, col = ("time", "ts") if timed else ("order", "seq")
            lo, hi = self._db.execute(f"SELECT MIN({col}), MAX({col}) FROM runs").fetchone()
            if lo is None:
                return axis, [], {}
            n = buckets if hi > lo else 1
            width = (hi - lo) / n if hi > lo else 1.0
            if axis == "order":
                n = min(n, int(hi - lo) + 1)
                width = (hi - lo + 1) / n
            rows = self._db.execute(
                f"SELECT MIN(CAST(({col} - ?) / ? AS INTEGER), ?) AS b, termination, COUNT(*) "
                "FROM runs GROUP BY b, termination",
                (lo, width, n - 1),
            ).fetchall()
        series: dict[str, list[int]] = {}
        for b, term, c in rows:
            series.setdefault(term, [0] * n)[int(b)] += int(c)
        return axis, [lo + i * width for i in range(n)], series

    def records_iter(self) -> Iterator[dict[str, Any]]:
        """Every indexed record, in file order, read at its offset (for the figures)."""
        with self._lock:
            spans = self._db.execute("SELECT offset, length FROM runs ORDER BY seq").fetchall()
        with self.records.open("rb") as fh:
            for offset, length in spans:
                fh.seek(offset)
                try:
                    obj = loads_strict(fh.read(length).decode("utf-8", errors="surrogateescape"))
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    yield obj


def _parse(data: bytes, base: int, fallback: float) -> tuple[list[tuple[Any, ...]], int]:
    """Index rows for the whole lines in ``data`` (which starts at byte ``base`` of the file),
    and how many non-blank lines were not valid records."""
    rows: list[tuple[Any, ...]] = []
    skipped = 0
    pos = 0
    now = fallback or time.time()
    for line in data.split(b"\n"):
        length = len(line)
        start = base + pos
        pos += length + 1
        text = line.strip()
        if not text:
            continue
        try:
            obj = loads_strict(text.decode("utf-8", errors="surrogateescape"))
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("termination"), str):
            skipped += 1
            continue
        rows.append(_row(obj, start, length, now))
    return rows, skipped
