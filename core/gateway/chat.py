"""The Chat Completions wire: requests read, answers read and written, JSON and streamed.

Everything the gateway and the client wrapper know about the shape of ``/v1/chat/completions``
lives here -- what a request carries (the history, the tools, ``stream``, the user), how an
upstream answer becomes a :class:`~loopwarden.ModelResponse` (a JSON body, or the server-sent
events of a streamed one, assembled as they arrive), and how the gateway writes its own
answers: a stop as an ordinary completion (or a call to the agent's finish tool), a chunk
stream continued to its end, an error body in OpenAI's shape.  The judging
(:mod:`loopwarden.gateway.exchange`) never sees JSON.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from loopwarden.events import ModelResponse, ProposedCall, Usage

__all__ = [
    "ChatRequest",
    "SSEReader",
    "StreamAssembler",
    "WireError",
    "completion_body",
    "error_body",
    "forward_body",
    "json_object",
    "parse_request",
    "parse_response",
    "sse",
    "stream_chunks",
    "text_of",
    "tool_list",
]


class WireError(Exception):
    """A request or an upstream answer the gateway cannot read: the HTTP status, an error
    code and a message for the client (OpenAI's error shape)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(slots=True)
class ChatRequest:
    """One ``/v1/chat/completions`` request, read."""

    body: dict[str, Any]
    raw: bytes
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool
    model: str | None
    user: str | None
    tool_choice: Any = None
    #: the request carries only what is new since the run's last answer (the Responses API
    #: with ``previous_response_id``: the history stays at the provider)
    delta: bool = False
    #: the call ids its tool results answer (how a delta request finds its run)
    answered: list[str] = field(default_factory=list)
    #: the provider's id of the answer it continues (``previous_response_id``)
    previous: str | None = None
    #: a conversation id the request carries in its body (the Responses API's
    #: ``conversation``)
    session: str | None = None

    @property
    def requires_tool(self) -> bool:
        """The request forces a tool call (``"required"``, or one named function)."""
        tc = self.tool_choice
        return tc == "required" or (isinstance(tc, dict) and tc.get("type") == "function")


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (untrusted input)."""
    return value if isinstance(value, dict) else {}


def text_of(content: Any) -> str:
    """A message's text: a string as is, the text parts of a list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, Mapping):
                t = p.get("text")
                if isinstance(t, str):
                    parts.append(t)
            elif isinstance(p, str):
                parts.append(p)
        return "\n".join(parts)
    return str(content)


def json_bytes(obj: Any) -> bytes:
    """``obj`` as UTF-8 JSON for the wire.  Untrusted text may carry a lone surrogate (a
    JSON ``\\ud800`` escape decodes to one), which UTF-8 cannot encode: such a value is
    written ASCII-escaped, as the client sent it."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj).encode()


def json_object(raw: bytes, max_bytes: int) -> dict[str, Any]:
    """A request body read as a JSON object, whatever its wire: a :class:`WireError` (413
    over ``max_bytes``, 400 when it is no JSON object) otherwise."""
    if len(raw) > max_bytes:
        raise WireError(413, "request_too_large", f"the request body exceeds {max_bytes} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(400, "invalid_json", f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise WireError(400, "invalid_json", "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise WireError(400, "invalid_request", "the request body must be a JSON object")
    return body


def tool_list(body: dict[str, Any]) -> list[Any]:
    """A request's ``tools`` (none when absent); a 400 :class:`WireError` when not an array."""
    tools = body.get("tools")
    tools = [] if tools is None else tools
    if not isinstance(tools, list):
        raise WireError(400, "invalid_request", "'tools' must be an array")
    return tools


def parse_request(raw: bytes, max_bytes: int) -> ChatRequest:
    """Read a request body; a :class:`WireError` (400 / 413) names what is wrong."""
    body = json_object(raw, max_bytes)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError(400, "invalid_request", "'messages' must be a non-empty array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise WireError(
                400, "invalid_request", f"messages[{i}] must be an object with a 'role' string"
            )
    tools = tool_list(body)
    fns = [
        t["function"]
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    user = body.get("user")
    meta = body.get("metadata")
    if not isinstance(user, str) and isinstance(meta, dict):
        user = meta.get("user_id")
    model = body.get("model")
    return ChatRequest(
        body=body,
        raw=raw,
        messages=messages,
        tools=fns,
        stream=bool(body.get("stream")),
        model=model if isinstance(model, str) else None,
        user=user if isinstance(user, str) else None,
        tool_choice=body.get("tool_choice"),
    )


def _usage(u: Any) -> Usage | None:
    if not isinstance(u, dict):
        return None
    try:
        prompt = int(u.get("prompt_tokens") or 0)
        completion = int(u.get("completion_tokens") or 0)
        details = u.get("prompt_tokens_details")
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    except (TypeError, ValueError):
        return None
    return Usage(prompt=max(0, prompt), completion=max(0, completion), cached=max(0, cached))


def _calls(raw: Any) -> list[ProposedCall]:
    out: list[ProposedCall] = []
    for tc in raw or ():
        if not isinstance(tc, dict):
            continue
        fn = _obj(tc.get("function"))
        args = fn.get("arguments")
        out.append(
            ProposedCall(
                name=str(fn.get("name") or ""),
                arguments=args if isinstance(args, str) else json.dumps(args or {}),
                id=str(tc.get("id") or ""),
            )
        )
    return out


def parse_response(body: Any) -> ModelResponse:
    """An upstream's JSON completion as a :class:`ModelResponse` (the first choice); a
    :class:`WireError` (502) when it is no completion."""
    if not isinstance(body, dict):
        raise WireError(502, "bad_upstream", "the upstream answered something other than an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise WireError(502, "bad_upstream", "the upstream's answer has no choices")
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        raise WireError(502, "bad_upstream", "the upstream's first choice has no message")
    content = msg.get("content")
    model = body.get("model")
    return ModelResponse(
        content=text_of(content) if content is not None else None,
        tool_calls=_calls(msg.get("tool_calls")),
        usage=_usage(body.get("usage")),
        finish_reason=choices[0].get("finish_reason"),
        model=model if isinstance(model, str) else None,
    )


def forward_body(req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
    """The body forwarded upstream: the client's own bytes when nothing is added; else its
    messages with ``extra`` after them, and for a final (tool-less) turn ``tool_choice``
    "none"."""
    if not extra and not final:
        return req.raw
    body = dict(req.body)
    body["messages"] = [*req.messages, *extra]
    if final:
        if body.get("tools"):
            body["tool_choice"] = "none"
        body.pop("parallel_tool_calls", None)
    return json_bytes(body)


def new_id() -> str:
    return "chatcmpl-lw" + uuid.uuid4().hex[:24]


def _finish_message(text: str, finish_call: tuple[str, dict[str, Any]] | None) -> dict[str, Any]:
    if finish_call is None:
        return {"role": "assistant", "content": text}
    name, args = finish_call
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_lw" + uuid.uuid4().hex[:20],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
        ],
    }


def completion_body(
    text: str,
    *,
    model: str | None,
    finish_call: tuple[str, dict[str, Any]] | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """A completion the gateway writes itself (a stop's answer): one choice, ``finish_reason``
    "stop" -- or "tool_calls" with ``finish_call`` (the agent's finish tool and its
    arguments)."""
    u = usage or Usage()
    return {
        "id": new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "loopwarden",
        "choices": [
            {
                "index": 0,
                "message": _finish_message(text, finish_call),
                "logprobs": None,
                "finish_reason": "tool_calls" if finish_call else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": u.prompt,
            "completion_tokens": u.completion,
            "total_tokens": u.prompt + u.completion,
        },
    }


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event."""
    body = data.encode() if isinstance(data, str) else json_bytes(data)
    return b"data: " + body + b"\n\n"


def stream_chunks(
    text: str,
    *,
    chunk_id: str,
    model: str | None,
    created: int,
    finish_call: tuple[str, dict[str, Any]] | None = None,
    role: bool = False,
) -> Iterator[bytes]:
    """The rest of a stream the gateway ends itself: the text (or the finish tool's call) as
    chunks, a last chunk with its ``finish_reason``, then ``[DONE]``."""
    base = {"id": chunk_id, "object": "chat.completion.chunk", "created": created}
    base["model"] = model or "loopwarden"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    if role:
        yield chunk({"role": "assistant", "content": ""})
    if finish_call is None:
        if text:
            yield chunk({"content": text})
        yield chunk({}, "stop")
    else:
        msg = _finish_message(text, finish_call)
        tc = msg["tool_calls"][0]
        yield chunk({"tool_calls": [{"index": 0, **tc}]})
        yield chunk({}, "tool_calls")
    yield sse("[DONE]")


def error_body(code: str, message: str, *, kind: str = "invalid_request_error") -> bytes:
    """An error in OpenAI's shape."""
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        ensure_ascii=False,
    ).encode()


class SSEReader:
    """Splits a byte stream into server-sent events (each with its raw bytes)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The complete events in ``data`` and what came before it (raw, with their blank
        line); the rest is kept for the next call."""
        buf = self._buf + data
        out: list[bytes] = []
        while True:
            i = buf.find(b"\n\n")
            j = buf.find(b"\r\n\r\n")
            if i < 0 and j < 0:
                break
            end = j + 4 if j >= 0 and (i < 0 or j < i) else i + 2
            out.append(buf[:end])
            buf = buf[end:]
        self._buf = buf
        return out

    def rest(self) -> bytes:
        """What is left (an event the stream never ended)."""
        rest, self._buf = self._buf, b""
        return rest


def stream_index(value: Any) -> int:
    """An upstream stream event's ``index`` / ``output_index``: a 502 :class:`WireError` when
    it is no number (the upstream's fault, not the gateway's)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        raise WireError(
            502, "bad_upstream", f"an upstream stream event's index is {value!r}, not a number"
        ) from None


def event_data(raw: bytes) -> str | None:
    """The data of one event (its ``data:`` lines joined), None for a comment or empty one."""
    lines = [ln for ln in raw.replace(b"\r\n", b"\n").split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    return "\n".join(ln[5:].decode(errors="replace").lstrip(" ") for ln in lines)


@dataclass(slots=True)
class StreamAssembler:
    """A streamed completion, assembled chunk by chunk: text, tool calls, usage, ends.

    :meth:`add` says for each event whether it may go to the client at once (text before any
    tool call) or must be held until the answer is judged (tool-call fragments, the end, and
    everything after the first tool-call fragment, so that a released stream is the
    upstream's own bytes in the upstream's order)."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    chunk_id: str | None = None
    created: int = 0
    done: bool = False
    holding: bool = False
    bad: int = 0
    #: the text pieces that went to the client (those after a held event are held too)
    passed: int = 0

    def add(self, raw: bytes) -> bool:
        """Take one event; True when it may pass to the client now."""
        data = event_data(raw)
        if data is None:
            return not self.holding
        if data.strip() == "[DONE]":
            self.done = True
            self.holding = True
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            self.bad += 1
            return not self.holding
        if not isinstance(obj, dict):
            self.bad += 1
            return not self.holding
        if self.chunk_id is None and isinstance(obj.get("id"), str):
            self.chunk_id = obj["id"]
        if isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if isinstance(obj.get("created"), int):
            self.created = obj["created"]
        u = _usage(obj.get("usage"))
        if u is not None:
            self.usage = u
        hold = self.holding
        for ch in obj.get("choices") or ():
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            delta = _obj(ch.get("delta"))
            text = delta.get("content")
            if isinstance(text, str):
                self.content.append(text)
            for tc in delta.get("tool_calls") or ():
                if not isinstance(tc, dict):
                    continue
                hold = True
                slot = self.calls.setdefault(
                    stream_index(tc.get("index", len(self.calls))),
                    {"id": "", "name": "", "args": []},
                )
                if tc.get("id"):
                    slot["id"] = str(tc["id"])
                fn = _obj(tc.get("function"))
                if fn.get("name"):
                    slot["name"] += str(fn["name"])
                if isinstance(fn.get("arguments"), str):
                    slot["args"].append(fn["arguments"])
            if ch.get("finish_reason"):
                self.finish_reason = str(ch["finish_reason"])
                hold = True
        if u is not None:
            hold = True
        self.holding = hold
        if not hold:
            self.passed = len(self.content)
        return not hold

    def sent_text(self) -> str:
        """The text the client has got so far."""
        return "".join(self.content[: self.passed])

    def response(self) -> ModelResponse:
        """What the stream said, as a :class:`ModelResponse`."""
        text = "".join(self.content)
        return ModelResponse(
            content=text if self.content else None,
            tool_calls=[
                ProposedCall(name=c["name"], arguments="".join(c["args"]), id=c["id"])
                for _, c in sorted(self.calls.items())
            ],
            usage=self.usage,
            finish_reason=self.finish_reason,
            model=self.model,
        )
