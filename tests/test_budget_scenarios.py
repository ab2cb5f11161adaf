"""The budget-and-cap scenarios end as their [expect] says -- through Deployment(config).run
and through ``loopwarden run --scenario FILE --json`` -- and the shipped config lists the
plugins in order with every setting at its default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Config, Deployment, FakeClock
from loopwarden.config import default_config_path, parse_config
from loopwarden.demo import shop_tools
from loopwarden.demo.shop import Shop, default_data_dir
from loopwarden.models.scenario import builtin_scenarios, load_scenario, scenario_path

BUDGET_PLUGINS = [
    "timeout",
    "token_budget",
    "cost_budget",
    "tool_calls",
    "conversation_limits",
    "retry_policy",
    "terminal_tool",
]
SCENARIOS = ["never-finish", "token-flood", "retry-storm", "slow-tool", "transfer-loop"]


def _config_for(name: str, shipped: Config) -> Config:
    """The shipped config; retry-storm also needs repeat_call (another defence line)."""
    if name != "retry-storm":
        return shipped
    pytest.importorskip("loopwarden.plugins.repeat_call")
    if "repeat_call" in shipped.plugins.enabled:
        return shipped
    data = shipped.model_dump(exclude={"path"})
    data["plugins"] = {
        "enabled": [*shipped.plugins.enabled, "repeat_call"],
        "blocked": [],
        **shipped.plugins.tables(),
    }
    return parse_config(data, path="<shipped + repeat_call>")


def _run(name: str, shipped: Config) -> tuple[dict[str, Any], Any]:
    clock = FakeClock()
    run = Deployment(_config_for(name, shipped), clock=clock, tools=shop_tools()).run(
        scenario=scenario_path(name), clock=clock
    )
    return run.record(), run


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_is_shipped_with_expectations(name: str) -> None:
    path = scenario_path(name)
    assert path in builtin_scenarios()
    sc = load_scenario(path)
    assert sc.name == name
    assert sc.expect.termination is not None
    assert sc.expect.healthy is False and sc.expect.onset is not None


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_ends_as_expected(name: str, shipped_config: Config) -> None:
    rec, _ = _run(name, shipped_config)
    expected = load_scenario(scenario_path(name)).expect.termination
    allowed = expected if isinstance(expected, list) else [expected]
    assert rec["termination"] in allowed
    assert rec["stopped_by"] is not None and rec["evidence"]
    assert rec["final_answer"]
    assert rec["cost"] > 0 and rec["cost_currency"] == "USD"  # the scripted model is priced


def test_never_finish(shipped_config: Config) -> None:
    rec, _ = _run("never-finish", shipped_config)
    assert rec["termination"] == "max_steps" and rec["soft"] is True
    assert rec["stopped_by"] == "max_steps" and rec["steps"] == 10
    # the scenario keeps the worked example's tight limits through the "demo" profile
    assert rec["evidence"] == {"limit": 10, "steps": 9, "source": "profile demo"}
    assert rec["final_answer_present"] is True
    assert rec["final_answer"] == load_scenario(scenario_path("never-finish")).model.final_text
    assert {
        "step": 8,
        "plugin": "max_steps",
        "message": "You have 2 step(s) left. Wrap up: answer from what you know.",
    } in (rec["warnings"])


def test_token_flood(shipped_config: Config) -> None:
    rec, run = _run("token-flood", shipped_config)
    assert rec["termination"] == "max_context" and rec["soft"] is True
    assert rec["stopped_by"] == "token_budget"
    ev = rec["evidence"]
    assert ev["limit"] == 8000 and ev["projected"] <= 8000 < ev["projected_with_next"]
    assert ev["reserved_output"] == 1000 and ev["growth"] > 2500
    assert [w["plugin"] for w in rec["warnings"]] == ["token_budget"]
    assert rec["warnings"][0]["message"].startswith("The conversation is at ")
    assert rec["final_answer_present"] is True
    # the final turn was sent, and it fitted
    assert run.context_tokens < 8000


def test_slow_tool(shipped_config: Config) -> None:
    rec, run = _run("slow-tool", shipped_config)
    assert rec["termination"] == "timeout" and rec["soft"] is True
    assert rec["stopped_by"] == "timeout" and rec["profile"] == "quick"
    ev = rec["evidence"]
    assert ev["tool"] == "query_logistics" and ev["tool_error"] == "timeout"
    assert ev["limit_s"] == 1.0 and ev["source"] == "profile quick"
    assert rec["elapsed_s"] == 1.0  # the fake clock: the tool was cut at the run's deadline
    observations = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert observations == [
        "ERROR: TIMEOUT: query_logistics did not finish within 1.0s; its result was discarded."
    ]
    assert rec["final_answer_present"] is True


def test_transfer_loop(shipped_config: Config) -> None:
    rec, _ = _run("transfer-loop", shipped_config)
    assert rec["termination"] == "terminal_tool" and rec["soft"] is False
    assert rec["stopped_by"] == "terminal_tool" and rec["steps"] == 2
    assert json.loads(rec["final_answer"])["ticket_id"].startswith("H")
    assert rec["final_answer_present"] is True


def test_retry_storm_executes_the_failing_tool_only_within_its_retry_budget(
    shipped_config: Config,
) -> None:
    """The runtime retries the 429 (``max_retries`` more times), the model sees one
    observation, and repeat_call answers every repeat the model proposes after it."""
    rec, _ = _run("retry-storm", shipped_config)
    assert rec["termination"] == "repeat_call" and rec["stopped_by"] == "repeat_call"
    budget = shipped_config.plugins.tables()["retry_policy"]["max_retries"] + 1
    assert rec["tools_executed"] == budget
    assert [r["attempts"] for r in rec["tool_retries"]] == [budget]


# -- the command line --------------------------------------------------------------------------


def _cli(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopwarden",
            "run",
            *args,
            "--json",
            "--config",
            str(default_config_path()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.mark.parametrize("name", ["never-finish", "token-flood", "slow-tool", "transfer-loop"])
def test_cli_runs_the_scenario_file(name: str) -> None:
    path = Path(str(scenario_path(name)))
    rec = _cli("--scenario", str(path))
    expected = load_scenario(path).expect.termination
    assert rec["termination"] in (expected if isinstance(expected, list) else [expected])
    assert rec["scenario"] == name and rec["stopped_by"] and rec["evidence"]


REFUND_REPEAT = """
name = "refund-repeat"
user = "订单 88231 不想要了，帮我退款"
[model]
turns = [
  { content = "我为您提交退款。", tool_calls = [
      { name = "apply_refund", arguments = { order_id = "88231", reason = "七天无理由退货" } },
      { name = "apply_refund", arguments = { order_id = "88231", reason = "七天无理由退货" } },
  ] },
  { tool_calls = [
      { name = "apply_refund", arguments = { order_id = "88231", reason = " 七天无理由退货 " } },
  ] },
]
then = "repeat_last"
final_text = "已为您提交退款申请。"
"""


def test_a_run_that_repeats_apply_refund_leaves_exactly_one_refund_row(tmp_path: Path) -> None:
    path = tmp_path / "refund-repeat.toml"
    path.write_text(REFUND_REPEAT, encoding="utf-8")
    rec = _cli("--scenario", str(path))
    assert rec["tool_calls"] >= 3 and rec["termination"] != "final_answer"
    rows = Shop(default_data_dir() / "shop.sqlite3").refunds()
    assert len(rows) == 1 and rows[0][1:] == ("88231", "七天无理由退货")


# -- the shipped config ------------------------------------------------------------------------


def test_shipped_config_enables_the_budget_plugins_in_order(shipped_config: Config) -> None:
    enabled = shipped_config.plugins.enabled
    start = enabled.index("max_steps") + 1
    assert enabled[start : start + len(BUDGET_PLUGINS)] == BUDGET_PLUGINS
    text = default_config_path().read_text(encoding="utf-8")
    anchor = text.index("# -- budgets and caps --")
    assert text.index('"timeout"') > anchor
    assert text.index("[plugins.timeout]") > text.index("# == budgets and caps ==")


def test_shipped_config_sets_every_budget_setting_at_its_default(shipped_config: Config) -> None:
    dep = Deployment(shipped_config, tools=shop_tools())
    tables = shipped_config.plugins.tables()
    for lp in dep.plugins:
        if lp.name not in [*BUDGET_PLUGINS, "max_steps"]:
            continue
        assert lp.settings is not None
        default = type(lp.settings)()
        assert lp.settings == default, lp.name
        fields = set(type(lp.settings).model_fields)
        unset = fields - set(tables[lp.name])
        # None defaults stay commented out
        # unset by design: max_tool_calls (issue 31: max_steps x max_per_turn bounds a run)
        assert unset <= {"max_per_tool", "max_context", "max_cost", "max_tool_calls"}, (
            lp.name,
            unset,
        )


def test_every_setting_is_described() -> None:
    from loopwarden.host.find import BUILTIN_PLUGINS, _import_spec

    for name in [*BUDGET_PLUGINS, "max_steps"]:
        cls = _import_spec(BUILTIN_PLUGINS[name], name)
        for field, info in cls.Settings.model_fields.items():
            assert info.description, f"{name}.{field}"
