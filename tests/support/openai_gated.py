"""Answers for :mod:`support.openai_stub` held back until another request has arrived: two
runs against two stubs overlap for certain, without sleeping.

:func:`gated` returns a writer to queue with ``stub.responses.append(writer)``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from support.openai_stub import Stub, Writer, _encode, _head

__all__ = ["gated"]


def gated(
    body: Any,
    *,
    wait: threading.Event | None = None,
    release: threading.Event | None = None,
    timeout_s: float = 30.0,
) -> Writer:
    """``body`` answered once ``wait`` is set (at most ``timeout_s``: a test that never sets
    it fails on its assertions, not by hanging); sets ``release`` on arrival first."""
    data = _encode(body)

    def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
        if release is not None:
            release.set()
        if wait is not None:
            wait.wait(timeout_s)
        _head(h, 200, {"content-length": str(len(data))})
        stub._send(h, data)

    return write
