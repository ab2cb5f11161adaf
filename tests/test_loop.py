"""The loop's contract: hook order, verdict resolution, soft stops, failures, concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from support.contract import RECORD_FIELDS

from loopwarden import (
    Deployment,
    FakeClock,
    ModelError,
    ModelRequest,
    ModelResponse,
    Plugin,
    PluginLoadError,
    ProposedCall,
    ToolError,
    Usage,
    hookimpl,
    skip,
    stop,
    warn,
)
from loopwarden.config import parse_config
from loopwarden.testing import ScriptedModel, script, tool_call
from loopwarden.tools import ToolContext, ToolRegistry, tool
from loopwarden.verdicts import Skip, Stop, Warn, resolve

# -- a tiny tool set -----------------------------------------------------------------------

EXECUTED: list[str] = []


@tool(read_only=True, deterministic=True)
def lookup(key: str) -> str:
    """Look a key up."""
    EXECUTED.append(f"lookup:{key}")
    return f"value of {key}"


@tool(side_effect=True, idempotency_keys=("order_id",))
def refund(order_id: str) -> str:
    """Refund an order."""
    EXECUTED.append(f"refund:{order_id}")
    return f"refunded {order_id}"


@tool
def broken() -> str:
    """Always raises."""
    raise RuntimeError("disk on fire")


@tool
async def alookup(key: str) -> str:
    """Async lookup."""
    await asyncio.sleep(0)
    return f"async value of {key}"


@tool
def not_found(key: str) -> str:
    """Reports a domain error."""
    raise ToolError(f"NOT_FOUND: {key}")


TOOLS = ToolRegistry([lookup, refund, broken, alookup, not_found])


@pytest.fixture(autouse=True)
def _clear_executed() -> None:
    EXECUTED.clear()


def deployment(
    plugins: dict[str, Any] | None = None, max_steps: int = 10, **run: Any
) -> Deployment:
    cfg = parse_config(
        {"plugins": {"max_steps": {"max_steps": max_steps}}, "run": run}, path="<test>"
    )
    return Deployment(cfg, tools=TOOLS, plugins=plugins or {})


class Recorder(Plugin):
    """Records every hook call as one line."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    @hookimpl
    def on_start(self, run: Any) -> None:
        self.lines.append("on_start")

    @hookimpl
    def before_model(self, run: Any, request: ModelRequest) -> None:
        self.lines.append(f"before_model {request.step} {request.tool_choice}")

    @hookimpl
    def after_response(self, run: Any, response: ModelResponse) -> None:
        self.lines.append(f"after_response {len(response.tool_calls)}")

    @hookimpl
    def before_tool(self, run: Any, call: Any) -> None:
        self.lines.append(f"before_tool {call.name}")

    @hookimpl
    def after_tool(self, run: Any, call: Any, result: Any) -> None:
        self.lines.append(f"after_tool {call.name} ok={result.ok}")

    @hookimpl
    def on_stop(self, run: Any, outcome: Any) -> None:
        self.lines.append(f"on_stop {outcome.termination}")


# -- lifecycle -----------------------------------------------------------------------------


def test_lifecycle_sequence_of_one_run() -> None:
    rec = Recorder()
    model = ScriptedModel(
        script(
            [
                {
                    "content": "looking",
                    "tool_calls": [tool_call("lookup", key="a"), tool_call("lookup", key="b")],
                },
                {"content": "the answer"},
            ]
        )
    )
    run = deployment({"rec": rec}).run("q", model=model)
    assert rec.lines == [
        "on_start",
        "before_model 1 auto",
        "after_response 2",
        "before_tool lookup",
        "after_tool lookup ok=True",
        "before_tool lookup",
        "after_tool lookup ok=True",
        "before_model 2 auto",
        "after_response 0",
        "on_stop final_answer",
    ]
    rec_ = run.record()
    assert rec_["termination"] == "final_answer"
    assert rec_["steps"] == 2 and rec_["tool_calls"] == 2
    assert rec_["final_answer"] == "the answer" and rec_["final_answer_present"] is True
    # the conversation is well-formed OpenAI chat: every tool call answered by its id
    tool_msgs = [m for m in run.messages if m["role"] == "tool"]
    ids = [
        tc["id"] for m in run.messages if m["role"] == "assistant" for tc in m.get("tool_calls", [])
    ]
    assert [m["tool_call_id"] for m in tool_msgs] == ids


