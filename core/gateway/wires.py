"""One codec per wire shape, one interface: what the gateway's app and the client wrapper
need to read a request, forward it, read the upstream's answer and write their own.

Three shapes: Chat Completions (:class:`ChatWire`), the Responses API
(:class:`ResponsesWire`) and Anthropic Messages (:class:`MessagesWire`), each over its
module (:mod:`~loopwarden.gateway.chat`, :mod:`~loopwarden.gateway.responses`,
:mod:`~loopwarden.gateway.messages`).  The judging (:mod:`loopwarden.gateway.exchange`) sees
only the chat-completions form every codec reads requests into, and the
:class:`~loopwarden.gateway.exchange.Deliver` it decides; the codec turns that decision back
into its own shape, JSON or a continued stream.  A fourth shape is one more module and one
more class here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from loopwarden.events import ModelResponse
from loopwarden.gateway import chat, messages, responses
from loopwarden.gateway.chat import ChatRequest, json_bytes

__all__ = ["WIRES", "Assembler", "ChatWire", "MessagesWire", "ResponsesWire", "Wire", "wire_for"]


class Assembler(Protocol):
    """A streamed answer, assembled event by event."""

    done: bool

    def add(self, raw: bytes) -> bool:
        """Take one event; True when it may pass to the client now."""

    def response(self) -> ModelResponse:
        """What the stream said."""

    def complete(self) -> bool:
        """The stream reached its end (not cut)."""


class Wire:
    """A wire shape's codec (see the module doc)."""

    #: the name in records (``meta.wire``) and docs
    name: str = ""
    #: the path suffix it serves (``POST .../<suffix>``)
    suffix: str = ""

    #: the prefix of the ids of answers the gateway writes itself
    id_prefix: str = ""

    def parse_request(self, raw: bytes, max_bytes: int) -> ChatRequest:
        raise NotImplementedError

    def new_answer_id(self) -> str:
        """An id for an answer the gateway writes itself."""
        return self.id_prefix + uuid.uuid4().hex[:24]

    def wrote(self, answer_id: str) -> bool:
        """Whether ``answer_id`` names an answer the gateway wrote (not the upstream)."""
        return answer_id.startswith(self.id_prefix)

    def parse_response(self, data: dict[str, Any]) -> ModelResponse:
        raise NotImplementedError

    def forward_body(self, req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
        raise NotImplementedError

    def unstreamed(self, body: bytes) -> bytes:
        """``body`` asking for a whole (not streamed) answer."""
        data = json.loads(body)
        if not data.get("stream"):
            return body
        data["stream"] = False
        data.pop("stream_options", None)
        return json_bytes(data)

    def error_body(self, code: str, message: str, kind: str) -> bytes:
        return chat.error_body(code, message, kind=kind)

    def answer_body(
        self,
        req: ChatRequest,
        text: str,
        finish_call: tuple[str, dict[str, Any]] | None,
        answer_id: str | None = None,
    ) -> dict[str, Any]:
        """An answer the gateway writes itself (a stop's), with ``answer_id``."""
        body = self._answer(req, text, finish_call)
        if answer_id:
            body["id"] = answer_id
        return body

    def _answer(
        self, req: ChatRequest, text: str, finish_call: tuple[str, dict[str, Any]] | None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def with_message(self, data: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        """The upstream's answer ``data`` with its assistant message replaced by ``message``
        (chat form: the calls that passed, or the re-ask's text)."""
        raise NotImplementedError

    def message_of(self, data: dict[str, Any]) -> dict[str, Any]:
        """The assistant message of an answer, in chat form."""
        raise NotImplementedError

    def assembler(self) -> Assembler:
        raise NotImplementedError

    def stream_rest(
        self,
        req: ChatRequest,
        asm: Any,
        text: str,
        finish_call: tuple[str, dict[str, Any]] | None,
        calls: list[dict[str, Any]] | None = None,
    ) -> Iterator[bytes]:
        """The end of a stream the gateway writes itself after ``asm``'s events: ``text``
        (what was streamed already is not repeated), the agent's finish call, or ``calls``
        (chat form) that passed."""
        raise NotImplementedError

    def stream_whole(
        self,
        req: ChatRequest,
        text: str,
        finish_call: tuple[str, dict[str, Any]] | None,
        calls: list[dict[str, Any]] | None = None,
    ) -> bytes:
        """A whole stream for an answer given without a streamed upstream call (a stop, or
        the answer to a re-ask): :meth:`stream_rest` after nothing."""
        return b"".join(self.stream_rest(req, self.assembler(), text, finish_call, calls))

    def stream_error(self, code: str, message: str, kind: str, asm: Any = None) -> bytes:
        """The error event ending a stream (``asm``: the stream's events so far)."""
        return chat.sse({"error": {"message": message, "type": kind, "code": code}})


def _rest_text(sent: str, text: str) -> str:
    if sent and text.startswith(sent):
        return text[len(sent) :]
    if sent and text:
        return "\n\n" + text
    return text


class ChatWire(Wire):
    name = "chat"
    suffix = "/chat/completions"
    id_prefix = "chatcmpl-lw"

    def parse_request(self, raw: bytes, max_bytes: int) -> ChatRequest:
        return chat.parse_request(raw, max_bytes)

    def parse_response(self, data: dict[str, Any]) -> ModelResponse:
        resp = chat.parse_response(data)
        rid = data.get("id")
        if isinstance(rid, str):
            resp.id = rid
        return resp

    def forward_body(self, req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
        return chat.forward_body(req, extra, final=final)

    def _answer(
        self, req: ChatRequest, text: str, finish_call: tuple[str, dict[str, Any]] | None
    ) -> dict[str, Any]:
        return chat.completion_body(text, model=req.model, finish_call=finish_call)

    def with_message(self, data: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        data = dict(data)
        choice = dict(data["choices"][0])
        choice["message"] = message
        if not message.get("tool_calls"):
            choice["finish_reason"] = "stop"
        data["choices"] = [choice, *data["choices"][1:]]
        return data

    def message_of(self, data: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] = data["choices"][0]["message"]
        return msg

    def assembler(self) -> Assembler:
        return _ChatAssembler()

    def stream_rest(
        self,
        req: ChatRequest,
        asm: Any,
        text: str,
        finish_call: tuple[str, dict[str, Any]] | None,
        calls: list[dict[str, Any]] | None = None,
    ) -> Iterator[bytes]:
        cid = asm.chunk_id or chat.new_id()
        created = asm.created or int(time.time())
        model = asm.model or req.model
        if calls:
            base = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
            }
            delta = {"tool_calls": [{"index": i, **tc} for i, tc in enumerate(calls)]}
            yield chat.sse(
                {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            )
            yield chat.sse(
                {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
            )
            yield chat.sse("[DONE]")
            return
        yield from chat.stream_chunks(
            _rest_text(asm.sent_text(), text),
            chunk_id=cid,
            model=model,
            created=created,
            finish_call=finish_call,
        )


class _ChatAssembler(chat.StreamAssembler):
    __slots__ = ()

    def complete(self) -> bool:
        return self.done or bool(self.finish_reason)


class MessagesWire(Wire):
    name = "messages"
    suffix = "/messages"
    id_prefix = "msg_lw"

    def parse_request(self, raw: bytes, max_bytes: int) -> ChatRequest:
        return messages.parse_request(raw, max_bytes)

    def parse_response(self, data: dict[str, Any]) -> ModelResponse:
        return messages.parse_response(data)

    def forward_body(self, req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
        return messages.forward_body(req, extra, final=final)

    def error_body(self, code: str, message: str, kind: str) -> bytes:
        # Anthropic's error types: a stop is an invalid request (never retried)
        kinds = {"loopwarden_stop": "invalid_request_error", "api_error": "api_error"}
        return messages.error_body(kinds.get(kind, "invalid_request_error"), f"{code}: {message}")

    def stream_error(self, code: str, message: str, kind: str, asm: Any = None) -> bytes:
        body = json.loads(self.error_body(code, message, kind))
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"

    def _answer(
        self, req: ChatRequest, text: str, finish_call: tuple[str, dict[str, Any]] | None
    ) -> dict[str, Any]:
        return messages.answer_body(text, model=req.model, finish_call=finish_call)

    def with_message(self, data: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        data = dict(data)
        blocks: list[dict[str, Any]] = []
        if message.get("content"):
            blocks.append({"type": "text", "text": str(message["content"])})
        for tc in message.get("tool_calls") or ():
            fn = tc.get("function") or {}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": tc.get("id"),
                    "name": fn.get("name"),
                    "input": json.loads(fn.get("arguments") or "{}"),
                }
            )
        data["content"] = blocks
        data["stop_reason"] = "tool_use" if message.get("tool_calls") else "end_turn"
        return data

    def message_of(self, data: dict[str, Any]) -> dict[str, Any]:
        return messages.to_chat(None, [{"role": "assistant", "content": data.get("content")}])[0]

    def assembler(self) -> Assembler:
        return _MessagesAssembler()

    def stream_rest(
        self,
        req: ChatRequest,
        asm: Any,
        text: str,
        finish_call: tuple[str, dict[str, Any]] | None,
        calls: list[dict[str, Any]] | None = None,
    ) -> Iterator[bytes]:
        if calls:
            # the calls that passed, as tool_use blocks, then the end
            if not asm.started:
                start = messages.answer_body("", model=asm.model or req.model)
                start.update(content=[], stop_reason=None)
                yield messages._event("message_start", {"message": start})
            idx = asm.next_index
            if asm.open_text is not None:
                yield messages._event("content_block_stop", {"index": asm.open_text})
            for tc in calls:
                fn = tc.get("function") or {}
                block: dict[str, Any] = {
                    "type": "tool_use",
                    "id": tc.get("id"),
                    "name": fn.get("name"),
                    "input": {},
                }
                yield messages._event("content_block_start", {"index": idx, "content_block": block})
                yield messages._event(
                    "content_block_delta",
                    {
                        "index": idx,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": fn.get("arguments") or "{}",
                        },
                    },
                )
                yield messages._event("content_block_stop", {"index": idx})
                idx += 1
            yield messages._event(
                "message_delta",
                {
                    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                    "usage": {"output_tokens": 0},
                },
            )
            yield messages._event("message_stop", {})
            return
        open_text = asm.open_text is not None
        yield from messages.stream_answer(
            _rest_text(asm.sent, text),
            model=asm.model or req.model,
            started=asm.started,
            index=asm.next_index,
            open_text=open_text,
            finish_call=finish_call,
        )


class _MessagesAssembler(messages.MessagesAssembler):
    __slots__ = ()

    def complete(self) -> bool:
        return self.done or self.stop_reason is not None


class ResponsesWire(Wire):
    name = "responses"
    suffix = "/responses"
    id_prefix = "resp_lw"

    def parse_request(self, raw: bytes, max_bytes: int) -> ChatRequest:
        return responses.parse_request(raw, max_bytes)

    def parse_response(self, data: dict[str, Any]) -> ModelResponse:
        return responses.parse_response(data)

    def forward_body(self, req: ChatRequest, extra: list[dict[str, Any]], *, final: bool) -> bytes:
        return responses.forward_body(req, extra, final=final)

    def _answer(
        self, req: ChatRequest, text: str, finish_call: tuple[str, dict[str, Any]] | None
    ) -> dict[str, Any]:
        return responses.answer_body(text, model=req.model, finish_call=finish_call)

    def stream_error(self, code: str, message: str, kind: str, asm: Any = None) -> bytes:
        # the Responses API's error event (type, code, message, param, sequence_number, the
        # number after the stream's last), with the error object too: the openai SDK raises
        # an event carrying one as an APIError
        err = {"type": kind, "code": code, "message": message, "param": None}
        seq = asm.seq if asm is not None else 0
        data = {"code": code, "message": message, "param": None, "error": err}
        return responses._event("error", seq, data)

    def with_message(self, data: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        data = dict(data)
        keep = {tc.get("id") for tc in message.get("tool_calls") or ()}
        out = [
            it
            for it in data.get("output") or ()
            if not (
                isinstance(it, dict)
                and it.get("type") == "function_call"
                and it.get("call_id") not in keep
            )
        ]
        if (
            not keep
            and message.get("content")
            and not any(isinstance(it, dict) and it.get("type") == "message" for it in out)
        ):
            out = [*out, *responses._output(str(message["content"]), None)]
        data["output"] = out
        return data

    def message_of(self, data: dict[str, Any]) -> dict[str, Any]:
        msgs, _ = responses.to_chat(
            None, [it for it in data.get("output") or () if isinstance(it, dict)]
        )
        text = "".join(str(m.get("content") or "") for m in msgs if m.get("role") == "assistant")
        calls = [tc for m in msgs for tc in m.get("tool_calls") or ()]
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            msg["tool_calls"] = calls
        return msg

    def assembler(self) -> Assembler:
        return _ResponsesAssembler()

    def stream_rest(
        self,
        req: ChatRequest,
        asm: Any,
        text: str,
        finish_call: tuple[str, dict[str, Any]] | None,
        calls: list[dict[str, Any]] | None = None,
    ) -> Iterator[bytes]:
        seq, idx = asm.seq, asm.next_index
        if calls:
            if not asm.started:
                created = responses.answer_body("", model=asm.model or req.model)
                created.update(status="in_progress", output=[])
                yield responses._event("response.created", seq, {"response": created})
                seq += 1
            final = dict(
                asm.final
                or responses.answer_body(
                    "", model=asm.model or req.model, response_id=asm.response_id
                )
            )
            items = []
            for tc in calls:
                fn = tc.get("function") or {}
                item = {
                    "type": "function_call",
                    "id": responses.new_id("fc_lw"),
                    "call_id": tc.get("id"),
                    "name": fn.get("name"),
                    "arguments": fn.get("arguments") or "",
                    "status": "completed",
                }
                items.append(item)
                yield responses._event(
                    "response.output_item.added",
                    seq,
                    {"output_index": idx, "item": {**item, "arguments": ""}},
                )
                yield responses._event(
                    "response.function_call_arguments.done",
                    seq + 1,
                    {"item_id": item["id"], "output_index": idx, "arguments": item["arguments"]},
                )
                yield responses._event(
                    "response.output_item.done", seq + 2, {"output_index": idx, "item": item}
                )
                seq, idx = seq + 3, idx + 1
            final["output"] = items
            final["status"] = "completed"
            yield responses._event("response.completed", seq, {"response": final})
            return
        yield from responses.stream_answer(
            text,  # a new output item: what was streamed stays in its own
            model=asm.model or req.model,
            response_id=asm.response_id,
            started=asm.started,
            seq=seq,
            index=idx,
            finish_call=finish_call,
            before=asm.passed_items(),
        )


class _ResponsesAssembler(responses.ResponsesAssembler):
    __slots__ = ()

    def complete(self) -> bool:
        return self.done


#: the wire shapes the gateway serves, by path suffix
WIRES: tuple[Wire, ...] = (ChatWire(), ResponsesWire(), MessagesWire())


def wire_for(path: str) -> Wire | None:
    """The wire a ``POST`` to ``path`` speaks, None for a path that is only forwarded."""
    for w in WIRES:
        if path.endswith(w.suffix):
            return w
    return None
