"""Pieces for the tests of the Responses and Messages wires against real servers.

- :class:`Recording`: ASGI middleware around an upstream that keeps, per request, the path,
  the request body and exactly the response bytes it sent (how a test compares what the
  client got through the gateway with what the upstream sent).
- :class:`Misbehaving`: ASGI middleware around the scripted upstream that misbehaves when a
  request's ``x-fault`` header says so (the gateway forwards the client's headers): a 429
  with ``retry-after`` in the wire's own error shape, or a stream cut in the middle -- right
  after the first event of a kind (``x-cut-after: input_json_delta``), the body ended
  cleanly (``x-fault: cut``) or the connection dropped (``x-fault: reset``); or garbled: the
  first event carrying ``x-garble`` has it replaced by ``x-garble-with`` (``x-fault:
  garble``).
- :class:`Records`: the run records ``loopwarden.signals.run_stopped`` sends, found by
  ``meta.user`` (bounded polling: a record is written when the gateway ends a run).
- :func:`sse_events`, :func:`responses_from_sse`, :func:`message_from_sse`: a raw event
  stream read back into its events and the answer it carries (each wire's own shape).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from loopwarden import signals

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class Exchange:
    """One request an upstream answered: what it got and exactly what it sent back."""

    path: str
    request: bytes
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)


def _restyle_json(body: bytes) -> bytes:
    return json.dumps(json.loads(body), ensure_ascii=True, indent=1).encode()


def _restyle_event(body: bytes) -> bytes:
    out = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: ") and line[6:7] in (b"{", b"["):
            obj = json.loads(line[6:])
            line = b"data:" + json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
        out.append(line)
    return b"\n".join(out)


class Recording:
    """Keeps every exchange ``app`` answers (``exchanges``, in order), then hands it on.

    With ``restyle``, the upstream's answers are first re-encoded in a style of their own --
    JSON indented with every non-ASCII character escaped, events' ``data:`` compact with no
    space after the colon -- so that a gateway re-encoding what it passes on (however
    faithfully to the JSON) shows in a byte comparison."""

    def __init__(self, app: Any, *, restyle: bool = False) -> None:
        self.app = app
        self.restyle = restyle
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        ex = Exchange(scope["path"], body)
        self.exchanges.append(ex)
        given = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        start: MutableMapping[str, Any] | None = None
        whole = bytearray()

        async def keep(message: MutableMapping[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                ex.status = message["status"]
                ex.headers = list(message.get("headers") or [])
                ctype = dict(ex.headers).get(b"content-type", b"")
                if self.restyle and ex.status == 200 and ctype == b"application/json":
                    start = message  # sent with the whole body, its length restyled
                    return
            elif message["type"] == "http.response.body":
                data = message.get("body", b"")
                if start is not None:
                    whole.extend(data)
                    if message.get("more_body"):
                        return
                    data = _restyle_json(bytes(whole))
                    length = (b"content-length", str(len(data)).encode())
                    hs = [h for h in ex.headers if h[0] != b"content-length"]
                    ex.headers = [*hs, length]
                    await send({**start, "headers": ex.headers})
                elif self.restyle and data:
                    data = _restyle_event(data)
                message = {**message, "body": data}
                ex.body.extend(data)
            await send(message)

        await self.app(scope, replay, keep)


#: Anthropic's own shape of a rate limit, and the headers it sends with one
ANTHROPIC_429 = (
    b'{"type":"error","error":{"type":"rate_limit_error",'
    b'"message":"Number of request tokens has exceeded your per-minute rate limit"}}'
)
ANTHROPIC_429_HEADERS = (
    (b"retry-after", b"13"),
    (b"anthropic-ratelimit-requests-remaining", b"0"),
    (b"anthropic-ratelimit-requests-reset", b"2026-06-25T02:31:00Z"),
    (b"request-id", b"req_ant_429"),
)
OPENAI_429 = (
    b'{"error":{"message":"Rate limit reached, try again in 7s.","type":"requests",'
    b'"param":null,"code":"rate_limit_exceeded"}}'
)
OPENAI_429_HEADERS = ((b"retry-after", b"7"), (b"x-request-id", b"req_oai_429"))


class _Cut(Exception):
    """Raised inside the upstream to drop the connection mid-body."""


class Misbehaving:
    """The scripted upstream, misbehaving on request (see the module doc)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        #: streams cut so far (what a test waits on)
        self.cuts = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        fault = headers.get("x-fault")
        if fault == "429":
            anthropic = scope["path"].endswith("/messages")
            data = ANTHROPIC_429 if anthropic else OPENAI_429
            extra = ANTHROPIC_429_HEADERS if anthropic else OPENAI_429_HEADERS
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(data)).encode()),
                        *extra,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        if fault == "garble":
            old = headers.get("x-garble", "").encode()
            new = headers.get("x-garble-with", "").encode()
            garbled = False

            async def garbling(message: MutableMapping[str, Any]) -> None:
                nonlocal garbled
                body = message.get("body", b"")
                if message["type"] == "http.response.body" and not garbled and old in body:
                    garbled = True
                    message = {**message, "body": body.replace(old, new, 1)}
                await send(message)

            await self.app(scope, receive, garbling)
            return
        if fault not in ("cut", "reset"):
            await self.app(scope, receive, send)
            return
        marker = headers.get("x-cut-after", "").encode()
        done = False

        async def cutting(message: MutableMapping[str, Any]) -> None:
            nonlocal done
            if done:
                return  # what the upstream would have sent next never leaves
            if message["type"] == "http.response.body" and marker and marker in message["body"]:
                done = True
                self.cuts += 1
                if fault == "reset":
                    await send({**message, "more_body": True})
                    raise _Cut  # uvicorn drops the connection: no terminating chunk
                await send({**message, "more_body": False})
                return
            await send(message)

        try:
            await self.app(scope, receive, cutting)
        except _Cut:
            raise RuntimeError("the upstream's connection dropped (on purpose)") from None