def test_record_has_every_design_field() -> None:
    run = deployment().run("q", model=ScriptedModel(script([{"content": "hi"}])))
    record = run.record()
    assert set(record) >= RECORD_FIELDS
    assert set(record["tokens"]) == {"prompt", "completion", "total"}
    assert record["tokens"]["total"] == record["tokens"]["prompt"] + record["tokens"]["completion"]
    json.dumps(record)  # serialisable


# -- order -------------------------------------------------------------------------------


def make_orderer(tag: str, log: list[str], **marker: bool) -> Any:
    class P:
        @hookimpl(**marker)
        def before_model(self, run: Any) -> None:
            log.append(tag)

    return P()


def test_plugins_are_called_in_config_order() -> None:
    log: list[str] = []
    plugins = {n: make_orderer(n, log) for n in ("c", "a", "b")}
    dep = deployment(plugins)
    assert dep.plugins.names == ["max_steps", "c", "a", "b"]
    assert dep.plugins.call_order("before_model") == ["max_steps", "c", "a", "b"]
    dep.run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert log == ["c", "a", "b"]


def test_tryfirst_on_the_first_plugin_keeps_the_order() -> None:
    log: list[str] = []
    cfg = parse_config({"plugins": {"enabled": ["first", "max_steps", "second"]}}, path="<t>")
    plugins = {
        "first": make_orderer("first", log, tryfirst=True),
        "second": make_orderer("second", log),
    }
    dep = Deployment(cfg, tools=TOOLS, plugins=plugins)
    assert dep.plugins.call_order("before_model") == ["first", "max_steps", "second"]
    dep.run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert log == ["first", "second"]


def test_tryfirst_that_breaks_the_config_order_fails_naming_the_plugin() -> None:
    log: list[str] = []
    plugins = {
        "early": make_orderer("early", log),
        "jumper": make_orderer("jumper", log, tryfirst=True),
    }
    with pytest.raises(PluginLoadError) as info:
        deployment(plugins)
    assert info.value.plugin == "jumper"
    assert "order" in str(info.value)


def test_misspelled_hook_fails_at_start_naming_the_plugin() -> None:
    class Typo:
        @hookimpl
        def befor_tool(self, run: Any, call: Any) -> None: ...

    with pytest.raises(PluginLoadError) as info:
        deployment({"typo": Typo()})
    assert info.value.plugin == "typo"
    assert "befor_tool" in str(info.value)


# -- verdict resolution ------------------------------------------------------------------


def test_resolution_prefers_hard_stop_then_soft_then_skip_then_warn() -> None:
    w = warn("w", plugin="p1")
    sk = skip("obs", plugin="p2", message="skipped")
    soft = stop("r_soft", soft=True, plugin="p3")
    hard = stop("r_hard", plugin="p4")
    assert resolve([w, sk, soft, hard]).decisive is hard
    assert resolve([w, sk, soft]).decisive is soft
    assert resolve([w, sk]).decisive is sk
    res = resolve([w])
    assert res.decisive is None and res.warnings == (w,)
    assert resolve([]).decisive is None


def test_resolution_ties_go_to_the_earlier_plugin_and_warnings_are_kept() -> None:
    a = stop("a", plugin="first")
    b = stop("b", plugin="second")
    w1, w2 = warn("one", plugin="x"), warn("two", plugin="y")
    res = resolve([w1, a, w2, b])
    assert res.decisive is a
    assert [w.message for w in res.warnings] == ["one", "two"]
    assert isinstance(res.verdicts[1], Stop) and isinstance(res.warnings[0], Warn)
    assert isinstance(skip("o"), Skip)


