"""What 0.1 code keeps working in 0.2, with a warning (docs/upgrading.md)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from loopwarden.plugins.cost_budget import RUN_COST, run_cost
from loopwarden.testing import make_run, run_plugin, tool_call, turn


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