class Records:
    """The records of the runs ``run_stopped`` reports while connected."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, sender: Any, **kw: Any) -> None:
        with self._lock:
            self.got.append(kw["record"])

    def connect(self) -> None:
        signals.run_stopped.connect(self, weak=False)

    def disconnect(self) -> None:
        signals.run_stopped.disconnect(self)

    def of(self, user: str, n: int = 1, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """The first ``n`` records of the runs of ``user`` (``meta.user``), polled for at
        most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                mine = [r for r in self.got if (r.get("meta") or {}).get("user") == user]
            if len(mine) >= n:
                return mine
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(mine)} of {n} records of {user!r} in {timeout_s}s")
            time.sleep(0.02)

    def one(self, user: str) -> dict[str, Any]:
        return self.of(user)[-1]


def summary(rec: dict[str, Any]) -> tuple[Any, ...]:
    """What a run did and what was decided about it, wire aside."""
    warned = [(w["step"], w["plugin"]) for w in rec["warnings"]]
    return rec["termination"], rec["stopped_by"], rec["steps"], rec["tool_calls"], warned


# -- raw event streams ----------------------------------------------------------------------


def sse_events(raw: bytes) -> list[tuple[str | None, Any]]:
    """A raw event stream as (event name, data parsed as JSON, else the text)."""
    out: list[tuple[str | None, Any]] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        name: str | None = None
        data: list[str] = []
        for line in block.decode().split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        text = "\n".join(data)
        try:
            out.append((name, json.loads(text)))
        except ValueError:
            out.append((name, text))
    return out


def responses_from_sse(raw: bytes) -> dict[str, Any]:
    """The completed response a Responses stream ends with."""
    done = [d for n, d in sse_events(raw) if isinstance(d, dict) and d.get("type") == n]
    final = [d["response"] for d in done if d["type"] == "response.completed"]
    assert final, f"no response.completed in {raw[-400:]!r}"
    return dict(final[-1])


def message_from_sse(raw: bytes) -> dict[str, Any]:
    """The message a Messages stream carries, assembled from its events."""
    msg: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for name, d in sse_events(raw):
        if name == "message_start":
            msg = dict(d["message"])
        elif name == "content_block_start":
            blocks[d["index"]] = dict(d["content_block"])
        elif name == "content_block_delta":
            delta = d["delta"]
            if delta["type"] == "text_delta":
                blocks[d["index"]]["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[d["index"]] = partial.get(d["index"], "") + delta["partial_json"]
        elif name == "message_delta":
            msg.update(d["delta"])
    for i, text in partial.items():
        blocks[i]["input"] = json.loads(text or "{}")
    msg["content"] = [b for _, b in sorted(blocks.items())]
    return msg
