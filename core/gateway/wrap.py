"""``loopwarden.wrap(OpenAI())``: the gateway's judgement inside the client's own process.

:func:`wrap` returns a copy of an ``openai`` client (``OpenAI`` or ``AsyncOpenAI``) whose HTTP
transport runs every request through a :class:`~loopwarden.gateway.app.GatewayApp` in process
before the client's own transport sends it on: chat completions are judged -- JSON and
streamed, whichever call surface made them (``chat.completions.create``, ``.stream``,
``with_raw_response``, ``beta`` helpers) -- and every other request passes untouched.  The
same config, plugins, records and signals as the gateway; conversations are kept in this
process (``state="memory"``, the default) or in the shared store (``state="store"``).

A stop reaches the code as the gateway's answer does: an ordinary completion it can finish on,
with ``x-loopwarden-stop`` among the raw response's headers (or, with ``[gateway] stop_mode =
"error"``, a ``BadRequestError`` the SDK does not retry).

``with loopwarden.run("ticket-4711"):`` names the run of the requests made inside the block
(the ``x-loopwarden-run`` header); without it, the run is found as the gateway finds it.

How: the app is an ASGI application; a small bridge here calls it with the request and
streams its answer back as an ``httpx`` response.  For a sync client the app runs on one
private event-loop thread per wrapped client, and the client's own transport is called from
a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment
    from loopwarden.gateway.app import GatewayApp

__all__ = ["run", "wrap"]

C = TypeVar("C")

#: the run named by :func:`run` for the requests made in its block
_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("loopwarden_run", default=None)


@contextlib.contextmanager
def run(run_id: str) -> Iterator[str]:
    """Name the run (the conversation) of the wrapped clients' requests in this block."""
    token = _RUN.set(str(run_id))
    try:
        yield str(run_id)
    finally:
        _RUN.reset(token)


def wrap(
    client: C,
    deployment: Deployment | None = None,
    *,
    config: str | None = None,
    state: str = "memory",
) -> C:
    """A copy of ``client`` (``openai.OpenAI`` / ``AsyncOpenAI``) whose chat completions are
    judged by ``deployment`` (default: one built from ``config``, else the usual config
    lookup).  See the module doc."""
    from loopwarden.deployment import Deployment
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.state import open_state

    dep = deployment if deployment is not None else Deployment.from_config(config)
    inner_http = getattr(client, "_client", None)
    base = getattr(client, "base_url", None)
    if inner_http is None or base is None:
        kind = type(client).__name__
        raise TypeError(
            f"loopwarden.wrap() takes an openai.OpenAI or AsyncOpenAI client, not {kind}"
        )
    origin = f"{base.scheme}://{base.netloc.decode('ascii')}"
    inner = getattr(inner_http, "_transport", None)
    is_async = hasattr(inner_http, "aclose")  # httpx's AsyncClient, or the SDK's own kind
    store = open_state(dep.config.store, memory=state == "memory")
    timeout = httpx.Timeout(dep.config.gateway.upstream_timeout_s, connect=10.0)
    if is_async:
        upstream = httpx.AsyncClient(
            transport=inner if isinstance(inner, httpx.AsyncBaseTransport) else None,
            timeout=timeout,
        )
        app = GatewayApp(dep, origin, store, client=upstream)
        http: Any = httpx.AsyncClient(transport=_AsyncBridge(app), timeout=timeout)
    else:
        sync_inner = inner if isinstance(inner, httpx.BaseTransport) else httpx.HTTPTransport()
        upstream = httpx.AsyncClient(transport=_ThreadedTransport(sync_inner), timeout=timeout)
        app = GatewayApp(dep, origin, store, client=upstream)
        http = httpx.Client(transport=_SyncBridge(app), timeout=timeout)
    wrapped: C = client.with_options(http_client=http)  # type: ignore[attr-defined]
    return wrapped


# -- the bridge: an httpx request through the ASGI app ----------------------------------------


