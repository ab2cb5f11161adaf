"""The OpenAI Responses wire (``/v1/responses``): requests read, answers read and written.

A request's ``input`` items -- messages, ``function_call`` and ``function_call_output`` --
and its ``instructions``, ``tools`` and ``tool_choice`` are read into the chat-completions
form the judging works on (:class:`~loopwarden.gateway.chat.ChatRequest`).  A request that
continues with ``previous_response_id`` carries only what is new (the history stays at the
provider): it is read as a *delta* -- the judging counts it on top of what it kept of the run
-- and found by the response id the gateway saw (or by its ``function_call_output`` call ids).
Streamed answers are server-sent events named by type (``response.output_text.delta``,
``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done``,
``response.completed``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from loopwarden.events import ModelResponse, ProposedCall, Usage
from loopwarden.gateway.chat import (
    ChatRequest,
    WireError,
    _obj,
    event_data,
    json_bytes,
    json_object,
    stream_index,
    text_of,
    tool_list,
)

__all__ = [
    "ResponsesAssembler",
    "answer_body",
    "forward_body",
    "parse_request",
    "parse_response",
    "stream_answer",
]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text") or "")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
        )
    return text_of(content)


def to_chat(instructions: Any, items: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """``input`` items as chat-completions messages, and the call ids its
    ``function_call_output`` items answer."""
    out: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out, []
    answered: list[str] = []
    for it in items if isinstance(items, list) else ():
        if not isinstance(it, dict):
            continue
        kind = it.get("type")
        if kind == "function_call":
            call = {
                "id": str(it.get("call_id") or ""),
                "type": "function",
                "function": {
                    "name": str(it.get("name") or ""),
                    "arguments": str(it.get("arguments") or ""),
                },
            }
            if out and out[-1].get("role") == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            cid = str(it.get("call_id") or "")
            answered.append(cid)
            output = it.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": cid,
                    "content": _text(output) if not isinstance(output, str) else output,
                }
            )
        elif kind in (None, "message") and isinstance(it.get("role"), str):
            role = it["role"]
            text = _text(it.get("content"))
            if (
                role == "assistant"
                and out
                and out[-1].get("role") == "assistant"
                and not out[-1].get("tool_calls")
            ):
                out[-1]["content"] = (out[-1].get("content") or "") + text
            else:
                out.append({"role": role, "content": text})
    return out, answered


def parse_request(raw: bytes, max_bytes: int) -> ChatRequest:
    """Read a ``/v1/responses`` body; a :class:`WireError` names what is wrong."""
    body = json_object(raw, max_bytes)
    items = body.get("input")
    if not isinstance(items, (str, list)) or not items:
        raise WireError(400, "invalid_request", "'input' must be a string or a non-empty array")
    if isinstance(items, list):
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                raise WireError(400, "invalid_request", f"input[{i}] must be an object")
            if it.get("type") in ("message", None) and "role" not in it:
                raise WireError(400, "invalid_request", f"input[{i}] has neither a type nor a role")
    tools = tool_list(body)
    fns = [
        {
            "name": t["name"],
            "description": t.get("description") or "",
            "parameters": _obj(t.get("parameters")) or {"type": "object", "properties": {}},
        }
        for t in tools
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
    ]
    messages, answered = to_chat(body.get("instructions"), items)
    user = body.get("user")
    if not isinstance(user, str):
        user = _obj(body.get("metadata")).get("user_id")
    previous = body.get("previous_response_id")
    conv = body.get("conversation")
    conv_id = conv if isinstance(conv, str) else _obj(conv).get("id")
    tc = body.get("tool_choice")
    model = body.get("model")
    req = ChatRequest(
        body=body,
        raw=raw,
        messages=messages,
        tools=fns,
        stream=bool(body.get("stream")),
        model=model if isinstance(model, str) else None,
        user=user if isinstance(user, str) else None,
        tool_choice="required"
        if tc == "required" or (isinstance(tc, dict) and tc.get("type") == "function")
        else tc,
    )
    req.delta = (isinstance(previous, str) and bool(previous)) or isinstance(conv_id, str)
    req.answered = answered
    req.previous = previous if isinstance(previous, str) and previous else None
    req.session = conv_id if isinstance(conv_id, str) and conv_id else None
    return req


def _usage(u: Any) -> Usage | None:
    u = _obj(u)
    if not u:
        return None
    try:
        cached = int(_obj(u.get("input_tokens_details")).get("cached_tokens") or 0)
        return Usage(
            prompt=int(u.get("input_tokens") or 0),
            completion=int(u.get("output_tokens") or 0),
            cached=cached,
        )
    except (TypeError, ValueError):
        return None


def parse_response(body: Any) -> ModelResponse:
    """An upstream's response as a :class:`ModelResponse`; a 502 :class:`WireError` when
    it is none."""
    if not isinstance(body, dict) or not isinstance(body.get("output"), list):
        raise WireError(502, "bad_upstream", "the upstream's answer is not a response")
    texts: list[str] = []
    calls: list[ProposedCall] = []
    for it in body["output"]:
        if not isinstance(it, dict):
            continue
        if it.get("type") == "message":
            texts.append(_text(it.get("content")))
        elif it.get("type") == "function_call":
            calls.append(
                ProposedCall(
                    name=str(it.get("name") or ""),
                    arguments=str(it.get("arguments") or ""),
                    id=str(it.get("call_id") or ""),
                )
            )
    model = body.get("model")
    rid = body.get("id")
    resp = ModelResponse(
        id=rid if isinstance(rid, str) else None,
        content="".join(texts) if texts else None,
        tool_calls=calls,
        usage=_usage(body.get("usage")),
        finish_reason=str(body.get("status") or "") or None,
        model=model if isinstance(model, str) else None,
    )
    return resp


def forward_body(req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
    """The body forwarded upstream: the client's bytes when nothing is added; else its input
    with the notes (``extra``) appended as input messages, and for the wrap-up turn
    ``tool_choice`` "none"."""
    if not extra and not final:
        return req.raw
    body = dict(req.body)
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    for m in extra:
        role = m.get("role")
        if role == "tool":  # a skipped call's observation, after its call
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id"),
                    "output": text_of(m.get("content")),
                }
            )
        elif role == "assistant":
            for tc in m.get("tool_calls") or ():
                fn = _obj(tc.get("function"))
                items.append(
                    {
                        "type": "function_call",
                        "call_id": tc.get("id"),
                        "name": fn.get("name"),
                        "arguments": fn.get("arguments") or "",
                    }
                )
        else:
            items.append({"role": role, "content": text_of(m.get("content"))})
    body["input"] = items
    if final and body.get("tools"):
        body["tool_choice"] = "none"
    return json_bytes(body)


def new_id(prefix: str = "resp_lw") -> str:
    return prefix + uuid.uuid4().hex[:24]


def _output(text: str, finish_call: tuple[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    if finish_call is None:
        return [
            {
                "type": "message",
                "id": new_id("msg_lw"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
    name, args = finish_call
    return [
        {
            "type": "function_call",
            "id": new_id("fc_lw"),
            "call_id": new_id("call_lw"),
            "name": name,
            "arguments": json.dumps(args, ensure_ascii=False),
            "status": "completed",
        }
    ]


def answer_body(
    text: str,
    *,
    model: str | None,
    finish_call: tuple[str, dict[str, Any]] | None = None,
    response_id: str | None = None,
) -> dict[str, Any]:
    """A completed response the gateway writes itself (a stop's answer)."""
    return {
        "id": response_id or new_id(),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": model or "loopwarden",
        "output": _output(text, finish_call),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }


def _event(kind: str, seq: int, data: dict[str, Any]) -> bytes:
    payload = {"type": kind, "sequence_number": seq, **data}
    return b"event: " + kind.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"


def stream_answer(
    text: str,
    *,
    model: str | None,
    response_id: str | None,
    started: bool,
    seq: int,
    index: int,
    finish_call: tuple[str, dict[str, Any]] | None = None,
    before: list[dict[str, Any]] | None = None,
) -> Iterator[bytes]:
    """The rest of a stream the gateway ends itself: (``response.created`` unless
    ``started``), the answer as an output item at ``index`` with its deltas, then
    ``response.completed`` with the whole response -- the items streamed ``before`` it
    (the upstream's text that passed) and the answer."""
    body = answer_body(text, model=model, finish_call=finish_call, response_id=response_id)
    if not started:
        created = {**body, "status": "in_progress", "output": []}
        yield _event("response.created", seq, {"response": created})
        seq += 1
    item = body["output"][0]
    if finish_call is None:
        empty = {**item, "status": "in_progress", "content": []}
        yield _event("response.output_item.added", seq, {"output_index": index, "item": empty})
        part = {"type": "output_text", "text": "", "annotations": []}
        yield _event(
            "response.content_part.added",
            seq + 1,
            {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
        )
        yield _event(
            "response.output_text.delta",
            seq + 2,
            {"item_id": item["id"], "output_index": index, "content_index": 0, "delta": text},
        )
        yield _event(
            "response.output_text.done",
            seq + 3,
            {"item_id": item["id"], "output_index": index, "content_index": 0, "text": text},
        )
        yield _event(
            "response.content_part.done",
            seq + 4,
            {
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": {**part, "text": text},
            },
        )
        seq += 5
    else:
        yield _event(
            "response.output_item.added",
            seq,
            {"output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}},
        )
        yield _event(
            "response.function_call_arguments.delta",
            seq + 1,
            {"item_id": item["id"], "output_index": index, "delta": item["arguments"]},
        )
        yield _event(
            "response.function_call_arguments.done",
            seq + 2,
            {"item_id": item["id"], "output_index": index, "arguments": item["arguments"]},
        )
        seq += 3
    yield _event("response.output_item.done", seq, {"output_index": index, "item": item})
    yield _event(
        "response.completed", seq + 1, {"response": {**body, "output": [*(before or ()), item]}}
    )


@dataclass(slots=True)
class ResponsesAssembler:
    """A streamed response, assembled event by event: text passes as it comes; from the
    first ``function_call`` item on, and the end, everything is held."""

    items: dict[int, dict[str, Any]] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    response_id: str | None = None
    model: str | None = None
    started: bool = False
    done: bool = False
    holding: bool = False
    seq: int = 0
    bad: int = 0

    def add(self, raw: bytes) -> bool:
        data = event_data(raw)
        if data is None:
            return not self.holding
        try:
            obj = json.loads(data)
        except ValueError:
            self.bad += 1
            return not self.holding
        if not isinstance(obj, dict):
            return not self.holding
        kind = str(obj.get("type") or "")
        if isinstance(obj.get("sequence_number"), int):
            self.seq = obj["sequence_number"] + 1
        hold = self.holding
        resp = _obj(obj.get("response"))
        if kind == "response.created":
            self.started = True
            self.response_id = resp.get("id") if isinstance(resp.get("id"), str) else None
            self.model = resp.get("model") if isinstance(resp.get("model"), str) else None
        elif kind == "response.output_item.added":
            item = dict(_obj(obj.get("item")))
            idx = stream_index(obj.get("output_index"))
            item.setdefault("_text", [])
            item.setdefault("_args", [])
            self.items[idx] = item
            if item.get("type") == "function_call":
                hold = True
        elif kind == "response.output_text.delta":
            idx = stream_index(obj.get("output_index"))
            self.items.setdefault(idx, {"type": "message", "_text": [], "_args": []})[
                "_text"
            ].append(str(obj.get("delta") or ""))
        elif kind == "response.function_call_arguments.delta":
            idx = stream_index(obj.get("output_index"))
            self.items.setdefault(idx, {"type": "function_call", "_text": [], "_args": []})[
                "_args"
            ].append(str(obj.get("delta") or ""))
            hold = True
        elif kind == "response.output_item.done":
            idx = stream_index(obj.get("output_index"))
            item = dict(_obj(obj.get("item")))
            prev = self.items.get(idx, {})
            item["_text"], item["_args"] = prev.get("_text", []), prev.get("_args", [])
            self.items[idx] = item
            if item.get("type") == "function_call":
                hold = True
        elif kind in (
            "response.completed",
            "response.incomplete",
            "response.failed",
            "response.done",
        ):
            self.final = resp
            self.done = True
            hold = True
        self.holding = hold
        return not hold

    @property
    def next_index(self) -> int:
        return max(self.items, default=-1) + 1

    def passed_items(self) -> list[dict[str, Any]]:
        """The message items streamed so far, whole (as a completed response lists them)."""
        out = []
        for _, it in sorted(self.items.items()):
            if it.get("type") != "message":
                continue
            text = "".join(it.get("_text") or ())
            item = {k: v for k, v in it.items() if not k.startswith("_")}
            item["status"] = "completed"
            item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
            out.append(item)
        return out

    def text(self) -> str:
        return "".join(
            "".join(it.get("_text") or ())
            for _, it in sorted(self.items.items())
            if it.get("type") == "message"
        )

    def response(self) -> ModelResponse:
        if (
            self.final is not None
            and isinstance(self.final.get("output"), list)
            and self.final["output"]
        ):
            return parse_response(self.final)
        calls = [
            ProposedCall(
                name=str(it.get("name") or ""),
                arguments=str(it.get("arguments") or "".join(it.get("_args") or ())),
                id=str(it.get("call_id") or ""),
            )
            for _, it in sorted(self.items.items())
            if it.get("type") == "function_call"
        ]
        has_text = any(it.get("type") == "message" for it in self.items.values())
        return ModelResponse(
            content=self.text() if has_text else None,
            tool_calls=calls,
            usage=_usage(_obj(self.final).get("usage")) if self.final else None,
            model=self.model,
        )
