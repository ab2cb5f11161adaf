"""The hostile-world kit for stores: a store whose reply is lost after the write was applied.

A store error is no proof that nothing was written.  Two faults make that happen on purpose:

:class:`ReplyLosingProxy` (Redis, a real fault)
    a TCP proxy in front of the real redis-server: it forwards every command, but withholds
    the reply of the next script call (``EVALSHA``) -- the server applied it, the client
    times out -- and may then go *down* (every connection closed at once: a partition).
:class:`LateFailingSQLite` (SQLite, simulated)
    a :class:`SQLiteStore` whose next transaction commits and *then* raises the
    :class:`StoreError` a timeout would (SQLite has no reply to lose), and may then go down
    (every transaction fails before it starts).

:func:`faulty_store` opens either for a ``store_url`` fixture value, with one interface:
``lose_next_reply(then_down=...)``, ``heal()``, ``store()`` (a store through the fault) and
``install(deployment)`` (the deployment's ``[store]`` goes through the fault).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loopwarden.exceptions import StoreError
from loopwarden.store import Counter, SQLiteStore, Store, open_store
from support.stores import split_url

__all__ = [
    "LateFailingSQLite",
    "ReplyLosingProxy",
    "StoreFault",
    "faulty_store",
    "warm_up",
]


class ReplyLosingProxy:
    """A TCP proxy to a real Redis that can lose replies and go down (see the module doc)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._lose = 0  # script calls whose reply to withhold
        self._then_down = False
        self.down = False
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = int(self._server.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_next_reply(self, *, then_down: bool = False) -> None:
        """Withhold the reply of the next script call; ``then_down``: go down right after it
        reached the server."""
        with self._lock:
            self._lose, self._then_down = 1, then_down

    def heal(self) -> None:
        with self._lock:
            self._lose, self._then_down, self.down = 0, False, False

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self._drop_all()

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            withhold, down_on_reply = threading.Event(), threading.Event()
            threading.Thread(
                target=self._requests, args=(client, upstream, withhold, down_on_reply), daemon=True
            ).start()
            threading.Thread(
                target=self._replies, args=(upstream, client, withhold, down_on_reply), daemon=True
            ).start()

    def _requests(
        self,
        src: socket.socket,
        dst: socket.socket,
        withhold: threading.Event,
        down_on_reply: threading.Event,
    ) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if self._lose and b"EVALSHA" in data.upper():
                        self._lose -= 1
                        if self._then_down:
                            down_on_reply.set()
                        withhold.set()  # before the server can answer
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def _replies(
        self,
        src: socket.socket,
        dst: socket.socket,
        withhold: threading.Event,
        down_on_reply: threading.Event,
    ) -> None:
        try:
            while data := src.recv(65536):
                if down_on_reply.is_set():  # the server answered: applied; now partition
                    self.down = True
                    self._drop_all()
                    return
                if not withhold.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.close()


class LateFailingSQLite(SQLiteStore):
    """A SQLite store whose next transaction commits, then fails as a timeout would
    (simulated: SQLite has no reply to lose); ``down``: every transaction fails at once."""

    def __init__(self, path: Path, *, timeout_s: float = 5.0) -> None:
        super().__init__(path, timeout_s=timeout_s)
        self.lose = 0
        self.then_down = False
        self.down = False

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        if self.down:
            raise StoreError("simulated: the store is down", url=self.url)
        late = self.lose > 0
        with super()._tx() as conn:
            yield conn
        if late:  # committed: the write stands, the caller hears a timeout
            self.lose -= 1
            self.down = self.then_down
            raise StoreError("simulated: timed out after the write committed", url=self.url)


class StoreFault:
    """One store fault for a ``store_url`` fixture value (see :func:`faulty_store`)."""

    def __init__(self, store_url: str, timeout_s: float) -> None:
        self.base, self.namespace = split_url(store_url)
        self.timeout_s = timeout_s
        self.proxy: ReplyLosingProxy | None = None
        self._sqlite: list[LateFailingSQLite] = []
        self.url = self.base  # the URL a deployment is configured with
        if self.base.startswith("redis"):
            parts = urlsplit(self.base)
            self.proxy = ReplyLosingProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
            self.url = f"redis://127.0.0.1:{self.proxy.port}{parts.path}"

    def store(self) -> Store:
        """A store that goes through the fault."""
        if self.proxy is not None:
            return open_store(self.url, namespace=self.namespace, timeout_s=self.timeout_s)
        store = LateFailingSQLite(Path(self.base[len("sqlite:///") :]), timeout_s=self.timeout_s)
        self._sqlite.append(store)
        return store

    def install(self, deployment: Any) -> None:
        """Make ``deployment``'s shared store go through the fault (configure it with
        :attr:`url`, ``namespace`` and ``timeout_s``)."""
        deployment.shared._store = self.store()

    def lose_next_reply(self, *, then_down: bool = False) -> None:
        if self.proxy is not None:
            self.proxy.lose_next_reply(then_down=then_down)
        for s in self._sqlite:
            s.lose, s.then_down = 1, then_down

    def heal(self) -> None:
        if self.proxy is not None:
            self.proxy.heal()
        for s in self._sqlite:
            s.lose, s.then_down, s.down = 0, False, False

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()


@contextmanager
def faulty_store(store_url: str, *, timeout_s: float = 0.5) -> Iterator[StoreFault]:
    """A :class:`StoreFault` for ``store_url``, its scripts loaded on the server first (a
    lost ``NOSCRIPT`` reply would be a write that never happened)."""
    warm_up(store_url)
    fault = StoreFault(store_url, timeout_s)
    try:
        yield fault
    finally:
        fault.close()


def warm_up(store_url: str) -> None:
    """One call of each store operation on ``store_url`` (Redis: every script loaded)."""
    base, ns = split_url(store_url)
    store = open_store(base, namespace=ns)
    c = Counter("warm-up", "-", "run", "-", expires_at=1.0)
    store.reserve([c], (0, 0, 0, 1, 0), token="warm-up", ttl_s=1)
    store.settle([c], "warm-up", None)
    store.claim("warm-up", "warm-up", 1)
    store.finish("warm-up", "warm-up", "done", None, 1)
    store.release("warm-up", "warm-up")
    store.close()