def _scope(request: httpx.Request) -> dict[str, Any]:
    headers = [(k.lower(), v) for k, v in request.headers.raw]
    named = _RUN.get()
    if named is not None:
        headers.append((b"x-loopwarden-run", named.encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.url.scheme,
        "path": request.url.path,
        "raw_path": request.url.raw_path,
        "query_string": request.url.query,
        "headers": headers,
        "server": (request.url.host, request.url.port),
        "client": ("127.0.0.1", 0),
    }


async def _call_app(
    app: GatewayApp, request: httpx.Request, body: bytes, out: Any, put: Any
) -> None:
    """Run ``app`` on one request; ``put`` receives ("start", status, headers), ("body",
    bytes) ... and ("end", None)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # no disconnect until the caller closes the stream
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            await put(("start", message["status"], message.get("headers", [])))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                await put(("body", message["body"]))
            if not message.get("more_body"):
                await put(("end", None))

    try:
        await app(_scope(request), receive, send)
    except BaseException as exc:  # surfaces in the caller's thread
        await put(("error", exc))
        raise


class _AsyncBody(httpx.AsyncByteStream):
    def __init__(self, q: asyncio.Queue[Any], task: asyncio.Task[None]) -> None:
        self._q = q
        self._task = task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._q.get()
            if item[0] == "body":
                yield item[1]
            elif item[0] == "error":
                raise httpx.ReadError(str(item[1]))
            else:
                return

    async def aclose(self) -> None:
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class _AsyncBridge(httpx.AsyncBaseTransport):
    def __init__(self, app: GatewayApp) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        q: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(_call_app(self.app, request, body, None, q.put))
        first = await q.get()
        if first[0] == "error":
            raise httpx.ConnectError(f"loopwarden: {first[1]}", request=request)
        _, status, headers = first
        return httpx.Response(status, headers=headers, stream=_AsyncBody(q, task), request=request)

    async def aclose(self) -> None:
        await self.app.aclose()


class _SyncBody(httpx.SyncByteStream):
    def __init__(self, q: queue.Queue[Any], fut: Any) -> None:
        self._q = q
        self._fut = fut

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._q.get()
            if item[0] == "body":
                yield item[1]
            elif item[0] == "error":
                raise httpx.ReadError(str(item[1]))
            else:
                return

    def close(self) -> None:
        if not self._fut.done():
            self._fut.cancel()


class _SyncBridge(httpx.BaseTransport):
    """The app on a private event loop thread (one per wrapped sync client)."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="loopwarden-wrap", daemon=True
        )
        self._thread.start()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        q: queue.Queue[Any] = queue.Queue()

        async def put(item: Any) -> None:
            q.put(item)

        ctx = contextvars.copy_context()  # the caller's loopwarden.run() name travels along
        fut = ctx.run(
            asyncio.run_coroutine_threadsafe,
            _call_app(self.app, request, body, None, put),
            self._loop,
        )
        first = q.get()
        if first[0] == "error":
            raise httpx.ConnectError(f"loopwarden: {first[1]}", request=request)
        _, status, headers = first
        return httpx.Response(status, headers=headers, stream=_SyncBody(q, fut), request=request)

    def close(self) -> None:
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self.app.aclose(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)


class _ThreadedBody(httpx.AsyncByteStream):
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._it = resp.stream.__iter__()  # type: ignore[union-attr]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        end = object()
        while True:
            part = await asyncio.to_thread(next, self._it, end)
            if part is end:
                return
            yield part  # type: ignore[misc]

    async def aclose(self) -> None:
        await asyncio.to_thread(self._resp.close)


class _ThreadedTransport(httpx.AsyncBaseTransport):
    """A sync client's own transport, called from a worker thread by the app's loop."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        ext = dict(request.extensions)
        if isinstance(ext.get("timeout"), httpx.Timeout):
            ext["timeout"] = ext["timeout"].as_dict()
        sync_req = httpx.Request(
            request.method, request.url, headers=request.headers, content=body, extensions=ext
        )
        resp = await asyncio.to_thread(self.inner.handle_request, sync_req)
        return httpx.Response(
            resp.status_code,
            headers=resp.headers,
            stream=_ThreadedBody(resp),
            request=request,
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        await asyncio.to_thread(self.inner.close)
