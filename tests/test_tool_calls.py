"""tool_calls: caps per run and per tool; parallel calls counted one by one."""

from __future__ import annotations

from typing import Any

import pytest
from support.budgets import FINAL, config, scenario

from loopwarden import ConfigError, Deployment, Skip, Stop, Warn
from loopwarden.demo import shop_tools
from loopwarden.engine.pluginmanager import load_plugins
from loopwarden.plugins.tool_calls import ToolCalls, ToolCallsSettings
from loopwarden.testing import make_run, make_tool_call, make_tool_result, tool_call, turn


def plugin(**settings: Any) -> ToolCalls:
    return ToolCalls(ToolCallsSettings.model_validate(settings))


def ran(p: ToolCalls, run: Any, n: int, name: str = "query_order") -> None:
    """``n`` calls of ``name`` that passed before_tool and ran."""
    for i in range(n):
        c = make_tool_call(name, index=i)
        assert p.before_tool(run, c) is None
        p.after_tool(run, c, make_tool_result())


# -- hook level: boundaries --------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3, 10])
def test_run_cap_boundaries(limit: int) -> None:
    p = plugin(max_tool_calls=limit, warn_at=None)
    run = make_run()
    ran(p, run, limit - 1)
    assert p.before_tool(run, make_tool_call("query_order")) is None  # call N runs
    p.after_tool(run, make_tool_call("query_order"), make_tool_result())
    v = p.before_tool(run, make_tool_call("query_order"))  # call N+1 does not
    assert isinstance(v, Skip)
    assert v.observation.startswith("ERROR: LIMIT_REACHED: query_order was not executed")
    assert v.evidence == {
        "tool": "query_order",
        "scope": "run",
        "limit": limit,
        "used": limit,
        "refused": 1,
        "run_calls": limit,
        "on_exceed": "continue",
    }


def test_end_stops_the_run() -> None:
    p = plugin(max_tool_calls=2, on_exceed="end", warn_at=None)
    run = make_run()
    ran(p, run, 2)
    v = p.before_tool(run, make_tool_call("query_order"))
    assert isinstance(v, Stop) and v.reason == "max_tool_calls" and v.soft
    assert v.message == "The limit of 2 tool calls per run is reached."
    hard = plugin(max_tool_calls=2, on_exceed="end", soft=False, warn_at=None)
    ran(hard, run, 0)
    hard.state(run).used = 2
    v = hard.before_tool(run, make_tool_call("query_order"))
    assert isinstance(v, Stop) and not v.soft


def test_only_calls_that_ran_count() -> None:
    p = plugin(max_tool_calls=1, warn_at=None)
    run = make_run()
    c = make_tool_call("query_order")
    assert p.before_tool(run, c) is None
    # a later plugin skipped it: nothing ran
    p.after_tool(run, c, make_tool_result("skipped", skipped=True, skipped_by="other"))
    assert p.before_tool(run, make_tool_call("query_order")) is None


def test_the_hint_is_injected_once() -> None:
    p = plugin(max_tool_calls=1, warn_at=None)
    run = make_run()
    ran(p, run, 1)
    first = p.before_tool(run, make_tool_call("query_order"))
    second = p.before_tool(run, make_tool_call("query_order"))
    assert isinstance(first, Skip) and isinstance(second, Skip)
    assert first.message and "Answer from what you already know" in first.message
    assert second.message is None
    assert second.evidence["refused"] == 2


@pytest.mark.parametrize("cap", [1, 2])
def test_per_tool_caps(cap: int) -> None:
    p = plugin(per_tool={"apply_refund": cap}, warn_at=None)
    run = make_run()
    ran(p, run, cap, "apply_refund")
    v = p.before_tool(run, make_tool_call("apply_refund"))
    assert isinstance(v, Skip) and v.evidence["scope"] == "tool" and v.evidence["limit"] == cap
    assert "per tool" in v.observation
    assert p.before_tool(run, make_tool_call("query_order")) is None  # other tools go on


def test_max_per_tool_applies_to_declared_tools_and_per_tool_overrides_it() -> None:
    from loopwarden.demo.shop import Shop

    tools = Shop().tools()
    p = plugin(max_per_tool=1, per_tool={"search_knowledge": 3}, warn_at=None)
    run = make_run(tools=tools)
    c = make_tool_call("query_order", order_id="88231", run=run)
    assert p.before_tool(run, c) is None
    p.after_tool(run, c, make_tool_result())
    assert isinstance(
        p.before_tool(run, make_tool_call("query_order", order_id="88231", run=run)), Skip
    )
    for _ in range(3):
        c = make_tool_call("search_knowledge", query="refund", run=run)
        assert p.before_tool(run, c) is None
        p.after_tool(run, c, make_tool_result())
    assert isinstance(
        p.before_tool(run, make_tool_call("search_knowledge", query="refund", run=run)), Skip
    )
    # an undeclared name is not tracked per tool (bounded state): only the run cap applies
    assert p.tool_cap(make_tool_call("made_up")) is None


