"""The LangChain adapter's translations: LangChain messages, model answers, tools and graph
state read as loopwarden's events and values (pure functions, no run state).

Used by :mod:`loopwarden.adapters.langchain` and the middleware's run bookkeeping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware.types import ModelResponse
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langgraph.config import get_config

from loopwarden import events
from loopwarden.adapters._driver import proposed, usage

if TYPE_CHECKING:
    from loopwarden.adapters._driver import GuardedRun


def _stop(guarded: GuardedRun) -> dict[str, Any]:
    """What the result says of the run: its id (the run record's ``run_id``), how it ended,
    the plugin that stopped it, soft or hard."""
    o = guarded.outcome
    return {
        "run_id": guarded.run.run_id,
        "termination": o.termination if o else None,
        "stopped": o is not None and o.stopped_by is not None,
        "stopped_by": o.stopped_by if o else None,
        "soft": bool(o and o.soft),
    }


def _get(state: Any, key: str) -> Any:
    """A key of the graph state (a mapping, or an object with attributes)."""
    return state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)


def _thread(config: Mapping[str, Any] | None) -> str | None:
    """The LangGraph thread of the invocation (``configurable.thread_id``), if any."""
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return None if thread is None else str(thread)


def _config() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:  # called outside a graph (a test calling a hook directly)
        return {}


def _pending(messages: list[BaseMessage]) -> AIMessage | None:
    """The last message when it is the model's answer with tool calls still unanswered."""
    if not messages:
        return None
    last = messages[-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return last
    return None


#: the graph-state key where LangChain's ``HumanInTheLoopMiddleware`` keeps a reviewer's
#: "edit" decisions (tool call id -> the action to run instead: ``name``, ``args``); the
#: model's own call stays in the messages and is replaced only when the tool runs
HITL_EDITS = "hitl_edited_tool_calls"


def _edited(pending: AIMessage, edits: Any) -> AIMessage:
    """``pending`` with each tool call a reviewer edited replaced by the call that will run
    (``edits``: :data:`HITL_EDITS`' value), so the guards and the side-effect ledger see
    what executes."""
    if not isinstance(edits, Mapping) or not edits:
        return pending
    calls = []
    for tc in pending.tool_calls:
        action = edits.get(tc.get("id") or "")
        if isinstance(action, Mapping):
            tc = {**tc, "name": action.get("name", tc["name"]), "args": action.get("args", {})}
        calls.append(tc)
    return pending.model_copy(update={"tool_calls": calls})


def _received(messages: list[BaseMessage]) -> str | None:
    """The text the caller receives as the agent's answer (its last message's)."""
    if not messages or isinstance(messages[-1], HumanMessage):
        return None
    return _text(messages[-1])


def _text(msg: BaseMessage) -> str:
    content = msg.content
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


def _openai(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    converted = convert_to_openai_messages(messages)
    return [m for m in converted if isinstance(m, dict)]


def _structured_text(value: Any) -> str:
    """A structured response as the answer's text (JSON where it can be)."""
    dump = getattr(value, "model_dump_json", None)
    if callable(dump):
        return str(dump())
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _response(
    result: ModelResponse[Any] | AIMessage | Any, *, with_usage: bool = True
) -> tuple[AIMessage | None, events.ModelResponse]:
    """The framework's model answer as loopwarden's.  With a structured response
    (``response_format``), the calls that the answer itself settled (ToolStrategy's output
    tool, answered by its ``ToolMessage``) are the answer, not tools to run: its text is the
    structured output when the model gave none."""
    msgs = result.result if isinstance(result, ModelResponse) else [result]
    ai = next((m for m in msgs if isinstance(m, AIMessage)), None)
    if ai is None:
        return None, events.ModelResponse(content=None)
    structured = result.structured_response if isinstance(result, ModelResponse) else None
    settled = (
        {m.tool_call_id for m in msgs if isinstance(m, ToolMessage)}
        if structured is not None
        else set()
    )
    content = _text(ai) or None
    if structured is not None and content is None:
        content = _structured_text(structured)
    meta = ai.usage_metadata if with_usage else None
    return ai, events.ModelResponse(
        content=content,
        tool_calls=[
            proposed(tc["name"], tc.get("args") or {}, tc.get("id") or "")
            for tc in ai.tool_calls
            if tc.get("id") not in settled
        ],
        usage=usage(meta["input_tokens"], meta["output_tokens"]) if meta else None,
        model=(ai.response_metadata or {}).get("model_name"),
        finish_reason=(ai.response_metadata or {}).get("finish_reason"),
        id=_response_id(ai),
    )


def _response_id(ai: AIMessage) -> str | None:
    """The provider's id of the answer (``gen_ai.response.id``): the response metadata's,
    else the message's own id unless LangChain made it up (``run-...`` / ``lc_run-...``)."""
    rid = (ai.response_metadata or {}).get("id")
    if isinstance(rid, str) and rid:
        return rid
    own = ai.id
    if isinstance(own, str) and own and not own.startswith(("run-", "lc_run-")):
        return own
    return None


def _server_calls(ai: AIMessage) -> list[dict[str, Any]]:
    """The provider-side tool calls in the answer (LangChain's ``server_tool_call`` content
    blocks: web search ... run during the model call): no hook saw them, the record says
    they ran."""
    if isinstance(ai.content, str):  # no content blocks: no server tool call
        return []
    return [
        {"type": b.get("name"), "id": b.get("id")}
        for b in ai.content_blocks
        if b.get("type") == "server_tool_call"
    ]


def _output_tools(response_format: Any) -> list[str]:
    """The tools through which the agent gives its structured response: ``ToolStrategy``'s
    (one per schema variant); none for a response format the provider enforces."""
    specs = getattr(response_format, "schema_specs", None)
    if not isinstance(response_format, ToolStrategy) or not specs:
        return []
    return [str(spec.name) for spec in specs]


def _tool_name(tool: Any) -> str:
    """A tool's name: a LangChain tool's, or an OpenAI-format dict's (``function.name``)."""
    if isinstance(tool, dict):
        return str(tool.get("function", tool).get("name"))
    return str(getattr(tool, "name", None))


def _schema(tool: Any) -> tuple[str, str, dict[str, Any] | None]:
    if isinstance(tool, dict):
        fn = tool.get("function", tool)
        return str(fn.get("name")), str(fn.get("description") or ""), fn.get("parameters")
    try:
        params = tool.tool_call_schema.model_json_schema()
    except Exception:  # a tool without a pydantic schema: counted without its parameters
        params = None
    return str(tool.name), str(getattr(tool, "description", "") or ""), params
