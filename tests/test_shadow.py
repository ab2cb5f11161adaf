"""Shadow mode never touches a run (issue 19, items 1 and 2).

A shadowed plugin's verdicts are computed and recorded, never honoured -- and neither is
anything else it does to a run: the deadlines the timeout plugin sets (a call's, a request's,
the run's watchdog), the backoff and spent retry budget of retry_policy, any field of a
request, call or result.  Those are undone after each of its hooks and recorded as
``shadow_effects``.  Only the essential ``max_steps`` (and what the loop itself guarantees: a
side effect that took place, or failed for good, never runs again) still acts.

The last test plays every built-in scenario with every built-in plugin set to refuse, shadowed,
against the same scenario with ``max_steps`` alone: same transcript, same tool executions, same
time on the run's clock.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support.budgets import FINAL, config, scenario
from support.slow import SlowModel

from loopwarden import Deployment, FakeClock, hookimpl
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.demo import shop_tools
from loopwarden.demo.shop import Shop, with_shop_prompt
from loopwarden.engine import drivers
from loopwarden.engine.loop import adrive, drive
from loopwarden.engine.pluginmanager import BUILTIN_PLUGINS
from loopwarden.engine.shadow import MAX_EFFECTS, Snapshot
from loopwarden.events import ToolCall
from loopwarden.exceptions import ToolError
from loopwarden.models.scenario import Scenario, builtin_scenarios, load_scenario
from loopwarden.report import analyse
from loopwarden.run import Run
from loopwarden.store import Shared
from loopwarden.testing import (
    HookRecorder,
    ScriptedModel,
    make_run,
    make_tool,
    make_tool_call,
    script,
    tool_call,
    turn,
)
from loopwarden.tools import ToolRegistry

BENCH_SCENARIOS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"
ANSWER = "您的包裹已签收。"


def _go(dep: Deployment, driver: str, **kwargs: Any) -> Run:
    if driver == "sync":
        return dep.run(**kwargs)
    return asyncio.run(dep.arun(**kwargs))


def _effects(rec: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The first value each (plugin, effect) would have set."""
    first: dict[tuple[str, str], Any] = {}
    for e in rec["shadow_effects"]:
        first.setdefault((e["plugin"], e["effect"]), e["value"])
    return first


# -- item 1: a shadowed timeout cuts nothing ----------------------------------------------------


