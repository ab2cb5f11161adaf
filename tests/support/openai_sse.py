"""Answers for :mod:`support.openai_stub` beyond a plain JSON body: a streamed
chat-completion (server-sent events, as ``stream=True`` clients read it) and answers held
back until another request has arrived (to make two runs overlap without sleeping).

Each function returns a writer to queue with ``stub.responses.append(writer)``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from support.openai_stub import Stub, Writer, _encode, _head

__all__ = ["gated", "streamed"]


def streamed(body: dict[str, Any]) -> Writer:
    """The chat.completion ``body`` (see :func:`support.openai_stub.completion`) as a stream
    of ``chat.completion.chunk`` events: the role, the content, each tool call, the finish
    reason, the usage, then ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    for i, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": i, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if "usage" in body:
        chunks.append(base | {"choices": [], "usage": body["usage"]})
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    data += b"data: [DONE]\n\n"

    def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
        _head(h, 200, {"content-type": "text/event-stream", "content-length": str(len(data))})
        stub._send(h, data)

    return write


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
