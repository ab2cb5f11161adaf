"""A scripted OpenAI-compatible upstream: scenario files played over HTTP.

What the gateway's tests, its benchmark and ``loopwarden gateway demo`` put behind the
gateway, offline: an ASGI application answering ``/v1/chat/completions`` (JSON and streamed)
from a scenario's ``[model]`` script (docs/contracts.md).  It keeps no state: the turn it
plays is read off the request -- the number of assistant turns since the last user message --
so any number of conversations run at once, and a guard's note in the request (a message
starting with the warning prefix after the last assistant turn) makes an ``on_warning =
"final"`` script answer its ``final_text``, as the in-process scripted model does.  The
scenario is named by the request's model (``"scenario:NAME"``) or an ``x-scenario`` header.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from loopwarden.models.scenario import Scenario, ScriptConfig
from loopwarden.models.tokens import estimate_messages, estimate_text

__all__ = ["ScriptedUpstream", "turn_of"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def turn_of(
    script: ScriptConfig, messages: list[Mapping[str, Any]], tools_off: bool, prefix: str
) -> tuple[str | None, list[dict[str, Any]]]:
    """The scripted turn answering ``messages``: content and calls (name, arguments).

    The turn is the number of assistant turns since the last user message (a tool result
    replayed as a user message -- "Observation: ..." -- or a guard's note does not count)."""

    def text(m: Mapping[str, Any]) -> str:
        c = m.get("content")
        return c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)

    def real_user(m: Mapping[str, Any]) -> bool:
        t = text(m)
        return m.get("role") == "user" and not t.startswith((prefix, "Observation", "Call id"))

    start = max((i for i, m in enumerate(messages) if real_user(m)), default=-1)
    k = sum(1 for m in messages[start + 1 :] if m.get("role") == "assistant")
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=start)
    noted = any(text(m).startswith(prefix) for m in messages[last + 1 :])
    if tools_off or (script.on_warning == "final" and noted):
        return script.final_text, []
    turns = script.turns
    if k < len(turns):
        turn = turns[k]
    elif not turns or script.then == "final":
        return script.final_text, []
    elif script.then == "cycle":
        turn = turns[k % len(turns)]
    else:
        turn = turns[-1]
    return turn.content, [
        {
            "name": c.name,
            "arguments": c.arguments
            if isinstance(c.arguments, str)
            else json.dumps(c.arguments, ensure_ascii=False),
        }
        for c in turn.tool_calls
    ]


class ScriptedUpstream:
    """The ASGI application (see the module doc); ``scenarios`` by name."""

    def __init__(
        self,
        scenarios: Mapping[str, Scenario],
        *,
        default: str | None = None,
        prefix: str = "[loopwarden] ",
        piece_chars: int = 8,
    ) -> None:
        self.scenarios = dict(scenarios)
        self.default = default
        self.prefix = prefix
        self.piece_chars = piece_chars
        #: requests answered (what a test may count)
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if not scope["path"].endswith("/chat/completions"):
            await _send(send, 404, {"error": {"message": "not found", "type": "not_found"}})
            return
        req = json.loads(body)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        name = headers.get("x-scenario") or str(req.get("model") or "")
        name = name.removeprefix("scenario:")
        sc = self.scenarios.get(name) or (
            self.scenarios.get(self.default) if self.default else None
        )
        if sc is None:
            await _send(
                send,
                404,
                {
                    "error": {
                        "message": f"no scenario {name!r}",
                        "type": "invalid_request_error",
                        "code": "model_not_found",
                    }
                },
            )
            return
        self.calls += 1
        messages = req.get("messages") or []
        tools_off = req.get("tool_choice") == "none" or not req.get("tools")
        content, calls = turn_of(sc.model, messages, tools_off, self.prefix)
        prompt = estimate_messages(messages, estimate_text)
        completion = max(
            1, estimate_text(content or "") + sum(estimate_text(c["arguments"]) + 3 for c in calls)
        )
        wire_calls: list[dict[str, Any]] = [
            {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": c}
            for c in calls
        ]
        model = str(req.get("model") or "scripted")
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        finish = "tool_calls" if calls else "stop"
        if not req.get("stream"):
            answer: dict[str, Any] = {"role": "assistant", "content": content}
            if wire_calls:
                answer["tool_calls"] = wire_calls
            await _send(
                send,
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": 0, "message": answer, "logprobs": None, "finish_reason": finish}
                    ],
                    "usage": usage,
                },
            )
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}

        async def chunk(delta: dict[str, Any], fin: str | None = None, **extra: Any) -> None:
            data = {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": fin}],
                **extra,
            }
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n",
                    "more_body": True,
                }
            )

        await chunk({"role": "assistant", "content": ""})
        text = content or ""
        for i in range(0, len(text), self.piece_chars):
            await chunk({"content": text[i : i + self.piece_chars]})
        for i, tc in enumerate(wire_calls):
            args = tc["function"]["arguments"]
            await chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": tc["id"],
                            "type": "function",
                            "function": {"name": tc["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                if part:
                    await chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
        await chunk({}, finish)
        if (req.get("stream_options") or {}).get("include_usage"):
            data = {**base, "choices": [], "usage": usage}
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(data).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _send(send: Send, status: int, obj: Any) -> None:
    body = json.dumps(obj, ensure_ascii=False).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
