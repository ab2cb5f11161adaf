"""Fixtures for the shared-store tests: a real SQLite file and a real redis-server.

The Redis URL comes from ``LOOPWARDEN_TEST_REDIS_URL`` (``.ci/run`` starts a server and sets
it).  Without it, a ``redis-server`` found on PATH is started on a free local port for the
session.  Without either, the Redis half of the suite is skipped -- except in CI
(``CI=true``), where that is a failure: the Redis tests must run there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwarden.store import RedisStore, SQLiteStore, Store, open_store

STORES = ("sqlite", "redis")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """The URL of a running redis-server (see the module docstring)."""
    url = os.environ.get("LOOPWARDEN_TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI: no redis-server and no LOOPWARDEN_TEST_REDIS_URL; the Redis tests "
                        "must run in CI (.ci/run starts one)")
        pytest.skip("no redis-server on PATH and no LOOPWARDEN_TEST_REDIS_URL")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="lw-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL, once per kind: a new SQLite file, or a new Redis namespace.

    Redis URLs carry the namespace as ``#ns`` -- :func:`config_for` moves it to
    ``[store] namespace`` -- and the namespace's keys are deleted afterwards.
    """
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite3'}"
        return
    base = request.getfixturevalue("redis_server")
    ns = "lwtest-" + uuid.uuid4().hex[:12]
    yield f"{base}#{ns}"
    import redis

    r = redis.Redis.from_url(base)
    keys = list(r.scan_iter(match="{" + ns + "}:*", count=500))
    if keys:
        r.delete(*keys)
    r.close()


def split_url(url: str) -> tuple[str, str]:
    """``(url, namespace)`` from a :func:`store_url` value."""
    base, _, ns = url.partition("#")
    return base, ns or "loopwarden"


def store_table(url: str, **extra: object) -> dict[str, object]:
    """The ``[store]`` table for a :func:`store_url` value."""
    base, ns = split_url(url)
    return {"url": base, "namespace": ns, **extra}


def make_store(url: str) -> Store:
    base, ns = split_url(url)
    store = open_store(base, namespace=ns)
    assert isinstance(store, (SQLiteStore, RedisStore))
    return store
