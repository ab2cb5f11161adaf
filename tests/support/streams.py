"""Streamed runs for tests: a runaway scenario that loops *inside* one answer, models whose
streams misbehave in time or length, and hostile server-sent-event streams for the stub
chat-completions server (:mod:`support.openai_stub`; well-formed streams are in
:mod:`support.openai_stream`).

Hostile streams (each queues one answer on a :class:`~support.openai_stub.Stub`):

* :func:`push_truncated`    the connection closes after a few chunks (no finish, no ``[DONE]``)
* :func:`push_garbage`      a chunk that is not JSON in the middle of a good stream
* :func:`push_stalled`      a few chunks, then silence (the connection stays open)
* :func:`push_endless_text` the same sentence, chunk after chunk, until the client leaves
* :func:`push_sse`          any chunks as one complete response (a str chunk sent verbatim)
* :func:`push_held`         the first part of an answer, the rest only once a test releases it
  (to see a client show text while its stream is still open)
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from loopwarden import Deployment, FakeClock, ModelRequest, ModelResponse
from loopwarden.engine.streaming import StreamEvent
from loopwarden.models.scenario import Scenario, load_scenario
from loopwarden.models.scripted import ScriptedModel
from support.openai_stream import stream_chunks
from support.openai_stub import Stub

__all__ = [
    "LOOP_SENTENCE",
    "ClockedModel",
    "events_of",
    "healthy_scenario",
    "push_endless_text",
    "push_garbage",
    "push_held",
    "push_sse",
    "push_stalled",
    "push_truncated",
    "runaway_scenario",
    "sse",
]

#: the sentence the runaway scenario's model says again and again in one answer
LOOP_SENTENCE = "我再查一下这个订单的状态。"


def events_of(dep: Deployment, mode: str, **kwargs: Any) -> list[StreamEvent]:
    """Every event of one streamed run of ``dep``, driven ``"sync"`` or ``"async"``."""
    if mode == "sync":
        return list(dep.stream(**kwargs))

    async def collect() -> list[StreamEvent]:
        return [e async for e in dep.astream(**kwargs)]

    return asyncio.run(collect())


def runaway_scenario(directory: Path, repeats: int = 60) -> Scenario:
    """A scenario whose first answer says :data:`LOOP_SENTENCE` ``repeats`` times before
    proposing a lookup: unstreamed, the whole answer is paid for and the lookup runs."""
    text = LOOP_SENTENCE * repeats
    path = directory / "runaway-answer.toml"
    path.write_text(
        f"""name = "runaway-answer"
user = "订单 88231 到哪了？"
[model]
turns = [
  {{ content = "{text}", tool_calls = [
      {{ name = "query_order", arguments = {{ order_id = "88231" }} }},
  ] }},
  {{ content = "订单已签收。" }},
]
then = "final"
final_text = "订单 88231 已签收。"
""",
        encoding="utf-8",
    )
    return load_scenario(path)


def healthy_scenario() -> str:
    """The built-in healthy scenario (order and policy lookups, a refund, an answer)."""
    return "refund"


class ClockedModel(ScriptedModel):
    """A scripted model whose stream takes ``seconds_per_piece`` on ``clock`` per delta (a
    slow generation, on a fake clock: no real waiting), with an optional output cap."""

    def __init__(
        self,
        scenario: Scenario,
        clock: FakeClock,
        seconds_per_piece: float = 0.0,
        max_output_tokens: int | None = None,
    ) -> None:
        super().__init__(scenario.model)
        self.clock = clock
        self.seconds_per_piece = seconds_per_piece
        self.max_output_tokens = max_output_tokens
        #: text deltas handed out (what the run was "billed" for)
        self.pieces = 0

    def stream(self, request: ModelRequest) -> Iterator[str | ModelResponse]:
        for item in super().stream(request):
            if isinstance(item, str):
                self.clock.advance(self.seconds_per_piece)
                self.pieces += 1
            yield item


# -- hostile server-sent events -----------------------------------------------------------------


def sse(chunks: list[Any]) -> bytes:
    """``data:`` events for ``chunks`` (a str is sent as it is, anything else as JSON)."""
    return b"".join(
        b"data: " + (c if isinstance(c, str) else json.dumps(c)).encode() + b"\n\n" for c in chunks
    )


def _stream_writer(data: bytes, *, hold_open: bool = False, close: bool = False) -> Any:
    def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        stub._send(h, b"%x\r\n%s\r\n" % (len(data), data))
        if hold_open:
            stub.closing.wait(30)
        if close or hold_open:
            h.close_connection = True
            return
        stub._send(h, b"0\r\n\r\n")

    return write


def push_sse(stub: Stub, chunks: list[Any]) -> None:
    """Queue ``chunks`` as one complete event stream (with a content-length): wrong-shaped
    or unfinished answers that arrive in full."""
    data = sse(chunks)

    def write(h: BaseHTTPRequestHandler, s: Stub) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        s._send(h, data)

    stub.responses.append(write)


def push_truncated(stub: Stub, content: str = "The order is on its way and", keep: int = 3) -> None:
    """A stream of ``content`` whose connection closes after ``keep`` chunks: no finish
    reason, no usage, no ``[DONE]`` -- a server or proxy that dies mid-answer."""
    chunks = stream_chunks(content, None, None)[:keep]
    stub.responses.append(_stream_writer(sse(chunks), close=True))


def push_garbage(stub: Stub, content: str = "The order is on its way.") -> None:
    """A good stream of ``content`` with a chunk that is not JSON after its second one."""
    chunks: list[Any] = stream_chunks(content, None, {"prompt_tokens": 5, "completion_tokens": 5})
    chunks.insert(2, "{not json at all")
    stub.responses.append(_stream_writer(sse([*chunks, "[DONE]"])))


def push_stalled(stub: Stub, content: str = "The order is", keep: int = 2) -> None:
    """``keep`` chunks of ``content``, then nothing (the connection stays open until the
    client gives up or the server shuts down)."""
    chunks = stream_chunks(content, None, None)[:keep]
    stub.responses.append(_stream_writer(sse(chunks), hold_open=True))


def push_endless_text(stub: Stub, sentence: str = "I will check the order again. ") -> None:
    """A stream that says ``sentence`` chunk after chunk and never ends by itself."""
    head = sse(stream_chunks(None, None, None)[:1])
    piece = sse([stream_chunks(sentence, None, None, piece=len(sentence))[1]])

    def write(h: BaseHTTPRequestHandler, s: Stub) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        h.close_connection = True
        s._send(h, b"%x\r\n%s\r\n" % (len(head), head))
        while not s.closing.is_set():
            s._send(h, b"%x\r\n%s\r\n" % (len(piece), piece))
            if s.closing.wait(0.001):
                return

    stub.responses.append(write)


def push_held(
    stub: Stub,
    first: str,
    rest: str,
    release: threading.Event,
    usage: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """A stream that sends ``first`` (in one chunk), then waits for ``release`` (at most
    ``timeout_s``: a test that never sets it fails on its assertions, not by hanging)
    before it sends ``rest``, the finish, ``usage`` and ``[DONE]``."""
    chunks: list[Any] = stream_chunks(first + rest, None, usage, piece=len(first))
    head = sse(chunks[:2])  # the role, then ``first``
    tail = sse([*chunks[2:], "[DONE]"])

    def write(h: BaseHTTPRequestHandler, s: Stub) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        s._send(h, b"%x\r\n%s\r\n" % (len(head), head))
        release.wait(timeout_s)
        s._send(h, b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))

    stub.responses.append(write)