class Emit(Plugin):
    """Returns a scripted verdict from one hook at one step."""

    def __init__(self, name: str, hook: str, verdict: Any, at_step: int = 1) -> None:
        super().__init__()
        self.name, self.hook, self.verdict, self.at_step = name, hook, verdict, at_step

    def _maybe(self, hook: str, step: int) -> Any:
        if hook == self.hook and step == self.at_step:
            return dataclasses.replace(self.verdict, plugin=self.name)
        return None

    @hookimpl
    def before_model(self, run: Any, request: ModelRequest) -> Any:
        return self._maybe("before_model", request.step)

    @hookimpl
    def after_response(self, run: Any) -> Any:
        return self._maybe("after_response", run.step)

    @hookimpl
    def before_tool(self, run: Any, call: Any) -> Any:
        return self._maybe("before_tool", run.step)

    @hookimpl
    def after_tool(self, run: Any, call: Any) -> Any:
        return self._maybe("after_tool", run.step)


def looping_model() -> Any:
    return ScriptedModel(
        script(
            [{"content": "step", "tool_calls": [tool_call("lookup", key="a")]}],
            then="repeat_last",
            final_text="best answer from what I know",
        )
    )


def test_warning_is_injected_into_the_next_request_and_recorded() -> None:
    p = Emit("nag", "after_tool", warn("3 steps left"), at_step=1)
    model = looping_model()
    run = deployment({"nag": p}, max_steps=4).run("q", model=model)
    second = model.requests[1]
    assert second.notes == ["3 steps left"]
    # a system note by default: a guard's note never reaches the model as the user's words
    assert {"role": "system", "content": "[loopwarden] 3 steps left"} in run.messages
    assert run.record()["warnings"][0] == {"step": 1, "plugin": "nag", "message": "3 steps left"}


@pytest.mark.parametrize("hook", ["after_response", "before_tool", "after_tool"])
def test_soft_stop_grants_one_final_turn_without_tools(hook: str) -> None:
    p = Emit("guard", hook, stop("my_reason", soft=True), at_step=2)
    model = looping_model()
    run = deployment({"guard": p}).run("q", model=model)
    rec = run.record()
    assert rec["termination"] == "my_reason" and rec["soft"] is True
    assert rec["stopped_by"] == "guard"
    assert rec["steps"] == 3 and model.calls == 3
    last = model.requests[-1]
    assert last.tool_choice == "none" and last.final is True
    assert rec["final_answer"] == "best answer from what I know"
    assert rec["final_answer_present"] is True
    # the stopped turn's tool calls are answered, so the final request is well-formed
    assert run.messages[-2]["role"] in ("tool", "system")


def test_soft_stop_in_before_model_turns_that_call_into_the_final_turn() -> None:
    p = Emit("guard", "before_model", stop("budget", soft=True), at_step=2)
    model = looping_model()
    run = deployment({"guard": p}).run("q", model=model)
    assert model.calls == 2
    assert model.requests[1].tool_choice == "none"
    assert run.record()["soft"] is True


def test_hard_stop_returns_best_effort_answer_at_once() -> None:
    p = Emit("guard", "before_tool", stop("nope"), at_step=2)
    model = looping_model()
    run = deployment({"guard": p}).run("q", model=model)
    rec = run.record()
    assert rec["termination"] == "nope" and rec["soft"] is False
    assert model.calls == 2
    assert rec["final_answer"] == "step"  # the latest non-empty model content
    assert rec["final_answer_present"] is False
    assert EXECUTED == ["lookup:a"]  # the second call never ran


