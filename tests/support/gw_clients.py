"""Real clients against the gateway: the pieces the client tests share.

- :class:`DeterministicUpstream`: an OpenAI-compatible upstream (ASGI, served by real uvicorn)
  that plays a scenario like :class:`loopwarden.gateway.scripted.ScriptedUpstream` but answers
  the same request with the same bytes -- ids and timestamps derived from the request -- so a
  run through the gateway can be compared byte for byte with the same run sent direct.
- :class:`Counting`: ASGI middleware that counts the chat-completions requests an app gets
  (how a test sees that a client did not retry).
- :class:`ToolBox`: runs the demo shop's real tools for a client's agent loop, with a
  scenario's canned results where it has them (``get_current_time``'s fixed clock).
- :func:`agent_loop` / :func:`agent_loop_async`: an agent loop on the real ``openai`` SDK --
  JSON or streamed -- that keeps every raw response body it got.
- :func:`gateway_config`: a deployment config (the shipped one plus ``run_record``) as a
  table, and :func:`records` / :func:`wait_for_record` to read the records it writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.demo import shop_tools
from loopwarden.demo.shop import Shop
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.scripted import turn_of
from loopwarden.gateway.state import open_state
from loopwarden.models.scenario import Scenario
from support.gateway import serve

#: the scenarios' "today" (their get_current_time answers 2026-06-25 10:30:00, UTC+8)
TODAY = datetime(2026, 6, 25, 10, 30, tzinfo=timezone(timedelta(hours=8)))

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: the shop tools' natures, declared as a deployment declares tools it does not define
SHOP_TOOL_NATURES: dict[str, dict[str, Any]] = {
    "query_order": {"read_only": True, "deterministic": True},
    "query_logistics": {"read_only": True, "deterministic": True},
    "search_knowledge": {"read_only": True, "deterministic": True},
    "get_current_time": {"read_only": True, "deterministic": False},
    "apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]},
    "transfer_to_human": {"terminal": True},
}


def gateway_config(tmp: Path, **tables: Any) -> dict[str, Any]:
    """The shipped config with ``run_record`` writing to ``tmp/runs.jsonl``, the store in
    ``tmp``, the shop tools' natures, and ``tables`` merged in (one level deep)."""
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "run_record"]
    data["plugins"]["run_record"] = {"path": str(tmp / "runs.jsonl")}
    data["store"] = {"url": f"sqlite:///{tmp / 'store.sqlite3'}"}
    data["tools"] = dict(SHOP_TOOL_NATURES)
    for name, table in tables.items():
        data[name] = {**data.get(name, {}), **table}
    return data


def serve_gateway(
    stack: contextlib.ExitStack, tmp: Path, upstream: str, **tables: Any
) -> tuple[str, Counting]:
    """A :class:`GatewayApp` (config: :func:`gateway_config`, state in the store) in front of
    ``upstream`` under real uvicorn, stopped when ``stack`` closes: its URL and counter."""
    config = parse_config(gateway_config(tmp, **tables), path="<gateway-test>")
    dep = Deployment(config, tools=[])
    stack.callback(dep.close)
    app = Counting(GatewayApp(dep, upstream + "/v1", open_state(config.store)))
    return stack.enter_context(serve(app)), app


def records(path: Path) -> list[dict[str, Any]]:
    """The run records in a ``run_record`` file (none yet: an empty list)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_record(
    path: Path, pred: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0
) -> dict[str, Any]:
    """The first record ``pred`` accepts, polled for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        for rec in records(path):
            if pred(rec):
                return rec
        if time.monotonic() > deadline:
            raise AssertionError(f"no such record in {path} within {timeout_s}s: {records(path)}")
        time.sleep(0.02)


# -- upstreams and middleware -------------------------------------------------------------