def _timeout_dep(shadow: bool, **settings: Any) -> Deployment:
    return Deployment(config("max_steps", "timeout", timeout={"shadow": shadow, **settings}))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_shadowed_timeout_lets_a_slow_tool_finish_and_records_the_would_be_timeout(
    driver: str,
) -> None:
    sc = scenario(
        [turn("我查一下物流。", tool_call("query_logistics", tracking_no="SF1"))],
        then="final",
        tools={"query_logistics": {"results": [ANSWER], "delay_s": 5.0}},
    )
    settings = {"max_seconds": 60.0, "tool_timeout_s": 0.5, "grace_s": 0.0}
    run = _go(_timeout_dep(True, **settings), driver, scenario=sc, clock=FakeClock())
    rec = run.record()
    assert [m["content"] for m in run.messages if m["role"] == "tool"] == [ANSWER]
    assert rec["termination"] == "final_answer" and rec["final_answer"] == FINAL
    assert rec["elapsed_s"] == 5.0  # the tool took its five seconds (on the run's clock)
    would = rec["shadow_stop"]
    assert (would["plugin"], would["hook"], would["reason"]) == ("timeout", "after_tool", "timeout")
    assert would["evidence"]["tool_timeout_s"] == 0.5
    effects = _effects(rec)
    assert effects[("timeout", "call.timeout")] == 0.5
    assert effects[("timeout", "run.deadline")] == 60.0  # seconds after the run's start
    assert effects[("timeout", "request.timeout")] == 60.0
    # enforced, the same settings cut the call at 0.5 s
    enforced = _go(_timeout_dep(False, **settings), driver, scenario=sc, clock=FakeClock())
    assert "TIMEOUT" in next(m["content"] for m in enforced.messages if m["role"] == "tool")
    assert enforced.record()["termination"] == "timeout"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_shadowed_timeout_lets_a_slow_model_answer_and_records_the_would_be_timeout(
    driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model needs 0.6 s of real time; the run has 0.2 s: enforced, the async driver
    # abandons the call at its request timeout and the sync watchdog ends the run
    monkeypatch.setattr(drivers, "WATCHDOG_SLACK_S", 0.05)
    settings = {"max_seconds": 0.2, "grace_s": 0.0}

    def model() -> SlowModel:
        return SlowModel(ScriptedModel(script(final_text=ANSWER)), [0.6])

    run = _go(_timeout_dep(True, **settings), driver, user="包裹到哪了？", model=model())
    rec = run.record()
    assert rec["termination"] == "final_answer" and rec["final_answer"] == ANSWER
    assert rec["final_answer_present"] is True
    would = rec["shadow_stop"]
    assert (would["plugin"], would["hook"], would["reason"]) == (
        "timeout",
        "after_response",
        "timeout",
    )
    effects = _effects(rec)
    assert effects[("timeout", "run.deadline")] == pytest.approx(0.2)
    assert effects[("timeout", "request.timeout")] == pytest.approx(0.2, abs=0.05)
    enforced = _go(_timeout_dep(False, **settings), driver, user="包裹到哪了？", model=model())
    assert enforced.record()["termination"] == "timeout"
    assert enforced.record()["final_answer"] != ANSWER


# -- item 2: a shadowed retry_policy neither delays nor spends a retry budget -------------------


def _paying(
    tmp_path: Path, shadow: bool, error: ToolError, runtime: bool = False
) -> tuple[Run, list[str]]:
    attempts: list[str] = []

    def pay(**kwargs: Any) -> str:
        attempts.append(kwargs["order_id"])
        raise error

    tool = dataclasses.replace(
        make_tool("pay", pay, side_effect=True), idempotency_keys=("order_id",)
    )
    cfg = parse_config(
        {
            "store": {"url": f"sqlite:///{tmp_path / 'store.sqlite3'}"},
            "plugins": {
                "enabled": ["max_steps", "retry_policy"],
                "retry_policy": {
                    "shadow": shadow,
                    "max_retries": 1,
                    "backoff_s": 1.0,
                    "runtime": runtime,
                },
            },
        },
        path="<test>",
    )
    pay_turn = turn(None, tool_call("pay", order_id="88231"))
    model = ScriptedModel(script([pay_turn, pay_turn, pay_turn, turn("付款失败。")], then="final"))
    with Deployment(cfg, tools=ToolRegistry([tool])) as dep:
        run = dep.run("付款", model=model, clock=FakeClock())
    return run, attempts


def test_a_shadowed_retry_policy_neither_delays_nor_blocks_a_retryable_side_effect(
    tmp_path: Path,
) -> None:
    unavailable = ToolError("503 service unavailable", retryable=True)
    run, attempts = _paying(tmp_path / "shadow", True, unavailable)
    rec = run.record()
    # the tool said its failure left nothing behind: without retry_policy's budget the
    # model's three attempts all run, at once
    assert attempts == ["88231"] * 3 and rec["tools_executed"] == 3
    assert rec["elapsed_s"] == 0.0 and rec["termination"] == "final_answer"
    delays = [e for e in rec["shadow_effects"] if e["effect"] == "call.delay_s"]
    assert [(e["plugin"], e["step"], e["value"], e["was"]) for e in delays] == [
        ("retry_policy", 2, 1.0, 0.0)
    ]
    assert delays[0]["tool"] == "pay" and delays[0]["hook"] == "before_tool"
    spent = [e for e in rec["shadow_effects"] if e["effect"] == "result.retryable"]
    assert [(e["plugin"], e["step"], e["value"], e["was"]) for e in spent] == [
        ("retry_policy", 2, False, True),
        ("retry_policy", 3, False, True),
    ]
    # enforced: a one-second backoff before the retry, and the third attempt refused
    run, attempts = _paying(tmp_path / "enforce", False, unavailable)
    assert attempts == ["88231"] * 2 and run.record()["elapsed_s"] == 1.0
    assert run.record()["shadow_effects"] == []


def test_a_shadowed_retry_policy_leaves_retries_to_the_model(tmp_path: Path) -> None:
    # with runtime retries (the default), the plan it gives each call is undone: the loop
    # executes each proposal once, at once, and the record shows the plan
    unavailable = ToolError("503 service unavailable", retryable=True)
    run, attempts = _paying(tmp_path / "shadow", True, unavailable, runtime=True)
    rec = run.record()
    assert attempts == ["88231"] * 3 and rec["elapsed_s"] == 0.0
    plans = [e for e in rec["shadow_effects"] if e["effect"] == "call.retry"]
    assert plans and plans[0]["plugin"] == "retry_policy" and plans[0]["was"] is None
    assert plans[0]["value"]["attempts"] == 2 and plans[0]["step"] == 1
    enforced, attempts = _paying(tmp_path / "enforce", False, unavailable, runtime=True)
    assert attempts == ["88231"] * 2  # the runtime's retry, then the budget is spent
    assert enforced.record()["elapsed_s"] > 0


def test_in_shadow_mode_a_side_effect_that_failed_for_good_still_never_runs_again(
    tmp_path: Path,
) -> None:
    # the loop's own contract, not a plugin's effect: it holds with every plugin shadowed
    run, attempts = _paying(tmp_path, True, ToolError("card declined"))
    assert attempts == ["88231"] and run.record()["tools_executed"] == 1


def test_shadowed_plugins_see_each_others_effects_so_the_would_be_stop_is_the_real_one(
    tmp_path: Path,
) -> None:
    # retry_policy spends the retry budget (result.retryable = False) and repeat_call, later
    # in the config order, stops the storm on it: shadowed, the flag is undone for the run
    # and for enforced plugins, not for the shadowed plugins after it on the same event
    def storm(mode: str) -> dict[str, Any]:
        data = load_toml(default_config_path())
        data["store"] = {"url": f"sqlite:///{tmp_path / mode}.sqlite3"}
        data["run"]["mode"] = mode
        data["plugins"]["enabled"] = ["max_steps", "retry_policy", "repeat_call"]
        # the model's retries: the runtime's own are executions a shadow run does not make,
        # so with them the shadowed budget would be spent later than the enforced one
        data["plugins"]["retry_policy"]["runtime"] = False
        with Deployment(parse_config(data, path="<t>"), tools=shop_tools()) as dep:
            return dep.run(scenario="retry-storm", clock=FakeClock()).record()

    enforced, shadowed = storm("enforce"), storm("shadow")
    stop = next(v for v in enforced["verdicts"] if v["kind"] == "stop")
    assert (enforced["termination"], stop["plugin"]) == ("repeat_call", "repeat_call")
    would = shadowed["shadow_stop"]
    assert shadowed["termination"] == "max_steps"
    assert {k: would[k] for k in ("step", "hook", "plugin", "reason", "soft")} == {
        k: stop[k] for k in ("step", "hook", "plugin", "reason", "soft")
    }


# -- the dispatcher: generic over fields, on both paths ----------------------------------------


class Meddler:
    """Changes everything a before_model / before_tool / after_tool hook can reach."""

    @hookimpl
    def on_start(self, run: Run) -> None:
        run.deadline = run.started_at + 0.001

    @hookimpl
    def before_model(self, run: Run, request: Any) -> None:
        request.max_output_tokens = 1
        request.tool_choice = "none"
        request.notes.append("be brief")
        request.timeout = 0.001

    @hookimpl
    def before_tool(self, call: Any) -> None:
        call.delay_s = 30.0
        call.arguments["tracking_no"] = "SF-OTHER"

    @hookimpl
    def after_tool(self, result: Any) -> None:
        result.retryable = True
        result.content = "forged"


class Witness:
    """Enforced, after the meddler in config order: records what it sees."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @hookimpl
    def before_model(self, request: Any) -> None:
        self.seen.append((request.max_output_tokens, request.tool_choice, list(request.notes)))

    @hookimpl
    def before_tool(self, call: Any) -> None:
        self.seen.append((call.delay_s, dict(call.arguments)))

    @hookimpl
    def after_tool(self, result: Any) -> None:
        self.seen.append((result.retryable, result.content))


@pytest.mark.parametrize("path", ["direct", "pluggy"])
def test_whatever_a_shadowed_plugin_changes_is_undone_before_the_next_plugin_sees_it(
    path: str,
) -> None:
    witness = Witness()
    cfg = parse_config(
        {"plugins": {"enabled": ["max_steps"], "meddler": {"shadow": True}}}, path="<t>"
    )
    dep = Deployment(cfg, plugins={"meddler": Meddler(), "witness": witness}, tools=shop_tools())
    assert dep.engine.shadow == {"meddler"}
    model = ScriptedModel(
        script([turn(None, tool_call("query_logistics", tracking_no="SF1234567890")), turn("ok")])
    )
    if path == "pluggy":  # a monitor makes the dispatcher go through pluggy's own call
        with HookRecorder(dep) as hooks:
            run = dep.run("where?", model=model)
        assert len(hooks.getcalls("before_tool")) == 1
    else:
        run = dep.run("where?", model=model)
    assert witness.seen == [
        (None, "auto", []),
        (0.0, {"tracking_no": "SF1234567890"}),
        (False, witness.seen[2][1]),
        (None, "auto", []),
    ]
    assert witness.seen[2][1] != "forged" and run.deadline is None
    rec = run.record()
    assert rec["termination"] == "final_answer" and rec["final_answer"] == "ok"
    effects = {e["effect"] for e in rec["shadow_effects"] if e["plugin"] == "meddler"}
    assert effects == {
        "run.deadline",
        "request.max_output_tokens",
        "request.tool_choice",
        "request.notes",
        "request.timeout",
        "call.delay_s",
        "call.arguments",
        "result.retryable",
        "result.content",
    }


def test_a_shadowed_plugin_that_raises_keeps_no_later_plugin_from_its_turn() -> None:
    class Broken:
        @hookimpl
        def before_tool(self, call: Any) -> None:
            call.timeout = 0.001
            raise RuntimeError("bug")

    witness = Witness()
    cfg = parse_config({"plugins": {"enabled": [], "broken": {"shadow": True}}}, path="<t>")
    dep = Deployment(cfg, plugins={"broken": Broken(), "witness": witness}, tools=shop_tools())
    model = ScriptedModel(script([turn(None, tool_call("get_current_time")), turn("ok")]))
    rec = dep.run("time?", model=model).record()
    assert rec["termination"] == "final_answer"
    assert rec["shadow_stop"]["reason"] == "plugin_error"
    assert any(isinstance(s[0], float) for s in witness.seen)  # the witness saw the call
    assert [e["effect"] for e in rec["shadow_effects"]] == ["call.timeout"]


def test_a_field_added_to_an_event_later_is_restored_too() -> None:
    @dataclasses.dataclass(slots=True, eq=False)
    class PlannedCall(ToolCall):
        plan: list[float] | None = None  # e.g. a runtime-retry plan a plugin fills in

    run = make_run()
    call = PlannedCall(
        **{f.name: getattr(make_tool_call("pay"), f.name) for f in dataclasses.fields(ToolCall)}
    )
    snapshot = Snapshot(("run", "call"), (run, call))
    call.plan = [1.0, 2.0]
    call.delay_s = 3.0
    changes = snapshot.restore()
    assert call.plan is None and call.delay_s == 0.0
    assert sorted(c[0] for c in changes) == ["call.delay_s", "call.plan"]
    for c in changes:  # each change can be applied again (shadowed plugins see each other's)
        c[3]()
    assert call.plan == [1.0, 2.0] and call.delay_s == 3.0


def test_shadow_effects_are_bounded() -> None:
    class Busy:
        @hookimpl
        def before_tool(self, call: Any) -> None:
            call.timeout = 1.0

        @hookimpl
        def after_tool(self, result: Any) -> None:
            result.retryable = True

    cfg = parse_config({"plugins": {"enabled": [], "busy": {"shadow": True}}}, path="<t>")
    dep = Deployment(cfg, plugins={"busy": Busy()}, tools=shop_tools())
    calls = [tool_call("get_current_time") for _ in range(MAX_EFFECTS // 2 + 10)]
    rec = dep.run("time?", model=ScriptedModel(script([turn(None, *calls)]))).record()
    assert rec["tools_executed"] == len(calls)
    assert len(rec["shadow_effects"]) == MAX_EFFECTS
    assert rec["shadow_effects_dropped"] == 2 * len(calls) - MAX_EFFECTS


def test_the_report_lists_what_shadowed_plugins_would_have_done(tmp_path: Path) -> None:
    run, _ = _paying(tmp_path, True, ToolError("503", retryable=True), runtime=False)
    report = analyse([run.record()])
    assert report["shadow"]["effects"] == {
        "retry_policy: call.delay_s": 1,
        "retry_policy: result.retryable": 2,
    }


# -- done when: every built-in scenario, every built-in plugin refusing, shadowed ----------------


def _refusing(mode: str) -> dict[str, Any]:
    """The shipped config with every built-in plugin enabled and set to refuse at once --
    shadowed: by ``[run] mode`` (``mode="run"``) or by every table (``mode="tables"``, which
    shadows the normal endings too)."""
    data = load_toml(default_config_path())
    p = data["plugins"]
    p["enabled"] = list(BUILTIN_PLUGINS)
    p["max_steps"].update(max_steps=30, warn_remaining=0)
    p["timeout"].update(max_seconds=0.001, tool_timeout_s=0.001, grace_s=0.0, warn_at=0.1)
    p["token_budget"].update(max_total_tokens=10, max_context=10, warn_at=0.1)
    p["cost_budget"].update(max_cost=0.000001, warn_at=0.1)
    p["spend_limits"]["budgets"] = [
        {"scope": "deployment", "window": "run", "max_tokens": 1},
        {"scope": "deployment", "window": "day", "max_tool_calls": 1},
    ]
    p["tool_calls"].update(max_tool_calls=1, warn_at=0.1)
    p["conversation_limits"].update(
        max_model_calls=1, max_tool_calls=1, max_tokens=10, max_idle_turns=1, warn_at=0.1
    )
    p["retry_policy"].update(max_retries=0, backoff_s=5.0)
    p["repeat_call"].update(stop_at_repeat=1, window_count=2)
    p["failure_streak"].update(stop_after=1, warn_after=None)
    p["run_record"] = {"path": "runs.jsonl"}
    if mode == "run":
        data["run"]["mode"] = "shadow"
    else:
        for name in BUILTIN_PLUGINS:
            if name != "max_steps":
                p.setdefault(name, {})["shadow"] = True
    return data


def _only(data: dict[str, Any], enabled: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    out["run"]["mode"] = "enforce"
    out["plugins"] = {
        "enabled": enabled,
        **{k: v for k, v in out["plugins"].items() if k in enabled},
    }
    for table in out["plugins"].values():
        if isinstance(table, dict):
            table.pop("shadow", None)
    return out


class _Now:
    """The shop's wall clock: a fixed day, moving on 20 s per reading (as the demo's)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 6, 25, 10, 30, tzinfo=timezone(timedelta(hours=8)))

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=20)
        return self.now


