"""``loopwarden.wrap(client)``: the gateway's judgement inside the client's own process.

:func:`wrap` returns a copy of an ``openai`` client (``OpenAI`` / ``AsyncOpenAI``) or an
``anthropic`` client (``Anthropic`` / ``AsyncAnthropic``) whose HTTP transport runs every
request through a :class:`~loopwarden.gateway.app.GatewayApp` in process before the client's
own transport sends it on: chat completions, the Responses API and Anthropic Messages are
judged -- JSON and streamed, whichever call surface made them (``create``, ``.stream``,
``with_raw_response``) -- and every other request passes untouched.  The same config,
plugins, records and signals as the gateway; conversations are kept in this process
(``state="memory"``, the default) or in the shared store (``state="store"``).

A stop reaches the code as the gateway's answer does: an ordinary answer it can finish on,
with ``x-loopwarden-stop`` among the raw response's headers (or, with ``[gateway] stop_mode =
"error"``, a ``BadRequestError`` the SDK does not retry).

``with loopwarden.run("ticket-4711"):`` names the run of the requests made inside the block
(the ``x-loopwarden-run`` header); without it, the run is found as the gateway finds it.

How: the app is an ASGI application; a small bridge here calls it with the request and
streams its answer back as a response of the client's own HTTP library (``httpx``, or the
``httpx2`` the newer SDKs ship).  For a sync client the app runs on one private event-loop
thread per wrapped client, and the client's own transport is called from a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the gateway extra is missing
    raise ImportError(
        "loopwarden.wrap needs the gateway extra: pip install 'loopwarden[gateway]'"
    ) from exc

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
    """A copy of ``client`` (an ``openai`` or ``anthropic`` client, sync or async) whose
    requests are judged by ``deployment`` (default: one built from ``config``, else the
    usual config lookup).  See the module doc."""
    from loopwarden.deployment import Deployment
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.state import open_state

    inner_http = getattr(client, "_client", None)
    base = getattr(client, "base_url", None)
    if inner_http is None or base is None or not hasattr(client, "with_options"):
        kind = type(client).__name__
        raise TypeError(
            f"loopwarden.wrap() takes an openai or anthropic client (OpenAI, AsyncOpenAI, "
            f"Anthropic, AsyncAnthropic), not {kind}"
        )
    dep = deployment if deployment is not None else Deployment.from_config(config)
    # the client's HTTP library: httpx, or the httpx2 fork the newer SDKs take
    hx = _library(inner_http)
    origin = f"{base.scheme}://{base.netloc.decode('ascii')}"
    inner = getattr(inner_http, "_transport", None)
    is_async = hasattr(inner_http, "aclose")
    store = open_state(dep.config.store, memory=state == "memory")
    timeout = httpx.Timeout(dep.config.gateway.upstream_timeout_s, connect=10.0)
    # the same timeout in the client's own library (httpx2 2.17 takes no dict any more)
    own_timeout = hx.Timeout(dep.config.gateway.upstream_timeout_s, connect=10.0)
    bridges = _bridges(hx)
    if is_async:
        own = inner if isinstance(inner, hx.AsyncBaseTransport) else hx.AsyncHTTPTransport()
        upstream = httpx.AsyncClient(transport=_ForeignAsync(own, hx), timeout=timeout)
        app = GatewayApp(dep, origin, store, client=upstream, front="wrap")
        http: Any = hx.AsyncClient(transport=bridges[1](app), timeout=own_timeout)
    else:
        sync_inner = inner if isinstance(inner, hx.BaseTransport) else hx.HTTPTransport()
        upstream = httpx.AsyncClient(transport=_ForeignThreaded(sync_inner, hx), timeout=timeout)
        app = GatewayApp(dep, origin, store, client=upstream, front="wrap")
        http = hx.Client(transport=bridges[0](app), timeout=own_timeout)
    wrapped: C = client.with_options(http_client=http)
    return wrapped


def _library(http_client: Any) -> ModuleType:
    """The HTTP library of an SDK's client (its class derives from the library's)."""
    for cls in type(http_client).__mro__:
        top = cls.__module__.split(".")[0]
        if top in ("httpx", "httpx2"):
            return importlib.import_module(top)
    raise TypeError(
        f"loopwarden.wrap(): the client's HTTP client {type(http_client).__name__} "
        "is neither httpx's nor httpx2's"
    )


# -- the bridge: a client's request through the ASGI app ---------------------------------------


def _scope(request: Any) -> dict[str, Any]:
    headers = [(k.lower(), v) for k, v in request.headers.raw]
    named = _RUN.get()
    if named is not None:
        headers.append((b"x-loopwarden-run", named.encode()))
    url = request.url
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": url.scheme,
        "path": url.path,
        "raw_path": url.raw_path,
        "query_string": url.query,
        "headers": headers,
        "server": (url.host, url.port),
        "client": ("127.0.0.1", 0),
    }


async def _call_app(app: GatewayApp, scope: dict[str, Any], body: bytes, put: Any) -> None:
    """Run ``app`` on one request; ``put`` receives ("start", status, headers), ("body",
    bytes) ... and ("end", None) -- or ("error", exception)."""
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
        await app(scope, receive, send)
    except BaseException as exc:  # surfaces in the caller's thread
        await put(("error", exc))
        raise


_BRIDGES: dict[str, tuple[type, type]] = {}


def _bridges(hx: ModuleType) -> tuple[type, type]:
    """The sync and async bridge transports for the HTTP library ``hx`` (built once)."""
    made = _BRIDGES.get(hx.__name__)
    if made is not None:
        return made

    class SyncBody(hx.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, q: queue.Queue[Any], fut: Any) -> None:
            self._q = q
            self._fut = fut

        def __iter__(self) -> Iterator[bytes]:
            while True:
                item = self._q.get()
                if item[0] == "body":
                    yield item[1]
                elif item[0] == "error":
                    raise hx.ReadError(str(item[1]))
                else:
                    return

        def close(self) -> None:
            if not self._fut.done():
                self._fut.cancel()

    class SyncBridge(hx.BaseTransport):  # type: ignore[name-defined,misc]
        """The app on a private event loop thread (one per wrapped sync client)."""

        def __init__(self, app: GatewayApp) -> None:
            self.app = app
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="loopwarden-wrap", daemon=True
            )
            self._thread.start()

        def handle_request(self, request: Any) -> Any:
            body = request.read()
            q: queue.Queue[Any] = queue.Queue()

            async def put(item: Any) -> None:
                q.put(item)

            coro = _call_app(self.app, _scope(request), body, put)  # the caller's run name
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
            first = q.get()
            if first[0] == "error":
                raise hx.ConnectError(f"loopwarden: {first[1]}", request=request)
            _, status, headers = first
            return hx.Response(status, headers=headers, stream=SyncBody(q, fut), request=request)

        def close(self) -> None:
            if self._loop.is_running():
                asyncio.run_coroutine_threadsafe(self.app.aclose(), self._loop).result(10)
                self._loop.call_soon_threadsafe(self._loop.stop)

    class AsyncBody(hx.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, q: asyncio.Queue[Any], task: asyncio.Task[None]) -> None:
            self._q = q
            self._task = task

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while True:
                item = await self._q.get()
                if item[0] == "body":
                    yield item[1]
                elif item[0] == "error":
                    raise hx.ReadError(str(item[1]))
                else:
                    return

        async def aclose(self) -> None:
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task

    class AsyncBridge(hx.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        def __init__(self, app: GatewayApp) -> None:
            self.app = app

        async def handle_async_request(self, request: Any) -> Any:
            body = await request.aread()
            q: asyncio.Queue[Any] = asyncio.Queue()
            task = asyncio.ensure_future(_call_app(self.app, _scope(request), body, q.put))
            first = await q.get()
            if first[0] == "error":
                raise hx.ConnectError(f"loopwarden: {first[1]}", request=request)
            _, status, headers = first
            return hx.Response(status, headers=headers, stream=AsyncBody(q, task), request=request)

        async def aclose(self) -> None:
            await self.app.aclose()

    made = _BRIDGES[hx.__name__] = (SyncBridge, AsyncBridge)
    return made


# -- the client's own transport, under the app's httpx client ---------------------------------


def _foreign_request(request: httpx.Request, body: bytes, hx: ModuleType) -> Any:
    ext = dict(request.extensions)
    if isinstance(ext.get("timeout"), httpx.Timeout):
        ext["timeout"] = ext["timeout"].as_dict()
    return hx.Request(
        request.method, str(request.url), headers=request.headers.raw, content=body, extensions=ext
    )


class _ThreadedBody(httpx.AsyncByteStream):
    def __init__(self, resp: Any) -> None:
        self._resp = resp
        self._it = iter(resp.stream)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        end = object()
        while True:
            part = await asyncio.to_thread(next, self._it, end)
            if part is end:
                return
            yield part  # type: ignore[misc]

    async def aclose(self) -> None:
        await asyncio.to_thread(self._resp.close)


class _ForeignThreaded(httpx.AsyncBaseTransport):
    """A sync client's own transport (of its library), called from a worker thread."""

    def __init__(self, inner: Any, hx: ModuleType) -> None:
        self.inner = inner
        self.hx = hx

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        resp = await asyncio.to_thread(
            self.inner.handle_request, _foreign_request(request, body, self.hx)
        )
        return httpx.Response(
            resp.status_code,
            headers=resp.headers.raw,
            stream=_ThreadedBody(resp),
            request=request,
        )

    async def aclose(self) -> None:
        await asyncio.to_thread(self.inner.close)


class _ForeignBody(httpx.AsyncByteStream):
    def __init__(self, resp: Any) -> None:
        self._resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._resp.stream:
            yield part

    async def aclose(self) -> None:
        await self._resp.aclose()


class _ForeignAsync(httpx.AsyncBaseTransport):
    """An async client's own transport (of its library)."""

    def __init__(self, inner: Any, hx: ModuleType) -> None:
        self.inner = inner
        self.hx = hx

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        resp = await self.inner.handle_async_request(_foreign_request(request, body, self.hx))
        return httpx.Response(
            resp.status_code, headers=resp.headers.raw, stream=_ForeignBody(resp), request=request
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
