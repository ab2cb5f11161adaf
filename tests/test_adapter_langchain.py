"""LangChain v1 ``create_agent`` guarded by ``LoopwardenMiddleware``, offline.

The model is LangChain's own ``GenericFakeChatModel`` (given ``bind_tools``, which it lacks),
playing :class:`support.adapters.Script`; the tools are real LangChain tools.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from support.adapters import (
    SCENARIOS,
    WORLD_SCENARIOS,
    Effects,
    Outcome,
    Script,
    World,
    deployment,
    only_record,
)

from loopwarden.adapters.langchain import LoopwardenMiddleware


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel whose next message depends on whether tools are bound."""

    tools_bound: bool = False

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(lw_tools=[getattr(t, "name", t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
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

    model = ScriptedChatModel(messages=play())
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


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any) -> Outcome:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    agent = create_agent(
        make_model(script),
        make_tools(effects),
        middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")],
    )
    state = {"messages": [HumanMessage("Where is my order 99999?")]}
    try:
        out = agent.invoke(state) if mode == "sync" else asyncio.run(agent.ainvoke(state))
    finally:
        dep.close()
    messages = out["messages"]
    last = messages[-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    return Outcome(
        output=str(last.content),
        observations=[str(m.content) for m in messages if isinstance(m, ToolMessage)],
        effects=effects,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario(tmp_path: Path, scenario: str, mode: str) -> None:
    check: Callable[..., None] = SCENARIOS[scenario]
    check(tmp_path, run_agent, mode)


@dataclass
class UserContext:
    user: str


def run_world(tmp_path: Path, script: Script, mode: str, world: World, user: str) -> Outcome:
    """One run of an agent whose tools nobody declared, ``user`` in the run's context."""

    @tool
    def account_balance(runtime: ToolRuntime[UserContext]) -> str:
        """The signed-in user's account balance."""
        return world.account_balance(runtime.context.user)

    dep = deployment(tmp_path)
    agent = create_agent(
        make_model(script),
        [tool(world.bash), tool(world.edit_file), account_balance],
        middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")],
        context_schema=UserContext,
    )
    state = {"messages": [HumanMessage("Please help.")]}
    ctx = UserContext(user)
    try:
        out = (
            agent.invoke(state, context=ctx)
            if mode == "sync"
            else asyncio.run(agent.ainvoke(state, context=ctx))
        )
    finally:
        dep.close()
    messages = out["messages"]
    return Outcome(
        output=str(messages[-1].content),
        observations=[str(m.content) for m in messages if isinstance(m, ToolMessage)],
        effects=world.effects,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(WORLD_SCENARIOS))
def test_undeclared_tools(tmp_path: Path, scenario: str, mode: str) -> None:
    """Tools nobody declared run every time, for every user (support.adapters.World)."""
    WORLD_SCENARIOS[scenario](tmp_path, run_world, mode)


def test_warnings_reach_the_model_as_messages(tmp_path: Path) -> None:
    effects = Effects()
    dep = deployment(tmp_path)
    seen: list[list[BaseMessage]] = []
    script = Script([[("query_order", {"order_id": "99999"})]], repeat=True)
    model = make_model(script)
    original = model._generate

    def spy(messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        seen.append(list(messages))
        return original(messages, *args, **kwargs)

    object.__setattr__(model, "_generate", spy)
    agent = create_agent(
        model, make_tools(effects), middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")]
    )
    out = agent.invoke({"messages": [HumanMessage("Where is my order 99999?")]})
    dep.close()
    role = HumanMessage if dep.config.run.warning_role == "user" else SystemMessage

    def is_note(m: BaseMessage) -> bool:
        return isinstance(m, role) and str(m.content).startswith("[loopwarden] ")

    notes = [m for m in seen[-1] if is_note(m)]
    assert len(notes) >= 2  # the repeat warning, then the wrap-up instruction
    assert "already made" in str(notes[0].content)
    # kept in the agent's messages, each just before the model's answer to it
    kept = out["messages"]
    for i, m in enumerate(kept):
        if is_note(m):
            assert is_note(kept[i + 1]) or isinstance(kept[i + 1], AIMessage)
    assert [str(m.content) for m in notes] == [str(m.content) for m in kept if is_note(m)]


def test_the_frameworks_own_limit_ends_the_run_with_a_record(tmp_path: Path) -> None:
    from langchain.agents.middleware import ModelCallLimitMiddleware

    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": str(n)})] for n in range(10)])
    agent = create_agent(
        make_model(script),
        make_tools(effects),
        middleware=[
            ModelCallLimitMiddleware(run_limit=2, exit_behavior="end"),
            LoopwardenMiddleware(dep, model_name="gpt-4o-mini"),
        ],
    )
    agent.invoke({"messages": [HumanMessage("Orders?")]})
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and rec["steps"] == 2


def test_a_tool_exception_that_ends_the_agent_is_recorded(tmp_path: Path) -> None:
    dep = deployment(tmp_path)

    @tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        raise RuntimeError("database down")

    script = Script([[("query_order", {"order_id": "1"})]])
    middleware = LoopwardenMiddleware(dep, model_name="gpt-4o-mini")
    agent = create_agent(make_model(script), [query_order], middleware=[middleware])
    with pytest.raises(RuntimeError, match="database down"):
        agent.invoke({"messages": [HumanMessage("Order 1?")]})
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "error" and "database down" in rec["evidence"]["error"]
    assert rec["tools_executed"] == 1
    assert middleware.runs() == []


def test_an_interrupted_tool_resumes_in_the_same_run(tmp_path: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command, interrupt

    effects = Effects()
    dep = deployment(tmp_path)

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order (a person approves it first)."""
        if interrupt({"approve": order_id}) != "yes":
            return "refund declined"
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    script = Script(
        [[("apply_refund", {"order_id": "88231", "reason": "damaged"})]], final="Refunded."
    )
    agent = create_agent(
        make_model(script),
        [apply_refund],
        checkpointer=InMemorySaver(),
        middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")],
    )
    config: Any = {"configurable": {"thread_id": "t1"}}
    first = agent.invoke({"messages": [HumanMessage("Refund 88231")]}, config)
    assert "__interrupt__" in first and effects.counts == {}
    out = agent.invoke(Command(resume="yes"), config)
    dep.close()
    assert effects.counts == {"apply_refund": 1}
    assert out["messages"][-1].content == "Refunded."
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["tools_executed"] == 1
