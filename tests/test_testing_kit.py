"""loopwarden.testing, and the hook contract it lets authors test (one ``test_hook_*`` per hook).

The ``test_hook_<name>`` tests pin what docs/hooks.md promises about each hook; the meta-test
in test_docs.py requires one for every hook.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Plugin, PluginLoadError, hookimpl
from loopwarden.config import load_config
from loopwarden.demo import Shop, shop_tools
from loopwarden.exceptions import ConfigError
from loopwarden.fingerprint import Fingerprinter
from loopwarden.plugins.cost_budget import run_cost
from loopwarden.testing import (
    FakeClock,
    HookRecorder,
    SignalRecorder,
    call_hook,
    make_deployment,
    make_outcome,
    make_request,
    make_response,
    make_run,
    make_tool,
    make_tool_call,
    make_tool_result,
    run_plugin,
    script,
    tool_call,
    turn,
)

pytest_plugins = ["pytester"]

LOOKUP = tool_call("query_order", order_id="88231")
REFUND = tool_call("apply_refund", order_id="88231", reason="七天无理由退货")


class Probe(Plugin):  # type: ignore[type-arg]
    """Records what each hook saw *at call time* into ``run.state['seen']``."""

    name = "probe"

    def _seen(self, run: Any) -> list[tuple[Any, ...]]:
        seen: list[tuple[Any, ...]] = run.state.setdefault("seen", [])
        return seen

    @hookimpl
    def on_start(self, run: Any) -> None:
        self._seen(run).append(("on_start", run.step, len(run.messages)))

    @hookimpl
    def before_model(self, run: Any, request: Any) -> None:
        self._seen(run).append(("before_model", run.step, request.step, request.tool_choice))

    @hookimpl
    def after_response(self, run: Any, response: Any) -> None:
        self._seen(run).append(
            ("after_response", run.step, run.usage.total, len(response.tool_calls))
        )

    @hookimpl
    def before_tool(self, run: Any, call: Any) -> None:
        self._seen(run).append(("before_tool", call.name, call.error, call.fingerprint))

    @hookimpl
    def after_tool(self, run: Any, call: Any, result: Any) -> None:
        self._seen(run).append(
            ("after_tool", call.name, result.ok, result.skipped, result.retryable)
        )

    @hookimpl
    def on_stop(self, run: Any, outcome: Any) -> None:
        self._seen(run).append(("on_stop", outcome.termination))


def seen(result: Any, hook: str) -> list[tuple[Any, ...]]:
    return [s for s in result.run.state["seen"] if s[0] == hook]


# -- the lifecycle, one line per hook -----------------------------------------------------------


def test_lifecycle_of_the_refund_scenario(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "shop.sqlite3")
    result = run_plugin(Probe, scenario="refund", tools=shop.tools())
    assert result.termination == "final_answer"
    assert result.hooks.names == [
        "on_start",
        "before_model",
        "after_response",
        "before_tool",
        "after_tool",  # query_order
        "before_tool",
        "after_tool",  # search_knowledge (same turn)
        "before_model",
        "after_response",
        "before_tool",
        "after_tool",  # get_current_time
        "before_model",
        "after_response",
        "before_tool",
        "after_tool",  # apply_refund
        "before_model",
        "after_response",  # the answer
        "on_stop",
    ]
    assert len(shop.refunds()) == 1


# -- the contract of each hook --------------------------------------------------------------


def test_hook_on_start() -> None:
    result = run_plugin(Probe, turns=[turn("hi", LOOKUP)], tools=shop_tools())
    assert seen(result, "on_start") == [("on_start", 0, 2)]  # system + user, no model call yet

    class Refuse(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def on_start(self) -> Any:
            return self.stop("not_today")

    refused = run_plugin(Refuse, name="refuse", turns=[turn("hi", LOOKUP)], tools=shop_tools())
    assert refused.termination == "not_today"
    assert refused.model.calls == 0  # a hard stop in on_start: no model call at all
    assert refused.hooks.names == ["on_start", "on_stop"]


def test_hook_before_model() -> None:
    result = run_plugin(Probe, turns=[turn("a", LOOKUP), turn("b", LOOKUP)], tools=shop_tools())
    # request.step is the call about to be made: run.step + 1
    assert [(s[1], s[2]) for s in seen(result, "before_model")] == [(0, 1), (1, 2), (2, 3)]

    class SoftAtTwo(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_model(self, request: Any) -> Any:
            return self.stop("enough", soft=True) if request.step == 2 else None

    soft = run_plugin(
        SoftAtTwo,
        name="soft",
        turns=[turn("a", LOOKUP)],
        then="repeat_last",
        final_text="wrapped up",
        tools=shop_tools(),
    )
    # a soft stop turns this very request into the tool-less final turn
    assert soft.model.requests[-1].tool_choice == "none" and soft.model.requests[-1].final
    assert (soft.termination, soft.record["soft"], soft.outcome.final_answer) == (
        "enough",
        True,
        "wrapped up",
    )

    class HardAtTwo(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_model(self, request: Any) -> Any:
            return self.stop("broke") if request.step == 2 else None

    hard = run_plugin(
        HardAtTwo, name="hard", turns=[turn("a", LOOKUP)], then="repeat_last", tools=shop_tools()
    )
    assert hard.model.calls == 1  # the model is never called for the refused request
    assert hard.record["soft"] is False


def test_hook_after_response(tmp_path: Path) -> None:
    result = run_plugin(Probe, turns=[turn("a", LOOKUP, LOOKUP)], tools=shop_tools())
    first = seen(result, "after_response")[0]
    assert first[1] == 1  # run.step already counts this response
    # run.usage already includes this response's usage: the scripted model bills the request
    assert first[2] >= result.model.requests[0].estimated_tokens > 0
    assert first[3] == 2

    class StopProposals(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def after_response(self, response: Any) -> Any:
            return self.stop("no_tools") if response.tool_calls else None

    shop = Shop(tmp_path / "shop.sqlite3")
    stopped = run_plugin(
        StopProposals, name="gate", turns=[turn("退款", REFUND)], tools=shop.tools()
    )
    assert stopped.executed == []  # none of the proposed calls runs
    assert shop.refunds() == []
    assert "before_tool" not in stopped.hooks.names


def test_hook_before_tool(tmp_path: Path) -> None:
    result = run_plugin(
        Probe, turns=[turn("a", LOOKUP, tool_call("no_such_tool"))], tools=shop_tools()
    )
    (lookup, unknown) = seen(result, "before_tool")
    # called for unknown tools too; they then fail without running anything
    assert unknown[1:3] == ("no_such_tool", "unknown_tool")
    # the fingerprint the loop computes is the one make_tool_call computes
    assert lookup[3] == make_tool_call("query_order", order_id="88231").fingerprint

    class SkipRefunds(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_tool(self, call: Any) -> Any:
            if call.side_effect:
                return self.skip("SKIPPED: refunds need a human")
            return None

    shop = Shop(tmp_path / "shop.sqlite3")
    skipped = run_plugin(
        SkipRefunds, name="skipper", turns=[turn("退款", REFUND)], tools=shop.tools()
    )
    after = skipped.hooks.getcall("after_tool")
    assert after.result.skipped and after.result.skipped_by == "skipper"
    assert after.result.content == "SKIPPED: refunds need a human"
    assert shop.refunds() == []


def test_hook_after_tool() -> None:
    class Flaky(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def after_tool(self, result: Any) -> None:
            result.retryable = False  # a spent retry budget

    # the change is seen by plugins later in the config order, not earlier ones
    result = run_plugin(
        Probe,
        enabled=["probe", "flaky", "late"],
        plugins={"flaky": Flaky, "late": Probe},
        turns=[turn("a", LOOKUP)],
        tool_results={"query_order": [{"error": "429", "retryable": True}]},
        tools=shop_tools(),
    )
    saw = [s for s in result.run.state["seen"] if s[0] == "after_tool"]
    assert [s[4] for s in saw] == [True, False]  # probe (before flaky), late (after flaky)


def test_hook_on_stop() -> None:
    class Broken(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_tool(self) -> None:
            raise RuntimeError("bug")

        @hookimpl
        def on_stop(self) -> None:
            raise RuntimeError("bug in on_stop too")

    result = run_plugin(
        Probe,
        enabled=["broken", "probe"],
        plugins={"broken": Broken},
        turns=[turn("a", LOOKUP)],
        tools=shop_tools(),
    )
    # the guard failed closed, and on_stop still ran for everyone, once
    assert result.termination == "plugin_error"
    assert result.record["stopped_by"] == "broken"
    assert seen(result, "on_stop") == [("on_stop", "plugin_error")]
    assert result.record["errors"] == [
        {"plugin": "broken", "hook": "on_stop", "error": "RuntimeError: bug in on_stop too"}
    ]
    assert result.hooks.names[-1] == "on_stop"


# -- builders ---------------------------------------------------------------------------------


def test_make_tool_call_matches_the_loops_parsing() -> None:
    run = make_run(tools=shop_tools())
    call = make_tool_call("query_order", {"order_id": " 88231 "}, run=run)
    same = make_tool_call("query_order", order_id="88231", run=run)
    assert (
        call.fingerprint
        == same.fingerprint
        == Fingerprinter()("query_order", {"order_id": "88231"})
    )
    assert call.tool is not None and call.read_only and call.error is None
    # volatile keys (request ids, timestamps) do not change the fingerprint
    run = make_run(tools=[make_tool("lookup")])
    a = make_tool_call("lookup", {"q": "x", "request_id": "1"}, run=run)
    b = make_tool_call("lookup", {"q": "X", "request_id": "2"}, run=run)
    assert a.fingerprint == b.fingerprint
    shop = make_run(tools=shop_tools())
    refund = make_tool_call("apply_refund", order_id="88231", reason="x", run=shop)
    assert refund.side_effect and refund.idempotency_key
    assert make_tool_call("query_order", order_id=5, run=shop).arguments == {"order_id": "5"}
    assert make_tool_call("query_order", run=shop).error == "invalid_arguments"
    bad = make_tool_call("query_order", '{"order_id": ', run=shop)
    assert (bad.error, bad.arguments, bad.raw_arguments) == (
        "malformed_arguments",
        None,
        '{"order_id": ',
    )
    run = make_run(step=3)
    assert make_tool_call("query_order", order_id="1", run=run, index=2).step == 3
    # without tools, every name is unknown -- as in the loop
    assert make_tool_call("query_order", order_id="1").error == "unknown_tool"


def test_make_run_sets_limits_and_counters() -> None:
    clock = FakeClock(100.0)
    run = make_run(
        "hi",
        max_steps=4,
        usage=(100, 20),
        cost=0.5,
        step=2,
        clock=clock,
        tools=[make_tool("ping", read_only=True)],
    )
    assert run.limits.max_steps == 4 and run.step == 2
    assert (run.usage.total, float(run_cost(run))) == (120, 0.5)
    assert run.tools is not None and run.tools.names == ["ping"]
    clock.advance(7)
    assert run.elapsed == 7
    assert run.messages == [{"role": "user", "content": "hi"}]


def test_make_request_and_response() -> None:
    run = make_run(step=2)
    request = make_request(run, notes=["slow down"])
    assert request.step == 3 and request.notes == ["slow down"]
    assert run.messages[-1]["content"].endswith("slow down")
    assert make_request(run, final=True).tool_choice == "none"
    response = make_response("好的", LOOKUP, ("get_current_time", {}), usage=(50, 5))
    assert [c.name for c in response.tool_calls] == ["query_order", "get_current_time"]
    assert response.usage is not None and response.usage.total == 55
    assert response.finish_reason == "tool_calls"
    assert make_response("done").finish_reason == "stop"


def test_make_tool_result_and_outcome() -> None:
    failed = make_tool_result("429", error="tool_error", retryable=True)
    assert (failed.ok, failed.error, failed.retryable) == (False, "tool_error", True)
    assert make_tool_result("x").digest == make_tool_result("x").digest
    outcome = make_outcome("max_steps", soft=True, stopped_by="max_steps")
    assert (outcome.termination, outcome.soft, outcome.final_answer_present) == (
        "max_steps",
        True,
        False,
    )


def test_make_tool_runs_its_result() -> None:
    tool = make_tool("echo", result=lambda **kw: kw, parameters={"text": str})
    assert tool.validate({"text": 1}) == {"text": "1"}  # coerced like a declared tool
    result = run_plugin(Probe, tools=[tool], turns=[turn("a", tool_call("echo", text="hi"))])
    assert result.hooks.getcall("after_tool").result.content == '{"text": "hi"}'


def test_script_builds_a_scenario_script() -> None:
    s = script([turn("a", LOOKUP)], then="cycle", final_text="bye")
    assert (s.then, s.final_text, s.turns[0].tool_calls[0].name) == ("cycle", "bye", "query_order")


# -- call_hook ------------------------------------------------------------------------------


def test_call_hook_passes_only_the_arguments_asked_for() -> None:
    class OnlyCall(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_tool(self, call: Any) -> Any:
            return self.warn(f"saw {call.name}")

    verdict = call_hook(OnlyCall(), "before_tool", call=make_tool_call("query_order", order_id="1"))
    assert verdict.message == "saw query_order"
    assert verdict.plugin == "OnlyCall"
    assert call_hook(OnlyCall(), "after_tool", call=None, result=None) is None


def test_call_hook_registers_like_the_loader() -> None:
    class Typo(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def after_tol(self) -> None:
            return None

    with pytest.raises(PluginLoadError, match="did you mean 'after_tool'"):
        call_hook(Typo(), "after_tool")

    class Raises(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def on_start(self) -> None:
            raise ValueError("the author's bug")

    with pytest.raises(ValueError, match="the author's bug"):  # not swallowed
        call_hook(Raises(), "on_start")


def test_call_hook_builds_a_class_with_settings() -> None:
    from loopwarden.plugins.max_steps import MaxSteps

    run = make_run(step=2)
    verdict = call_hook(
        MaxSteps, "before_model", settings={"max_steps": 3}, run=run, request=make_request(run)
    )
    assert (verdict.reason, verdict.soft, verdict.plugin) == ("max_steps", True, "max_steps")
    with pytest.raises(ConfigError) as err:
        call_hook(MaxSteps, "before_model", settings={"max_steps": 0})
    assert err.value.key == "plugins.max_steps.max_steps"


# -- recorders ------------------------------------------------------------------------------


def test_hook_recorder_getcalls_and_finish() -> None:
    with make_deployment(
        plugins={"probe": Probe}, tools=[make_tool("ping", read_only=True)]
    ) as dep:
        hook_recorder_checks(dep)


def hook_recorder_checks(dep: Any) -> None:
    rec = HookRecorder(dep)
    dep.run(scenario=_scenario())
    calls = rec.getcalls("before_tool after_tool")
    assert [c.name for c in calls] == ["before_tool", "after_tool"]
    assert calls[1].call is calls[0].call  # keyword arguments as attributes
    assert calls[1].result.content == "pong"
    with pytest.raises(LookupError, match="exactly one before_model"):
        rec.getcall("before_model")
    assert rec.getcall("on_start").returned == []
    rec.finish_recording()
    n = len(rec.calls)
    dep.run(scenario=_scenario())
    assert len(rec.calls) == n


def _scenario() -> Any:
    from loopwarden.models.scenario import Scenario

    return Scenario(
        name="ping",
        user="ping",
        model=script([turn("p", tool_call("ping"))]),
        tools={"ping": {"results": ["pong"]}},
    )


def test_hook_recorder_collects_verdicts() -> None:
    result = run_plugin(
        "max_steps",
        settings={"max_steps": 3, "warn_remaining": 1},
        turns=[turn("a", LOOKUP)],
        then="repeat_last",
        tools=shop_tools(),
    )
    kinds = [(v.kind, getattr(v, "soft", None)) for v in result.hooks.verdicts()]
    assert kinds == [("warn", None), ("stop", True)]
    assert [v.kind for v in result.hooks.verdicts("after_response")] == ["warn"]
    assert [v.kind for v in result.hooks.verdicts("before_model")] == ["stop"]
    assert result.hooks.verdicts() == result.verdicts


def test_signal_recorder_records_only_while_active() -> None:
    with make_deployment(tools=[make_tool("ping", read_only=True)]) as dep:
        signal_recorder_checks(dep)


def signal_recorder_checks(dep: Any) -> None:
    with SignalRecorder() as rec:
        run = dep.run(scenario=_scenario())
    assert rec.names()[0] == "run-started" and rec.names()[-1] == "run-stopped"
    assert rec.get("run-stopped")[0].sender is run
    assert rec.get("run-stopped")[0].record["termination"] == "final_answer"
    n = len(rec.records)
    dep.run(scenario=_scenario())
    assert len(rec.records) == n
    with SignalRecorder(deployment=object()) as other:
        dep.run(scenario=_scenario())
    assert other.records == []


def test_make_deployment_takes_a_mapping_a_config_or_a_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[plugins]\nenabled = ["max_steps"]\n[plugins.max_steps]\nmax_steps = 3\n', encoding="utf-8"
    )
    for source in ({"plugins": {"max_steps": {"max_steps": 3}}}, load_config(path), path):
        with make_deployment(source, tools=shop_tools()) as dep:
            assert dep.plugins.get("max_steps").settings.max_steps == 3


# -- run_plugin -----------------------------------------------------------------------------


def test_run_plugin_validates_settings_like_the_config() -> None:
    with pytest.raises(ConfigError) as err:
        run_plugin("max_steps", settings={"max_stepz": 3}, tools=shop_tools())
    assert err.value.key == "plugins.max_steps.max_stepz"


def test_run_plugin_scripts_tool_failures_and_uses_a_fake_clock() -> None:
    result = run_plugin(
        Probe,
        turns=[turn("a", LOOKUP)],
        then="repeat_last",
        config={"plugins": {"max_steps": {"max_steps": 3}}},
        tool_results={"query_order": [{"error": "503", "retryable": True}, "found it"]},
        tools=shop_tools(),
    )
    assert [(s[2], s[4]) for s in seen(result, "after_tool")] == [(False, True), (True, False)]
    assert result.termination == "max_steps"
    assert result.record["elapsed_s"] == 0.0  # time only moves when told to


def test_run_plugin_requires_the_plugin_in_enabled() -> None:
    with pytest.raises(ValueError, match="does not name 'probe'"):
        run_plugin(Probe, enabled=["max_steps"], tools=shop_tools())


# -- the pytest plugin is opt-in ------------------------------------------------------------


FIXTURE_TEST = """
from loopwarden.demo import shop_tools

