"""The engine by turn: a model-turn and a tool-turn unit, and tool calls that go from the
driver to execution directly (an Engine subclass that wraps tool execution still does)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.calls import count_calls

from loopwarden import Deployment
from loopwarden.config import parse_config
from loopwarden.engine.calls import ModelTurn
from loopwarden.engine.effects import CallModel, RunTool
from loopwarden.engine.guards import Guards
from loopwarden.engine.loop import Engine, wraps_tools
from loopwarden.engine.toolturn import ToolTurn
from loopwarden.events import ModelResponse, ProposedCall, ToolResult
from loopwarden.fingerprint import AnswerMasks, Fingerprinter
from loopwarden.testing import ScriptedModel, make_tool, script, tool_call, turn
from loopwarden.tools import ToolRegistry


def _deployment() -> Deployment:
    probe = make_tool("probe", "ok")
    return Deployment(parse_config({}, path="<test>"), tools=ToolRegistry([probe]))


def _model() -> ScriptedModel:
    return ScriptedModel(script([turn("a", tool_call("probe"))], final_text="done"))


class Tracing(Engine):
    """An Engine subclass that wraps tool execution, as 0.1 allowed."""

    wrapped: list[str]

    def run_tool_sync(self, eff: RunTool, run: Any) -> ToolResult:
        self.wrapped.append("sync:" + eff.call.name)
        return super().run_tool_sync(eff, run)

    async def run_tool_async(self, eff: RunTool, run: Any) -> ToolResult:
        self.wrapped.append("async:" + eff.call.name)
        return await super().run_tool_async(eff, run)


def test_only_an_engine_subclass_that_overrides_tool_execution_wraps_it() -> None:
    with _deployment() as dep:
        assert not wraps_tools(dep.engine) and not wraps_tools(dep.engine, is_async=True)
        tracing = Tracing(dep.hooks, dep.config.run)
        assert wraps_tools(tracing) and wraps_tools(tracing, is_async=True)


def test_a_plain_engine_hands_tool_calls_from_the_driver_to_execution_directly() -> None:
    with _deployment() as dep:
        run, counts = count_calls(lambda: dep.run("q", model=_model()))
    assert run.outcome is not None and run.outcome.termination == "final_answer"
    assert run.tools_executed == 1
    assert counts["execution.py:run_tool_sync <- drivers.py:drive"] == 1
    assert counts.get("loop.py:run_tool_sync", 0) == 0  # no forwarding method on the way


@pytest.mark.parametrize("how", ["run", "arun", "stream", "astream"])
def test_every_driver_runs_tools_through_a_subclass_that_wraps_them(how: str) -> None:
    with _deployment() as dep:
        engine = dep.engine = Tracing(dep.hooks, dep.config.run)
        engine.wrapped = []
        if how == "run":
            run = dep.run("q", model=_model())
        elif how == "arun":
            run = asyncio.run(dep.arun("q", model=_model()))
        elif how == "stream":
            end = list(dep.stream("q", model=_model()))[-1]
            run = end.run  # type: ignore[attr-defined]
        else:

            async def collect() -> list[Any]:
                return [e async for e in dep.astream("q", model=_model())]

            run = asyncio.run(collect())[-1].run
        kind = "async" if how.startswith("a") else "sync"
        assert engine.wrapped == [f"{kind}:probe"]
        assert run.outcome.termination == "final_answer"


def test_the_model_turn_checks_and_parses_the_response_within_itself() -> None:
    # the machine enters the model turn's module once per turn (the turn itself), never for
    # its checks and parsing: no loop <-> calls back and forth within one model turn
    with _deployment() as dep:
        _, counts = count_calls(lambda: dep.run("q", model=_model()))
    from_loop = {
        k.split(" <- ")[0] for k in counts if " <- loop.py:" in k and k.startswith("calls")
    }
    assert from_loop == {"calls.py:__call__"}
    assert counts["calls.py:parse_proposals <- calls.py:__call__"] == 2  # one per model turn
    assert counts["calls.py:well_formed <- calls.py:__call__"] == 2


def test_the_turns_run_over_what_they_are_given_without_an_engine() -> None:
    with _deployment() as dep:
        settings = dep.config.run
        guards = Guards(dep.hooks, settings, ())
        model_turn = ModelTurn(guards, Fingerprinter(settings.volatile_keys))
        tool_turn = ToolTurn(guards, AnswerMasks(settings.volatile_patterns))
        run, _ = dep.prepare("q", model=_model())
        gen = model_turn(run)
        eff = next(gen)
        assert isinstance(eff, CallModel) and eff.request.step == 1
        response = ModelResponse(
            content="a", tool_calls=[ProposedCall(id="c1", name="probe", arguments="{}")]
        )
        with pytest.raises(StopIteration) as turned:
            gen.send(response)
        calls = turned.value.value
        assert [c.name for c in calls] == ["probe"] and calls[0].error is None
        tools = tool_turn(run, calls, {}, {})
        eff = next(tools)
        assert isinstance(eff, RunTool) and eff.call is calls[0]
        with pytest.raises(StopIteration) as done:
            tools.send(ToolResult(content="ok"))
        assert done.value.value is None  # the run goes on
        assert run.messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": "ok"}
        assert run.step == 1 and run.tools_executed == 1
