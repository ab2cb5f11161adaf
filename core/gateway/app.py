"""The gateway's HTTP face: an ASGI application in front of an OpenAI-compatible upstream.

``POST .../chat/completions``, ``.../responses`` and ``.../messages`` (Anthropic) are judged
(:mod:`loopwarden.gateway.exchange`), JSON and streamed, each read and written by its wire's
codec (:mod:`loopwarden.gateway.wires`); every other path is forwarded untouched, streamed
through as it arrives.  The upstream's own answers -- a 429 with its ``retry-after``, a 5xx,
an error body -- reach the client as the upstream gave them; what the gateway itself answers
is always a JSON error in the wire's shape (OpenAI's, or Anthropic's on ``/messages``) with a
clear code, never a traceback: 400 (malformed JSON, a request the wire cannot read), 401 (a
missing gateway key), 413 (a body over ``max_body_bytes``), 502 (an upstream that answered no
completion, or could not be reached), 504 (an upstream that took longer than
``upstream_timeout_s``), 503 (the shared store is down under ``on_store_error =
"fail_closed"``).

Served by any ASGI server; ``loopwarden gateway`` runs it under uvicorn
(:mod:`loopwarden.gateway.serve`).  The upstream client is httpx's, one connection pool per
application.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the gateway extra is missing
    raise ImportError(
        "loopwarden gateway needs the gateway extra: pip install 'loopwarden[gateway]'"
    ) from exc

from loopwarden.exceptions import StoreError
from loopwarden.gateway import chat
from loopwarden.gateway.chat import json_bytes
from loopwarden.gateway.exchange import Deliver, Exchange, Forward, Gate
from loopwarden.gateway.wires import Wire, wire_for

if TYPE_CHECKING:
    from loopwarden.console.asgi import ConsoleASGI
    from loopwarden.deployment import Deployment
    from loopwarden.gateway.state import StateStore

__all__ = ["GatewayApp"]

log = logging.getLogger("loopwarden.gateway")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: request headers never passed upstream: hop-by-hop, the body's framing (recomputed), the
#: encoding (the gateway reads answers: identity), and the gateway's own
_DROP_REQUEST = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "accept-encoding",
        "proxy-authorization",
    }
)
#: response headers never passed back: hop-by-hop, the framing, and the ones the gateway's own
#: server writes (uvicorn's date and server: passed on as well, a client would get two)
_DROP_RESPONSE = frozenset(
    {
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-encoding",
        "date",
        "server",
    }
)


#: the end of a stream the gateway failed on after its headers went out
_STREAM_FAILED = chat.sse(
    {
        "error": {
            "message": "the gateway failed on this request; see its log",
            "type": "api_error",
            "code": "gateway_error",
        }
    }
)


class _Sent:
    """The ASGI ``send``, noting whether the response has started (a second
    ``http.response.start`` would break the protocol)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self.send(message)


class _Disconnected(Exception):
    """The client went away."""