def _play(dep: Deployment, sc: Scenario, db: Path, driver: str) -> tuple[Run, int]:
    """Play ``sc`` on a fresh shop and store of its own, on a FakeClock; the run and the
    refund rows it left."""
    shop = Shop(db, now=_Now())
    run, model = dep.prepare(scenario=sc, tools=shop.tools(), clock=FakeClock())
    run.shared = Shared(dep.config.store.model_copy(update={"url": f"sqlite:///{db}.store"}))
    try:
        if driver == "sync":
            drive(dep.engine, run, model)
        else:
            asyncio.run(adrive(dep.engine, run, model))
    finally:
        run.shared.close()
    return run, len(shop.refunds())


#: the scenarios ``loopwarden demo`` plays, and those of the detection benchmark
DEMO = builtin_scenarios()
EVERY = [*DEMO, *sorted(BENCH_SCENARIOS.glob("*.toml"))]
#: what built-in plugins change besides their verdicts (retry_policy's backoff, call.delay_s,
#: and its runtime retry plan, call.retry, are not reached with these settings: no retry is
#: granted)
AUDITED_EFFECTS = {
    ("timeout", "run.deadline"),
    ("timeout", "request.timeout"),
    ("timeout", "call.timeout"),
    ("retry_policy", "call.delay_s"),
    ("retry_policy", "call.retry"),
    ("retry_policy", "result.retryable"),
}
#: the baseline of each way of shadowing: what stays enforced
BASELINE = {"tables": ["max_steps"], "run": ["max_steps", "terminal_tool"]}


