"""The wrappers a guarded OpenAI Agents SDK run puts around an agent: its model
(:class:`_GuardedModel`: loopwarden decides before and after every model call), its function
tools and MCP servers' tools (:func:`_wrap_tool`: ``before_tool`` / ``after_tool`` around the
implementation), and the SDK's values read as loopwarden's events.

Used by :mod:`loopwarden.adapters.openai_agents`, whose per-run state (``_RunState``) makes
the wrapped copies of each agent.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from agents import FunctionTool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage as SDKUsage
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
)

from loopwarden import events
from loopwarden.adapters._driver import Answer, proposed, tool_result, usage

if TYPE_CHECKING:
    from agents.tool_context import ToolContext

    from loopwarden.adapters.openai_agents import _RunState


def _message(text: str) -> Any:
    from openai.types.responses import ResponseOutputText

    return ResponseOutputMessage(
        id="loopwarden-answer",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value)


def _openai(items: list[Any]) -> list[dict[str, Any]]:
    """Responses-API input items as chat messages (for loopwarden's token estimates)."""
    out: list[dict[str, Any]] = []
    for item in items:
        d = item if isinstance(item, dict) else getattr(item, "model_dump", lambda: {})()
        role = d.get("role")
        if role in ("user", "system", "developer", "assistant"):
            content = d.get("content")
            if not isinstance(content, str):
                content = "".join(
                    str(p.get("text", "")) for p in content or () if isinstance(p, dict)
                )
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif d.get("type") == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": d.get("call_id"), "content": str(d.get("output"))}
            )
    return out


def _sdk_usage(u: Any) -> events.Usage:
    return usage(getattr(u, "input_tokens", 0), getattr(u, "output_tokens", 0))


def _response(resp: ModelResponse, handoffs: set[str]) -> tuple[events.ModelResponse, list[str]]:
    """The SDK's answer as loopwarden's, and the ids of the handoff calls in it.

    A handoff is a tool call in the model's eyes, and loopwarden's: it goes through
    ``before_tool`` / ``after_tool`` and counts as a call.  The function calls come first, then
    the handoffs: the SDK runs an answer's function tools before it hands off."""
    texts: list[str] = []
    calls: list[events.ProposedCall] = []
    transfers: list[events.ProposedCall] = []
    for item in resp.output:
        if isinstance(item, ResponseOutputMessage):
            texts.extend(getattr(c, "text", "") for c in item.content)
        elif isinstance(item, ResponseFunctionToolCall):
            call = proposed(item.name, item.arguments, item.call_id)
            (transfers if item.name in handoffs else calls).append(call)
    rid = getattr(resp, "response_id", None)
    response = events.ModelResponse(
        content="".join(texts) or None,
        tool_calls=[*calls, *transfers],
        usage=_sdk_usage(resp.usage),
        id=rid if isinstance(rid, str) and rid else None,
    )
    return response, [c.id for c in transfers]


def _hosted(resp: ModelResponse) -> list[dict[str, Any]]:
    """The calls in the answer that no loopwarden hook saw: hosted tools the provider ran
    during the model call (``web_search_call``, ``file_search_call``, ``code_interpreter_call``
    ...) and the SDK's built-in local actions (``computer_call``, ``local_shell_call`` ...) --
    every ``*_call`` item but a function call."""
    out: list[dict[str, Any]] = []
    for item in resp.output:
        kind = getattr(item, "type", None)
        if isinstance(kind, str) and kind.endswith("_call") and kind != "function_call":
            out.append({"type": kind, "id": getattr(item, "id", None)})
    return out


def _completed(resp: ModelResponse) -> ResponseCompletedEvent:
    """A stream's end event carrying ``resp`` (the stream of an answer loopwarden gives)."""
    from openai.types.responses import Response

    return ResponseCompletedEvent(
        type="response.completed",
        sequence_number=0,
        response=Response(
            id=resp.response_id or "loopwarden-answer",
            created_at=0,
            model="loopwarden",
            object="response",
            output=list(resp.output),
            tool_choice="none",
            tools=[],
            top_p=None,
            parallel_tool_calls=False,
            status="completed",
        ),
    )