class DeterministicUpstream:
    """A scripted upstream whose answer is a function of the request's bytes alone."""

    def __init__(self, scenarios: Mapping[str, Scenario], prefix: str = "[loopwarden] ") -> None:
        self.scenarios = dict(scenarios)
        self.prefix = prefix
        #: the request bodies it answered, in order
        self.requests: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.requests.append(body)
        req = json.loads(body)
        name = str(req.get("model") or "").removeprefix("scenario:")
        sc = self.scenarios[name]
        seed = hashlib.sha256(body).hexdigest()
        messages = req.get("messages") or []
        tools_off = req.get("tool_choice") == "none" or not req.get("tools")
        content, calls = turn_of(sc.model, messages, tools_off, self.prefix)
        wire_calls = [
            {"id": f"call_{seed[i * 8 : i * 8 + 24]}", "type": "function", "function": c}
            for i, c in enumerate(calls)
        ]
        # a fixed timestamp, a usage block and non-ASCII text left unescaped, with the key
        # order and spacing a real server might use: any re-encoding by the gateway shows
        base = {"id": f"chatcmpl-{seed[:20]}", "created": 1767225600, "model": str(req["model"])}
        usage = {"prompt_tokens": len(body) // 4, "completion_tokens": 7, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + 7
        finish = "tool_calls" if calls else "stop"
        if not req.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if wire_calls:
                message["tool_calls"] = wire_calls
            out = {
                **base,
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                ],
                "usage": usage,
                "system_fingerprint": "fp_det",
            }
            data = json.dumps(out, ensure_ascii=False, indent=1).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(data)).encode()),
                        (b"x-upstream", b"deterministic"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"x-upstream", b"det")],
            }
        )
        chunk_base = {**base, "object": "chat.completion.chunk"}

        async def event(choices: list[dict[str, Any]], **extra: Any) -> None:
            obj = {**chunk_base, "choices": choices, **extra}
            data = b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})

        def delta(d: dict[str, Any], fin: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": d, "logprobs": None, "finish_reason": fin}]

        await event(delta({"role": "assistant", "content": ""}))
        text = content or ""
        for i in range(0, len(text), 5):
            await event(delta({"content": text[i : i + 5]}))
        for i, tc in enumerate(wire_calls):
            args = tc["function"]["arguments"]
            head = {"index": i, "id": tc["id"], "type": "function"}
            await event(
                delta(
                    {
                        "tool_calls": [
                            {**head, "function": {"name": tc["function"]["name"], "arguments": ""}}
                        ]
                    }
                )
            )
            for j in range(0, len(args), 7):
                part = {"index": i, "function": {"arguments": args[j : j + 7]}}
                await event(delta({"tool_calls": [part]}))
        await event(delta({}, finish))
        if (req.get("stream_options") or {}).get("include_usage"):
            await event([], usage=usage)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


class Counting:
    """Counts the chat-completions requests ``app`` gets (``count``), then hands them on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.count += 1
        await self.app(scope, receive, send)


# -- the client side ----------------------------------------------------------------------


class ToolBox:
    """The demo shop's real tools (a fresh shop in ``shop_dir``, its clock pinned to the
    scenarios' "today" so two runs write the same refund row), with the scenario's canned
    results and failures for the tools it scripts (a failure is the result text
    ``ERROR: ...``, as a client reports one over Chat Completions)."""

    def __init__(self, scenario: Scenario, shop_dir: Path) -> None:
        self.scenario = scenario
        shop = Shop(shop_dir / "shop.sqlite3", now=lambda: TODAY)
        self.registry = shop_tools(shop)
        self.schemas: list[dict[str, Any]] = self.registry.schemas()
        self._used: dict[str, int] = {}
        #: every call the agent ran: (name, arguments)
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def run(self, name: str, arguments: str | Mapping[str, Any]) -> str:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        self.ran.append((name, args))
        script = self.scenario.tools.get(name)
        if script is not None and script.error is not None:  # the tool fails, every time
            err = script.error
            return f"ERROR: {err if isinstance(err, str) else err.message}"
        if script is not None and script.results:
            i = self._used.get(name, 0)
            self._used[name] = i + 1
            got = script.results[min(i, len(script.results) - 1)]
            return got if isinstance(got, str) else f"ERROR: {got.error}"
        tool = self.registry.get(name)
        if tool is None:
            return f"ERROR: unknown tool {name}"
        try:
            return str(tool.func(**args))
        except Exception as exc:  # the agent sees a failing tool as its result
            return f"ERROR: {exc}"


@dataclass
class Loop:
    """What an agent loop saw: its messages, the raw bodies, the last response's headers."""

    messages: list[dict[str, Any]]
    bodies: list[bytes] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)
    answer: str | None = None
    finish_call: dict[str, Any] | None = None

    @property
    def steps(self) -> int:
        return len(self.bodies)

    @property
    def stop(self) -> str | None:
        """The ``x-loopwarden-stop`` header of the last answer."""
        return self.headers[-1].get("x-loopwarden-stop") if self.headers else None


