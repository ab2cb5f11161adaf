"""What every adapter shares: lazy imports, ``[tools.<name>]`` natures, the driver's contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.adapters import deployment

from loopwarden.adapters._driver import Answer, Execute, GuardedRun
from loopwarden.config import parse_config
from loopwarden.events import ModelResponse, ProposedCall, ToolResult, Usage
from loopwarden.exceptions import ConfigError

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "agents", "pydantic_ai")


def test_import_loopwarden_imports_no_framework() -> None:
    code = (
        "import sys, json, loopwarden, loopwarden.adapters\n"
        "from loopwarden import Deployment\n"
        "from loopwarden.adapters import _driver\n"
        "Deployment(tools=[]).run(scenario='always-not-found')\n"
        f"print(json.dumps(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_tool_natures_come_from_config_and_the_adapter_argument(tmp_path: Path) -> None:
    dep = deployment(tmp_path)  # [tools.apply_refund] side_effect, idempotency_keys order_id
    g = GuardedRun(
        dep,
        user="hi",
        natures={
            "query_order": {"deterministic": False},
            "apply_refund": {"retryable": True},
            "lookup": {"read_only": True},
        },
    )
    g.declare("apply_refund")
    g.declare("query_order")
    g.declare("get_weather")
    g.declare("lookup")  # by name a side effect; declared read-only below
    tools = g.run.tools
    assert tools is not None
    refund, query, weather = (tools.get(n) for n in ("apply_refund", "query_order", "get_weather"))
    assert refund is not None and query is not None and weather is not None
    assert refund.side_effect and refund.idempotency_keys == ("order_id",)
    assert refund.is_retryable(RuntimeError("429"))  # the adapter argument adds to the table
    assert query.read_only and not query.deterministic  # declared, then overridden
    # undeclared: no flag asserted (it runs every time); its name only weighs detectors
    assert not (weather.read_only or weather.deterministic or weather.side_effect)
    assert not weather.declared and weather.likely_read_only
    lookup = tools.get("lookup")
    assert lookup is not None and lookup.read_only and not lookup.side_effect  # consistent
    g.finish()
    dep.close()


def test_a_bad_tools_table_names_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"tools": {"refund": {"side_efect": True}}}, path="c.toml")
    assert "tools.refund.side_efect" in str(err.value)
    cfg = parse_config(
        {"tools": {"refund": {"side_effect": True, "idempotency_keys": ["order_id"]}}}
    )
    assert cfg.tools["refund"].idempotency_keys == ["order_id"]


def test_the_driver_follows_the_machine(tmp_path: Path) -> None:
    """The framework-neutral contract, call by call: a model turn, two proposed calls (the
    second waits for the first), a final answer, a record."""
    dep = deployment(tmp_path)
    g = GuardedRun(dep, user="refund order 1", model_name="gpt-4o-mini")
    g.declare("apply_refund")
    request = g.model_turn()
    assert request is not None and not request.final and request.step == 1
    assert g.model_turn() is request  # asked twice (before_model, then the call): one turn
    calls = [
        ProposedCall("apply_refund", {"order_id": "1", "reason": r}, f"c{i}")
        for i, r in enumerate(("a", "b"))
    ]
    g.model_done(ModelResponse(content=None, tool_calls=calls, usage=Usage(10, 5)))
    assert g._decide("c1") is None  # the second waits for the first
    assert g.tool("c0") == Execute("c0")
    assert g.tool("c0") == Answer(
        "NOT EXECUTED: the run is stopping (this call is already running)."
    )
    g.tool_done("c0", ToolResult(content="refunded"))
    second = g.tool("c1")
    assert isinstance(second, Answer) and "was not executed again" in second.text
    assert g.model_turn() is not None
    g.model_done(ModelResponse(content="Done.", usage=Usage(20, 5)))
    assert g.finished and not g.replaced and g.final_answer == "Done."
    record = g.run.record()
    assert record["termination"] == "final_answer" and record["tools_executed"] == 1
    assert record["tokens"]["total"] == 40
    dep.close()


def test_calls_the_framework_never_ran_are_recorded(tmp_path: Path) -> None:
    dep = deployment(tmp_path)
    g = GuardedRun(dep, user="hi", model_name="gpt-4o-mini")
    g.declare("query_order")
    g.model_turn()
    g.model_done(ModelResponse(tool_calls=[ProposedCall("query_order", {"order_id": "1"}, "x")]))
    assert g.model_turn() is not None  # the framework went back to its model without the tool
    g.finish(detail="stopped by the test")
    rec = g.run.record()
    assert rec["termination"] == "ended_by_framework"
    assert rec["evidence"]["adapter"] == ["query_order (x) was not run by the framework"]
    dep.close()


def test_call_ids_may_repeat_from_one_answer_to_the_next(tmp_path: Path) -> None:
    dep = deployment(tmp_path)
    g = GuardedRun(dep, user="hi", model_name="gpt-4o-mini")
    g.declare("query_order")
    for order in ("1", "2"):
        g.model_turn()
        g.model_done(
            ModelResponse(tool_calls=[ProposedCall("query_order", {"order_id": order}, "call_0")])
        )
        assert g.tool("call_0") == Execute("call_0")
        g.tool_done("call_0", ToolResult(content=f"order {order}: shipped"))
    assert g.run.tools_executed == 2
    g.finish()
    dep.close()


def test_a_call_the_framework_never_starts_does_not_hold_up_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from loopwarden.adapters import _driver

    monkeypatch.setattr(_driver, "GRACE_S", 0.05)
    dep = deployment(tmp_path)
    g = GuardedRun(dep, user="hi", model_name="gpt-4o-mini")
    g.declare("query_order")
    g.model_turn()
    g.model_done(
        ModelResponse(
            tool_calls=[
                ProposedCall("query_order", {"order_id": str(n)}, f"c{n}") for n in range(3)
            ]
        )
    )
    assert g.tool("c1") == Execute("c1")  # c0 never started: abandoned after the grace
    g.tool_done("c1", ToolResult(content="ok"))
    assert asyncio.run(g.atool("c2")) == Execute("c2")
    g.tool_done("c2", ToolResult(content="ok"))
    late = g.tool("c0")
    assert isinstance(late, Answer) and late.text.startswith("NOT EXECUTED")
    assert g.run.tools_executed == 2
    g.finish()
    dep.close()


def test_a_model_failure_the_framework_retries_does_not_end_the_run(tmp_path: Path) -> None:
    dep = deployment(tmp_path)
    g = GuardedRun(dep, user="hi", model_name="gpt-4o-mini")
    first = g.model_turn()
    g.model_failed(TimeoutError("read timed out"))  # the framework retries the same call
    assert g.model_turn() is first and not g.finished
    g.model_done(ModelResponse(content="Hello.", usage=Usage(10, 2)))
    assert g.run.record()["termination"] == "final_answer"
    g2 = GuardedRun(dep, user="hi", model_name="gpt-4o-mini")
    g2.model_turn()
    err = TimeoutError("read timed out")
    g2.model_failed(err)
    g2.finish(err)  # ...and this time the exception ended the framework's run
    rec = g2.run.record()
    assert rec["termination"] == "model_error" and "read timed out" in rec["evidence"]["error"]
    dep.close()