def test_hard_stop_without_any_content_uses_the_configured_fallback() -> None:
    p = Emit("guard", "before_model", stop("nope"), at_step=1)
    run = deployment({"guard": p}, fallback_answer="Sorry!").run("q", model=looping_model())
    assert run.record()["final_answer"] == "Sorry!"
    assert run.record()["steps"] == 0


def test_skip_hands_the_model_the_observation_instead_of_running_the_tool() -> None:
    p = Emit("cache", "before_tool", skip("cached value", message="already called"), at_step=2)
    model = looping_model()
    run = deployment({"cache": p}, max_steps=3).run("q", model=model)
    assert EXECUTED == ["lookup:a"]  # step 1 ran; step 2 was skipped; step 3 is the final turn
    assert {"role": "tool", "tool_call_id": "call_2_0", "content": "cached value"} in run.messages
    cache_warnings = [w for w in run.record()["warnings"] if w["plugin"] == "cache"]
    assert cache_warnings == [{"step": 2, "plugin": "cache", "message": "already called"}]


# -- failures ----------------------------------------------------------------------------


class ExplodingModel:
    name = "boom"

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError("429 rate limited", status=429, kind="rate_limited")


def test_model_error_stops_the_run_with_a_record_and_on_stop_runs() -> None:
    rec = Recorder()
    run = deployment({"rec": rec}).run("q", model=ExplodingModel())
    r = run.record()
    assert r["termination"] == "model_error"
    assert r["evidence"]["status"] == 429 and r["evidence"]["kind"] == "rate_limited"
    assert rec.lines[-1] == "on_stop model_error"
    assert r["final_answer"]  # the fallback, never None


def test_tool_exception_becomes_an_error_observation_and_the_run_goes_on() -> None:
    model = ScriptedModel(script([{"tool_calls": [tool_call("broken")]}, {"content": "sorry"}]))
    run = deployment().run("q", model=model)
    tool_msg = next(m for m in run.messages if m["role"] == "tool")
    assert tool_msg["content"] == "ERROR: RuntimeError: disk on fire"
    assert run.record()["termination"] == "final_answer"


def test_tool_error_text_reaches_the_model_verbatim() -> None:
    model = ScriptedModel(
        script([{"tool_calls": [tool_call("not_found", key="k9")]}, {"content": "not there"}])
    )
    run = deployment().run("q", model=model)
    assert any(m.get("content") == "NOT_FOUND: k9" for m in run.messages)


class Raiser(Plugin):
    @hookimpl
    def after_response(self, run: Any) -> None:
        raise KeyError("oops")


def test_a_raising_plugin_fails_closed_naming_the_plugin() -> None:
    rec = Recorder()
    run = deployment({"rec": rec, "raiser": Raiser()}).run("q", model=looping_model())
    r = run.record()
    assert r["termination"] == "plugin_error" and r["stopped_by"] == "raiser"
    assert r["evidence"]["hook"] == "after_response"
    assert "KeyError" in r["evidence"]["error"]
    assert rec.lines[-1] == "on_stop plugin_error"


def test_a_plugin_returning_garbage_fails_closed() -> None:
    class Garbage:
        @hookimpl
        def before_model(self) -> str:
            return "please stop"

    run = deployment({"garbage": Garbage()}).run("q", model=looping_model())
    assert run.record()["termination"] == "plugin_error"


def test_on_stop_failure_does_not_stop_other_plugins_on_stop() -> None:
    seen: list[str] = []

    class Bad:
        @hookimpl
        def on_stop(self) -> None:
            raise RuntimeError("sink down")

    class Good:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        @hookimpl
        def on_stop(self) -> None:
            seen.append(self.tag)

    plugins = {"g1": Good("g1"), "bad": Bad(), "g2": Good("g2")}
    run = deployment(plugins).run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert seen == ["g1", "g2"]
    assert run.record()["errors"] == [
        {"plugin": "bad", "hook": "on_stop", "error": "RuntimeError: sink down"}
    ]
    assert run.record()["termination"] == "final_answer"


