"""Tests of the allow-list plugin, written only against loopwarden.testing.

The tools are declared here: a small order desk whose refunds are recorded in a list, so a
test can tell whether the side effect happened."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

import pytest
from loopwarden_allowlist import Allowlist

from loopwarden.testing import (
    ScriptedModel,
    call_hook,
    make_run,
    make_tool,
    make_tool_call,
    run_plugin,
    script,
    tool_call,
    turn,
)

REFUND = tool_call("apply_refund", order_id="88231", reason="七天无理由退货")
LOOKUP = tool_call("query_order", order_id="88231")


def desk(refunds: list[dict[str, Any]] | None = None) -> list[Any]:
    """Two read-only lookups, a refund (a side effect, appended to ``refunds``) and a
    hand-off to a human (terminal)."""
    done = refunds if refunds is not None else []

    def refund(**kwargs: Any) -> str:
        done.append(kwargs)
        return "refund accepted"

    return [
        make_tool("query_order", '{"status": "delivered"}', read_only=True, deterministic=True),
        make_tool("search_knowledge", "7-day returns", read_only=True, deterministic=True),
        make_tool("apply_refund", refund, side_effect=True),
        make_tool("transfer_to_human", "transferred", side_effect=True, terminal=True),
    ]


def desk_run(**kwargs: Any) -> Any:
    return make_run(tools=desk(), **kwargs)


def call(name: str, run: Any = None, **arguments: Any) -> Any:
    """A parsed call of one of the desk's tools."""
    return make_tool_call(name, run=run if run is not None else desk_run(), **arguments)


def refund_model() -> Any:
    """A scripted model that looks the order up, then asks for the refund."""
    return ScriptedModel(
        script([turn("先查订单", LOOKUP), turn("退款", REFUND)], final_text="已退款")
    )


# -- one hook at a time ----------------------------------------------------------------------


def test_read_only_tools_pass_by_default() -> None:
    assert (
        call_hook(Allowlist, "before_tool", run=desk_run(), call=call("query_order", order_id="1"))
        is None
    )


def test_a_side_effect_outside_the_list_is_skipped_with_an_explanation() -> None:
    verdict = call_hook(
        Allowlist,
        "before_tool",
        settings={"allowed": ["search_*"]},
        run=desk_run(),
        call=call("apply_refund", order_id="88231", reason="x"),
    )
    assert verdict.kind == "skip"
    assert verdict.plugin == "allowlist"
    assert "apply_refund" in verdict.observation
    # the observation names what *is* allowed: read-only tools and the listed pattern's matches
    assert "search_knowledge" in verdict.observation
    assert "query_order" in verdict.observation
    assert verdict.evidence["refused"] == 1


def test_patterns_allow_matching_tools() -> None:
    assert (
        call_hook(
            Allowlist,
            "before_tool",
            settings={"allowed": ["apply_*"]},
            call=call("apply_refund", order_id="1", reason="x"),
        )
        is None
    )


def test_read_only_tools_can_be_refused_too() -> None:
    verdict = call_hook(
        Allowlist,
        "before_tool",
        settings={"allow_read_only": False},
        call=call("query_order", order_id="88231"),
    )
    assert verdict.kind == "skip"
    assert "(none)" in verdict.observation


def test_the_refusal_after_max_refusals_stops_the_run_softly() -> None:
    plugin = Allowlist(Allowlist.Settings(max_refusals=1))
    run = desk_run()
    refund = call("apply_refund", run, order_id="88231", reason="x")
    first = plugin.before_tool(run, refund)
    second = plugin.before_tool(run, refund)
    assert first is not None and first.kind == "skip"
    assert second is not None and second.kind == "stop"
    assert (second.reason, second.soft) == ("tool_not_allowed", True)
    assert second.message == "The agent called tools outside the allow-list 2 times."


def test_refusals_are_counted_per_run_not_per_plugin() -> None:
    plugin = Allowlist(Allowlist.Settings(max_refusals=0))
    busy, fresh = desk_run(run_id="busy"), desk_run(run_id="fresh")
    refund = call("apply_refund", busy, order_id="88231", reason="x")
    first = plugin.before_tool(busy, refund)
    assert first is not None and first.kind == "stop"
    # one plugin object serves many runs: the other run starts from zero
    other = plugin.before_tool(fresh, call("transfer_to_human", fresh, reason="x"))
    assert other is not None and other.kind == "stop"
    assert plugin.state(busy).refused == 1
    assert plugin.state(fresh).refused == 1


