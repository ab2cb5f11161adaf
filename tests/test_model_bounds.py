"""Every model call is bounded in time and size, against a hostile local server.

A real stdlib HTTP server (tests/support/openai_stub.py) drips bodies, streams without end,
sends gzip bombs, asks for absurd ``Retry-After`` waits and hangs; the real ``openai`` client
talks to it.  The bounds asserted are several times the configured ones (a loaded machine), and far
below what the unbounded client took (a dripping body: minutes).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from support.openai_stub import Stub, completion

from loopwarden import Deployment, ModelError, ModelRequest
from loopwarden.clock import CancelToken
from loopwarden.config import parse_config
from loopwarden.models.openai_chat import OpenAIChatModel

SLACK_S = 2.0  # what a loaded machine may add to a bound


def model(url: str, **kw: Any) -> OpenAIChatModel:
    kw.setdefault("timeout_s", 1.0)
    kw.setdefault("max_retries", 0)
    return OpenAIChatModel(model="stub-model", api_key="sk-test-key-0123456789", base_url=url, **kw)


def ask(**kw: Any) -> ModelRequest:
    return ModelRequest(messages=[{"role": "user", "content": "hi"}], tools=[], **kw)


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    try:
        out: Any = fn(*args)
    except ModelError as exc:
        out = exc
    return time.monotonic() - t0, out


def test_a_dripping_body_ends_at_the_total_timeout(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push_slow(interval_s=0.3)  # ~300 bytes: 90 s at this pace
    took, err = timed(model(url).complete, ask())
    assert isinstance(err, ModelError) and err.kind == "timeout"
    assert took < 1.0 + SLACK_S


def test_async_a_dripping_body_ends_at_the_total_timeout(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push_slow(interval_s=0.3)
    took, err = timed(lambda: asyncio.run(model(url).acomplete(ask())))
    assert isinstance(err, ModelError) and err.kind == "timeout"
    assert took < 1.0 + SLACK_S


def test_the_run_s_time_left_lowers_the_call_s_deadline(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push_slow(interval_s=0.3)
    took, err = timed(model(url, timeout_s=60).complete, ask(timeout=0.8))
    assert isinstance(err, ModelError) and err.kind == "timeout"
    assert took < 0.8 + SLACK_S


@pytest.mark.parametrize("sync", [True, False])
def test_an_endless_body_is_cut_at_the_size_cap(stub: tuple[Stub, str], sync: bool) -> None:
    state, url = stub
    state.push_endless()
    m = model(url, timeout_s=30, max_response_bytes=256 * 1024)
    call = (lambda: m.complete(ask())) if sync else (lambda: asyncio.run(m.acomplete(ask())))
    took, err = timed(call)
    assert isinstance(err, ModelError) and err.kind == "too_large", err
    assert "max_response_bytes" in str(err)
    assert took < SLACK_S * 5  # far from the 30 s deadline: the cap ended it


@pytest.mark.parametrize("sync", [True, False])
def test_a_gzip_bomb_is_cut_while_it_inflates(stub: tuple[Stub, str], sync: bool) -> None:
    state, url = stub
    state.push_gzip_bomb(inflated_bytes=64 * 1024 * 1024)
    m = model(url, timeout_s=30, max_response_bytes=1024 * 1024)
    call = (lambda: m.complete(ask())) if sync else (lambda: asyncio.run(m.acomplete(ask())))
    _took, err = timed(call)
    assert isinstance(err, ModelError) and err.kind == "too_large", err


def test_a_gzip_body_within_the_cap_is_decoded(stub: tuple[Stub, str]) -> None:
    import gzip
    import json

    state, url = stub
    body = gzip.compress(json.dumps(completion("compressed ok")).encode())

    def write(h: Any, s: Stub) -> None:
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-encoding", "gzip")
        h.send_header("content-length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    state.responses.append(write)
    assert model(url).complete(ask()).content == "compressed ok"


def test_a_huge_retry_after_is_not_waited_for(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "119"})
    took, err = timed(model(url, timeout_s=2, max_retries=3).complete, ask())
    assert isinstance(err, ModelError) and err.kind == "rate_limited" and err.status == 429
    assert "not retried" in str(err)
    assert took < SLACK_S
    assert len(state.requests) == 1


def test_retries_and_their_waits_fit_in_the_total_timeout(stub: tuple[Stub, str]) -> None:
    state, url = stub
    for _ in range(10):
        state.push({"error": {"message": "busy"}}, status=503, headers={"retry-after": "0.6"})
    took, err = timed(model(url, timeout_s=1.5, max_retries=10).complete, ask())
    assert isinstance(err, ModelError) and err.status == 503
    assert took < 1.5 + SLACK_S
    assert 2 <= len(state.requests) <= 3  # retried while time was left, then gave up


def test_a_short_retry_after_is_honoured(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "0.2"})
    state.push(completion("ok"))
    assert model(url, timeout_s=5, max_retries=1).complete(ask()).content == "ok"
    assert len(state.requests) == 2


@pytest.mark.parametrize("sync", [True, False])
def test_a_cancel_interrupts_a_call_in_flight(stub: tuple[Stub, str], sync: bool) -> None:
    state, url = stub
    state.push_hang(30)
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    m = model(url, timeout_s=30)
    req = ask(cancel=cancel)
    call = (lambda: m.complete(req)) if sync else (lambda: asyncio.run(m.acomplete(req)))
    took, err = timed(call)
    assert isinstance(err, ModelError) and err.kind == "cancelled"
    assert took < SLACK_S


# -- whole runs: always a record, with the right termination ------------------------------


def deployment(
    url: str, monkeypatch: pytest.MonkeyPatch, *, max_seconds: float = 60, **model_cfg: Any
) -> Deployment:
    monkeypatch.setenv("STUB_KEY", "sk-stub-key-0123456789")
    cfg = parse_config(
        {
            "model": {
                "provider": "openai",
                "name": "stub-model",
                "base_url": url,
                "api_key_env": "STUB_KEY",
                "max_retries": 0,
                **model_cfg,
            },
            "plugins": {
                "enabled": ["timeout"],
                "timeout": {"max_seconds": max_seconds, "grace_s": 0},
            },
        },
        path="<test>",
    )
    return Deployment(cfg)


def run_both(dep: Deployment, sync: bool) -> tuple[float, dict[str, Any]]:
    t0 = time.monotonic()
    run = dep.run("q") if sync else asyncio.run(dep.arun("q"))
    return time.monotonic() - t0, run.record()


@pytest.mark.parametrize("sync", [True, False])
def test_a_dripping_body_ends_the_run_at_the_run_s_deadline_with_a_timeout_record(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    state, url = stub
    state.push_slow(interval_s=0.3)
    took, rec = run_both(deployment(url, monkeypatch, max_seconds=1.0, timeout_s=60), sync)
    assert rec["termination"] == "timeout"
    assert rec["evidence"]["kind"] == "timeout" and rec["evidence"]["limit_s"] <= 1.0
    assert rec["final_answer"]  # the fallback: the user still gets an answer
    assert took < 1.0 + SLACK_S


@pytest.mark.parametrize("sync", [True, False])
def test_a_dripping_body_ends_the_run_at_the_model_timeout_with_a_model_error_record(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    state, url = stub
    state.push_slow(interval_s=0.3)
    took, rec = run_both(deployment(url, monkeypatch, max_seconds=60, timeout_s=1.0), sync)
    assert rec["termination"] == "model_error" and rec["evidence"]["kind"] == "timeout"
    assert took < 1.0 + SLACK_S


@pytest.mark.parametrize("sync", [True, False])
def test_an_oversized_body_ends_the_run_with_a_model_error_record(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    state, url = stub
    state.push_gzip_bomb()
    _took, rec = run_both(deployment(url, monkeypatch, max_response_bytes=100_000), sync)
    assert rec["termination"] == "model_error" and rec["evidence"]["kind"] == "too_large"


@pytest.mark.parametrize("sync", [True, False])
def test_cancelling_a_run_during_a_hung_call_ends_it_cancelled(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    state, url = stub
    state.push_hang(30)
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel, kwargs={"reason": "user left"}).start()
    dep = deployment(url, monkeypatch, timeout_s=30)
    t0 = time.monotonic()
    run = dep.run("q", cancel=cancel) if sync else asyncio.run(dep.arun("q", cancel=cancel))
    rec = run.record()
    assert rec["termination"] == "cancelled" and rec["evidence"]["reason"] == "user left"
    assert time.monotonic() - t0 < SLACK_S


def test_max_response_bytes_is_a_config_key_with_a_default() -> None:
    assert parse_config({}).model.max_response_bytes == 8 * 1024 * 1024
    with pytest.raises(Exception, match="max_response_bytes"):
        parse_config({"model": {"max_response_bytes": 0}})


@pytest.mark.parametrize("sync", [True, False])
def test_the_issue_s_case_one_byte_every_1_5_s_with_timeout_2_and_max_seconds_5(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    # before: ~8 minutes without output, then final_answer with elapsed_s 443
    state, url = stub
    state.push_slow(interval_s=1.5)
    took, rec = run_both(deployment(url, monkeypatch, max_seconds=5, timeout_s=2), sync)
    assert rec["termination"] == "model_error" and rec["evidence"]["kind"] == "timeout"
    assert took < 2 + SLACK_S and rec["elapsed_s"] < 2 + SLACK_S