class GatewayApp:
    """The ASGI application: one deployment, one upstream."""

    def __init__(
        self,
        deployment: Deployment,
        upstream: str,
        state: StateStore,
        *,
        client: httpx.AsyncClient | None = None,
        front: str = "gateway",
    ) -> None:
        self.deployment = deployment
        self.settings = deployment.config.gateway
        self.upstream = upstream.rstrip("/")
        #: a wire's own upstream (``[gateway.upstreams]``: Anthropic Messages to Anthropic)
        self.upstreams: dict[str, str] = {
            str(k): v.rstrip("/") for k, v in self.settings.upstreams.items()
        }
        self.gate = Gate(deployment, state, self.settings, front=front)
        self._client = client
        #: judged JSON calls go through aiohttp (its C parser and pool: about 0.2 ms of CPU a
        #: call against httpx's 1.1 ms, bench/gateway.py), unless a client was handed in (the
        #: wrapper's: the SDK's own transport)
        self._session: Any = None if client is None else False
        self.keys = frozenset(_expand(k) for k in self.settings.keys if _expand(k))
        #: ``[gateway] console = true``: the console at /console/ (its own access rule)
        self.console: ConsoleASGI | None = None
        if self.settings.console:
            from loopwarden.console.asgi import ConsoleASGI

            self.console = ConsoleASGI.from_config(deployment.config)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.settings.upstream_timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
            )
        return self._client

    async def _post(
        self, url: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, httpx.Headers, bytes]:
        """POST upstream: (status, headers, body), whichever client sends it; a timeout or
        a failed connection raise httpx's exceptions either way."""
        if self._session is False:
            resp = await self.client.post(url, headers=headers, content=body)
            return resp.status_code, resp.headers, resp.content
        try:
            import aiohttp
        except ImportError:  # the gateway extra brings it; without it, httpx
            self._session = False
            return await self._post(url, headers, body)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000),
                timeout=aiohttp.ClientTimeout(
                    total=self.settings.upstream_timeout_s, sock_connect=10.0
                ),
                skip_auto_headers=("User-Agent",),
            )
        try:
            async with self._session.post(url, data=body, headers=headers) as r:
                return r.status, httpx.Headers(list(r.headers.items())), await r.read()
        except TimeoutError as exc:
            raise httpx.TimeoutException(str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise httpx.TransportError(type(exc).__name__) from exc

    async def aclose(self) -> None:
        if self._session:
            await self._session.close()
            self._session = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self.gate.state.close()
        if self.console is not None:
            self.console.close()

    # -- ASGI -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        t0 = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        send = sent = _Sent(send)
        wire: Wire | None = None
        try:
            if path == "/_loopwarden/health":
                await _respond(send, 200, b'{"ok":true}', {})
                return
            if self.console is not None and self.console.serves(path):
                await self.console(scope, receive, send)
                return
            if self.keys and not self._authorised(headers):
                await _error(send, 401, "invalid_gateway_key", "a valid gateway key is required")
                return
            wire = wire_for(path) if scope["method"] == "POST" else None
            if wire is not None:
                await self._judged(wire, scope, headers, receive, send, t0)
            else:
                await self._proxy(scope, headers, receive, send)
        except _Disconnected:
            return
        except Exception:  # never a traceback to the client; the log has it
            log.exception("gateway: internal error on %s %s", scope["method"], path)
            if sent.started:  # a stream under way: end it with an error event, not a 2nd start
                failed = (
                    _STREAM_FAILED
                    if wire is None
                    else wire.stream_error(
                        "gateway_error",
                        "the gateway failed on this request; see its log",
                        "api_error",
                    )
                )
                with contextlib.suppress(Exception):
                    await _body(send, failed, more=False)
                return
            await _error(
                send,
                500,
                "gateway_error",
                "the gateway failed on this request; see its log",
                retry=False,
            )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _authorised(self, headers: Mapping[str, str]) -> bool:
        key = headers.get("x-loopwarden-key")
        if key is None and not self.settings.forward_key:
            auth = headers.get("authorization", "")
            key = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key")
        return key is not None and key in self.keys

    def _url(self, scope: Scope, wire: Wire | None = None) -> str:
        """The upstream URL of a request: its wire's upstream (``[gateway.upstreams]``),
        else ``upstream``, with the request's path (``/v1`` once) and query."""
        base = self.upstreams.get(wire.name, self.upstream) if wire is not None else self.upstream
        path: str = scope["path"]
        if path.startswith("/v1/") and base.endswith("/v1"):
            path = path[3:]
        query = scope.get("query_string") or b""
        return base + path + ("?" + query.decode("latin-1") if query else "")

    def _upstream_headers(
        self, headers: Mapping[str, str], wire: Wire | None = None
    ) -> dict[str, str]:
        out = {
            k: v
            for k, v in headers.items()
            if k not in _DROP_REQUEST and not k.startswith("x-loopwarden-")
        }
        if not self.settings.forward_key:
            out.pop("x-api-key", None)
            out.pop("authorization", None)
            envs = {str(k): v for k, v in self.settings.upstream_key_envs.items()}
            env = envs.get(wire.name) if wire is not None else None
            key = os.environ.get(env or self.settings.upstream_key_env)
            if key:
                # Anthropic's API takes its key in x-api-key; the others a bearer token
                if wire is not None and wire.name == "messages":
                    out["x-api-key"] = key
                else:
                    out["authorization"] = "Bearer " + key
        return out

    # -- everything else: forwarded untouched ---------------------------------------------

    async def _proxy(
        self, scope: Scope, headers: Mapping[str, str], receive: Receive, send: Send
    ) -> None:
        body = await _read_body(receive, self.settings.max_body_bytes)
        req = self.client.build_request(
            scope["method"], self._url(scope), headers=self._upstream_headers(headers), content=body
        )
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.TimeoutException:
            await _error(send, 504, "upstream_timeout", "the upstream did not answer in time")
            return
        except httpx.HTTPError as exc:
            await _error(send, 502, "upstream_unreachable", f"the upstream: {type(exc).__name__}")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status_code,
                    "headers": _pass_headers(resp.headers),
                }
            )
            async for part in resp.aiter_raw():
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()

    # -- the judged wires: chat completions, responses, messages --------------------------

    async def _judged(
        self,
        wire: Wire,
        scope: Scope,
        headers: Mapping[str, str],
        receive: Receive,
        send: Send,
        t0: float,
    ) -> None:
        settings = self.settings
        try:
            raw = await _read_body(receive, settings.max_body_bytes)
            req = wire.parse_request(raw, settings.max_body_bytes)
        except chat.WireError as exc:
            await _error(send, exc.status, exc.code, exc.message, wire=wire)
            return
        url = self._url(scope, wire)
        up_headers = self._upstream_headers(headers, wire)
        ex = self.gate.exchange(req, headers, wire=wire)
        try:
            step = ex.start()
        except StoreError as exc:
            if self.deployment.config.store.on_store_error == "fail_open":
                log.warning("gateway: store unavailable, forwarding unjudged: %s", exc)
                await self._proxy_body(url, up_headers, raw, send, wire)
                return
            await _error(
                send, 503, "store_unavailable", "the gateway's store is unavailable", wire=wire
            )
            return
        waited = 0.0
        last: tuple[dict[str, Any], bytes, httpx.Headers] | None = None
        try:
            if req.stream and isinstance(step, Forward) and not step.final and not step.followup:
                await _watching(
                    receive, self._stream(wire, ex, req, url, up_headers, step, send, t0), ex
                )
                return
            while isinstance(step, Forward):
                t1 = time.perf_counter()
                got = await self._call(
                    wire, url, up_headers, wire.unstreamed(step.body) if req.stream else step.body
                )
                waited += time.perf_counter() - t1
                if isinstance(got, _Upstream):
                    ex.upstream_failed(got.why)
                    await got.respond(send)
                    return
                last = got
                step = ex.answer(wire.parse_response(got[0]))
            # saved before the answer goes out: the client's next request may reach another
            # worker or process at once, which must find this step's state there
            ex.close()
            # the gateway's own time, the save included (the upstream's wait left out)
            overhead = (time.perf_counter() - t0 - waited) * 1000
            await self._deliver(wire, ex, req, step, send, overhead, last)
        except chat.WireError as exc:
            ex.upstream_failed(exc.message)
            await _error(send, exc.status, exc.code, exc.message, wire=wire)
        finally:
            ex.close()

    async def _call(
        self, wire: Wire, url: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[dict[str, Any], bytes, httpx.Headers] | _Upstream:
        def failed(status: int, code: str, message: str, why: str) -> _Upstream:
            return _Upstream(status, wire.error_body(code, message, "api_error"), {}, why)

        try:
            status, resp_headers, content = await self._post(url, headers, body)
        except httpx.TimeoutException:
            return failed(504, "upstream_timeout", "the upstream did not answer in time", "timeout")
        except httpx.HTTPError as exc:
            name = type(exc).__name__
            return failed(502, "upstream_unreachable", f"the upstream: {name}", name)
        if status != 200:
            return _Upstream(status, content, resp_headers, f"HTTP {status}", passthrough=True)
        try:
            data = json.loads(content)
        except ValueError:
            return failed(
                502, "bad_upstream", "the upstream answered something other than JSON", "non-JSON"
            )
        if not isinstance(data, dict):
            return failed(
                502,
                "bad_upstream",
                "the upstream answered something other than an object",
                "non-object answer",
            )
        return data, content, resp_headers

    async def _proxy_body(
        self, url: str, headers: Mapping[str, str], body: bytes, send: Send, wire: Wire
    ) -> None:
        try:
            resp = await self.client.post(url, headers=headers, content=body)
        except httpx.HTTPError as exc:
            await _error(
                send, 502, "upstream_unreachable", f"the upstream: {type(exc).__name__}", wire=wire
            )
            return
        await _respond(
            send, resp.status_code, resp.content, _pass_headers(resp.headers), raw_headers=True
        )

    def _stop_headers(self, step: Deliver, overhead_ms: float | None) -> dict[str, str]:
        h: dict[str, str] = {}
        if step.run_id:
            h["x-loopwarden-run"] = step.run_id
        if step.stop is not None and step.stop["reason"] != "final_answer":
            h["x-loopwarden-stop"] = str(step.stop["reason"])
        if overhead_ms is not None and self.settings.overhead_header:
            h["x-loopwarden-overhead-ms"] = f"{overhead_ms:.3f}"
        return h

    async def _deliver(
        self,
        wire: Wire,
        ex: Exchange,
        req: chat.ChatRequest,
        step: Deliver,
        send: Send,
        overhead: float,
        last: tuple[dict[str, Any], bytes, httpx.Headers] | None,
    ) -> None:
        """A decided answer as JSON (or, for a streaming client answered without a streamed
        upstream call, as a whole stream)."""
        headers = self._stop_headers(step, overhead)
        reason = step.stop["reason"] if step.stop else "stop"
        if step.kind == "error":
            await _error(
                send,
                400,
                "loopwarden_stop",
                f"loopwarden stopped the run ({reason}): {step.text}",
                retry=False,
                extra=headers,
                kind="loopwarden_stop",
                wire=wire,
            )
            return
        message = step.message
        if step.kind == "pass" and last is not None:
            message = wire.message_of(last[0])
        if req.stream:  # answered without a streamed upstream call: the whole stream at once
            text = step.text if message is None else str(message.get("content") or "")
            calls = (message or {}).get("tool_calls") or None
            body = wire.stream_whole(req, text, step.finish_call, calls)
            ctype = {"content-type": "text/event-stream"}
            await _respond(send, 200, body, {**ctype, **headers})
            return
        # the upstream's answer passed on: with its own headers (request ids, rate-limit
        # counters, content type), as a streamed answer and any other path get them
        passed = (
            _pass_headers(last[2]) if last is not None else [(b"content-type", b"application/json")]
        )
        passed += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        if step.kind == "pass" and last is not None:
            await _respond(send, 200, last[1], passed, raw_headers=True)
            return
        if step.kind == "message" and step.message is not None and last is not None:
            data = wire.with_message(last[0], step.message)
            await _respond(send, 200, json_bytes(data), passed, raw_headers=True)
            return
        data = wire.answer_body(req, step.text, step.finish_call, step.answer_id)
        await _respond(
            send,
            200,
            json_bytes(data),
            {"content-type": "application/json", **headers},
        )

    async def _stream(
        self,
        wire: Wire,
        ex: Exchange,
        req: chat.ChatRequest,
        url: str,
        up_headers: Mapping[str, str],
        step: Forward,
        send: Send,
        t0: float,
    ) -> None:
        client = self.client
        try:
            resp = await client.send(
                client.build_request("POST", url, headers=up_headers, content=step.body),
                stream=True,
            )
        except asyncio.CancelledError:  # the client went away before the upstream answered
            _cancel(ex)
            raise
        except httpx.TimeoutException:
            ex.upstream_failed("timeout")
            await _error(
                send, 504, "upstream_timeout", "the upstream did not answer in time", wire=wire
            )
            return
        except httpx.HTTPError as exc:
            ex.upstream_failed(type(exc).__name__)
            await _error(
                send, 502, "upstream_unreachable", f"the upstream: {type(exc).__name__}", wire=wire
            )
            return
        try:
            if resp.status_code != 200:
                body = await resp.aread()
                ex.upstream_failed(f"HTTP {resp.status_code}")
                await _respond(
                    send, resp.status_code, body, _pass_headers(resp.headers), raw_headers=True
                )
                return
            ctype = resp.headers.get("content-type", "")
            if ctype and "event-stream" not in ctype.lower():
                # an HTML error page, or a JSON body for a streamed request: no stream to
                # pass on -- a defined 502, before a 200 with the wrong content type starts
                await resp.aread()
                ex.upstream_failed(f"not an event stream: {ctype}")
                await _error(
                    send,
                    502,
                    "bad_upstream",
                    f"the upstream answered a streamed request with {ctype[:80]!r}, not an "
                    "event stream",
                    kind="api_error",
                    wire=wire,
                )
                return
            overhead = (time.perf_counter() - t0) * 1000
            head: dict[str, str] = {}
            if self.settings.overhead_header:
                head["x-loopwarden-overhead-ms"] = f"{overhead:.3f}"
            if ex.run is not None:
                head["x-loopwarden-run"] = ex.run.run_id
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": _pass_headers(resp.headers)
                    + [(k.encode(), v.encode()) for k, v in head.items()],
                }
            )
            reader = chat.SSEReader()
            asm = wire.assembler()
            held: list[bytes] = []
            try:
                async for part in resp.aiter_raw():
                    for ev in reader.feed(part):
                        if asm.add(ev):
                            await _body(send, ev)
                        else:
                            held.append(ev)
            except chat.WireError as exc:  # an event the upstream garbled
                ex.upstream_failed(exc.message)
                await _body(send, wire.stream_error(exc.code, exc.message, "api_error", asm))
                await _body(send, b"", more=False)
                return
            except httpx.HTTPError as exc:
                ex.upstream_failed(f"stream cut: {type(exc).__name__}")
                await _body(
                    send,
                    wire.stream_error(
                        "upstream_stream_cut", "the upstream's stream was cut", "api_error", asm
                    ),
                )
                await _body(send, b"", more=False)
                return
            rest = reader.rest()
            if rest.strip():
                held.append(rest)
            if not asm.complete():
                ex.upstream_failed("stream ended without finish")
                await _body(
                    send,
                    wire.stream_error(
                        "upstream_stream_cut",
                        "the upstream's stream ended early",
                        "api_error",
                        asm,
                    ),
                )
                await _body(send, b"", more=False)
                return
            nxt = ex.answer(asm.response())
            again: dict[str, Any] | None = None
            while isinstance(nxt, Forward):
                got = await self._call(wire, url, up_headers, wire.unstreamed(nxt.body))
                if isinstance(got, _Upstream):
                    ex.upstream_failed(got.why)
                    nxt = Deliver("answer", text=ex.run.best_answer or "" if ex.run else "")
                    break
                again = got[0]
                nxt = ex.answer(wire.parse_response(again))
            if again is not None and nxt.kind == "pass":
                # what passed is the answer to the re-ask (a skipped call's), not the
                # stream's held calls: those were never to reach the client
                nxt = Deliver("message", message=wire.message_of(again), run_id=nxt.run_id)
            # saved before the stream's end goes out (see _judged): the client may send its
            # next request, to any worker, as soon as it reads the end
            ex.close()
            await self._stream_tail(wire, req, asm, held, nxt, send)
        except (_Disconnected, asyncio.CancelledError):
            _cancel(ex)
            raise
        finally:
            await resp.aclose()
            ex.close()

    async def _stream_tail(
        self,
        wire: Wire,
        req: chat.ChatRequest,
        asm: Any,
        held: list[bytes],
        step: Deliver,
        send: Send,
    ) -> None:
        """The end of a streamed answer: the held events as they came, or the gateway's own
        continuation of the same stream (a stop's answer, the calls that passed)."""
        if step.kind == "pass":
            for ev in held:
                await _body(send, ev)
            await _body(send, b"", more=False)
            return
        if step.kind == "error":
            await _body(
                send,
                wire.stream_error(
                    "loopwarden_stop",
                    f"loopwarden stopped the run: {step.text}",
                    "loopwarden_stop",
                    asm,
                ),
            )
            await _body(send, b"", more=False)
            return
        text, calls = step.text, None
        if step.kind == "message" and step.message is not None:
            calls = step.message.get("tool_calls") or None
            text = str(step.message.get("content") or "")
        for ev in wire.stream_rest(req, asm, text, step.finish_call, calls):
            await _body(send, ev)
        await _body(send, b"", more=False)