def test_warns_once_at_70_percent() -> None:
    p = plugin(max_tool_calls=10, warn_at=0.7)
    run = make_run()
    verdicts = []
    for i in range(10):
        c = make_tool_call("query_order", index=i)
        p.before_tool(run, c)
        verdicts.append(p.after_tool(run, c, make_tool_result()))
    warns = [(i + 1, v) for i, v in enumerate(verdicts) if v is not None]
    assert len(warns) == 1 and warns[0][0] == 7
    assert isinstance(warns[0][1], Warn)
    assert warns[0][1].message.startswith("You have used 7 of 10 tool calls for this run.")


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"plugins\.tool_calls"):
        load_plugins(config("tool_calls", tool_calls={"per_tool": {"apply_refund": 0}}))
    with pytest.raises(ConfigError, match=r"plugins\.tool_calls\.on_exceed"):
        load_plugins(config("tool_calls", tool_calls={"on_exceed": "explode"}))


# -- end to end: parallel calls ----------------------------------------------------------------


def _parallel(n: int) -> list[dict[str, Any]]:
    return [tool_call("search_knowledge", query=f"问题 {i}") for i in range(n)]


def test_parallel_calls_past_the_cap_get_an_error_and_the_run_goes_on() -> None:
    sc = scenario([turn("一次查五个", *_parallel(5))], then="final")
    dep = Deployment(
        config("tool_calls", tool_calls={"max_tool_calls": 3, "warn_at": None}), tools=shop_tools()
    )
    run = dep.run(scenario=sc)
    rec = run.record()
    assert rec["termination"] == "final_answer" and rec["final_answer"] == FINAL
    assert rec["tool_calls"] == 5 and rec["tools_executed"] == 3
    observations = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert [o.startswith("ERROR: LIMIT_REACHED") for o in observations] == [
        False,
        False,
        False,
        True,
        True,
    ]
    assert [w["plugin"] for w in rec["warnings"]] == ["tool_calls"]  # the hint, once


def test_parallel_calls_past_the_cap_end_the_run() -> None:
    sc = scenario([turn("一次查五个", *_parallel(5))], then="final")
    dep = Deployment(
        config("tool_calls", tool_calls={"max_tool_calls": 3, "on_exceed": "end", "warn_at": None}),
        tools=shop_tools(),
    )
    run = dep.run(scenario=sc)
    rec = run.record()
    assert rec["termination"] == "max_tool_calls" and rec["soft"] is True
    assert rec["stopped_by"] == "tool_calls" and rec["tools_executed"] == 3
    assert rec["evidence"]["limit"] == 3 and rec["evidence"]["run_calls"] == 3
    assert rec["final_answer"] == FINAL and rec["final_answer_present"]
    observations = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert len(observations) == 5 and all(o.startswith("NOT EXECUTED") for o in observations[3:])


def test_a_run_cap_across_turns() -> None:
    sc = scenario(
        [turn(None, tool_call("search_knowledge", query=f"q{i}")) for i in range(6)], then="final"
    )
    dep = Deployment(
        config("tool_calls", tool_calls={"max_tool_calls": 4, "on_exceed": "end", "warn_at": 0.7}),
        tools=shop_tools(),
    )
    rec = dep.run(scenario=sc).record()
    assert rec["termination"] == "max_tool_calls" and rec["tools_executed"] == 4
    assert rec["warnings"][0]["plugin"] == "tool_calls"  # 3 of 4 (70% rounded up)
    assert rec["warnings"][0]["message"].startswith("You have used 3 of 4 tool calls")


def test_parse_calls_is_the_loops_own_parser() -> None:
    from loopwarden.engine.loop import parse_calls
    from loopwarden.events import ModelResponse, ProposedCall

    run = make_run(tools=shop_tools())
    response = ModelResponse(
        tool_calls=[
            ProposedCall(id="a", name="query_order", arguments='{"order_id": "88231"}'),
            ProposedCall(id="b", name="no_such_tool", arguments="{}"),
            ProposedCall(id="c", name="query_order", arguments="{not json"),
        ]
    )
    ok, unknown, malformed = parse_calls(run, response)
    assert (ok.error, ok.arguments, ok.index) == (None, {"order_id": "88231"}, 0)
    assert ok.fingerprint == parse_calls(run, response)[0].fingerprint  # stable
    assert unknown.error == "unknown_tool" and malformed.error == "malformed_arguments"
