"""retry_policy: a retryable failure may run again, max_retries times, after a backoff."""

from __future__ import annotations

from typing import Any

import pytest
from support.budgets import config, scenario

from loopwarden import Deployment, FakeClock
from loopwarden.plugins.retry_policy import RetryPolicy, RetryPolicySettings
from loopwarden.testing import (
    make_run,
    make_tool,
    make_tool_call,
    make_tool_result,
    tool_call,
    turn,
)


def plugin(**settings: Any) -> RetryPolicy:
    return RetryPolicy(RetryPolicySettings.model_validate(settings))


def test_first_failure_stays_retryable_second_spends_the_budget() -> None:
    clock = FakeClock()
    run = make_run(clock=clock)
    p = plugin(max_retries=1, runtime=False)
    c1 = make_tool_call("query_logistics")
    assert p.before_tool(run, c1) is None and c1.delay_s == 0  # not a retry
    r1 = make_tool_result("429 rate limited", error="tool_error", retryable=True)
    assert p.after_tool(run, c1, r1) is None
    assert r1.retryable is True  # may be retried once
    clock.advance(0.25)  # the model thought for a while: that counts toward the backoff
    run.step = 2
    c2 = make_tool_call("query_logistics", run=run)
    assert p.before_tool(run, c2) is None
    assert c2.delay_s == pytest.approx(0.75)
    r2 = make_tool_result("429 rate limited", error="tool_error", retryable=True)
    p.after_tool(run, c2, r2)
    assert r2.retryable is False  # the budget is spent: repeat_call takes over
    run.step = 3
    c3 = make_tool_call("query_logistics", run=run)
    assert p.before_tool(run, c3) is None and c3.delay_s == 0  # no more retries granted


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_boundaries_of_max_retries(max_retries: int) -> None:
    run = make_run()
    p = plugin(max_retries=max_retries)
    flags = []
    for i in range(max_retries + 2):
        run.step = i + 1
        c = make_tool_call("query_order", run=run)
        p.before_tool(run, c)
        r = make_tool_result("ERROR", error="tool_error", retryable=True)
        p.after_tool(run, c, r)
        flags.append(r.retryable)
    # failures 1..N (N = max_retries) keep it retryable; failure N+1 spends the budget
    assert flags == [True] * max_retries + [False, False]


def test_backoff_grows_and_is_capped() -> None:
    clock = FakeClock()
    run = make_run(clock=clock)
    p = plugin(max_retries=4, backoff_s=1.0, backoff_factor=3.0, max_backoff_s=5.0)
    delays = []
    for i in range(5):
        run.step = i + 1
        c = make_tool_call("query_order", run=run)
        p.before_tool(run, c)
        delays.append(c.delay_s)
        clock.advance(c.delay_s)  # the loop waits on the run's clock
        p.after_tool(run, c, make_tool_result("ERROR", error="tool_error", retryable=True))
    assert delays == [0, 1.0, 3.0, 5.0, 5.0]
    assert p.backoff(1) == 1.0 and p.backoff(2) == 3.0 and p.backoff(3) == 5.0


def test_a_later_plugin_delay_is_not_shortened() -> None:
    run = make_run()
    p = plugin()
    p.after_tool(
        run,
        make_tool_call("query_order"),
        make_tool_result("ERROR", error="tool_error", retryable=True),
    )
    c = make_tool_call("query_order")
    c.delay_s = 10.0
    p.before_tool(run, c)
    assert c.delay_s == 10.0


def test_success_and_non_retryable_failures_forget_the_call() -> None:
    run = make_run()
    p = plugin()
    p.after_tool(
        run,
        make_tool_call("query_order"),
        make_tool_result("ERROR", error="tool_error", retryable=True),
    )
    p.after_tool(run, make_tool_call("query_order"), make_tool_result())
    c = make_tool_call("query_order")
    p.before_tool(run, c)
    assert c.delay_s == 0
    p.after_tool(
        run,
        make_tool_call("query_order"),
        make_tool_result("ERROR", error="tool_error", retryable=True),
    )
    p.after_tool(
        run, make_tool_call("query_order"), make_tool_result("NOT_FOUND", error="tool_error")
    )
    c = make_tool_call("query_order")
    p.before_tool(run, c)
    assert c.delay_s == 0


def test_skipped_results_change_nothing() -> None:
    run = make_run()
    p = plugin(max_retries=1)
    r = make_tool_result("ERROR", error="tool_error", retryable=True)
    p.after_tool(run, make_tool_call("query_order"), r)
    p.after_tool(
        run,
        make_tool_call("query_order"),
        make_tool_result("skipped", skipped=True, skipped_by="other"),
    )
    r2 = make_tool_result("ERROR", error="tool_error", retryable=True)
    p.after_tool(run, make_tool_call("query_order"), r2)
    assert r2.retryable is False  # the skip did not reset the count


def test_timeouts_can_be_excluded() -> None:
    run = make_run()
    r = make_tool_result("ERROR: TIMEOUT", error="timeout", retryable=True)
    plugin(retry_timeouts=False).after_tool(run, make_tool_call("query_order"), r)
    assert r.retryable is False
    r = make_tool_result("ERROR: TIMEOUT", error="timeout", retryable=True)
    plugin().after_tool(run, make_tool_call("query_order"), r)
    assert r.retryable is True


