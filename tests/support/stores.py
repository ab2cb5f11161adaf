"""Fixtures for the shared-store tests: a real SQLite file and a real redis-server.

The Redis URL comes from ``LOOPWARDEN_TEST_REDIS_URL`` (``.ci/run`` starts a server and sets
it).  Without it, a ``redis-server`` found on PATH is started on a free local port for the
session.  Without either, the Redis half of the suite is skipped -- except in CI
(``CI=true``), where that is a failure: the Redis tests must run there.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
            pytest.fail(
                "CI: no redis-server and no LOOPWARDEN_TEST_REDIS_URL; the Redis tests "
                "must run in CI (.ci/run starts one)"
            )
        pytest.skip("no redis-server on PATH and no LOOPWARDEN_TEST_REDIS_URL")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="lw-redis-")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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


# ---------------------------------------------------------------------------------------------
# Deployments on a store, and workers for real subprocesses (spawned: module-level functions)
# ---------------------------------------------------------------------------------------------

PAY = """
name = "pay"
user = "Pay invoice 7."
[model]
turns = [
  { content = "Paying.", tool_calls = [{ name = "pay_invoice", arguments = { invoice = "7" } }] },
  { content = "Paid." },
]
then = "final"
final_text = "Paid."
"""


def write_scenario(directory: Path, text: str = PAY, name: str = "pay") -> Path:
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def pay_tool(effects: Path, *, kill: bool = False, delay_s: float = 0.0) -> Any:
    """A side-effecting tool that appends one line to ``effects`` per execution (``kill``:
    the process dies by SIGKILL in the middle of the call, after the effect)."""
    from loopwarden.tools import tool

    @tool(side_effect=True, idempotency_keys=("invoice",))
    def pay_invoice(invoice: str) -> str:
        """Pay an invoice (a side effect)."""
        with effects.open("a", encoding="utf-8") as fh:
            fh.write(f"{invoice} {os.getpid()}\n")
        if delay_s:
            time.sleep(delay_s)
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"PAID {invoice}"

    return pay_invoice


def deployment_for(
    url: str,
    *,
    plugins: dict[str, Any] | None = None,
    store: dict[str, Any] | None = None,
    tools: Any = None,
    enabled: tuple[str, ...] = ("spend_limits",),
) -> Any:
    """A deployment on the store at ``url``: ``plugins`` tables, ``[store]`` extras; the
    demo shop's tools unless ``tools`` are given."""
    from loopwarden import Deployment
    from loopwarden.config import parse_config
    from loopwarden.demo import shop_tools

    tables: dict[str, Any] = {"enabled": list(enabled), **(plugins or {})}
    config = parse_config(
        {"store": store_table(url, **(store or {})), "plugins": tables}, path="<test>"
    )
    return Deployment(config, tools=tools if tools is not None else shop_tools())


def pay_worker(url: str, directory: str, start: float, kill: bool = False) -> dict[str, Any]:
    """Run the pay scenario once in this process (its own deployment); returns the record."""
    d = Path(directory)
    dep = deployment_for(url, enabled=(), tools=[pay_tool(d / "effects.txt", kill=kill)])
    while time.time() < start:
        time.sleep(0.001)
    run = dep.run(scenario=str(d / "pay.toml"))
    dep.close()
    record: dict[str, Any] = run.record()
    record["observation"] = [m["content"] for m in run.messages if m["role"] == "tool"]
    return record


class BlockingModel:
    """A model whose call never returns: it touches ``marker`` and sleeps (to be killed)."""

    name = "scripted"

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def complete(self, request: Any) -> Any:
        self.marker.write_text("calling", encoding="utf-8")
        time.sleep(600)
        raise RuntimeError("unreachable")


def blocked_run_worker(url: str, marker: str, budgets: list[dict[str, Any]]) -> None:
    """Start a tenant run whose first model call blocks until the process is killed."""
    dep = deployment_for(
        url, plugins={"spend_limits": {"budgets": budgets}}, store={"reservation_ttl_s": 1.0}
    )
    dep.run("hello", model=BlockingModel(Path(marker)), meta={"tenant": "acme"})


ALERTS: list[dict[str, Any]] = []


def collect_alert(alert: dict[str, Any]) -> None:
    """A callable alert sink for the tests."""
    ALERTS.append(alert)