def test_uses_the_kit(lw_clock, lw_signals, lw_deployment, lw_hooks):
    dep = lw_deployment(tools=shop_tools())
    rec = lw_hooks(dep)
    dep.run(scenario="refund", clock=lw_clock)
    assert rec.names[0] == "on_start"
    assert "run-stopped" in lw_signals.names()
"""


@pytest.mark.slow
def test_fixtures_are_inactive_unless_asked_for(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FIXTURE_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'lw_clock' not found*"])


@pytest.mark.parametrize("how", ["-p", "conftest", "ini"])
@pytest.mark.slow
def test_fixtures_are_active_when_asked_for(pytester: pytest.Pytester, how: str) -> None:
    pytester.makepyfile(FIXTURE_TEST)
    args = ["-p", "no:cacheprovider"]
    if how == "-p":
        args += ["-p", "loopwarden.testing"]
    elif how == "conftest":
        pytester.makeconftest('pytest_plugins = ["loopwarden.testing"]')
    else:
        pytester.makeini("[pytest]\nloopwarden_testing = true\n")
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["loopwarden *: testing kit active"])


def test_importing_the_kit_does_not_import_pytest() -> None:
    code = "import sys, loopwarden.testing; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_run_plugin_isolates_the_shared_store_between_runs(tmp_path: Path) -> None:
    """Each run_plugin call gets its own store: the ledger of an earlier test run (or of the
    user's data directory) never answers this run's side effect."""
    from loopwarden.testing import run_plugin, tool_call, turn

    refund = tool_call("apply_refund", order_id="88231", reason="七天无理由退货")
    for i in range(2):
        shop = Shop(tmp_path / f"shop{i}.sqlite3")
        result = run_plugin(
            "max_steps", turns=[turn("退款", refund)], final_text="已退款", tools=shop.tools()
        )
        assert result.record["tools_executed"] == 1
        assert len(shop.refunds()) == 1