class _Upstream:
    """An upstream answer that is no completion: passed on (its own status and headers) or
    the gateway's error for it."""

    def __init__(
        self, status: int, body: bytes, headers: Any, why: str, *, passthrough: bool = False
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.why = why
        self.passthrough = passthrough

    async def respond(self, send: Send) -> None:
        if self.passthrough:
            await _respond(
                send, self.status, self.body, _pass_headers(self.headers), raw_headers=True
            )
        else:
            await _respond(send, self.status, self.body, {"content-type": "application/json"})


def _expand(key: str) -> str:
    if key.startswith("${") and key.endswith("}"):
        return os.environ.get(key[2:-1], "")
    return key


def _pass_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    return [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in headers.multi_items()
        if k.lower() not in _DROP_RESPONSE
    ]


async def _watching(receive: Receive, work: Awaitable[None], ex: Exchange) -> None:
    """Run ``work`` (a streamed answer) until it ends or the client goes away, whichever is
    first: then the work is cancelled where it waits (reading the upstream, or writing), the
    run ends ``cancelled`` and the upstream's stream is let go.  An ASGI server need not fail
    a ``send`` to a client that left (uvicorn drops it silently), so the request's
    ``http.disconnect`` is what tells."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        task.result()  # its own exception, if any
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, _Disconnected):
        await task
    _cancel(ex)  # already done by the work when it was cancelled; idempotent
    raise _Disconnected


def _cancel(ex: Exchange) -> None:
    """The client went away: the run ends ``cancelled`` -- unless its answer was decided and
    saved already (the client left during the last bytes of it), when the run goes on as
    the store has it."""
    if ex.live is not None:
        ex.cancel()


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone away (the request's body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise chat.WireError(
                413, "request_too_large", f"the request body exceeds {limit} bytes"
            )
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _body(send: Send, data: bytes, *, more: bool = True) -> None:
    try:
        await send({"type": "http.response.body", "body": data, "more_body": more})
    except OSError as exc:  # the client went away
        raise _Disconnected from exc


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    headers: Mapping[str, str] | list[tuple[bytes, bytes]],
    *,
    raw_headers: bool = False,
) -> None:
    if raw_headers and isinstance(headers, list):
        hs = [h for h in headers if h[0].lower() != b"content-length"]
    else:
        assert isinstance(headers, Mapping)
        hs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    hs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _error(
    send: Send,
    status: int,
    code: str,
    message: str,
    *,
    retry: bool | None = None,
    extra: Mapping[str, str] | None = None,
    kind: str = "invalid_request_error",
    wire: Wire | None = None,
) -> None:
    headers = {"content-type": "application/json", **(extra or {})}
    if retry is not None:
        headers["x-should-retry"] = "true" if retry else "false"
    body = (
        wire.error_body(code, message, kind)
        if wire is not None
        else chat.error_body(code, message, kind=kind)
    )
    await _respond(send, status, body, headers)
