"""LangChain v1 ``create_agent`` guarded by ``LoopwardenMiddleware``, offline.

The model is LangChain's own ``GenericFakeChatModel`` (given ``bind_tools``, which it lacks),
playing :class:`adapter_support.Script`; the tools are real LangChain tools.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool

from adapter_support import (
    FINAL,
    FORBIDDEN,
    LOOKUP,
    REFUND_A,
    REFUND_B,
    Effects,
    Script,
    deployment,
    only_record,
)
from loopwarden.adapters.langchain import LoopwardenMiddleware


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel whose next message depends on whether tools are bound."""

    script: Any = None
    tools_bound: bool = False

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(lw_tools=[getattr(t, "name", t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.tools_bound = bool(kwargs.get("lw_tools"))
        return super()._generate(messages, stop=stop, run_manager=run_manager)


def make_model(script: Script) -> ScriptedChatModel:
    model: ScriptedChatModel

    def play() -> Iterator[AIMessage]:
        while True:
            text, calls = script.next(model.tools_bound)
            p, c = script.usage
            yield AIMessage(
                content=text or "",
                tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls],
                usage_metadata={"input_tokens": p, "output_tokens": c, "total_tokens": p + c},
            )

    model = ScriptedChatModel(messages=play(), script=script)
    return model


def make_tools(effects: Effects) -> list[Any]:
    @tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    @tool
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        effects.hit("delete_account")
        return f"account {user} deleted"

    return [query_order, apply_refund, delete_account]


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any
              ) -> tuple[dict[str, Any], Effects]:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    agent = create_agent(make_model(script), make_tools(effects),
                         middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")])
    state = {"messages": [HumanMessage("Where is my order 99999?")]}
    try:
        if mode == "sync":
            out = agent.invoke(state)
        else:
            out = asyncio.run(agent.ainvoke(state))
    finally:
        dep.close()
    return out, effects


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_repeat_loop_is_stopped_with_a_wrap_up_answer(tmp_path: Path, mode: str) -> None:
    script = Script([[LOOKUP]], repeat=True)
    out, effects = run_agent(tmp_path, script, mode)
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["soft"] is True
    assert rec["stopped_by"] == "repeat_call"
    assert effects.counts == {"query_order": 1}  # the repeat was answered from the first result
    assert script.toolless == 1  # the wrap-up turn had no tools bound
    last = out["messages"][-1]
    assert isinstance(last, AIMessage) and last.content == FINAL and not last.tool_calls
    assert rec["final_answer"] == FINAL and rec["final_answer_present"] is True
    skipped = [m for m in out["messages"] if isinstance(m, ToolMessage)][1]
    assert "already made" in str(skipped.content)
    notes = [m for m in out["messages"] if isinstance(m, HumanMessage)
             and str(m.content).startswith("[loopwarden] ")]
    assert notes, "the warning reached the model as a message"


@pytest.mark.parametrize("mode", MODES)
def test_side_effect_proposed_twice_runs_once(tmp_path: Path, mode: str) -> None:
    script = Script([[REFUND_A], [REFUND_B]], final="Refunded.")
    out, effects = run_agent(tmp_path, script, mode)
    assert effects.counts == {"apply_refund": 1}
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert "was not executed again" in str(answers[1].content)
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["final_answer"] == "Refunded."
    assert rec["tool_calls"] == 2 and rec["tools_executed"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_token_budget_stops_before_the_call_that_would_pass_it(tmp_path: Path, mode: str) -> None:
    limit = 7000
    script = Script([[LOOKUP]], repeat=True, usage=(3000, 100))
    dep_kwargs = {"max_total_tokens": limit}
    out, _ = run_agent(tmp_path, script, mode, **dep_kwargs)
    rec = only_record(tmp_path)
    assert rec["termination"] == "max_tokens" and rec["stopped_by"] == "token_budget"
    assert rec["tokens"]["total"] <= limit
    # one more call of the same size would have passed the limit: it was never made
    assert rec["tokens"]["total"] + 3100 > limit
    assert script.calls == rec["steps"]
    # a hard stop: no wrap-up call, the best-effort answer is the agent's last message
    assert rec["soft"] is False and script.toolless == 0
    last = out["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert last.content == rec["final_answer"] and rec["final_answer_present"] is False


@pytest.mark.parametrize("mode", MODES)
def test_third_party_allowlist_plugin_is_enforced(tmp_path: Path, mode: str) -> None:
    script = Script([[FORBIDDEN]], repeat=True, final="I cannot do that.")
    out, effects = run_agent(tmp_path, script, mode, allowlist=True)
    assert effects.counts == {}
    refusal = [m for m in out["messages"] if isinstance(m, ToolMessage)][0]
    assert str(refusal.content).startswith("NOT ALLOWED: delete_account")
    rec = only_record(tmp_path)
    assert rec["termination"] == "tool_not_allowed" and rec["stopped_by"] == "allowlist"
    assert rec["final_answer"] == "I cannot do that."
    assert out["messages"][-1].content == "I cannot do that."