# -- untrusted model output ---------------------------------------------------------------


def test_malformed_unknown_and_invalid_calls_become_error_observations() -> None:
    model = ScriptedModel(
        script(
            [
                {
                    "tool_calls": [
                        {"name": "lookup", "arguments": '{"key": "a"'},  # truncated JSON
                        {"name": "launch_rockets", "arguments": {}},
                        {"name": "lookup", "arguments": {"key": "a", "extra": 1}},
                        {"name": "lookup", "arguments": {}},
                        {"name": "lookup", "arguments": "[1, 2]"},
                    ]
                },
                {"content": "recovered"},
            ]
        )
    )
    rec = Recorder()
    run = deployment({"rec": rec}).run("q", model=model)
    outs = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert outs[0].startswith("ERROR: the arguments for lookup are not a valid JSON object")
    assert outs[1].startswith("ERROR: unknown tool 'launch_rockets'")
    assert "Available tools: lookup, refund" in outs[1]
    assert outs[2].startswith("ERROR: invalid arguments for lookup: extra")
    assert outs[3].startswith("ERROR: invalid arguments for lookup: key")
    assert "JSON object" in outs[4]
    assert EXECUTED == []  # nothing ran
    assert rec.lines.count("before_tool launch_rockets") == 1  # guards see bad calls too
    assert run.record()["termination"] == "final_answer"


def test_numbers_are_accepted_for_string_parameters() -> None:
    model = ScriptedModel(
        script([{"tool_calls": [tool_call("lookup", key=88231)]}, {"content": "ok"}])
    )
    deployment().run("q", model=model)
    assert EXECUTED == ["lookup:88231"]


def test_a_side_effect_never_runs_twice_for_the_same_key_in_a_run() -> None:
    model = ScriptedModel(
        script(
            [
                {"tool_calls": [tool_call("refund", order_id="1")]},
                {
                    "tool_calls": [
                        tool_call("refund", order_id="1"),
                        tool_call("refund", order_id="2"),
                    ]
                },
                {"content": "done"},
            ]
        )
    )
    run = deployment().run("q", model=model)
    assert EXECUTED == ["refund:1", "refund:2"]
    replay = [m["content"] for m in run.messages if m["role"] == "tool"][1]
    assert "was not executed again" in replay and "refunded 1" in replay


# -- cancellation, clocks, async ------------------------------------------------------------


def test_cancel_token_ends_the_run_between_steps() -> None:
    class Canceller(Plugin):
        @hookimpl
        def after_tool(self, run: Any) -> None:
            run.cancel.cancel("user left")

    run = deployment({"c": Canceller()}).run("q", model=looping_model())
    r = run.record()
    assert r["termination"] == "cancelled" and r["evidence"]["reason"] == "user left"
    assert r["steps"] == 1


def test_elapsed_time_comes_from_the_run_clock() -> None:
    clock = FakeClock(100.0)

    class Tick(Plugin):
        @hookimpl
        def after_response(self, run: Any) -> None:
            run.clock.advance(2.5)

    run = deployment({"t": Tick()}).run("q", model=looping_model(), clock=clock)
    assert run.record()["elapsed_s"] == pytest.approx(2.5 * run.step)


def test_async_run_awaits_async_and_sync_tools() -> None:
    model = ScriptedModel(
        script(
            [
                {"tool_calls": [tool_call("alookup", key="x"), tool_call("lookup", key="y")]},
                {"content": "both"},
            ]
        )
    )
    run = asyncio.run(deployment().arun("q", model=model))
    outs = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert outs == ["async value of x", "value of y"]


def test_sync_run_also_runs_async_tools() -> None:
    model = ScriptedModel(
        script([{"tool_calls": [tool_call("alookup", key="x")]}, {"content": "ok"}])
    )
    run = deployment().run("q", model=model)
    assert [m["content"] for m in run.messages if m["role"] == "tool"] == ["async value of x"]


