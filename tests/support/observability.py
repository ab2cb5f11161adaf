"""Helpers shared by the observability tests (logging, alerting, metrics, run_record, report).

* the local scenario files under ``tests/observability_data``;
* a repeat guard: the real ``repeat_call`` plugin when it is installed, else a tiny stand-in
  that stops with reason ``repeat_call`` on the third identical call;
* real local HTTP servers for webhook tests (127.0.0.1, port 0): one that records JSON bodies,
  one that hangs; and a URL whose port refuses connections;
* :func:`captured_logs`: every record a logger (and those below it) writes, at any level.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loopwarden import Plugin, Run, ToolCall, Verdict, hookimpl

DATA = Path(__file__).parent.parent / "observability_data"
ALWAYS_NOT_FOUND = str(DATA / "always_not_found.toml")
WANDERING = str(DATA / "wandering.toml")
SECRET_TOOL = str(DATA / "secret_tool.toml")

HAVE_REPEAT_CALL = importlib.util.find_spec("loopwarden.plugins.repeat_call") is not None


class StandInRepeatCall(Plugin):
    """Stops the run (hard) on the third identical call; counts duplicates on the run."""

    name = "repeat_call"

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        seen: dict[str, int] = self.state(run)
        n = seen[call.fingerprint] = seen.get(call.fingerprint, 0) + 1
        if n > 1:
            run.duplicate_calls += 1
        if n >= 3:
            return self.stop(
                "repeat_call", fingerprint=call.fingerprint, tool=call.name, count=n, threshold=3
            )
        return None


def repeat_guard() -> tuple[list[str], dict[str, Any]]:
    """(names to enable, plugin objects) for a repeat_call guard (the real one if installed)."""
    if HAVE_REPEAT_CALL:
        return ["repeat_call"], {}
    return [], {"repeat_call": StandInRepeatCall()}


class _Recorder(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.server.hang:
            self.server.release.wait(30)  # past any client timeout; released at teardown
        self.server.bodies.append(json.loads(body))
        self.server.content_types.append(self.headers.get("Content-Type"))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hang: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.hang = hang
        self.release = threading.Event()
        self.bodies: list[Any] = []
        self.content_types: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/alerts"


@contextmanager
def webhook_server(*, hang: bool = False) -> Iterator[_Server]:
    """A real HTTP server on 127.0.0.1 that records POSTed JSON (or hangs before answering)."""
    server = _Server(hang)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def refused_url() -> str:
    """A URL on 127.0.0.1 whose port nobody listens on (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/alerts"


#: alerts delivered to the callable sink ``support.observability:collect``
COLLECTED: list[dict[str, Any]] = []


def collect(alert: dict[str, Any]) -> None:
    COLLECTED.append(alert)


def explode(alert: dict[str, Any]) -> None:
    raise RuntimeError("sink is down")


GATE = threading.Event()
STARTED = threading.Event()


def blocked(alert: dict[str, Any]) -> None:
    """A sink that hangs until ``GATE`` is set (``STARTED`` tells that it is hanging)."""
    STARTED.set()
    GATE.wait(30)
    COLLECTED.append(alert)


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A run record without the fields that differ between identical runs."""
    return {k: v for k, v in record.items() if k not in ("run_id", "elapsed_s", "conversation_id")}


class LogCapture(logging.Handler):
    """The records a logger wrote: as written (:meth:`lines`, :meth:`text`), and the logging
    plugin's fields (:attr:`fields`, from ``record.loopwarden``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def fields(self) -> list[dict[str, Any]]:
        return [r.loopwarden for r in self.records if hasattr(r, "loopwarden")]

    def lines(self, name: str = "") -> list[str]:
        """The messages of the records of logger ``name`` and those below it (all: "")."""
        return [r.getMessage() for r in self.records if r.name.startswith(name)]

    def text(self) -> str:
        return "\n".join(self.lines())


@contextmanager
def captured_logs(name: str) -> Iterator[LogCapture]:
    """Every record logger ``name`` and those below it write, at any level, while inside."""
    handler = LogCapture()
    logger = logging.getLogger(name)
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
