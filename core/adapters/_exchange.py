"""What the adapters hand to the shared driver and back, framework-neutral: a framework's
tools, calls, results and token counts as loopwarden's; the tool-nature tables of an
adapter's ``tools=`` argument; the conversation a framework's own thread or session continues;
and how a run ended, for the framework's result.

Imports nothing of the driver at run time: :mod:`loopwarden.adapters._driver` builds on it.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from loopwarden.events import ProposedCall, ToolResult, Usage
from loopwarden.run import Conversation
from loopwarden.tools import Tool
from loopwarden.traffic.replay import recorded_tool

if TYPE_CHECKING:
    from loopwarden.adapters._driver import GuardedRun
    from loopwarden.config import ToolNature
    from loopwarden.deployment import Deployment

#: tool natures an adapter argument gives: ``{"refund": {"side_effect": True, ...}}``
NatureSpec = Mapping[str, Mapping[str, Any]]


def framework_tool(
    name: str,
    description: str = "",
    parameters: Mapping[str, Any] | None = None,
    declared: Mapping[str, Any] | None = None,
) -> Tool:
    """A loopwarden declaration standing for a framework's tool: its schema (counted in token
    estimates) and its nature -- ``declared`` (a ``[tools.<name>]`` table), the rest inferred
    from the name as ``loopwarden replay`` does.  The framework validates and runs the tool."""
    tool = recorded_tool(name, declared)
    tool.description = description or name
    tool._schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": tool.description,
            "parameters": dict(parameters or {"type": "object", "properties": {}}),
        },
    }
    return tool


def proposed(name: str, arguments: Any, call_id: str) -> ProposedCall:
    """A framework's tool call as loopwarden's :class:`ProposedCall` (dict arguments are
    turned into JSON text by the loop's parser, as for any adapter)."""
    return ProposedCall(name=name, arguments=arguments, id=call_id)


def tool_result(
    value: Any, *, error: BaseException | None = None, ok: bool = True, retryable: bool = False
) -> ToolResult:
    """A framework tool's outcome as loopwarden's :class:`ToolResult`."""
    if error is not None:
        return ToolResult(
            content=f"ERROR: {type(error).__name__}: {error}",
            ok=False,
            error="exception",
            retryable=retryable,
        )
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(value)
    return ToolResult(
        content=text, ok=ok, error=None if ok else "tool_error", value=value, retryable=retryable
    )


def model_url(model: Any) -> str | None:
    """The endpoint a framework's model calls (for telemetry's ``server.address`` /
    ``server.port``): its ``base_url``, or its client's (LangChain's ``openai_api_base`` /
    ``root_client``, the Agents SDK's ``_client``); None when it names none."""
    for attr in ("base_url", "openai_api_base", "anthropic_api_url"):
        value = getattr(model, attr, None)
        if value:
            text = str(value)
            if text.startswith(("http://", "https://")):
                return text
    for attr in ("root_client", "client", "_client"):
        inner = getattr(model, attr, None)
        value = getattr(inner, "base_url", None) if inner is not None else None
        if value:
            text = str(value)
            if text.startswith(("http://", "https://")):
                return text
    return None


def usage(prompt: int | None, completion: int | None) -> Usage:
    """Token counts a framework reported (None counts as 0)."""
    return Usage(prompt=max(0, int(prompt or 0)), completion=max(0, int(completion or 0)))


def nature_tables(natures: NatureSpec | Mapping[str, ToolNature] | None) -> dict[str, Any]:
    """Adapter ``tools=`` arguments as plain tables (ToolNature models or mappings)."""
    out: dict[str, Any] = {}
    for name, spec in (natures or {}).items():
        out[name] = (
            spec.model_dump(exclude_none=True) if isinstance(spec, BaseModel) else dict(spec)
        )
    return out


#: conversations a deployment keeps for framework threads / sessions / histories (the most
#: recently used; an older one is forgotten and its next run starts a new conversation)
MAX_CONVERSATIONS = 1024

_conversations: weakref.WeakKeyDictionary[Deployment, OrderedDict[str, Conversation]] = (
    weakref.WeakKeyDictionary()
)
_conversations_lock = threading.Lock()


def conversation_for(deployment: Deployment, key: str) -> Conversation:
    """The deployment's :class:`Conversation` for a framework's own conversation key (a
    thread, a session, a message history's id): the same object for every run that continues
    it, so conversation-scoped state (``conversation_limits``, ``failure_streak``'s
    ``across_turns`` ...) carries on.  In-process, the :data:`MAX_CONVERSATIONS` most
    recently used per deployment."""
    with _conversations_lock:
        known = _conversations.get(deployment)
        if known is None:
            known = _conversations[deployment] = OrderedDict()
        conv = known.get(key)
        if conv is None:
            conv = known[key] = Conversation(key)
            while len(known) > MAX_CONVERSATIONS:
                known.popitem(last=False)
        else:
            known.move_to_end(key)
        return conv


def structured_wrap_up(tools: list[str]) -> str:
    """The note added to a soft stop's wrap-up turn when the agent must answer in its output
    type: the framework's own way of answering -- its output tool (``tools``), or, with none,
    its response format -- is the one way left, so the wrap-up instruction's "stop calling
    tools" does not keep the model from it."""
    if tools:
        how = "by calling " + " or ".join(tools) + " (the only tool left)"
    else:
        how = "as JSON in the response format you were given"
    return f"Give that final answer in the required structured form, {how}."


def stop_info(guarded: GuardedRun) -> dict[str, Any] | None:
    """How loopwarden's run ended, for the framework's result: its ``run_id`` (the run
    record's), ``termination``, ``stopped_by`` (the plugin; None when no guard stopped it),
    ``soft`` and ``final_answer_present``.  None while the run is not over."""
    o = guarded.outcome
    if o is None:
        return None
    return {
        "run_id": guarded.run.run_id,
        "termination": o.termination,
        "stopped_by": o.stopped_by,
        "soft": o.soft,
        "final_answer_present": o.final_answer_present,
    }