class TeeTransport(httpx.BaseTransport):
    """httpx's own transport, with a copy of every response body as the client reads it."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.bodies: list[bytearray] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.inner.handle_request(request)
        sink = bytearray()
        self.bodies.append(sink)
        inner = resp.stream
        assert isinstance(inner, httpx.SyncByteStream)

        class Tee(httpx.SyncByteStream):
            def __iter__(self) -> Any:
                for part in inner:
                    sink.extend(part)
                    yield part

            def close(self) -> None:
                inner.close()

        return httpx.Response(
            resp.status_code, headers=resp.headers, stream=Tee(), extensions=resp.extensions
        )

    def close(self) -> None:
        self.inner.close()


def _assistant(text: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _settle(loop: Loop, box: ToolBox, text: str | None, calls: list[dict[str, Any]]) -> bool:
    """Append the answer and run its calls; True when the loop is over."""
    loop.messages.append(_assistant(text, calls))
    if not calls:
        loop.answer = text or ""
        return True
    for tc in calls:
        fn = tc["function"]
        loop.messages.append(
            {
                "role": "tool",
                "tool_call_id": tc["id"],
                "content": box.run(fn["name"], fn["arguments"]),
            }
        )
    return False


def _calls_of(message: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": tc.id,
            "type": "function",
            "function": {"name": tc.function.name, "arguments": tc.function.arguments},
        }
        for tc in (message.tool_calls or [])
    ]


def agent_loop(
    client: Any,
    model: str,
    box: ToolBox,
    *,
    stream: bool = False,
    tee: TeeTransport | None = None,
    max_steps: int = 40,
    **extra: Any,
) -> Loop:
    """An agent loop on the sync ``openai`` client until the model answers without calls.

    JSON: ``with_raw_response`` (the raw body and headers of every answer).  Streamed: the
    SDK's own stream of chunks, the raw bytes from ``tee`` (the client's transport)."""
    loop = Loop(messages=[{"role": "user", "content": box.scenario.user}])
    for _ in range(max_steps):
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=loop.messages, tools=box.schemas, stream=True, **extra
            )
            loop.headers.append(raw.headers)
            text, acc = "", {}
            for chunk in raw.parse():
                if not chunk.choices:
                    continue
                d = chunk.choices[0].delta
                text += d.content or ""
                for tc in d.tool_calls or []:
                    slot = acc.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                    slot["id"] = tc.id or slot["id"]
                    if tc.function is not None:
                        slot["name"] += tc.function.name or ""
                        slot["args"] += tc.function.arguments or ""
            assert tee is not None
            loop.bodies.append(bytes(tee.bodies[-1]))
            calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for _, c in sorted(acc.items())
            ]
            if _settle(loop, box, text, calls):
                return loop
            continue
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=loop.messages, tools=box.schemas, **extra
        )
        loop.headers.append(raw.headers)
        loop.bodies.append(raw.http_response.content)
        msg = raw.parse().choices[0].message
        if _settle(loop, box, msg.content, _calls_of(msg)):
            return loop
    raise AssertionError(f"the agent loop ran {max_steps} steps without an answer")


async def agent_loop_async(
    client: Any, model: str, box: ToolBox, *, max_steps: int = 40, **extra: Any
) -> Loop:
    """:func:`agent_loop` (JSON) on ``AsyncOpenAI``."""
    loop = Loop(messages=[{"role": "user", "content": box.scenario.user}])
    for _ in range(max_steps):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=loop.messages, tools=box.schemas, **extra
        )
        loop.headers.append(raw.headers)
        loop.bodies.append(raw.http_response.content)
        msg = raw.parse().choices[0].message
        if _settle(loop, box, msg.content, _calls_of(msg)):
            return loop
    raise AssertionError(f"the agent loop ran {max_steps} steps without an answer")
