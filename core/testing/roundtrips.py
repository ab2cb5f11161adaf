"""Counting what a store call costs: round trips to the store and, on SQLite, statements.

For tests and benches (``tests/test_store_round_trips.py``, ``bench/shared_budget.py``): the
real store underneath, with its client instrumented for the length of a ``with`` block --

* Redis: every request the client writes to the server is one round trip (a pipeline is one
  request; a NOSCRIPT answer followed by ``SCRIPT LOAD`` and the ``EVALSHA`` again is three);
* SQLite: every transaction (ended by ``COMMIT`` or ``ROLLBACK``) is one round trip -- the
  write lock taken, the WAL appended -- and :attr:`RoundTrips.statements` lists each
  statement SQLite executed (an ``executemany`` runs its statement once per row; a
  ``BEGIN IMMEDIATE`` tried again while another connection holds the lock, once per try).

Only the calling thread's requests are counted, so a concurrent caller of the same store
cannot inflate a count.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RoundTrips", "count_round_trips"]


@dataclass
class RoundTrips:
    """What the calls inside :func:`count_round_trips` sent to the store."""

    round_trips: int = 0
    statements: list[str] = field(default_factory=list)  #: SQLite only

    def reset(self) -> None:
        self.round_trips = 0
        self.statements.clear()


@contextmanager
def count_round_trips(store: Any) -> Iterator[RoundTrips]:
    """Count the round trips of ``store`` (a :class:`~loopwarden.store.SQLiteStore` or
    :class:`~loopwarden.store.RedisStore`) made by this thread inside the block."""
    from loopwarden.store import RedisStore, SQLiteStore

    counts = RoundTrips()
    me = threading.get_ident()
    if isinstance(store, SQLiteStore):

        def trace(sql: str) -> None:
            if threading.get_ident() == me:
                counts.statements.append(sql)
                if sql.lstrip().upper().startswith(("COMMIT", "ROLLBACK")):
                    counts.round_trips += 1  # a transaction ended (a BEGIN may be retried)

        conn = store._conn
        conn.set_trace_callback(trace)
        try:
            yield counts
        finally:
            conn.set_trace_callback(None)
        return
    if isinstance(store, RedisStore):
        import redis.connection

        cls = redis.connection.AbstractConnection
        send: Callable[..., None] = cls.send_packed_command

        def counted(self: Any, command: Any, check_health: bool = True) -> None:
            if threading.get_ident() == me:
                counts.round_trips += 1
            send(self, command, check_health)

        cls.send_packed_command = counted  # type: ignore[method-assign]
        try:
            yield counts
        finally:
            cls.send_packed_command = send  # type: ignore[method-assign]
        return
    raise TypeError(f"cannot count the round trips of a {type(store).__name__}")
