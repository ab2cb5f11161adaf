"""One streamed chat-completion answer assembled from its chunks into the response an
unstreamed call returns (text, tool calls by index, finish reason, usage -- estimated where a
server omits it), with the checks that make a chunk of the wrong shape a malformed stream.

Used by :mod:`loopwarden.models.openai_chat`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, TypeVar

from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, Usage
from loopwarden.exceptions import ModelError
from loopwarden.models.tokens import estimate_text

if TYPE_CHECKING:
    from loopwarden.models.openai_chat import OpenAIChatModel

T = TypeVar("T")


class _Assembly:
    """The chunks of one streamed answer assembled into the response an unstreamed call
    returns: text, tool calls (by index: id, name, arguments in pieces), finish, usage."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
        self.finish: str | None = None
        self.usage: Any = None
        self.model: Any = None
        self.id: Any = None

    def add(self, chunk: Any) -> str | None:
        """Take one chunk; its text, if any.  A chunk of the wrong shape is malformed."""
        if self.model is None:
            self.model = _field(chunk, "model")
        if self.id is None:
            self.id = _field(chunk, "id")  # every chunk of one answer carries its id
        usage = _field(chunk, "usage")
        if usage is not None:
            self.usage = usage
        choices = _field(chunk, "choices") or []
        if not isinstance(choices, list):
            raise _malformed("its choices are not a list")
        text = None
        for choice in choices[:1]:  # one answer asked for: the first choice
            finish = _field(choice, "finish_reason")
            if finish is not None:
                self.finish = str(finish)
            delta = _field(choice, "delta")
            if delta is None:
                continue
            content = _field(delta, "content")
            if content is not None and not isinstance(content, str):
                raise _malformed(f"its content is a {type(content).__name__}, not text")
            if content:
                self.parts.append(content)
                text = content
            for tc in _field(delta, "tool_calls") or ():
                self._tool_delta(tc)
        return text

    def whole(self, data: Any) -> str | None:
        """Take a whole chat completion (the answer of a server that ignores ``stream``) as
        one chunk; its text, if any."""
        choices = _field(data, "choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise _malformed("a whole answer without choices")
        choice = choices[0]
        message = _field(choice, "message")
        calls = _field(message, "tool_calls") or []
        if not isinstance(calls, list):
            raise _malformed("its tool calls are not a list")
        delta = {
            "content": _field(message, "content"),
            "tool_calls": [{**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)],
        }
        finish = _field(choice, "finish_reason") or ("tool_calls" if calls else "stop")
        return self.add(
            {
                "id": data.get("id"),
                "model": data.get("model"),
                "usage": data.get("usage"),
                "choices": [{"delta": delta, "finish_reason": finish}],
            }
        )

    def _tool_delta(self, tc: Any) -> None:
        index = _field(tc, "index")
        if isinstance(index, bool) or not isinstance(index, int):
            index = len(self.calls)  # no index: each delta is a call of its own
        slot = self.calls.setdefault(index, ["", ""])
        call_id, fn = _field(tc, "id"), _field(tc, "function")
        if isinstance(call_id, str) and call_id and not slot[0]:
            slot[0] = call_id
        if fn is None:
            return
        name, arguments = _field(fn, "name"), _field(fn, "arguments")
        if isinstance(name, str) and name and not slot[1]:
            slot[1] = name
        if isinstance(arguments, str) and arguments:
            slot.append(arguments)

    def response(self, model: OpenAIChatModel, request: ModelRequest) -> ModelResponse:
        if self.finish is None:
            raise _malformed("the stream ended before the answer did (no finish reason)")
        calls = [
            ProposedCall(name=slot[1], arguments="".join(slot[2:]), id=slot[0])
            for _, slot in sorted(self.calls.items())
        ]
        content = "".join(self.parts) or None
        return ModelResponse(
            content=content,
            tool_calls=calls,
            usage=_usage(self.usage, request, content, calls),
            finish_reason=self.finish,
            model=_text_or(self.model, model.name),
            id=_text_or(self.id, None),
        )


def _whole_answer(response: Any) -> bool:
    """Whether the server answered a streamed request with one JSON body, not events."""
    ctype = str(response.headers.get("content-type", "")).lower()
    return "json" in ctype and "event-stream" not in ctype


def _field(obj: Any, name: str) -> Any:
    """``obj``'s field ``name`` (an SDK object, or a dict the SDK left unparsed)."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _malformed(why: str) -> ModelError:
    return ModelError(f"a malformed stream: {why}", kind="malformed")


def _close(stream: Any) -> None:
    with contextlib.suppress(Exception):  # the connection is going away anyway
        stream.close()


def _usage(u: Any, request: ModelRequest, content: str | None, calls: list[ProposedCall]) -> Usage:
    """The response's usage, or -- some compatible servers omit it -- an estimate rather
    than zero."""
    if u is not None:
        details = _field(u, "prompt_tokens_details")
        cached = int(_field(details, "cached_tokens") or 0) if details else 0
        return Usage(
            prompt=int(_field(u, "prompt_tokens") or 0),
            completion=int(_field(u, "completion_tokens") or 0),
            cached=cached,
        )
    return Usage(
        prompt=request.estimated_tokens,
        completion=estimate_text(content or "") + sum(estimate_text(c.arguments) for c in calls),
    )


def _text_or(value: Any, default: T) -> str | T:
    """``value`` when it is a non-empty string (a field a server filled), else ``default``."""
    return value if isinstance(value, str) and value else default
