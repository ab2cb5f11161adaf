"""What 0.1 code keeps working in 0.2, with a warning (docs/upgrading.md)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from loopwarden.plugins.cost_budget import RUN_COST, run_cost
from loopwarden.testing import make_run, run_plugin, tool_call, turn
from loopwarden.tools import ToolRegistry


def test_run_cost_is_a_deprecated_alias_of_the_plugins_accessor() -> None:
    run = make_run(cost=0.25)
    with pytest.warns(DeprecationWarning, match=r"run_cost\(run\)"):
        assert run.cost == Decimal("0.25") == run_cost(run)
    fresh = make_run()
    with pytest.warns(DeprecationWarning):
        assert fresh.cost == Decimal(0)  # 0 without the plugin, as in 0.1
    assert RUN_COST not in fresh.stash  # reading it stores nothing


def test_run_cost_reads_what_cost_budget_priced() -> None:
    result = run_plugin(
        "cost_budget",
        settings={"max_cost": 10, "prices": {"scripted": {"input": 1.0, "output": 2.0}}},
        turns=[turn("x", tool_call("lookup", q="a"))],
        tool_results={"lookup": ["found"]},
    )
    spent = run_cost(result.run)
    assert spent > 0
    assert result.record["cost"] == float(spent)
    with pytest.warns(DeprecationWarning):
        assert result.run.cost == spent


def test_the_core_never_reads_the_deprecated_alias() -> None:
    # the whole suite runs without a DeprecationWarning from loopwarden's own code paths:
    # here, one full run of the shipped stack with warnings as errors
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        result = run_plugin(
            "cost_budget",
            enabled=["max_steps", "cost_budget", "conversation_limits", "metrics"],
            settings={"max_cost": 10, "prices": {"scripted": {"input": 1.0, "output": 2.0}}},
            turns=[turn("x", tool_call("lookup", q="a"))],
            tool_results={"lookup": ["found"]},
        )
    assert result.termination == "final_answer"


def test_run_cost_can_still_be_set_with_a_warning() -> None:
    run = make_run()
    with pytest.warns(DeprecationWarning, match="RUN_COST"):
        run.cost = Decimal("0.5")  # type: ignore[misc]  # a 0.1 plugin keeping its own spend
    assert run_cost(run) == Decimal("0.5")
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="NoneType"):
        run.cost = None  # type: ignore[misc,assignment]
    assert run_cost(run) == Decimal("0.5")


def test_an_engine_subclass_that_wraps_tool_execution_still_takes_effect() -> None:
    from loopwarden import Deployment
    from loopwarden.config import parse_config
    from loopwarden.engine.loop import Engine, drive
    from loopwarden.testing import ScriptedModel, make_tool, script

    wrapped: list[str] = []

    class Tracing(Engine):
        def run_tool_sync(self, eff: Any, run: Any) -> Any:
            wrapped.append(eff.call.name)
            return super().run_tool_sync(eff, run)

    probe = make_tool("probe", "ok")
    with Deployment(parse_config({}, path="<test>"), tools=ToolRegistry([probe])) as dep:
        run, model = dep.prepare(
            "q", model=ScriptedModel(script([turn("a", tool_call("probe"))], final_text="done"))
        )
        engine = Tracing(dep.hooks, dep.config.run)
        outcome = drive(engine, run, model)
    assert outcome.termination == "final_answer"
    assert wrapped == ["probe"]


def test_a_0_1_driver_still_runs_tools_through_the_engine() -> None:
    """A driver written against 0.1 called ``engine.run_tool_sync(eff, run)`` and
    ``execution.run_tool_sync(engine, eff, run)``: both still work."""
    from loopwarden import Deployment
    from loopwarden.config import parse_config
    from loopwarden.engine import execution
    from loopwarden.engine.loop import CallModel
    from loopwarden.testing import ScriptedModel, make_tool, script

    ran: list[str] = []
    probe = make_tool("probe", lambda **kw: ran.append("x") or "ok")
    turns = [turn("a", tool_call("probe")), turn("b", tool_call("probe"))]
    with Deployment(parse_config({}, path="<test>"), tools=ToolRegistry([probe])) as dep:
        run, model = dep.prepare("q", model=ScriptedModel(script(turns, final_text="done")))
        engine = dep.engine
        gen = engine.machine(run)
        eff = next(gen)
        tools_run = 0
        try:
            while True:
                if isinstance(eff, CallModel):
                    value = model.complete(eff.request)
                elif tools_run == 0:
                    value, tools_run = engine.run_tool_sync(eff, run), 1
                else:
                    value = execution.run_tool_sync(engine, eff, run)
                eff = gen.send(value)
        except StopIteration as done:
            outcome = engine.finish(run, done.value)
    assert outcome.termination == "final_answer"
    assert ran == ["x", "x"]