class Counter(Plugin):
    """Counts tool calls per run in run state, and stops at its limit."""

    name = "counter"

    def new_state(self) -> dict[str, int]:
        return {"n": 0}

    @hookimpl
    def after_tool(self, run: Any) -> Any:
        st = self.state(run)
        st["n"] += 1
        if st["n"] >= int(run.meta["limit"]):
            return self.stop("counted", n=st["n"])
        return None


def test_two_concurrent_async_runs_share_a_deployment_not_state() -> None:
    dep = deployment({"counter": Counter()}, max_steps=50)

    class SlowModel:
        name = "slow"

        def __init__(self) -> None:
            self.inner = looping_model()

        async def acomplete(self, request: ModelRequest) -> ModelResponse:
            await asyncio.sleep(0.001)
            return self.inner.complete(request)

    async def both() -> list[Any]:
        return await asyncio.gather(
            dep.arun("a", model=SlowModel(), meta={"limit": 3}),
            dep.arun("b", model=SlowModel(), meta={"limit": 5}),
        )

    r1, r2 = asyncio.run(both())
    assert r1.record()["evidence"] == {"n": 3} and r1.step == 3
    assert r2.record()["evidence"] == {"n": 5} and r2.step == 5
    assert r1.state["counter"] is not r2.state["counter"]


# -- side effects: at most once per idempotency key, whatever happened -------------------------

CHARGES: list[str] = []


@tool(side_effect=True, idempotency_keys=("order_id",))
def charge_slow(order_id: str, ctx: ToolContext) -> str:
    """Charges, slowly (cooperative: sleeps on the run's clock)."""
    CHARGES.append(order_id)
    ctx.sleep(5.0)
    return f"charged {order_id}"


@tool(side_effect=True, idempotency_keys=("order_id",))
def charge_flaky(order_id: str) -> str:
    """Always answers 503 (retryable)."""
    CHARGES.append(order_id)
    raise ToolError("503 upstream unavailable", retryable=True)


@tool(side_effect=True, idempotency_keys=("order_id",))
def charge_refused(order_id: str) -> str:
    """Always refuses (not retryable)."""
    CHARGES.append(order_id)
    raise ToolError("DECLINED: card expired")


class SetTimeout(Plugin):
    @hookimpl
    def before_tool(self, call: Any) -> None:
        call.timeout = 1.0


def charging(name: str) -> Any:
    return ScriptedModel(
        script([{"tool_calls": [tool_call(name, order_id="A1")]}], then="repeat_last")
    )


@pytest.fixture
def charges() -> list[str]:
    CHARGES.clear()
    return CHARGES


def side_effect_deployment(plugins: dict[str, Any] | None = None, **tables: Any) -> Deployment:
    cfg = parse_config({"plugins": {"max_steps": {"max_steps": 6}, **tables}}, path="<t>")
    return Deployment(
        cfg, tools=ToolRegistry([charge_slow, charge_flaky, charge_refused]), plugins=plugins or {}
    )


def test_a_timed_out_side_effect_is_never_run_again(charges: list[str]) -> None:
    dep = side_effect_deployment({"t": SetTimeout()})
    run = dep.run("q", model=charging("charge_slow"), clock=FakeClock())
    assert charges == ["A1"]
    outs = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert outs[0].startswith("ERROR: TIMEOUT")
    assert all("may have taken effect" in o for o in outs[1:]) and len(outs) >= 3


def test_a_declined_side_effect_is_not_run_again(charges: list[str]) -> None:
    run = side_effect_deployment().run("q", model=charging("charge_refused"))
    assert charges == ["A1"]
    outs = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert "already failed" in outs[1] and "DECLINED" in outs[1]