class _GuardedModel(Model):
    """An agent's model, with loopwarden deciding before and after every call."""

    def __init__(self, inner: Model, state: _RunState) -> None:
        self.inner = inner
        self.state = state

    def _answer(self, text: str, base: ModelResponse | None = None) -> ModelResponse:
        return ModelResponse(
            output=[_message(text)],
            usage=base.usage if base is not None else SDKUsage(),
            response_id=base.response_id if base is not None else None,
        )

    def _declare(self, tools: list[Any], handoffs: list[Any]) -> None:
        """Make the call's tools and handoffs known to the run (before a step decides
        whether it may wait on the store: a declared side effect says so)."""
        guarded = self.state.guarded
        for t in tools:
            if isinstance(t, FunctionTool):
                guarded.declare(t.name, t.description, t.params_json_schema)
        for h in handoffs:
            guarded.declare(h.tool_name, h.tool_description, h.input_json_schema)

    def _before(
        self, system_instructions: str | None, input: Any, tools: list[Any], handoffs: list[Any]
    ) -> tuple[Any, list[Any], list[Any]] | None:
        """Advance to the model call: its input (with the notes to inject), tools and
        handoffs (none for the wrap-up turn); None when the run has ended (answer with its
        answer)."""
        guarded = self.state.guarded
        guarded.system(system_instructions)
        turn = guarded.model_turn()
        if turn is None:
            return None
        if turn.notes:
            settings = guarded.engine.settings
            input = [
                *_items(input),
                *(
                    {"role": settings.warning_role, "content": settings.warning_prefix + n}
                    for n in turn.notes
                ),
            ]
        return (input, [], []) if turn.final else (input, tools, handoffs)

    def _after(self, resp: ModelResponse, handoffs: list[Any]) -> ModelResponse:
        """Send the model's answer to the machine: the answer to give the SDK."""
        state = self.state
        guarded = state.guarded
        response, transfers = _response(resp, {h.tool_name for h in handoffs})
        guarded.unguarded.extend(_hosted(resp))
        guarded.model_done(response)
        if guarded.replaced:
            state.transfers = []
            return self._answer(guarded.final_answer, resp)
        state.transfers = transfers[:1]
        for call_id in transfers[1:]:  # the SDK ignores every handoff but an answer's first
            guarded.not_run(call_id, "the SDK carries out only the first handoff of an answer")
        return resp

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        guarded = self.state.guarded
        self._declare(tools, handoffs)
        prepared = await guarded.off_loop(self._before, system_instructions, input, tools, handoffs)
        if prepared is None:
            return self._answer(guarded.final_answer)
        input, tools, handoffs = prepared
        try:
            resp = await self.inner.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **kwargs,
            )
        except BaseException as exc:
            guarded.model_failed(exc)  # the SDK may retry; recorded if the run ends on it
            raise
        return await guarded.off_loop(self._after, resp, handoffs)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        """The model's stream, passed through event by event; its end event goes through
        the machine, and carries loopwarden's answer where a stop replaces the model's (the
        deltas of a replaced answer have already been streamed)."""
        guarded = self.state.guarded
        self._declare(tools, handoffs)
        prepared = await guarded.off_loop(self._before, system_instructions, input, tools, handoffs)
        if prepared is None:
            yield _completed(self._answer(guarded.final_answer))
            return
        input, tools, handoffs = prepared
        items: list[Any] = []  # output items streamed (some backends end with an empty output)
        try:
            async for event in self.inner.stream_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **kwargs,
            ):
                if isinstance(event, ResponseOutputItemDoneEvent):
                    items.append(event.item)
                elif isinstance(event, ResponseCompletedEvent):
                    r = event.response
                    resp = ModelResponse(
                        output=list(r.output) or items,
                        usage=SDKUsage(
                            input_tokens=r.usage.input_tokens if r.usage else 0,
                            output_tokens=r.usage.output_tokens if r.usage else 0,
                        ),
                        response_id=r.id,
                    )
                    answer = await guarded.off_loop(self._after, resp, handoffs)
                    if answer is not resp:
                        output = {"output": list(answer.output)}
                        event = event.model_copy(update={"response": r.model_copy(update=output)})
                yield event
        except (Exception, asyncio.CancelledError) as exc:
            guarded.model_failed(exc)
            raise

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        await self.inner.close()