def test_state_is_bounded() -> None:
    run = make_run()
    p = plugin(max_fingerprints=2)
    calls = {key: make_tool_call("query_order", order_id=key) for key in ("a", "b", "c")}
    for c in calls.values():
        p.after_tool(run, c, make_tool_result("ERROR", error="tool_error", retryable=True))
    assert list(p.state(run).failing) == [calls["b"].fingerprint, calls["c"].fingerprint]


def test_fingerprints_are_independent() -> None:
    run = make_run()
    p = plugin()
    ra = make_tool_result("ERROR", error="tool_error", retryable=True)
    p.after_tool(run, make_tool_call("query_order", order_id="a"), ra)
    rb = make_tool_result("ERROR", error="tool_error", retryable=True)
    p.after_tool(run, make_tool_call("query_order", order_id="b"), rb)
    assert ra.retryable and rb.retryable


# -- end to end --------------------------------------------------------------------------------

FAILING = {"query_logistics": {"error": {"message": "429 rate limited", "retryable": True}}}
LOOKUP = tool_call("query_logistics", tracking_no="SF1234567890")


def test_the_backoff_is_waited_on_the_run_clock() -> None:
    clock = FakeClock()
    policy = {"max_retries": 1, "runtime": False}
    dep = Deployment(
        config("retry_policy", max_steps={"max_steps": 4}, retry_policy=policy), clock=clock
    )
    run = dep.run(scenario=scenario([turn(None, LOOKUP)], tools=FAILING), clock=clock)
    rec = run.record()
    # without repeat_call nothing skips the later repeats: 3 executions, one backoff waited
    assert rec["tools_executed"] == 3
    assert clock.now() == pytest.approx(1.0)
    assert run.state["retry_policy"].retries == 1


def test_retry_storm_executes_the_failing_tool_exactly_twice() -> None:
    """Needs the repeat_call plugin (another defence line): skipped until it exists."""
    pytest.importorskip("loopwarden.plugins.repeat_call")
    clock = FakeClock()
    policy = {"max_retries": 1, "runtime": False}
    dep = Deployment(config("retry_policy", "repeat_call", retry_policy=policy), clock=clock)
    run = dep.run(scenario="retry-storm", clock=clock)
    rec = run.record()
    assert rec["termination"] == "repeat_call" and rec["stopped_by"] == "repeat_call"
    assert rec["tools_executed"] == 2
    observations = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert observations[:2] == ["429 rate limited", "429 rate limited"]
    assert clock.now() == pytest.approx(1.0)  # one backoff before the retry


def test_retry_storm_with_the_runtime_retrying_executes_the_budget_and_no_more() -> None:
    """The shipped way: the runtime makes the attempts (max_retries + 1), the model sees one
    observation, and repeat_call answers the model's repeats -- no further execution."""
    clock = FakeClock()
    policy = {"max_retries": 2, "jitter": 0.0}
    dep = Deployment(config("retry_policy", "repeat_call", retry_policy=policy), clock=clock)
    run = dep.run(scenario="retry-storm", clock=clock)
    rec = run.record()
    assert rec["termination"] == "repeat_call"
    assert rec["tools_executed"] == 3
    assert [r["attempts"] for r in rec["tool_retries"]] == [3]
    observations = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert observations[0].startswith("429 rate limited") and "3 times" in observations[0]
    assert clock.now() == pytest.approx(1.0 + 2.0)  # the runtime's two backoffs


def test_the_runtime_plan_carries_the_budget_left() -> None:
    run = make_run(tools=[make_tool("query_order", read_only=True)])
    p = plugin(max_retries=3, backoff_s=1.0, backoff_factor=2.0, jitter=0.0)
    c = make_tool_call("query_order", run=run)
    p.before_tool(run, c)
    assert c.retry is not None and c.retry.attempts == 4 and c.retry.backoff_s == 1.0
    r = make_tool_result("ERROR", error="tool_error", retryable=True)
    r.attempts = 2  # the runtime tried twice
    p.after_tool(run, c, r)
    c2 = make_tool_call("query_order", run=run)
    p.before_tool(run, c2)
    # two of four executions spent: two left, the backoff carrying on from the third retry
    assert c2.retry is not None and c2.retry.attempts == 2 and c2.retry.backoff_s == 4.0


@pytest.mark.parametrize(
    ("nature", "planned"),
    [
        ({"read_only": True}, True),
        ({"side_effect": True}, False),  # no idempotency keys declared: the model decides
        ({"undeclared": True}, False),  # nobody declared it: a guess never changes execution
    ],
)
def test_only_declared_safe_calls_get_a_runtime_plan(nature: dict[str, Any], planned: bool) -> None:
    t = make_tool("query_order", **{k: v for k, v in nature.items() if k != "undeclared"})
    if nature.get("undeclared"):
        t.declared = False
    run = make_run(tools=[t])
    c = make_tool_call("query_order", run=run)
    plugin().before_tool(run, c)
    assert (c.retry is not None) is planned
