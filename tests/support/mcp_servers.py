"""Real MCP servers for tests: ``[mcp.servers.<name>]`` tables that start
:mod:`support.mcp_orders` (well-behaved, or one that exits or never answers at start-up),
and the same server over streamable HTTP in a subprocess, optionally behind a bearer token."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ORDERS = Path(__file__).parent / "mcp_orders.py"


def count(log: Path, line: str) -> int:
    """How many times the server logged ``line`` (an execution of a tool on an order)."""
    if not log.exists():
        return 0
    return log.read_text(encoding="utf-8").splitlines().count(line)


def server_pids(log: Path) -> list[int]:
    """The process ids of the stdio servers that logged to ``log``."""
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").splitlines()
    return [int(ln.split()[1]) for ln in lines if ln.startswith("started ")]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie -- ended, not yet reaped -- does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        import os

        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def stdio_table(log: Path, mode: str | None = None, **extra: Any) -> dict[str, Any]:
    """The table of a stdio ``mcp_orders`` server logging to ``log`` (``mode``: ``exit``,
    ``mute``; see the server's docstring)."""
    args = [str(ORDERS), str(log)] + ([mode] if mode else [])
    return {"command": sys.executable, "args": args, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_server(log: Path, token: str | None = None) -> Iterator[str]:
    """``mcp_orders`` serving streamable HTTP in a subprocess; yields its endpoint URL (requests
    need ``Authorization: Bearer <token>`` when ``token`` is given)."""
    port = _free_port()
    mode = f"http:{port}" + (f":{token}" if token else "")
    proc = subprocess.Popen(
        [sys.executable, str(ORDERS), str(log), mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until it listens (a start-up, not a timing assertion)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP HTTP test server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