Invoke = Callable[[Any, str], Awaitable[Any]]

#: set while a guarded tool runs: MCP results the server flagged ``isError`` are noted in it
#: (the SDK turns them into plain output text; the MCP call runs in a task of its own, which
#: sees this holder through the copied context)
_MCP_ERRORS: ContextVar[list[str] | None] = ContextVar("loopwarden_mcp_errors", default=None)


def _watch(server: Any) -> None:
    """Have ``server.call_tool`` note the error results of guarded calls (once per server
    object; calls outside a guarded run are not affected)."""
    if vars(server).get("_loopwarden_watched"):
        return
    call = server.call_tool

    async def call_tool(*args: Any, **kwargs: Any) -> Any:
        result = await call(*args, **kwargs)
        holder = _MCP_ERRORS.get()
        if holder is not None and (
            getattr(result, "is_error", None) or getattr(result, "isError", None)
        ):
            holder.append(str(args[0]) if args else "?")
        return result

    vars(server).update(call_tool=call_tool, _loopwarden_watched=True)


def _wrap_tool(tool: FunctionTool, state: _RunState) -> FunctionTool:
    """``tool`` (a function tool or an MCP server's) going through ``before_tool`` /
    ``after_tool``.  Where the SDK's own failure handling wraps the tool (``function_tool``,
    MCP tools: an exception becomes "An error occurred while running the tool..." or your
    ``failure_error_function``'s text), loopwarden guards the implementation inside it, so
    it sees the exception -- a failed call -- and the SDK still formats what the model reads.
    The call goes to the run ``state`` holds when it is made (a resumed run's, see
    :meth:`_RunState.retarget`)."""
    inner = tool.on_invoke_tool

    async def guard(ctx: ToolContext[Any], input_json: str, run: Invoke) -> Any:
        guarded = state.guarded
        call_id = ctx.tool_call_id
        decision = await guarded.atool(call_id)
        if isinstance(decision, Answer):
            return decision.text
        errors: list[str] = []
        token = _MCP_ERRORS.set(errors)
        try:
            value = await run(ctx, input_json)
        except BaseException as exc:
            await guarded.off_loop(guarded.tool_done, call_id, tool_result(None, error=exc))
            raise
        finally:
            _MCP_ERRORS.reset(token)
        result = tool_result(value, ok=not errors)  # MCP isError: failed
        await guarded.off_loop(guarded.tool_done, call_id, result)
        return value

    impl = getattr(inner, "_invoke_tool_impl", None)
    if callable(impl) and callable(getattr(inner, "__agents_bind_function_tool__", None)):

        async def guarded_impl(ctx: ToolContext[Any], input_json: str) -> Any:
            return await guard(ctx, input_json, impl)

        # the SDK's markers on the implementation (argument preparation for approvals, the
        # wrapped function) stay visible on ours
        guarded_impl.__dict__.update(getattr(impl, "__dict__", {}))
        invoker = copy.copy(inner)
        invoker._invoke_tool_impl = guarded_impl  # type: ignore[attr-defined]
        invoker._function_tool = None  # type: ignore[attr-defined]  # bound to the copy below
        return dataclasses.replace(tool, on_invoke_tool=invoker)

    async def invoke(ctx: ToolContext[Any], input_json: str) -> Any:
        return await guard(ctx, input_json, inner)

    return dataclasses.replace(tool, on_invoke_tool=invoke)
