"""HTTP client hooks that bound one model call: its total time and its decoded size.

httpx's timeouts are per phase -- connect, and *each* read -- so a body that drips one byte a
second never trips them, and nothing caps how much a body (or a gzip bomb, once inflated) may
grow.  These ``event_hooks`` (public httpx API, so proxies from the environment still apply)
lower every phase's timeout to the time left and read the response body through a stream that

* fails with :class:`CallDeadline` (a read timeout) once the call's deadline has passed;
* decodes ``gzip`` / ``deflate`` itself, in pieces, and fails with :class:`ResponseTooLarge`
  as soon as the decoded body passes ``max_bytes`` (other encodings are refused: the request
  only offers these two).

The bounds of the call in progress travel in a context variable (:func:`bounded`), so one
client serves many concurrent calls, each with its own deadline.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx2

__all__ = [
    "CallBounds",
    "CallDeadline",
    "ResponseTooLarge",
    "async_event_hooks",
    "bounded",
    "event_hooks",
]

ACCEPT_ENCODING = "gzip, deflate"


@dataclass(frozen=True, slots=True)
class CallBounds:
    """One call's bounds: a deadline on ``time.monotonic()`` (``seconds`` after its start)
    and a decoded-size cap."""

    deadline: float
    max_bytes: int
    seconds: float = float("inf")

    def left(self) -> float:
        return self.deadline - time.monotonic()


_BOUNDS: ContextVar[CallBounds | None] = ContextVar("loopwarden_model_call", default=None)


@contextmanager
def bounded(bounds: CallBounds) -> Iterator[None]:
    """HTTP requests made in this block (this thread / task) are held to ``bounds``."""
    token = _BOUNDS.set(bounds)
    try:
        yield
    finally:
        _BOUNDS.reset(token)


class CallDeadline(httpx2.ReadTimeout):
    """The model call's total deadline passed while the response was still arriving."""


class ResponseTooLarge(httpx2.DecodingError):
    """The response body (decoded) is larger than ``[model] max_response_bytes``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"the response body is larger than {limit} bytes ([model] max_response_bytes)"
        )


def _prepare(request: httpx2.Request, bounds: CallBounds) -> None:
    left = bounds.left()
    if left <= 0:
        raise CallDeadline("the model call's deadline passed before the request", request=request)
    request.headers["accept-encoding"] = ACCEPT_ENCODING
    if left == float("inf"):
        return
    timeouts = dict(request.extensions.get("timeout") or {})
    for phase in ("connect", "read", "write", "pool"):
        t = timeouts.get(phase)
        timeouts[phase] = left if t is None else min(t, left)
    request.extensions["timeout"] = timeouts


class _Body:
    """Deadline, decoding and size accounting shared by the sync and async streams."""

    def __init__(self, bounds: CallBounds, encoding: str, request: httpx2.Request) -> None:
        self.bounds = bounds
        self.request = request
        self.size = 0
        if encoding in ("gzip", "x-gzip"):
            self.inflate: Any = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self.inflate = zlib.decompressobj()
        else:
            self.inflate = None

    def take(self, chunk: bytes) -> bytes:
        if self.bounds.left() <= 0:
            raise CallDeadline(
                "the model call's deadline passed while reading the response", request=self.request
            )
        if self.inflate is None:
            return self._count(chunk)
        out = []
        data = chunk
        while data:
            try:
                piece = self.inflate.decompress(data, self.bounds.max_bytes - self.size + 1)
            except zlib.error as exc:
                raise httpx2.DecodingError(
                    f"invalid compressed body: {exc}", request=self.request
                ) from None
            out.append(self._count(piece))
            data = self.inflate.unconsumed_tail
        return b"".join(out)

    def end(self) -> bytes:
        if self.inflate is None:
            return b""
        return self._count(self.inflate.flush())

    def _count(self, piece: bytes) -> bytes:
        self.size += len(piece)
        if self.size > self.bounds.max_bytes:
            raise ResponseTooLarge(self.bounds.max_bytes)
        return piece


def _bounds(max_bytes: int) -> CallBounds:
    return _BOUNDS.get() or CallBounds(float("inf"), max_bytes)


def _wrap(response: httpx2.Response, max_bytes: int, sync: bool) -> None:
    """Read ``response``'s body through a bounded stream; take over its decoding."""
    request = response.request
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
        raise httpx2.DecodingError(f"unsupported content-encoding {encoding!r}", request=request)
    if encoding not in ("identity", ""):
        del response.headers["content-encoding"]  # decoded here, not again by httpx
        response.headers.pop("content-length", None)
    body = _Body(_bounds(max_bytes), encoding, request)
    inner = response.stream
    response.stream = _SyncStream(inner, body) if sync else _AsyncStream(inner, body)


class _SyncStream(httpx2.SyncByteStream):
    def __init__(self, inner: Any, body: _Body) -> None:
        self._inner, self._body = inner, body

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            out = self._body.take(chunk)
            if out:
                yield out
        tail = self._body.end()
        if tail:
            yield tail

    def close(self) -> None:
        self._inner.close()


class _AsyncStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, body: _Body) -> None:
        self._inner, self._body = inner, body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            out = self._body.take(chunk)
            if out:
                yield out
        tail = self._body.end()
        if tail:
            yield tail

    async def aclose(self) -> None:
        await self._inner.aclose()


def event_hooks(max_bytes: int) -> dict[str, list[Callable[..., Any]]]:
    """``event_hooks`` for an ``httpx2.Client`` that hold each request to its call's bounds."""

    def on_request(request: httpx2.Request) -> None:
        _prepare(request, _bounds(max_bytes))

    def on_response(response: httpx2.Response) -> None:
        _wrap(response, max_bytes, sync=True)

    return {"request": [on_request], "response": [on_response]}


def async_event_hooks(max_bytes: int) -> dict[str, list[Callable[..., Any]]]:
    """``event_hooks`` for an ``httpx2.AsyncClient`` (see :func:`event_hooks`)."""

    async def on_request(request: httpx2.Request) -> None:
        _prepare(request, _bounds(max_bytes))

    async def on_response(response: httpx2.Response) -> None:
        _wrap(response, max_bytes, sync=False)

    return {"request": [on_request], "response": [on_response]}