def test_unknown_tools_are_refused_like_any_other() -> None:
    run = make_run(tools=[make_tool("lookup", read_only=True)])
    verdict = call_hook(Allowlist, "before_tool", run=run, call=make_tool_call("rm_rf", run=run))
    assert verdict.kind == "skip"
    assert "Use only these tools: lookup;" in verdict.observation


def test_bad_templates_fail_when_the_config_loads() -> None:
    with pytest.raises(Exception, match=r"plugins\.allowlist\.refusal"):
        call_hook(
            Allowlist,
            "before_tool",
            settings={"refusal": "no {tool} here"},
            call=call("query_order", order_id="1"),
        )


# -- a whole run -------------------------------------------------------------------------------


def test_a_model_that_insists_on_a_refund_never_gets_one() -> None:
    refunds: list[dict[str, Any]] = []
    result = run_plugin(
        Allowlist,
        tools=desk(refunds),
        turns=[turn("我先查订单", LOOKUP), turn("直接退款", REFUND)],
        then="repeat_last",
        final_text="抱歉，我无法直接办理退款，已为您记录。",
    )
    assert result.termination == "tool_not_allowed"
    assert result.record["soft"] is True
    assert result.record["stopped_by"] == "allowlist"
    assert result.record["final_answer"] == "抱歉，我无法直接办理退款，已为您记录。"
    assert [v.kind for v in result.verdicts] == ["skip", "skip", "stop"]
    assert result.executed == ["query_order"]
    assert refunds == []  # the side effect never happened
    # the plugin's own field in the run record (the record_fields hook)
    assert result.record["refused_calls"] == 3
    # the model saw why: the refusal is the tool observation of each refused call
    observations = [c.result.content for c in result.hooks.getcalls("after_tool")]
    assert sum("NOT ALLOWED: apply_refund" in o for o in observations) == 2


def test_allowed_runs_are_untouched() -> None:
    refunds: list[dict[str, Any]] = []
    result = run_plugin(
        Allowlist,
        tools=desk(refunds),
        settings={"allowed": ["apply_refund"]},
        turns=[turn("退款", REFUND)],
        final_text="已退款",
    )
    assert result.termination == "final_answer"
    assert result.verdicts == []
    assert len(refunds) == 1
    assert result.record["refused_calls"] == 0


# -- as an installed distribution --------------------------------------------------------------


def test_the_installed_entry_point_is_found_by_name() -> None:
    dist = metadata.distribution("loopwarden-allowlist")
    result = run_plugin(
        "allowlist", settings={"max_refusals": 0}, tools=desk(), turns=[turn("退款", REFUND)]
    )
    (row,) = [r for r in result.deployment.plugins.describe() if r["name"] == "allowlist"]
    assert row["source"] == f"entry point (loopwarden-allowlist {dist.version})"
    assert row["hooks"] == ["before_tool", "record_fields"]
    assert result.termination == "tool_not_allowed"


def test_configured_position_is_the_call_order(
    lw_deployment: Callable[..., Any], lw_hooks: Callable[[Any], Any]
) -> None:
    dep = lw_deployment({"plugins": {"enabled": ["allowlist", "max_steps"]}}, tools=desk())
    assert dep.plugins.names == ["allowlist", "max_steps"]
    assert dep.plugins.call_order("before_tool") == ["allowlist"]
    recorder = lw_hooks(dep)
    dep.run("退款", model=refund_model())
    assert "before_tool" in recorder.names


def test_fixtures_record_signals(lw_deployment: Callable[..., Any], lw_signals: Any) -> None:
    dep = lw_deployment(
        {"plugins": {"enabled": ["max_steps", "allowlist"], "allowlist": {"max_refusals": 0}}},
        tools=desk(),
    )
    run = dep.run("退款", model=refund_model())
    guard = [r.verdict for r in lw_signals.get("guard-triggered") if r.sender is run]
    assert guard and guard[-1].plugin == "allowlist"
