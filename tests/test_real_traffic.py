"""Real traffic: limits that follow the model, conversation limits, shadow mode, notes that do
not impersonate the user, and a growth projection that one large batch does not fool."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.budgets import FINAL, config, request, scenario

from loopwarden import ConfigError, Conversation, Deployment, FakeClock
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.models.windows import CONSERVATIVE_WINDOW, context_window, known_window
from loopwarden.plugins.token_budget import TokenBudget, TokenBudgetSettings
from loopwarden.testing import ScriptedModel, make_run, make_tool, script, tool_call, turn
from loopwarden.tools import ToolRegistry

# -- context windows ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("openai/gpt-4.1-mini", 1_047_576),
        ("gpt-4", 8_192),
        ("gpt-4-turbo", 128_000),
        ("Qwen/Qwen2.5-7B-Instruct", 32_768),
        ("deepseek-chat", 128_000),
        ("o3-mini", 200_000),
    ],
)
def test_known_models_have_their_window(model: str, window: int) -> None:
    assert known_window(model) == window


def test_a_prefix_must_end_at_a_word_boundary() -> None:
    assert known_window("gpt-4x-custom") is None
    assert known_window("o1x") is None
    assert known_window("my-private-model") is None


def test_declared_window_wins_then_package_then_table_then_conservative_default() -> None:
    assert context_window("gpt-4o", 50_000) == (50_000, "model.context_window")
    assert context_window("gpt-4o") == (128_000, "genai-prices")
    assert context_window("qwen-plus") == (131_072, "known models")  # not in genai-prices
    assert context_window("acme-llm") == (CONSERVATIVE_WINDOW, "default")


def _dep(model: dict[str, Any], **tables: Any) -> Deployment:
    cfg = parse_config(
        {"model": model, "plugins": {"enabled": ["token_budget"], **tables}}, path="<test>"
    )
    return Deployment(cfg, tools=ToolRegistry([]))


def test_max_context_follows_the_model_window() -> None:
    tb = _dep({"name": "gpt-4o"}).plugins.get("token_budget")
    assert tb.max_context == int(128_000 * 0.8)
    tb = _dep(
        {"name": "gpt-4o", "context_window": 16_000}, token_budget={"context_fraction": 0.5}
    ).plugins.get("token_budget")
    assert tb.max_context == 8_000
    tb = _dep({"name": "gpt-4o"}, token_budget={"max_context": 5_000}).plugins.get("token_budget")
    assert tb.max_context == 5_000 and tb.context_source == "plugins.token_budget.max_context"


def test_an_unknown_model_gets_the_stated_default_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.token_budget"):
        tb = _dep({"name": "acme-llm"}).plugins.get("token_budget")
    assert tb.max_context == int(CONSERVATIVE_WINDOW * 0.8)
    assert "model.context_window" not in caplog.text  # the message names the TOML key form
    assert "[model] context_window" in caplog.text and "acme-llm" in caplog.text


def test_cli_runs_an_unknown_model_with_the_conservative_default(tmp_path: Path) -> None:
    data = load_toml(default_config_path())
    text = (
        default_config_path()
        .read_text(encoding="utf-8")
        .replace('name = "gpt-4o-mini"', 'name = "acme-llm-unknown"', 1)
    )
    assert data["model"]["name"] == "gpt-4o-mini"
    # an unpriced model runs by default (unknown_model = "warn"): nothing else to change
    assert 'unknown_model = "warn"' in text
    cfg = tmp_path / "config.toml"
    cfg.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopwarden",
            "run",
            "--scenario",
            "refund",
            "--json",
            "--config",
            str(cfg),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**_env(), "LOOPWARDEN_DATA_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["termination"] == "final_answer"
    assert "'acme-llm-unknown' is unknown; assuming 32768 tokens" in proc.stderr
    assert "[model] context_window" in proc.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}


# -- growth projection -------------------------------------------------------------------------


def test_one_large_batch_is_not_assumed_to_repeat_every_step() -> None:
    """A +3,000-token batch once, then small steps: the run is not soft-stopped at ~55%."""
    p = TokenBudget(
        TokenBudgetSettings(max_context=10_000, reserve_output_tokens=200, warn_at=None)
    )
    run = make_run()
    prompts = [1_000, 1_200, 4_200, 4_400, 4_600, 4_800, 5_000, 5_200, 5_400, 5_600]
    verdicts = []
    for prompt in prompts:
        verdicts.append(p.before_model(run, request(run, prompt)))
        run.step += 1
    assert verdicts == [None] * len(prompts)  # the old projection stopped at 4,400 + 3,000 x 2


# -- conversation limits -----------------------------------------------------------------------

TOOLS = ToolRegistry([make_tool("lookup", "found it", read_only=True, deterministic=True)])


def _conversation_dep(mode: str = "enforce", **limits: Any) -> Deployment:
    cfg = parse_config(
        {
            "run": {"mode": mode},
            "plugins": {
                "enabled": ["max_steps", "conversation_limits"],
                "conversation_limits": limits,
            },
        },
        path="<test>",
    )
    return Deployment(cfg, tools=TOOLS, clock=FakeClock())


def _turns(dep: Deployment, n: int) -> list[dict[str, Any]]:
    conv = Conversation()
    records = []
    for i in range(n):
        model = ScriptedModel(
            script([turn(f"look {i}", tool_call("lookup", key=str(i)))], final_text=f"answer {i}")
        )
        records.append(dep.run(f"question {i}", model=model, conversation=conv).record())
    return records


def test_thirty_turns_with_a_turn_limit_of_five_end_the_sixth_run() -> None:
    recs = _turns(_conversation_dep(max_turns=5, warn_at=None), 30)
    assert [r["termination"] for r in recs[:5]] == ["final_answer"] * 5
    sixth = recs[5]
    assert sixth["termination"] == "max_turns" and sixth["steps"] == 0
    assert sixth["stopped_by"] == "conversation_limits"
    ev = sixth["evidence"]
    assert ev["scope"] == "conversation" and ev["limit"] == 5 and ev["spent"] == 6
    assert ev["key"] == sixth["conversation_id"]


def test_the_same_conversation_in_shadow_mode_runs_all_thirty_turns() -> None:
    recs = _turns(_conversation_dep("shadow", max_turns=5, warn_at=None), 30)
    assert [r["termination"] for r in recs] == ["final_answer"] * 30
    assert all(r["mode"] == "shadow" for r in recs)
    assert [r["shadow_stop"] for r in recs[:5]] == [None] * 5
    would = recs[5]["shadow_stop"]
    assert would["plugin"] == "conversation_limits" and would["reason"] == "max_turns"
    assert would["hook"] == "on_start" and would["step"] == 0
    assert {
        "plugin": "conversation_limits",
        "kind": "stop",
        "reason": "max_turns",
        "shadow": True,
    }.items() <= recs[5]["verdicts"][0].items()
    assert recs[29]["shadow_stop"]["evidence"]["spent"] == 30


def test_model_calls_tokens_and_tool_calls_are_counted_across_turns() -> None:
    recs = _turns(_conversation_dep(max_turns=None, max_model_calls=7, warn_at=None), 5)
    # each turn: one tool turn and one answer; the 7th call is the soft stop's final turn
    assert [r["termination"] for r in recs[:3]] == ["final_answer"] * 3
    assert recs[3]["termination"] == "max_steps" and recs[3]["soft"] is True
    assert recs[3]["evidence"]["scope"] == "conversation"
    recs = _turns(_conversation_dep(max_turns=None, max_tool_calls=2, warn_at=None), 3)
    assert [r["termination"] for r in recs] == ["final_answer", "final_answer", "max_tool_calls"]
    recs = _turns(_conversation_dep(max_turns=None, max_tokens=300, warn_at=None), 10)
    stops = [r for r in recs if r["termination"] == "max_tokens"]
    assert stops and stops[0]["evidence"]["scope"] == "conversation"


def test_a_warning_is_given_once_per_conversation_not_once_per_turn() -> None:
    recs = _turns(_conversation_dep(max_turns=10, warn_at=0.5), 10)
    warned = [i for i, r in enumerate(recs) if r["warnings"]]
    assert warned == [4]  # turn 5 of 10, once


def test_idle_turns_in_a_row_end_a_conversation_that_talks_in_circles() -> None:
    dep = _conversation_dep(max_turns=None, max_idle_turns=3)
    conv = Conversation()
    ends = [
        dep.run(
            f"q{i}",
            model=ScriptedModel(script(final_text="please send the details")),
            conversation=conv,
        ).record()
        for i in range(4)
    ]
    assert [r["termination"] for r in ends] == ["final_answer"] * 3 + ["max_turns"]
    assert ends[3]["evidence"]["rule"] == "idle_turns"


def test_context_warning_once_per_conversation() -> None:
    cfg = config(
        "token_budget",
        token_budget={"max_context": 4000, "warn_at": 0.02, "reserve_output_tokens": 10},
    )
    dep = Deployment(cfg, tools=TOOLS, clock=FakeClock())
    conv = Conversation()
    recs = [
        dep.run(f"q{i}", model=ScriptedModel(script(final_text="ok")), conversation=conv).record()
        for i in range(5)
    ]
    assert sum(len(r["warnings"]) for r in recs) == 1


# -- shadow mode -------------------------------------------------------------------------------


def _looping(dep: Deployment) -> dict[str, Any]:
    sc = scenario(
        [turn(None, tool_call("query_order", order_id="99999"))],
        final_text=FINAL,
        tools={"query_order": {"results": ["NOT_FOUND"]}},
    )
    return dep.run(scenario=sc).record()


def test_shadow_mode_records_every_verdict_but_changes_nothing_except_max_steps() -> None:
    data = {
        "run": {"mode": "shadow"},
        "plugins": {
            "enabled": ["max_steps", "repeat_call", "failure_streak"],
            "max_steps": {"max_steps": 12},
        },
    }
    rec = _looping(Deployment(parse_config(data, path="<test>")))
    assert rec["termination"] == "max_steps" and rec["steps"] == 12  # only max_steps acted
    # no shadowed plugin's note reached the model; the essential max_steps still warns
    assert {w["plugin"] for w in rec["warnings"]} == {"max_steps"}
    assert rec["duplicate_calls"] > 0
    assert rec["shadow_stop"]["plugin"] in ("repeat_call", "failure_streak")
    shadowed = [v for v in rec["verdicts"] if v.get("shadow")]
    assert shadowed and {v["plugin"] for v in shadowed} <= {"repeat_call", "failure_streak"}
    enforced = _looping(
        Deployment(parse_config({**data, "run": {"mode": "enforce"}}, path="<test>"))
    )
    assert enforced["termination"] == rec["shadow_stop"]["reason"]
    assert enforced["steps"] < rec["steps"]


def test_one_plugin_can_be_shadowed_and_max_steps_never() -> None:
    data = {
        "plugins": {
            "enabled": ["max_steps", "repeat_call", "failure_streak"],
            "repeat_call": {"shadow": True},
        }
    }
    rec = _looping(Deployment(parse_config(data, path="<test>")))
    assert rec["mode"] == "enforce" and rec["termination"] == "failure_streak"
    assert any(v.get("shadow") and v["plugin"] == "repeat_call" for v in rec["verdicts"])
    bad = {"plugins": {"enabled": ["max_steps"], "max_steps": {"shadow": True}}}
    with pytest.raises(ConfigError, match=r"plugins\.max_steps\.shadow"):
        Deployment(parse_config(bad, path="<test>"))
    with pytest.raises(ConfigError, match=r"plugins\.repeat_call\.shadow"):
        parse_config({"plugins": {"enabled": [], "repeat_call": {"shadow": "yes"}}}, path="<test>")


def test_a_side_effect_still_runs_once_in_shadow_mode() -> None:
    done: list[str] = []
    refund = make_tool(
        "refund", lambda **kw: done.append(kw["order_id"]) or "refunded", side_effect=True
    )
    refund = dataclasses.replace(refund, idempotency_keys=("order_id",))
    dep = Deployment(
        parse_config(
            {
                "run": {"mode": "shadow"},
                "plugins": {"enabled": ["max_steps", "repeat_call"], "max_steps": {"max_steps": 5}},
            },
            path="<t>",
        ),
        tools=ToolRegistry([refund]),
    )
    model = ScriptedModel(
        script([turn(None, tool_call("refund", order_id="1"))], then="repeat_last")
    )
    rec = dep.run("refund order 1", model=model).record()
    assert rec["termination"] == "max_steps" and done == ["1"]


# -- notes ---------------------------------------------------------------------------------


def test_guard_notes_are_system_notes_by_default() -> None:
    data = load_toml(default_config_path())
    assert data["run"]["warning_role"] == "system"
    assert parse_config({}).run.warning_role == "system"


def test_shipped_warnings_do_not_ask_to_wrap_up_early() -> None:
    text = default_config_path().read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith(("warning =", "context_warning =", "total_warning =")):
            assert "wrap up" not in line.casefold(), line


def test_report_shows_what_shadowed_guards_would_have_stopped() -> None:
    from loopwarden.report import analyse, format_text

    recs = _turns(_conversation_dep("shadow", max_turns=5, warn_at=None), 8)
    report = analyse(recs)
    assert report["shadow"]["runs"] == 8 and report["shadow"]["would_stop"] == 3
    assert report["shadow"]["by"] == {"conversation_limits: max_turns": 3}
    text = format_text(report)
    assert "guards would have stopped 3" in text
    assert f"run {recs[5]['run_id'][:12]}: step 0 conversation_limits (max_turns)" in text


def test_a_conversation_whose_runs_keep_looping_is_handed_over() -> None:
    cfg = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "conversation_limits", "repeat_call"],
                "conversation_limits": {"max_loop_stops": 2},
            }
        },
        path="<test>",
    )
    dep = Deployment(cfg, tools=TOOLS, clock=FakeClock())
    conv = Conversation()
    recs = [
        dep.run(
            f"q{i}",
            model=ScriptedModel(
                script([turn(None, tool_call("lookup", key="same"))], then="repeat_last")
            ),
            conversation=conv,
        ).record()
        for i in range(3)
    ]
    assert [r["termination"] for r in recs] == ["repeat_call", "repeat_call", "max_turns"]
    assert recs[2]["evidence"]["rule"] == "loop_stops" and recs[2]["steps"] == 0


def test_a_result_that_starts_with_error_is_a_failure() -> None:
    from loopwarden.plugins.failure_streak import FailureStreak
    from loopwarden.testing import make_tool_result

    p = FailureStreak()
    assert p.failed(make_tool_result("Error: payment amount does not add up"))
    assert not p.failed(make_tool_result("No errors found; the booking is confirmed."))


def test_shadow_mode_leaves_a_terminal_hand_off_enforced() -> None:
    data = load_toml(default_config_path())
    data["run"]["mode"] = "shadow"
    dep = Deployment(parse_config(data, path="<test>"))
    assert "terminal_tool" in dep.plugins.names
    assert "terminal_tool" not in dep.engine.shadow and "max_steps" not in dep.engine.shadow
    assert "repeat_call" in dep.engine.shadow
