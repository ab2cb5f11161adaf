"""The Anthropic Messages wire (``/v1/messages``): requests read, answers read and written.

What the gateway and the client wrapper know of Anthropic's shape: a request's ``system``,
``messages`` of content blocks (``text``, ``tool_use``, ``tool_result`` with ``is_error``),
``tools`` with ``input_schema`` and ``tool_choice``; an answer's content blocks and
``stop_reason``; the streamed events (``message_start``, ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta``, ``message_stop``, ``ping``).  A request is read
into the chat-completions form the judging works on (:class:`~loopwarden.gateway.chat.ChatRequest`:
``tool_use`` blocks become an assistant turn's calls, ``tool_result`` blocks tool messages,
their ``is_error`` kept), so one exchange judges every wire.
"""

from __future__ import annotations

import json
import re
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
    "MessagesAssembler",
    "answer_body",
    "error_body",
    "forward_body",
    "parse_request",
    "parse_response",
    "stream_answer",
]


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or () if isinstance(b, dict)] if isinstance(content, list) else []


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return text_of([b for b in _blocks(content) if b.get("type") == "text"])


def to_chat(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic messages as chat-completions messages (what the judging reads)."""
    out: list[dict[str, Any]] = []
    sys_text = _result_text(system) if system else ""
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    for m in messages:
        role = m.get("role")
        blocks = _blocks(m.get("content"))
        if role == "assistant":
            text = "\n".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")
            calls = [
                {
                    "id": str(b.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(b.get("name") or ""),
                        "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False),
                    },
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        texts = []
        for b in blocks:
            if b.get("type") == "tool_result":
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(b.get("tool_use_id") or ""),
                        "content": _result_text(b.get("content")),
                        "is_error": bool(b.get("is_error")),
                    }
                )
            elif b.get("type") == "text":
                texts.append(str(b.get("text") or ""))
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def parse_request(raw: bytes, max_bytes: int) -> ChatRequest:
    """Read a ``/v1/messages`` body; a :class:`WireError` names what is wrong."""
    body = json_object(raw, max_bytes)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError(400, "invalid_request", "'messages' must be a non-empty array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise WireError(
                400,
                "invalid_request",
                f"messages[{i}] must be an object with role user or assistant",
            )
    tools = tool_list(body)
    fns = [
        {
            "name": t["name"],
            "description": t.get("description") or "",
            "parameters": _obj(t.get("input_schema")) or {"type": "object", "properties": {}},
        }
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("name"), str) and "input_schema" in t
    ]
    meta = _obj(body.get("metadata"))
    user, session = claude_code_ids(meta.get("user_id"))
    model = body.get("model")
    tc = _obj(body.get("tool_choice"))
    req = ChatRequest(
        body=body,
        raw=raw,
        messages=to_chat(body.get("system"), messages),
        tools=fns,
        stream=bool(body.get("stream")),
        model=model if isinstance(model, str) else None,
        user=user if isinstance(user, str) else None,
        # Anthropic's "any" / "tool" force a call: the chat form's "required"
        tool_choice="required" if tc.get("type") in ("any", "tool") else None,
    )
    req.session = session
    return req


_LEGACY_SESSION = re.compile(r"^(?P<user>.*?)_session_(?P<session>[0-9A-Za-z-]{8,64})$")


def claude_code_ids(user_id: Any) -> tuple[str | None, str | None]:
    """``metadata.user_id`` as (user, session).  Claude Code puts its session in it: a JSON
    string with ``session_id`` (and ``device_id`` / ``account_uuid``), or, before v2.1.78,
    ``user_<hash>_account_<id>_session_<uuid>``; any other value is the user alone."""
    if not isinstance(user_id, str) or not user_id:
        return None, None
    if user_id.startswith("{"):
        try:
            data = json.loads(user_id)
        except ValueError:
            return user_id, None
        if isinstance(data, dict):
            session = data.get("session_id")
            who = data.get("account_uuid") or data.get("device_id") or data.get("user_id")
            return (
                str(who) if who else None,
                str(session) if isinstance(session, str) and session else None,
            )
        return user_id, None
    m = _LEGACY_SESSION.match(user_id)
    if m is not None:
        return m.group("user") or None, m.group("session")
    return user_id, None


def _usage(u: Any) -> Usage | None:
    u = _obj(u)
    if not u:
        return None
    try:
        cached = int(u.get("cache_read_input_tokens") or 0)
        prompt = (
            int(u.get("input_tokens") or 0)
            + cached
            + int(u.get("cache_creation_input_tokens") or 0)
        )
        return Usage(prompt=prompt, completion=int(u.get("output_tokens") or 0), cached=cached)
    except (TypeError, ValueError):
        return None


def parse_response(body: Any) -> ModelResponse:
    """An upstream's message as a :class:`ModelResponse`; a 502 :class:`WireError` when it
    is none."""
    if not isinstance(body, dict) or body.get("type") != "message":
        raise WireError(502, "bad_upstream", "the upstream's answer is not a message")
    blocks = _blocks(body.get("content"))
    text = "".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")
    calls = [
        ProposedCall(
            name=str(b.get("name") or ""),
            arguments=json.dumps(b.get("input") or {}, ensure_ascii=False),
            id=str(b.get("id") or ""),
        )
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    model = body.get("model")
    mid = body.get("id")
    return ModelResponse(
        id=mid if isinstance(mid, str) else None,
        content=text if any(b.get("type") == "text" for b in blocks) else None,
        tool_calls=calls,
        usage=_usage(body.get("usage")),
        finish_reason=str(body.get("stop_reason") or "") or None,
        model=model if isinstance(model, str) else None,
    )


def forward_body(req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
    """The body forwarded upstream: the client's bytes when nothing is added; else notes
    (``extra``: chat messages) -- a system note appended to ``system``, others as text after
    the last user message -- and for the wrap-up turn ``tool_choice`` none."""
    if not extra and not final:
        return req.raw
    body = dict(req.body)
    system_notes = [
        text_of(m.get("content")) for m in extra if m.get("role") in ("system", "developer")
    ]
    user_notes = [
        text_of(m.get("content")) for m in extra if m.get("role") not in ("system", "developer")
    ]
    if system_notes:
        sys_val = body.get("system")
        if isinstance(sys_val, list):
            body["system"] = [*sys_val, *({"type": "text", "text": t} for t in system_notes)]
        else:
            body["system"] = "\n\n".join([*([sys_val] if sys_val else []), *system_notes])
    if user_notes:
        messages = list(body["messages"])
        note_blocks = [{"type": "text", "text": t} for t in user_notes]
        last = messages[-1]
        if last.get("role") == "user":
            messages[-1] = {**last, "content": [*_blocks(last.get("content")), *note_blocks]}
        else:
            messages.append({"role": "user", "content": note_blocks})
        body["messages"] = messages
    if final and body.get("tools"):
        body["tool_choice"] = {"type": "none"}
    return json_bytes(body)


def new_id() -> str:
    return "msg_lw" + uuid.uuid4().hex[:24]


def _content(text: str, finish_call: tuple[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    if finish_call is None:
        return [{"type": "text", "text": text}]
    name, args = finish_call
    return [
        {"type": "tool_use", "id": "toolu_lw" + uuid.uuid4().hex[:20], "name": name, "input": args}
    ]


def answer_body(
    text: str, *, model: str | None, finish_call: tuple[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A message the gateway writes itself (a stop's answer): ``stop_reason`` "end_turn"
    (or "tool_use" for the agent's finish tool)."""
    return {
        "id": new_id(),
        "type": "message",
        "role": "assistant",
        "model": model or "loopwarden",
        "content": _content(text, finish_call),
        "stop_reason": "tool_use" if finish_call else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + json_bytes({"type": kind, **data}) + b"\n\n"


def stream_answer(
    text: str,
    *,
    model: str | None,
    started: bool,
    index: int,
    open_text: bool,
    finish_call: tuple[str, dict[str, Any]] | None = None,
) -> Iterator[bytes]:
    """The rest of a stream the gateway ends itself: (``message_start`` unless ``started``),
    the text or the finish tool's call as content blocks from ``index`` on, then
    ``message_delta`` with the stop reason and ``message_stop``.  ``open_text``: a text
    block is open at ``index - 1`` and is closed first."""
    if not started:
        msg = answer_body("", model=model)
        msg["content"] = []
        msg["stop_reason"] = None
        yield _event("message_start", {"message": msg})
    if open_text:
        yield _event("content_block_stop", {"index": index - 1})
    if finish_call is None:
        if text:
            yield _event(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            yield _event(
                "content_block_delta",
                {"index": index, "delta": {"type": "text_delta", "text": text}},
            )
            yield _event("content_block_stop", {"index": index})
        reason = "end_turn"
    else:
        block = _content(text, finish_call)[0]
        yield _event(
            "content_block_start",
            {"index": index, "content_block": {**block, "input": {}}},
        )
        yield _event(
            "content_block_delta",
            {
                "index": index,
                "delta": {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(block["input"], ensure_ascii=False),
                },
            },
        )
        yield _event("content_block_stop", {"index": index})
        reason = "tool_use"
    yield _event(
        "message_delta",
        {"delta": {"stop_reason": reason, "stop_sequence": None}, "usage": {"output_tokens": 0}},
    )
    yield _event("message_stop", {})


def error_body(kind: str, message: str) -> bytes:
    """An error in Anthropic's shape."""
    return json.dumps(
        {"type": "error", "error": {"type": kind, "message": message}}, ensure_ascii=False
    ).encode()


@dataclass(slots=True)
class MessagesAssembler:
    """A streamed message, assembled event by event (as
    :class:`~loopwarden.gateway.chat.StreamAssembler` for chat completions): text passes as it
    comes; from the first ``tool_use`` block on, and the ends, everything is held."""

    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    model: str | None = None
    message_id: str | None = None
    started: bool = False
    done: bool = False
    holding: bool = False
    open_text: int | None = None
    bad: int = 0
    #: the text the client has got so far (text after a held event is held too)
    sent: str = ""

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
        kind = obj.get("type")
        hold = self.holding
        if kind == "message_start":
            msg = _obj(obj.get("message"))
            self.started = True
            self.message_id = msg.get("id") if isinstance(msg.get("id"), str) else None
            self.model = msg.get("model") if isinstance(msg.get("model"), str) else None
            self.usage.update(_obj(msg.get("usage")))
        elif kind == "content_block_start":
            idx = stream_index(obj.get("index"))
            block = dict(_obj(obj.get("content_block")))
            block["_json"] = []
            self.blocks[idx] = block
            if block.get("type") == "tool_use":
                hold = True
            elif block.get("type") == "text":
                self.open_text = idx
        elif kind == "content_block_delta":
            idx = stream_index(obj.get("index"))
            block = self.blocks.setdefault(idx, {"type": "text", "text": "", "_json": []})
            delta = _obj(obj.get("delta"))
            if delta.get("type") == "text_delta":
                block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                block["_json"].append(str(delta.get("partial_json") or ""))
        elif kind == "content_block_stop":
            idx = stream_index(obj.get("index"))
            if self.open_text == idx:
                self.open_text = None
        elif kind == "message_delta":
            delta = _obj(obj.get("delta"))
            if delta.get("stop_reason"):
                self.stop_reason = str(delta["stop_reason"])
            self.usage.update(_obj(obj.get("usage")))
            hold = True
        elif kind == "message_stop":
            self.done = True
            hold = True
        self.holding = hold
        if not hold and kind == "content_block_delta":
            delta = _obj(obj.get("delta"))
            if delta.get("type") == "text_delta":
                self.sent += str(delta.get("text") or "")
        return not hold

    @property
    def next_index(self) -> int:
        return max(self.blocks, default=-1) + 1

    def text(self) -> str:
        return "".join(
            str(b.get("text") or "")
            for _, b in sorted(self.blocks.items())
            if b.get("type") == "text"
        )

    def response(self) -> ModelResponse:
        calls = []
        for _, b in sorted(self.blocks.items()):
            if b.get("type") != "tool_use":
                continue
            raw = "".join(b.get("_json") or ())
            calls.append(
                ProposedCall(
                    name=str(b.get("name") or ""),
                    arguments=raw or json.dumps(b.get("input") or {}, ensure_ascii=False),
                    id=str(b.get("id") or ""),
                )
            )
        has_text = any(b.get("type") == "text" for b in self.blocks.values())
        return ModelResponse(
            content=self.text() if has_text else None,
            tool_calls=calls,
            usage=_usage(self.usage),
            finish_reason=self.stop_reason,
            model=self.model,
        )


def created() -> int:
    return int(time.time())
