"""OpenAI Agents SDK runs guarded by ``LoopwardenRunner``, offline.

The model is the SDK's own ``agents.testing.ScriptedModel`` whose steps respond from the
recorded call (``ModelCall.tools`` says whether tools are offered), playing
:class:`support.adapters.Script`; the tools are real SDK function tools.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, RunContextWrapper, function_tool
from agents.items import ItemHelpers, ToolCallOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
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

from loopwarden.adapters.openai_agents import LoopwardenRunner


def make_model(script: Script) -> ScriptedModel:
    def respond(call: ModelCall) -> ModelStep:
        text, calls = script.next(bool(call.tools))
        output: list[Any] = [function_call(n, a, call_id=i) for n, a, i in calls]
        if text:
            output.append(assistant_message(text))
        p, c = script.usage
        return ModelStep(
            output=output,
            usage=Usage(requests=1, input_tokens=p, output_tokens=c, total_tokens=p + c),
        )

    return ScriptedModel([ModelStep.respond(respond) for _ in range(40)])


def make_agent(script: Script, effects: Effects) -> Agent[Any]:
    @function_tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    @function_tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    @function_tool
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        effects.hit("delete_account")
        return f"account {user} deleted"

    return Agent(
        name="shop",
        instructions="Help the customer.",
        model=make_model(script),
        tools=[query_order, apply_refund, delete_account],
    )


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any) -> Outcome:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    agent = make_agent(script, effects)
    prompt = "Where is my order 99999?"
    config = RunConfig(tracing_disabled=True)
    try:
        result = (
            runner.run_sync(agent, prompt, run_config=config)
            if mode == "sync"
            else asyncio.run(runner.run(agent, prompt, run_config=config))
        )
    finally:
        dep.close()
    observations = [
        str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
    ]
    assert ItemHelpers.text_message_outputs(result.new_items)
    return Outcome(output=str(result.final_output), observations=observations, effects=effects)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario(tmp_path: Path, scenario: str, mode: str) -> None:
    check: Callable[..., None] = SCENARIOS[scenario]
    check(tmp_path, run_agent, mode)


@dataclass
class UserContext:
    user: str


def run_world(tmp_path: Path, script: Script, mode: str, world: World, user: str) -> Outcome:
    """One run of an agent whose tools nobody declared, ``user`` in the SDK's run context."""

    @function_tool
    def account_balance(ctx: RunContextWrapper[UserContext]) -> str:
        """The signed-in user's account balance."""
        return world.account_balance(ctx.context.user)

    agent: Agent[UserContext] = Agent(
        name="helper",
        instructions="Help the user.",
        model=make_model(script),
        tools=[function_tool(world.bash), function_tool(world.edit_file), account_balance],
    )
    dep = deployment(tmp_path)
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    kwargs: dict[str, Any] = dict(
        context=UserContext(user), run_config=RunConfig(tracing_disabled=True)
    )
    try:
        result = (
            runner.run_sync(agent, "Please help.", **kwargs)
            if mode == "sync"
            else asyncio.run(runner.run(agent, "Please help.", **kwargs))
        )
    finally:
        dep.close()
    observations = [
        str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
    ]
    return Outcome(
        output=str(result.final_output), observations=observations, effects=world.effects
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(WORLD_SCENARIOS))
def test_undeclared_tools(tmp_path: Path, scenario: str, mode: str) -> None:
    """Tools nobody declared run every time, for every user (support.adapters.World)."""
    WORLD_SCENARIOS[scenario](tmp_path, run_world, mode)


def test_the_sdks_max_turns_ends_the_run_with_a_record(tmp_path: Path) -> None:
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": str(n)})] for n in range(10)])
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    result = runner.run_sync(
        make_agent(script, effects),
        "Orders?",
        max_turns=2,
        run_config=RunConfig(tracing_disabled=True),
    )
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and "max_turns" in rec["evidence"]["detail"]
    assert result.final_output == rec["final_answer"]
    assert runner.last_run is not None and runner.last_run.record()["run_id"] == rec["run_id"]


def test_a_model_error_is_recorded_and_raised(tmp_path: Path) -> None:
    dep = deployment(tmp_path)
    agent = Agent(name="shop", model=ScriptedModel([ModelStep.raise_error(RuntimeError("boom"))]))
    with pytest.raises(RuntimeError, match="boom"):
        LoopwardenRunner(dep, model_name="gpt-4o-mini").run_sync(
            agent, "Hi", run_config=RunConfig(tracing_disabled=True)
        )
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "model_error" and "boom" in rec["evidence"]["error"]


def test_notes_reach_the_model_input(tmp_path: Path) -> None:
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": "99999"})]], repeat=True)
    agent = make_agent(script, effects)
    model = agent.model
    assert isinstance(model, ScriptedModel)
    LoopwardenRunner(dep, model_name="gpt-4o-mini").run_sync(
        agent, "Where?", run_config=RunConfig(tracing_disabled=True)
    )
    dep.close()
    last = model.calls[-1]
    notes = [
        i["content"]
        for i in last.input
        if isinstance(i, dict) and str(i.get("content", "")).startswith("[loopwarden] ")
    ]
    assert notes and "Stop calling tools" in notes[-1]
    assert last.tools == [] and last.handoffs == []