def test_a_retryable_side_effect_runs_again_only_within_the_retry_budget(
    charges: list[str],
) -> None:
    cfg = parse_config(
        {
            "plugins": {
                "enabled": ["retry_policy"],
                "max_steps": {"max_steps": 8},
                "retry_policy": {"max_retries": 1, "backoff_s": 0.0},
            }
        },
        path="<t>",
    )
    dep = Deployment(cfg, tools=ToolRegistry([charge_flaky]))
    run = dep.run("q", model=charging("charge_flaky"), clock=FakeClock())
    assert charges == ["A1", "A1"]  # the call and one retry, never a third charge
    outs = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert "already failed" in outs[2]


class OutputGuard(Plugin):
    """Vetoes answers that mention a forbidden word; raises on another."""

    @hookimpl
    def after_response(self, response: ModelResponse) -> Any:
        text = response.content or ""
        if response.tool_calls:
            return None
        if "secret" in text:
            return self.stop("forbidden_content")
        if "crash" in text:
            raise RuntimeError("guard broke on the answer")
        if "meh" in text:
            return self.stop("ignored_soft", soft=True)
        return None


@pytest.mark.parametrize(
    ("answer", "termination"),
    [
        ("the secret is 42", "forbidden_content"),
        ("this makes the guard crash", "plugin_error"),
    ],
)
def test_a_hard_stop_or_a_failing_guard_on_the_answer_withholds_it(
    answer: str, termination: str
) -> None:
    model = ScriptedModel(
        script([{"tool_calls": [tool_call("lookup", key="a")]}, {"content": answer}])
    )
    run = deployment({"guard": OutputGuard()}, fallback_answer="Sorry.").run("q", model=model)
    rec = run.record()
    assert (rec["termination"], rec["stopped_by"]) == (termination, "guard")
    assert rec["final_answer"] == "Sorry." and rec["final_answer_present"] is False


def test_a_soft_stop_on_the_answer_changes_nothing() -> None:
    model = ScriptedModel(script([{"content": "meh, fine"}]))
    rec = deployment({"guard": OutputGuard()}).run("q", model=model).record()
    assert rec["termination"] == "final_answer" and rec["final_answer"] == "meh, fine"


def test_the_soft_stop_turns_answer_can_be_vetoed_too() -> None:
    p = Emit("early", "after_tool", stop("tired", soft=True), at_step=1)
    model = ScriptedModel(
        script(
            [{"tool_calls": [tool_call("lookup", key="a")]}],
            then="repeat_last",
            final_text="the secret is out",
        )
    )
    rec = deployment({"early": p, "guard": OutputGuard()}).run("q", model=model).record()
    assert rec["termination"] == "forbidden_content"
    assert rec["evidence"]["after_stop"] == "tired"


def test_every_verdict_is_in_the_record_also_the_ones_that_lost() -> None:
    loud = Emit("loud", "before_tool", stop("first", soft=True), at_step=1)
    louder = Emit("louder", "before_tool", stop("second"), at_step=1)
    quiet = Emit("quiet", "before_tool", skip("cached"), at_step=1)
    rec = (
        deployment({"loud": loud, "louder": louder, "quiet": quiet})
        .run("q", model=looping_model())
        .record()
    )
    assert rec["termination"] == "second"
    assert [(v["plugin"], v["kind"], v.get("reason")) for v in rec["verdicts"]] == [
        ("loud", "stop", "first"),
        ("louder", "stop", "second"),
        ("quiet", "skip", None),
    ]
    assert all(v["hook"] == "before_tool" and v["step"] == 1 for v in rec["verdicts"])


