"""Streamed chat completions for the stub server (:mod:`support.openai_stub`).

:func:`push_stream` queues one answer as a real ``text/event-stream`` response -- the
``chat.completion.chunk`` events an OpenAI-compatible endpoint sends for ``"stream": true``
(the text in pieces, each tool call's arguments in pieces, the usage in a last chunk, then
``data: [DONE]``) -- so a framework's streaming client parses it over a real socket.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

from support.openai_stub import Stub

__all__ = ["push_stream", "stream_chunks"]


def _chunk(
    delta: dict[str, Any], finish: str | None = None, response_id: str = "chatcmpl-1"
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "stub-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream_chunks(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    *,
    piece: int = 4,
    response_id: str = "chatcmpl-1",
) -> list[dict[str, Any]]:
    """The chunks of one streamed answer: ``content`` and ``tool_calls`` ({name, arguments},
    optionally an ``id``: ``call_<i>`` otherwise) split into ``piece``-character deltas, then
    a usage-only chunk when ``usage`` is given; every chunk carries ``response_id``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return _chunk(delta, finish, response_id)

    chunks = [chunk({"role": "assistant", "content": ""})]
    for text in _pieces(content, piece) if content else []:
        chunks.append(chunk({"content": text}))
    for i, tc in enumerate(tool_calls or []):
        head = {"index": i, "id": tc.get("id", f"call_{i}"), "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": tc["name"], "arguments": ""}}]})
        )
        for text in _pieces(tc["arguments"], piece):
            chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": text}}]}))
    chunks.append(chunk({}, "tool_calls" if tool_calls else "stop"))
    if usage is not None:
        chunks.append({**chunk({}), "choices": [], "usage": usage})
    return chunks


def push_stream(
    stub: Stub,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    *,
    response_id: str = "chatcmpl-1",
) -> None:
    """Queue one streamed answer (server-sent events, chunked by the connection's end)."""
    data = b"".join(
        b"data: " + json.dumps(c).encode() + b"\n\n"
        for c in stream_chunks(content, tool_calls, usage, response_id=response_id)
    )
    data += b"data: [DONE]\n\n"

    def write(h: BaseHTTPRequestHandler, s: Stub) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        s._send(h, data)

    stub.responses.append(write)
