"""pydantic-ai agents guarded by the ``Loopwarden`` capability, offline.

The model is pydantic-ai's own ``FunctionModel`` playing :class:`support.adapters.Script`
(``AgentInfo.function_tools`` says whether tools are offered); the tools are real
pydantic-ai tools.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage
from support.adapters import (
    REFUND_A as REFUND,
)
from support.adapters import (
    SCENARIOS,
    WORLD_SCENARIOS,
    Effects,
    Outcome,
    Script,
    World,
    deployment,
    only_record,
    records,
)

from loopwarden.adapters.pydantic_ai import Loopwarden


def make_model(script: Script) -> FunctionModel:
    def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        text, calls = script.next(bool(info.function_tools))
        parts: list[Any] = [pm.ToolCallPart(n, a, tool_call_id=i) for n, a, i in calls]
        if text:
            parts.append(pm.TextPart(text))
        p, c = script.usage
        return pm.ModelResponse(parts=parts, usage=RequestUsage(input_tokens=p, output_tokens=c))

    return FunctionModel(respond, model_name="gpt-4o-mini")


def tool_returns(messages: list[pm.ModelMessage]) -> list[str]:
    """The observations the model was given, in order."""
    return [
        p.model_response_str()
        for m in messages
        if isinstance(m, pm.ModelRequest)
        for p in m.parts
        if isinstance(p, pm.ToolReturnPart)
    ]


def make_agent(script: Script, effects: Effects, dep: Any) -> Agent[None, str]:
    agent = Agent(make_model(script), capabilities=[Loopwarden(dep)])

    @agent.tool_plain
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    @agent.tool_plain
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    @agent.tool_plain
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        effects.hit("delete_account")
        return f"account {user} deleted"

    return agent


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any) -> Outcome:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    agent = make_agent(script, effects, dep)
    prompt = "Where is my order 99999?"
    try:
        result = agent.run_sync(prompt) if mode == "sync" else asyncio.run(agent.run(prompt))
    finally:
        dep.close()
    observations = tool_returns(result.all_messages())
    return Outcome(output=result.output, observations=observations, effects=effects)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario(tmp_path: Path, scenario: str, mode: str) -> None:
    check: Callable[..., None] = SCENARIOS[scenario]
    check(tmp_path, run_agent, mode)


def run_world(tmp_path: Path, script: Script, mode: str, world: World, user: str) -> Outcome:
    """One run of an agent whose tools nobody declared, ``user`` as the run's deps."""
    dep = deployment(tmp_path)
    agent: Agent[str, str] = Agent(
        make_model(script), deps_type=str, capabilities=[Loopwarden(dep)]
    )

    agent.tool_plain(world.bash)
    agent.tool_plain(world.edit_file)

    @agent.tool
    def account_balance(ctx: RunContext[str]) -> str:
        """The signed-in user's account balance."""
        return world.account_balance(ctx.deps)

    try:
        result = (
            agent.run_sync("Please help.", deps=user)
            if mode == "sync"
            else asyncio.run(agent.run("Please help.", deps=user))
        )
    finally:
        dep.close()
    observations = tool_returns(result.all_messages())
    return Outcome(output=result.output, observations=observations, effects=world.effects)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(WORLD_SCENARIOS))
def test_undeclared_tools(tmp_path: Path, scenario: str, mode: str) -> None:
    """Tools nobody declared run every time, for every user (support.adapters.World)."""
    WORLD_SCENARIOS[scenario](tmp_path, run_world, mode)


def test_each_run_is_its_own_loopwarden_run(tmp_path: Path) -> None:
    """One agent (one capability object), two runs: two records, per-run state apart."""
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": "1"})]])
    agent = make_agent(script, effects, dep)
    first = agent.run_sync("Order 1?")
    script._turn = 0  # the same lookup again, in a new run
    second = agent.run_sync("Order 1 again?")
    dep.close()
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer", "final_answer"]
    assert recs[0]["run_id"] != recs[1]["run_id"]
    assert effects.counts == {"query_order": 2}  # not a repeat: a new run
    assert first.output == second.output


def test_refused_arguments_do_not_hold_up_the_next_call(tmp_path: Path) -> None:
    """pydantic-ai refuses the first call's arguments (a retry prompt) and never runs it; the
    second call of the same answer runs at once, and the record says what happened."""
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order": "99999"}), REFUND]], final="Refunded.")
    agent = make_agent(script, effects, dep)
    result = agent.run_sync("Refund 88231, and where is 99999?")
    dep.close()
    assert effects.counts == {"apply_refund": 1} and result.output == "Refunded."
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer"
    (note,) = rec["evidence"]["adapter"]
    assert "not run by the framework: arguments refused" in note


def test_a_side_effect_runs_once_across_runs(tmp_path: Path) -> None:
    """The deployment's shared ledger holds for framework runs too: the same refund asked for
    in a second run (a second conversation) is answered from the first."""
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[REFUND]], final="Refunded.")
    agent = make_agent(script, effects, dep)
    agent.run_sync("Refund 88231")
    script._turn = 0
    second = agent.run_sync("Refund 88231, please")
    dep.close()
    assert effects.counts == {"apply_refund": 1}
    replayed = [
        p.model_response_str()
        for m in second.all_messages()
        if isinstance(m, pm.ModelRequest)
        for p in m.parts
        if isinstance(p, pm.ToolReturnPart)
    ]
    assert "refund #1 created" in replayed[0] and len(records(tmp_path)) == 2
