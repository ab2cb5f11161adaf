"""terminal_tool: the first successful call of a terminal tool ends the run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.budgets import config, scenario

from loopwarden import ConfigError, Deployment, Stop
from loopwarden.demo import shop_tools
from loopwarden.demo.shop import Shop, default_data_dir
from loopwarden.engine.pluginmanager import load_plugins
from loopwarden.plugins.terminal_tool import TerminalTool, TerminalToolSettings
from loopwarden.testing import make_run, make_tool_call, make_tool_result, tool_call, turn


def plugin(**settings: Any) -> TerminalTool:
    return TerminalTool(TerminalToolSettings.model_validate(settings))


@pytest.fixture
def handoff_tool() -> Any:
    return Shop().tools().get("transfer_to_human")


def test_a_successful_terminal_call_stops_hard_with_its_observation(handoff_tool: Any) -> None:
    run = make_run(tools=[handoff_tool], step=3)
    c = make_tool_call("transfer_to_human", reason="refund", run=run, index=1)
    v = plugin().after_tool(run, c, make_tool_result('{"ticket_id": "H00001"}'))
    assert isinstance(v, Stop) and v.reason == "terminal_tool" and not v.soft
    assert v.plugin == "terminal_tool"
    assert v.answer == '{"ticket_id": "H00001"}'
    assert v.evidence == {
        "tool": "transfer_to_human",
        "step": 3,
        "call_index": 1,
        "declared_terminal": True,
        "observation": '{"ticket_id": "H00001"}',
    }


def test_failed_or_skipped_calls_do_not_end_the_run(handoff_tool: Any) -> None:
    run = make_run(tools=[handoff_tool])
    c = make_tool_call("transfer_to_human", reason="refund", run=run)
    assert (
        plugin().after_tool(
            run, c, make_tool_result("503 unavailable", error="tool_error", retryable=True)
        )
        is None
    )
    assert (
        plugin().after_tool(run, c, make_tool_result("skipped", skipped=True, skipped_by="other"))
        is None
    )


def test_other_tools_do_not_end_the_run() -> None:
    assert (
        plugin().after_tool(make_run(), make_tool_call("query_order"), make_tool_result()) is None
    )


def test_extra_names_and_a_custom_answer() -> None:
    p = plugin(tools=["mark_done"], answer="已完成（{tool}）：{observation}", max_evidence_chars=3)
    v = p.after_tool(make_run(), make_tool_call("mark_done"), make_tool_result("done!"))
    assert isinstance(v, Stop) and v.answer == "已完成（mark_done）：done!"
    assert v.evidence["declared_terminal"] is False and v.evidence["observation"] == "don"


def test_bad_answer_template_fails_at_load_time() -> None:
    with pytest.raises(ConfigError, match=r"plugins\.terminal_tool.*answer"):
        load_plugins(config("terminal_tool", terminal_tool={"answer": "{result}"}))


def _handoffs() -> list[tuple[str, ...]]:
    with Shop(default_data_dir() / "shop.sqlite3").connect() as c:
        return c.execute("SELECT ticket_id, reason FROM handoffs").fetchall()


def test_transfer_loop_ends_after_the_first_success() -> None:
    dep = Deployment(config("terminal_tool"), tools=shop_tools())
    run = dep.run(scenario="transfer-loop")
    rec = run.record()
    assert rec["termination"] == "terminal_tool" and rec["soft"] is False
    assert rec["stopped_by"] == "terminal_tool"
    assert rec["steps"] == 2 and rec["tools_executed"] == 2
    assert rec["final_answer_present"] is True
    answer = json.loads(rec["final_answer"])
    assert answer["status"] == "已转接人工客服"
    assert rec["evidence"]["tool"] == "transfer_to_human" and rec["evidence"]["step"] == 2
    assert len(_handoffs()) == 1


def test_a_failed_handoff_lets_the_run_go_on() -> None:
    sc = scenario(
        [
            turn(None, tool_call("transfer_to_human", reason="用户要求")),
            turn(None, tool_call("query_order", order_id="88231")),
        ],
        then="final",
        tools={"transfer_to_human": {"results": [{"error": "503 unavailable", "retryable": True}]}},
    )
    rec = Deployment(config("terminal_tool"), tools=shop_tools()).run(scenario=sc).record()
    assert rec["termination"] == "final_answer"


def test_parallel_calls_after_the_terminal_one_do_not_run() -> None:
    sc = scenario(
        [
            turn(
                None,
                tool_call("transfer_to_human", reason="投诉"),
                tool_call("apply_refund", order_id="88231", reason="七天无理由退货"),
            )
        ]
    )
    run = Deployment(config("terminal_tool"), tools=shop_tools()).run(scenario=sc)
    rec = run.record()
    assert rec["termination"] == "terminal_tool" and rec["tools_executed"] == 1
    assert Shop(default_data_dir() / "shop.sqlite3").refunds() == []
    tool_messages = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert tool_messages[1].startswith("NOT EXECUTED")