#: the benchmark's scenarios in parts of about 20 (each part one test: they run in parallel)
BENCH_PARTS = [EVERY[len(DEMO) :][i::4] for i in range(4)]


@pytest.mark.parametrize(
    ("mode", "driver", "scenarios"),
    [
        ("tables", "sync", DEMO),
        *(("tables", "sync", part) for part in BENCH_PARTS),
        ("run", "sync", DEMO),  # (a shop database per run is slow to create: the demo's
        ("tables", "async", DEMO),  # scenarios suffice to cover the other paths)
        ("run", "async", DEMO),
    ],
    ids=[
        "every-plugin-shadowed",
        *(f"every-plugin-shadowed-bench-{i}" for i in range(len(BENCH_PARTS))),
        "shadow-mode",
        "every-plugin-shadowed-async",
        "shadow-mode-async",
    ],
)
@pytest.mark.slow
def test_a_shadow_run_of_every_scenario_is_the_run_with_only_max_steps(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    driver: str,
    scenarios: list[Path],
) -> None:
    monkeypatch.chdir(tmp_path)  # run_record writes runs.jsonl here
    data = _refusing(mode)
    shadow_dep = Deployment(with_shop_prompt(parse_config(data, path="<shadow>")))
    base_dep = Deployment(
        with_shop_prompt(parse_config(_only(data, BASELINE[mode]), path="<base>"))
    )
    assert len(EVERY) > 60 and len(DEMO) > 10
    assert shadow_dep.engine.shadow == set(BUILTIN_PLUGINS) - {"max_steps"} - (
        {"terminal_tool"} if mode == "run" else set()
    )
    effects: set[tuple[str, str]] = set()
    for i, path in enumerate(scenarios):
        sc = load_scenario(path)
        shadowed, s_refunds = _play(shadow_dep, sc, tmp_path / f"{i}-shadow.sqlite3", driver)
        base, b_refunds = _play(base_dep, sc, tmp_path / f"{i}-base.sqlite3", driver)
        s, b = shadowed.record(), base.record()
        assert shadowed.messages == base.messages, sc.name  # the transcript
        assert (s["tools_executed"], s_refunds) == (b["tools_executed"], b_refunds), sc.name
        assert s["elapsed_s"] == pytest.approx(b["elapsed_s"], abs=1e-6), sc.name
        assert (s["termination"], s["steps"], s["final_answer"]) == (
            b["termination"],
            b["steps"],
            b["final_answer"],
        ), sc.name
        # ... and the guards did judge it: limits this small refuse every run
        assert s["shadow_stop"] is not None, sc.name
        assert all(v["plugin"] in ("max_steps", "terminal_tool") for v in b["verdicts"])
        effects.update((e["plugin"], e["effect"]) for e in s.get("shadow_effects", []))
    # the audit of the built-ins: only these two change anything besides their verdicts
    assert effects <= AUDITED_EFFECTS
    if scenarios is DEMO:  # (the demo's scenarios reach both; a part of the bench may not)
        assert {("timeout", "run.deadline"), ("timeout", "call.timeout")} <= effects
        assert ("retry_policy", "result.retryable") in effects
    shadow_dep.close()
    base_dep.close()
