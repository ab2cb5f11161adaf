"""Retries the runtime owns (retry_policy's ``runtime = true``).

A retryable failure (a 429, a 5xx, a reset connection, a read-only call's timeout) is
retried by the loop itself -- backoff with jitter, the failure's ``Retry-After`` honoured,
every attempt inside the call's deadline -- and the model sees one observation saying how many
attempts it took.  A semantic error is never retried; a side effect only under its idempotency
key; a tool whose nature nobody declared never.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from support.budgets import config

from loopwarden import CancelToken, Deployment, FakeClock, ToolError
from loopwarden.engine.execution import retry_after_of
from loopwarden.events import RetryPlan
from loopwarden.models.scripted import ScriptedModel
from loopwarden.testing import script, tool_call, turn
from loopwarden.tools import Tool, ToolRegistry, tool

FAST = {"backoff_s": 1.0, "backoff_factor": 2.0, "jitter": 0.0}


def flaky(errors: list[BaseException | None], **nature: Any) -> tuple[Tool, list[str]]:
    """A tool that raises ``errors`` in turn (None: succeeds), then succeeds."""
    calls: list[str] = []
    nature.setdefault("read_only", True)

    @tool(**nature)
    def lookup(order_id: str) -> str:
        """Look an order up."""
        calls.append(order_id)
        i = len(calls) - 1
        err = errors[i] if i < len(errors) else None
        if err is not None:
            raise err
        return f"order {order_id}: shipped"

    return lookup, calls


def run_once(
    t: Tool,
    *,
    mode: str = "run",
    clock: FakeClock | None = None,
    calls: int = 1,
    enabled: tuple[str, ...] = ("retry_policy",),
    **policy: Any,
) -> Any:
    clock = clock or FakeClock()
    name = t.name
    args = {"order_id": "88231"} if name != "refund" else {"order_id": "88231", "amount": 5}
    turns = [turn(None, tool_call(name, **args)) for _ in range(calls)]
    model = ScriptedModel(script(turns, then="final", final_text="done"))
    dep = Deployment(config(*enabled, retry_policy={**FAST, **policy}), clock=clock)
    with dep:
        if mode == "run":
            return dep.run("where is 88231", model=model, tools=ToolRegistry([t]), clock=clock)
        return asyncio.run(
            dep.arun("where is 88231", model=model, tools=ToolRegistry([t]), clock=clock)
        )


def observations(run: Any) -> list[str]:
    return [m["content"] for m in run.messages if m["role"] == "tool"]


@pytest.mark.parametrize("mode", ["run", "arun"])
def test_transient_failures_are_retried_by_the_runtime_and_the_model_sees_one_observation(
    mode: str,
) -> None:
    t, calls = flaky([ToolError("503 busy", retryable=True), ToolError("429", retryable=True)])
    clock = FakeClock()
    run = run_once(t, mode=mode, clock=clock)
    assert calls == ["88231"] * 3
    obs = observations(run)
    assert len(obs) == 1 and obs[0].startswith("order 88231: shipped")
    assert "3 attempts" in obs[0]
    assert clock.now() == pytest.approx(1.0 + 2.0)  # two backoffs, no jitter, on the run clock
    rec = run.record()
    assert rec["tools_executed"] == 3
    assert rec["tool_retries"] == [
        {
            "step": 1,
            "tool": "lookup",
            "call_id": rec["tool_retries"][0]["call_id"],
            "attempts": 3,
            "errors": ["tool_error", "tool_error"],
            "waited_s": 3.0,
            "ok": True,
        }
    ]


def test_the_digest_is_the_tools_own_output_not_the_attempt_note() -> None:
    t, _ = flaky([ToolError("503", retryable=True)])
    seen: list[Any] = []
    from loopwarden import signals

    def grab(sender: Any, **kw: Any) -> None:
        seen.append(kw["result"])

    signals.tool_finished.connect(grab)
    try:
        run_once(t)
    finally:
        signals.tool_finished.disconnect(grab)
    import hashlib

    (result,) = seen
    own = hashlib.blake2b(b"order 88231: shipped", digest_size=8).hexdigest()
    assert (
        result.attempts == 2 and result.digest == own and result.content != "order 88231: shipped"
    )


@pytest.mark.parametrize(
    "error",
    [ToolError("NOT_FOUND: order 88231"), ToolError("invalid order id"), ValueError("boom")],
)
def test_semantic_errors_are_never_retried(error: BaseException) -> None:
    t, calls = flaky([error])
    run = run_once(t)
    assert len(calls) == 1
    assert run.record()["tool_retries"] == []


def test_retry_after_is_honoured_instead_of_the_backoff() -> None:
    t, calls = flaky([ToolError("429 slow down", retryable=True, retry_after=7.0)])
    clock = FakeClock()
    run_once(t, clock=clock, max_backoff_s=10.0)
    assert len(calls) == 2 and clock.now() == pytest.approx(7.0)


def test_a_retry_after_longer_than_the_longest_backoff_is_not_waited_for() -> None:
    t, calls = flaky([ToolError("429 come back tomorrow", retryable=True, retry_after=3600)])
    clock = FakeClock()
    run = run_once(t, clock=clock, max_backoff_s=30.0)
    assert len(calls) == 1 and clock.now() == 0
    assert run.record()["tool_retries"] == []


def test_an_http_errors_retry_after_header_is_read() -> None:
    request = httpx.Request("GET", "http://shop.invalid/orders/88231")
    response = httpx.Response(429, headers={"Retry-After": "4"}, request=request)
    err = httpx.HTTPStatusError("429", request=request, response=response)
    assert retry_after_of(err) == 4.0
    t, calls = flaky([err], retryable=(httpx.HTTPStatusError,))
    clock = FakeClock()
    run_once(t, clock=clock)
    assert len(calls) == 2 and clock.now() == pytest.approx(4.0)


@pytest.mark.parametrize(
    "value",
    ["soon", "", "nan", "inf", "Wed, 21 Oct 2015 07:28:00 GMT"],
)
def test_odd_retry_after_headers_mean_no_wait_or_none(value: str) -> None:
    response = httpx.Response(503, headers={"Retry-After": value})
    err = httpx.HTTPStatusError(
        "503", request=httpx.Request("GET", "http://x.invalid"), response=response
    )
    got = retry_after_of(err)
    assert got is None or got == 0.0  # a date in the past: no wait; garbage: ignored


def test_jitter_spreads_the_backoff_within_its_bounds() -> None:
    plan = RetryPlan(attempts=3, backoff_s=2.0, factor=2.0, max_backoff_s=30.0, jitter=0.5)
    assert plan.wait(1, 0.0) == 2.0 and plan.wait(1, 0.999) == pytest.approx(1.001)
    assert plan.wait(2, 0.0) == 4.0
    assert RetryPlan(attempts=9, max_backoff_s=5.0, jitter=0.0).wait(8, 0.5) == 5.0


def test_jittered_waits_differ_between_runs() -> None:
    waits = set()
    for _ in range(8):
        t, _calls = flaky([ToolError("503", retryable=True)])
        clock = FakeClock()
        run_once(t, clock=clock, jitter=0.5)
        waits.add(round(clock.now(), 9))
        assert 0.5 <= clock.now() <= 1.0
    assert len(waits) > 1


def test_a_side_effect_without_an_idempotency_key_is_not_retried_by_the_runtime() -> None:
    t, calls = flaky([ToolError("503", retryable=True)], read_only=False, side_effect=True)
    run = run_once(t)
    assert len(calls) == 1 and run.record()["tool_retries"] == []


def test_a_side_effect_under_its_idempotency_key_is_retried() -> None:
    t, calls = flaky(
        [ToolError("503", retryable=True)],
        read_only=False,
        side_effect=True,
        idempotency_keys=("order_id",),
    )
    run = run_once(t)
    assert len(calls) == 2 and run.record()["tool_retries"][0]["ok"] is True


def test_a_timed_out_side_effect_is_never_retried() -> None:
    release = threading.Event()
    calls: list[str] = []

    @tool(side_effect=True, idempotency_keys=("order_id",), timeout_s=0.05)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        calls.append(order_id)
        release.wait(5)
        return "refunded"

    try:
        run = run_once(refund, enabled=("retry_policy",))
    finally:
        release.set()
    assert calls == ["88231"]
    assert run.record()["tool_retries"] == []


def test_a_tool_whose_nature_nobody_declared_is_not_retried() -> None:
    t, calls = flaky([ToolError("503", retryable=True)])
    t.declared = False
    run_once(t)
    assert len(calls) == 1


def test_runtime_false_leaves_retries_to_the_model() -> None:
    t, calls = flaky([ToolError("503", retryable=True)])
    run = run_once(t, runtime=False)
    assert len(calls) == 1 and observations(run) == ["503"]


def test_no_retry_starts_past_the_calls_deadline() -> None:
    # the call may take 2.5 s in all: attempt 1 at 0 s, attempt 2 after 1 s, the next retry
    # would start at 3 s -- past the deadline, so it is not made
    t, calls = flaky([ToolError("503", retryable=True)] * 5, timeout_s=2.5)
    clock = FakeClock()
    run = run_once(t, clock=clock, max_retries=5)
    assert len(calls) == 2 and clock.now() == pytest.approx(1.0)
    assert run.record()["tool_retries"][0]["ok"] is False


def test_the_budget_is_shared_with_the_models_repeats() -> None:
    # max_retries = 2: the runtime makes three attempts; the model's repeat gets none, and
    # repeat_call takes it from there (the runtime's failures count)
    t, calls = flaky([ToolError("503", retryable=True)] * 10)
    run = run_once(t, calls=3, enabled=("retry_policy", "repeat_call"), max_retries=2)
    assert len(calls) == 3
    obs = observations(run)
    assert "failed 3 times" in obs[0]
    assert run.record()["tools_executed"] == 3


def test_the_retries_wait_cancellably() -> None:
    token = CancelToken()
    calls: list[str] = []

    @tool(read_only=True)
    def lookup(order_id: str) -> str:
        """Look an order up."""
        calls.append(order_id)
        threading.Timer(0.2, token.cancel).start()  # cancelled during the 30 s backoff
        raise ToolError("503", retryable=True)

    dep = Deployment(config("retry_policy", retry_policy={"backoff_s": 30.0, "jitter": 0.0}))
    model = ScriptedModel(script([turn(None, tool_call("lookup", order_id="1"))], then="final"))
    with dep:
        run = dep.run("x", model=model, tools=ToolRegistry([lookup]), cancel=token)
    assert calls == ["1"]
    assert run.record()["termination"] == "cancelled"
    assert run.elapsed < 30