class RawModel:
    """A model adapter that answers whatever it is given, then a proper final answer."""

    name = "raw"

    def __init__(self, first: Any) -> None:
        self.first, self.calls = first, 0

    def complete(self, request: ModelRequest) -> Any:
        self.calls += 1
        return self.first if self.calls == 1 else ModelResponse(content="done")


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        {"content": "hi"},
        "just text",
        ModelResponse(content=42),  # type: ignore[arg-type]
        ModelResponse(tool_calls=[{"name": "lookup"}]),  # type: ignore[list-item]
        ModelResponse(content="x", usage={"prompt_tokens": 3}),  # type: ignore[arg-type]
        ModelResponse(content="x", usage=Usage(None, 3)),  # type: ignore[arg-type]
        ModelResponse(content="x", usage=Usage(-1, 3)),
        ModelResponse(tool_calls=[ProposedCall("lookup", "{}", 5)]),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_model_response_is_a_model_error_not_an_exception(garbage: Any) -> None:
    run = deployment().run("q", model=RawModel(garbage))
    rec = run.record()
    assert rec["termination"] == "model_error" and rec["evidence"]["kind"] == "malformed"


@pytest.mark.parametrize(
    ("arguments", "executed"),
    [
        ({"key": "a"}, ["lookup:a"]),  # parsed arguments from an adapter
        (None, []),  # null arguments: an empty object -> fails the schema, nothing runs
        (42, []),  # not JSON text: malformed, nothing runs
    ],
)
def test_proposed_call_arguments_of_other_types(arguments: Any, executed: list[str]) -> None:
    first = ModelResponse(tool_calls=[ProposedCall("lookup", arguments)])  # type: ignore[arg-type]
    run = deployment().run("q", model=RawModel(first))
    assert run.record()["termination"] == "final_answer"
    assert executed == EXECUTED


def test_dict_arguments_reach_the_plugins_as_json_text() -> None:
    seen: list[Any] = []

    class Peek(Plugin):
        @hookimpl
        def after_response(self, response: ModelResponse) -> None:
            seen.extend(c.arguments for c in response.tool_calls)

    first = ModelResponse(tool_calls=[ProposedCall("lookup", {"key": "a"})])  # type: ignore[arg-type]
    deployment({"peek": Peek()}).run("q", model=RawModel(first))
    assert seen == ['{"key": "a"}']


def test_cancelled_during_a_backoff_the_tool_is_not_started(charges: list[str]) -> None:
    class Backoff(Plugin):
        @hookimpl
        def before_tool(self, run: Any, call: Any) -> None:
            call.delay_s = 5.0
            run.cancel.cancel("user left")  # arrives while the loop waits

    clock = FakeClock()
    run = side_effect_deployment({"b": Backoff()}).run(
        "q", model=charging("charge_refused"), clock=clock
    )
    assert charges == []
    assert run.record()["termination"] == "cancelled"
    assert any("CANCELLED" in str(m.get("content")) for m in run.messages if m["role"] == "tool")


@tool
async def socket_timeout() -> str:
    """An async tool whose own network read times out at once."""
    raise TimeoutError("upstream read timed out")


def test_a_tools_own_timeout_error_is_not_the_loops_deadline() -> None:
    dep = Deployment(
        parse_config({}), tools=ToolRegistry([socket_timeout]), plugins={"t": SetTimeout()}
    )
    for runner in ("sync", "async"):
        model = ScriptedModel(
            script([{"tool_calls": [tool_call("socket_timeout")]}, {"content": "ok"}])
        )
        run = (
            dep.run("q", model=model)
            if runner == "sync"
            else asyncio.run(dep.arun("q", model=model))
        )
        out = next(m["content"] for m in run.messages if m["role"] == "tool")
        assert out == "ERROR: TimeoutError: upstream read timed out", runner


def test_a_sync_run_of_an_async_tool_works_inside_a_running_event_loop() -> None:
    async def inside() -> Any:
        model = ScriptedModel(
            script([{"tool_calls": [tool_call("alookup", key="x")]}, {"content": "ok"}])
        )
        return deployment().run("q", model=model)  # a sync call from async code

    run = asyncio.run(inside())
    assert [m["content"] for m in run.messages if m["role"] == "tool"] == ["async value of x"]
