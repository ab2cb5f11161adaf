"""End to end: the loop-detector scenario files, played through the shipped config."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment
from loopwarden.commands.cli import main as cli_main
from loopwarden.config import Config, default_config_path
from loopwarden.demo.shop import Shop
from loopwarden.models.scenario import load_scenario, scenarios_dir
from loopwarden.plugin import PluginSettings

DETECTORS = ["repeat_call", "oscillation", "no_progress", "stall", "failure_streak"]
SCENARIOS = [
    "repeat-then-recover",
    "always-not-found",
    "all-tools-fail",
    "oscillation",
    "explore-divergence",
]


def path(name: str) -> Path:
    return scenarios_dir() / f"{name}.toml"


@pytest.fixture
def play(shipped_config: Config, deployment_factory: Any) -> Any:
    def run(name: str) -> tuple[dict[str, Any], Any]:
        dep = deployment_factory(shipped_config)
        r = dep.run(scenario=path(name))
        return r.record(), r

    return run


def stops(run: Any) -> list[dict[str, Any]]:
    return [v for v in run.verdicts if v["kind"] == "stop"]


# -- the shipped config ------------------------------------------------------------------------


def test_shipped_config_enables_the_detectors_in_order(shipped_config: Config) -> None:
    enabled = shipped_config.plugins.enabled
    present = [n for n in enabled if n in DETECTORS]
    assert present == DETECTORS
    # consecutive, right after the anchor (no other plugin between them)
    first = enabled.index("repeat_call")
    assert enabled[first : first + len(DETECTORS)] == DETECTORS


def test_shipped_detector_tables_spell_out_every_default(
    shipped_config: Config, deployment_factory: Any
) -> None:
    dep = deployment_factory(shipped_config)
    tables = shipped_config.plugins.tables()
    for name in DETECTORS:
        settings = next(p.settings for p in dep.plugins if p.name == name)
        assert isinstance(settings, PluginSettings)
        assert set(tables[name]) == set(type(settings).model_fields), name
        assert settings == type(settings)(), f"{name}: the shipped table is not the defaults"


def test_every_detector_scenario_declares_what_it_expects() -> None:
    for name in SCENARIOS:
        sc = load_scenario(path(name))
        assert sc.name == name
        assert sc.expect.termination is not None and sc.expect.healthy is not None
        assert (sc.expect.onset is None) == sc.expect.healthy, name


# -- one test per scenario ---------------------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_ends_as_expected(play: Any, name: str) -> None:
    record, run = play(name)
    expect = load_scenario(path(name)).expect
    assert record["termination"] == expect.termination
    if expect.healthy:
        assert record["stopped_by"] is None
        assert stops(run) == []
    else:
        assert record["stopped_by"] == expect.termination
        assert record["evidence"]
        assert record["warnings"]
        assert record["final_answer_present"]  # the soft stop's wrap-up turn answered
        first_stop = stops(run)[0]
        assert expect.onset is not None and first_stop["step"] >= expect.onset


def test_repeat_then_recover(play: Any) -> None:
    record, run = play("repeat-then-recover")
    assert record["termination"] == "final_answer"
    assert [(w["step"], w["plugin"]) for w in record["warnings"]] == [(2, "repeat_call")]
    assert record["duplicate_calls"] == 1
    assert record["tools_executed"] == 1  # the repeat was answered from the earlier result
    assert record["final_answer"].startswith("订单 88231")
    skipped_obs = [m["content"] for m in run.messages if m["role"] == "tool"][1]
    assert '"order_id": "88231"' in skipped_obs and "already made" in skipped_obs


def test_always_not_found_warns_at_the_second_call_and_stops_at_the_third(play: Any) -> None:
    record, run = play("always-not-found")
    assert record["termination"] == "repeat_call"
    assert record["stopped_by"] == "repeat_call"
    assert record["soft"] is True
    rc_warnings = [w for w in record["warnings"] if w["plugin"] == "repeat_call"]
    assert [w["step"] for w in rc_warnings] == [2]
    assert 'already failed with "NOT_FOUND' in rc_warnings[0]["message"]
    assert [(s["step"], s["plugin"], s["reason"]) for s in stops(run)] == [
        (3, "repeat_call", "repeat_call")
    ]
    ev = record["evidence"]
    assert ev["tool"] == "query_order"
    assert ev["signature"] == 'query_order({"order_id": "99999"})'
    # the same words each turn: the third call stops (a moving text would wait for the fifth)
    assert ev["count"] == 3 and ev["threshold"] == 2 and ev["rule"] == "still_text"
    assert ev["fingerprint"].startswith("query_order:")
    assert record["tools_executed"] == 1
    assert record["duplicate_calls"] == 2
    assert record["steps"] == 4  # three turns and the wrap-up
    assert record["final_answer"] == "抱歉，没有查到订单 99999，请核对订单号。"


def test_all_tools_fail(play: Any) -> None:
    record, run = play("all-tools-fail")
    assert record["stopped_by"] == "failure_streak"
    assert [(w["step"], w["plugin"]) for w in record["warnings"]] == [(2, "failure_streak")]
    assert [(s["step"], s["plugin"]) for s in stops(run)] == [(3, "failure_streak")]
    ev = record["evidence"]
    assert ev["streak"] == 3 and ev["threshold"] == 3
    assert [f["tool"] for f in ev["failures"]] == [
        "query_order",
        "query_logistics",
        "search_knowledge",
    ]
    assert ev["failures"][2]["kind"] == "text"  # an error that came back as ordinary text


def test_oscillation(play: Any) -> None:
    record, run = play("oscillation")
    assert record["stopped_by"] == "oscillation"
    osc = [w for w in record["warnings"] if w["plugin"] == "oscillation"]
    assert [w["step"] for w in osc] == [4]
    assert (
        '"query_order(order_id=\\"88231\\")" -> "query_logistics(tracking_no=\\"SF1234567890\\")"'
        in osc[0]["message"]
    )
    assert [(s["step"], s["plugin"]) for s in stops(run)] == [(5, "oscillation")]
    assert record["oscillation_hits"] == 2
    assert record["evidence"]["period"] == 2
    assert record["tools_executed"] == 2  # the re-lookups were answered from earlier results


def test_explore_divergence(play: Any) -> None:
    record, run = play("explore-divergence")
    assert record["stopped_by"] == "stall"
    assert [(w["step"], w["plugin"]) for w in record["warnings"]] == [(3, "stall")]
    assert [(s["step"], s["plugin"]) for s in stops(run)] == [(4, "stall")]
    assert record["stall_rounds"] == 3
    assert record["duplicate_calls"] == 0  # every search was different
    assert record["evidence"]["streak"] == 3


def test_refund_stays_healthy_with_every_detector(play: Any) -> None:
    record, _ = play("refund")
    assert record["termination"] == "final_answer"
    assert record["warnings"] == []


# -- beyond the scenario files ---------------------------------------------------------------


def test_repeated_refund_leaves_one_row_and_is_stopped_by_the_window_rule(
    shipped_config: Config, deployment_factory: Any, tmp_path: Path
) -> None:
    sc = tmp_path / "refund-loop.toml"
    sc.write_text(
        'name = "refund-loop"\nuser = "退款"\n[model]\n'
        'turns = [{ content = "提交退款", tool_calls = [{ name = "apply_refund", '
        'arguments = { order_id = "88231", reason = "七天无理由退货" } }] }]\n'
        'then = "repeat_last"\n',
        encoding="utf-8",
    )
    dep = deployment_factory(shipped_config)
    record = dep.run(scenario=sc).record()
    assert record["stopped_by"] == "repeat_call"
    # the same words each turn: the third call stops (else the window rule, at the fifth)
    assert record["evidence"]["rule"] == "still_text"
    assert record["tools_executed"] == 1
    assert not [w for w in record["warnings"] if w["plugin"] == "repeat_call"]  # never skipped
    assert Shop().refunds() == [("RF88231001", "88231", "七天无理由退货")]


def test_concurrent_runs_keep_their_own_state(
    shipped_config: Config, deployment_factory: Any
) -> None:
    dep: Deployment = deployment_factory(shipped_config)

    async def both() -> list[Any]:
        return list(
            await asyncio.gather(*(dep.arun(scenario=path(n)) for n in SCENARIOS + SCENARIOS))
        )

    runs = asyncio.run(both())
    for name, run in zip(SCENARIOS + SCENARIOS, runs, strict=True):
        assert run.record()["termination"] == load_scenario(path(name)).expect.termination


def test_cli_json_record(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        [
            "run",
            "--scenario",
            str(path("always-not-found")),
            "--json",
            "--config",
            str(default_config_path()),
        ]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["termination"] == "repeat_call"
    assert record["stopped_by"] == "repeat_call"
    assert record["evidence"]["count"] == 3
    assert record["warnings"][0] == {
        "step": 2,
        "plugin": "repeat_call",
        "message": 'This call (query_order) already failed with "NOT_FOUND: 订单 99999 不存在"; '
        "do not retry it. Answer from what you know or change approach.",
    }
