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
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from loopwarden.models.scenario import Scenario, ScriptConfig
from loopwarden.models.tokens import estimate_messages, estimate_text

__all__ = ["ScriptedUpstream", "turn_of"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def turn_of(
    script: ScriptConfig, messages: Sequence[Mapping[str, Any]], tools_off: bool, prefix: str
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
        #: the Responses API's history at the "provider": response id -> chat messages
        self._history: dict[str, list[dict[str, Any]]] = {}

    async def _responses(self, sc: Scenario, req: dict[str, Any], send: Send) -> None:
        await _scripted_responses(self, sc, req, send)

    async def _messages(self, sc: Scenario, req: dict[str, Any], send: Send) -> None:
        await _scripted_messages(self, sc, req, send)

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
        path = scope["path"]
        if not path.endswith(("/chat/completions", "/responses", "/messages")):
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
        if path.endswith("/responses"):
            await self._responses(sc, req, send)
            return
        if path.endswith("/messages"):
            await self._messages(sc, req, send)
            return
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


def _events(send: Send) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    async def event(kind: str, data: dict[str, Any]) -> None:
        payload = json.dumps({"type": kind, **data}, ensure_ascii=False).encode()
        await send(
            {
                "type": "http.response.body",
                "body": b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n",
                "more_body": True,
            }
        )

    return event


async def _start_stream(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )


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


async def _end(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _tools_off(req: Mapping[str, Any]) -> bool:
    tc = req.get("tool_choice")
    return (
        not req.get("tools") or tc == "none" or (isinstance(tc, dict) and tc.get("type") == "none")
    )


def _noted(messages: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """Notes a gateway put into a system prompt, as a message after the history (where
    :func:`turn_of` looks for them)."""
    notes = [
        m for m in messages if m.get("role") == "system" and prefix in str(m.get("content") or "")
    ]
    return [*messages, *({"role": "system", "content": prefix} for _ in notes[:1])]


async def _scripted_responses(
    self: ScriptedUpstream, sc: Scenario, req: dict[str, Any], send: Send
) -> None:
    from loopwarden.gateway.responses import to_chat

    new, _ = to_chat(req.get("instructions"), req.get("input"))
    prev = req.get("previous_response_id")
    history = [*(self._history.get(prev, []) if isinstance(prev, str) else []), *new]
    content, calls = turn_of(sc.model, history, _tools_off(req), self.prefix)
    rid = "resp_" + uuid.uuid4().hex[:24]
    output: list[dict[str, Any]] = []
    if content:
        output.append(
            {
                "type": "message",
                "id": "msg_" + uuid.uuid4().hex[:24],
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        )
    for c in calls:
        output.append(
            {
                "type": "function_call",
                "id": "fc_" + uuid.uuid4().hex[:24],
                "call_id": "call_" + uuid.uuid4().hex[:24],
                "name": c["name"],
                "arguments": c["arguments"],
                "status": "completed",
            }
        )
    answer: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        answer["tool_calls"] = [
            {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            }
            for it in output
            if it["type"] == "function_call"
        ]
    self._history[rid] = [*history, answer]
    prompt = estimate_messages(history, estimate_text)
    completion = max(
        1, estimate_text(content or "") + sum(estimate_text(c["arguments"]) + 3 for c in calls)
    )
    body = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": str(req.get("model") or "scripted"),
        "output": output,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        "parallel_tool_calls": True,
        "tool_choice": req.get("tool_choice") or "auto",
        "tools": req.get("tools") or [],
    }
    if not req.get("stream"):
        await _send(send, 200, body)
        return
    await _start_stream(send)
    event = _events(send)
    seq = 0

    async def ev(kind: str, data: dict[str, Any]) -> None:
        nonlocal seq
        await event(kind, {"sequence_number": seq, **data})
        seq += 1

    await ev("response.created", {"response": {**body, "status": "in_progress", "output": []}})
    for i, it in enumerate(output):
        if it["type"] == "message":
            text = it["content"][0]["text"]
            await ev(
                "response.output_item.added",
                {"output_index": i, "item": {**it, "content": [], "status": "in_progress"}},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            await ev(
                "response.content_part.added",
                {"item_id": it["id"], "output_index": i, "content_index": 0, "part": part},
            )
            for k in range(0, len(text), self.piece_chars):
                await ev(
                    "response.output_text.delta",
                    {
                        "item_id": it["id"],
                        "output_index": i,
                        "content_index": 0,
                        "delta": text[k : k + self.piece_chars],
                    },
                )
            await ev(
                "response.output_text.done",
                {"item_id": it["id"], "output_index": i, "content_index": 0, "text": text},
            )
            await ev(
                "response.content_part.done",
                {
                    "item_id": it["id"],
                    "output_index": i,
                    "content_index": 0,
                    "part": {**part, "text": text},
                },
            )
        else:
            await ev(
                "response.output_item.added",
                {"output_index": i, "item": {**it, "arguments": "", "status": "in_progress"}},
            )
            args = it["arguments"]
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                if piece:
                    await ev(
                        "response.function_call_arguments.delta",
                        {"item_id": it["id"], "output_index": i, "delta": piece},
                    )
            await ev(
                "response.function_call_arguments.done",
                {"item_id": it["id"], "output_index": i, "arguments": args},
            )
        await ev("response.output_item.done", {"output_index": i, "item": it})
    await ev("response.completed", {"response": body})
    await _end(send)


async def _scripted_messages(
    self: ScriptedUpstream, sc: Scenario, req: dict[str, Any], send: Send
) -> None:
    from loopwarden.gateway.messages import to_chat

    history = _noted(to_chat(req.get("system"), req.get("messages") or []), self.prefix)
    content, calls = turn_of(sc.model, history, _tools_off(req), self.prefix)
    blocks: list[dict[str, Any]] = []
    if content:
        blocks.append({"type": "text", "text": content})
    for c in calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": "toolu_" + uuid.uuid4().hex[:24],
                "name": c["name"],
                "input": json.loads(c["arguments"] or "{}"),
            }
        )
    prompt = estimate_messages(history, estimate_text)
    completion = max(
        1, estimate_text(content or "") + sum(estimate_text(c["arguments"]) + 3 for c in calls)
    )
    body = {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": str(req.get("model") or "scripted"),
        "content": blocks,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }
    if not req.get("stream"):
        await _send(send, 200, body)
        return
    await _start_stream(send)
    event = _events(send)
    await event(
        "message_start",
        {
            "message": {
                **body,
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": prompt, "output_tokens": 1},
            }
        },
    )
    await event("ping", {})
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            await event(
                "content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}
            )
            for k in range(0, len(b["text"]), self.piece_chars):
                await event(
                    "content_block_delta",
                    {
                        "index": i,
                        "delta": {
                            "type": "text_delta",
                            "text": b["text"][k : k + self.piece_chars],
                        },
                    },
                )
        else:
            await event("content_block_start", {"index": i, "content_block": {**b, "input": {}}})
            raw = json.dumps(b["input"], ensure_ascii=False)
            half = len(raw) // 2
            for piece in (raw[:half], raw[half:]):
                if piece:
                    await event(
                        "content_block_delta",
                        {"index": i, "delta": {"type": "input_json_delta", "partial_json": piece}},
                    )
        await event("content_block_stop", {"index": i})
    await event(
        "message_delta",
        {
            "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": completion},
        },
    )
    await event("message_stop", {})
    await _end(send)
