"""The logging plugin: one structured, redacted record per run event."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.observability import (
    ALWAYS_NOT_FOUND,
    SECRET_TOOL,
    captured_logs,
    comparable,
    repeat_guard,
)
from support.observability import LogCapture as Capture

from loopwarden import ConfigError, Deployment, FakeClock, ModelRequest, ModelResponse, Run
from loopwarden.config import Config
from loopwarden.fingerprint import default_masks
from loopwarden.models.scenario import load_scenario, scenario_path
from loopwarden.models.scripted import ScriptedModel
from loopwarden.plugins.logging import LoggingPlugin, format_kv
from loopwarden.redaction import Redactor
from loopwarden.verdicts import stop, warn


@pytest.fixture
def captured() -> Iterator[Capture]:
    with captured_logs("loopwarden.events") as handler:
        yield handler


class RecordingModel(ScriptedModel):
    """The scripted model, keeping its responses so the test knows the tokens of each step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.responses: list[ModelResponse] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        response = super().complete(request)
        self.responses.append(response)
        return response


def _config(make_config: Callable[..., Config], **logging_settings: Any) -> Config:
    enabled = ["max_steps", "logging"]
    tables: dict[str, Any] = {"enabled": enabled}
    if logging_settings:
        tables["logging"] = logging_settings
    return make_config(plugins=tables)


_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\[.*?\](?= \w+=|$)|\{.*?\}(?= \w+=|$)|\S+)')


def parse_kv(line: str) -> dict[str, Any]:
    """Parse a kv line back: bare words, JSON strings, JSON lists/objects, numbers."""
    out: dict[str, Any] = {}
    for key, raw in _KV.findall(line):
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _digest(text: str) -> str:
    """A result's digest: the hash of its answer with the volatile parts masked."""
    return hashlib.blake2b(default_masks().mask(text).encode(), digest_size=8).hexdigest()


# ---------------------------------------------------------------------------------------------
# One scripted run, field by field
# ---------------------------------------------------------------------------------------------


def test_refund_run_logged_field_by_field(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    # content on: this test checks every field, the previews of conversation text included
    dep = deployment_factory(_config(make_config, capture_content=True), clock=FakeClock())
    sc = load_scenario(scenario_path("refund"))
    model = RecordingModel(sc.model, estimator=dep.estimator)
    run = dep.run(scenario=sc, model=model, run_id="run-refund")
    u = [r.usage for r in model.responses]
    assert all(x is not None for x in u) and len(u) == 4
    fp = dep.engine.fingerprint
    common = {"run_id": "run-refund", "scenario": "refund"}

    def model_rec(step: int, calls: list[str], content: str, finish: str) -> dict[str, Any]:
        usage = u[step - 1]
        assert usage is not None
        return {
            "event": "model_responded",
            **common,
            "step": step,
            "prompt_tokens": usage.prompt,
            "completion_tokens": usage.completion,
            "tokens": usage.total,
            "run_tokens": sum(x.total for x in u[:step] if x),
            "duration_s": 0.0,
            "tool_calls": calls,
            "finish_reason": finish,
            "final": False,
            "notes": 0,
            "content": content,
            "elapsed_s": 0.0,
        }

    def tool_rec(
        step: int, index: int, tool: str, args: dict[str, Any], result: str | None
    ) -> dict[str, Any]:
        return {
            "event": "tool_finished",
            **common,
            "step": step,
            "index": index,
            "tool": tool,
            "arguments": args,
            "ok": True,
            "error": None,
            "retryable": False,
            "skipped": False,
            "skipped_by": None,
            "duration_s": 0.0,
            "fingerprint": fp(tool, args),
            "digest": _digest(result) if result is not None else None,
            "result": result,
            "elapsed_s": 0.0,
        }

    order = (
        '{"order_id": "88231", "product": "比特 S10 Pro 扫地机", "amount_yuan": 1999, '
        '"status": "已签收", "ordered_at": "2026-06-18 09:12", '
        '"signed_at": "2026-06-22 14:05", "tracking_no": "SF1234567890"}'
    )
    got = captured.fields
    # apply_refund's result carries the wall-clock time of the refund: checked apart below.
    refund_result = got[7]["result"]
    assert refund_result.startswith('{"refund_id": "RF88231001", "order_id": "88231"')
    total = run.record()["tokens"]
    expected = [
        {
            "event": "run_started",
            **common,
            "profile": None,
            "model": "scripted",
            "max_steps": None,
            "max_tokens": None,
            "max_seconds": None,
            "tools": 6,
            "user": "我上周买的扫地机（订单 88231）不想要了，能退吗？",
            "elapsed_s": 0.0,
        },
        model_rec(
            1, ["query_order", "search_knowledge"], "我先查一下订单和退货政策。", "tool_calls"
        ),
        tool_rec(1, 0, "query_order", {"order_id": "88231"}, order),
        tool_rec(1, 1, "search_knowledge", {"query": "七天无理由退货"}, got[3]["result"]),
        model_rec(2, ["get_current_time"], "订单已签收，我确认一下今天的日期。", "tool_calls"),
        tool_rec(2, 0, "get_current_time", {}, "2026-06-25 10:30:00"),
        model_rec(3, ["apply_refund"], "在 7 天无理由退货期内，我为您提交退款。", "tool_calls"),
        tool_rec(
            3, 0, "apply_refund", {"order_id": "88231", "reason": "七天无理由退货"}, refund_result
        ),
        model_rec(
            4,
            [],
            "已为您提交订单 88231（比特 S10 Pro 扫地机）的七天无理由退货退款申请，"
            "金额 1999 元，退款将在 1-3 个工作日内原路退回。",
            "stop",
        ),
        {
            "event": "run_stopped",
            **common,
            "termination": "final_answer",
            "soft": False,
            "stopped_by": None,
            "steps": 4,
            "tool_calls": 4,
            "prompt_tokens": total["prompt"],
            "completion_tokens": total["completion"],
            "tokens": total["total"],
            "cost": 0.0,
            "duplicate_calls": 0,
            "warnings": 0,
            "final_answer_present": True,
            "evidence": {},
            "errors": 0,
            "elapsed_s": 0.0,
        },
    ]
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert list(g) == list(e), f"record {i}: field order"
        for key in e:
            assert g[key] == e[key], f"record {i} ({e['event']}): field {key!r}"
    assert "七天无理由退货政策" in got[3]["result"]
    assert [r.name for r in captured.records] == [
        "loopwarden.events.run",
        "loopwarden.events.model",
        "loopwarden.events.tool",
        "loopwarden.events.tool",
        "loopwarden.events.model",
        "loopwarden.events.tool",
        "loopwarden.events.model",
        "loopwarden.events.tool",
        "loopwarden.events.model",
        "loopwarden.events.run",
    ]
    assert {r.levelno for r in captured.records} == {logging.INFO}
    # The kv text says the same as the structured fields.
    for record, fields in zip(captured.records, got, strict=True):
        assert parse_kv(record.getMessage()) == fields
    assert (
        captured.records[0]
        .getMessage()
        .startswith(
            "event=run_started run_id=run-refund scenario=refund profile=null model=scripted "
        )
    )


def test_json_format_is_one_object_per_record(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    dep = deployment_factory(_config(make_config, format="json"), clock=FakeClock())
    dep.run(scenario="refund", run_id="r-json")
    assert len(captured.records) == 10
    for record in captured.records:
        assert json.loads(record.getMessage()) == record.loopwarden  # type: ignore[attr-defined]


def test_guard_verdicts_and_guarded_stop_are_logged_at_guard_level(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    names, objects = repeat_guard()
    cfg = make_config(plugins={"enabled": ["max_steps", *names, "logging"]})
    dep = deployment_factory(cfg, plugins=objects, clock=FakeClock())
    run = dep.run(scenario=ALWAYS_NOT_FOUND, run_id="r-loop")
    assert run.outcome is not None and run.outcome.termination == "repeat_call"
    guards = [r for r in captured.records if r.name == "loopwarden.events.guard"]
    stops = [r for r in guards if r.loopwarden["kind"] == "stop"]  # type: ignore[attr-defined]
    assert len(stops) == 1 and stops[0].levelno == logging.WARNING
    f = stops[0].loopwarden  # type: ignore[attr-defined]
    assert f["plugin"] == "repeat_call" and f["reason"] == "repeat_call"
    assert f["severity"] in ("soft_stop", "hard_stop")
    assert f["hook"] in ("before_tool", "after_tool", "after_response", "before_model")
    assert isinstance(f["evidence"], dict) and f["evidence"]
    last = captured.records[-1]
    assert last.loopwarden["event"] == "run_stopped"  # type: ignore[attr-defined]
    assert last.levelno == logging.WARNING
    assert last.loopwarden["stopped_by"] == "repeat_call"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------

SECRETS = ("sk-live-ABCDEF1234567890", "tok_abcdefgh12345", "hunter2-secret")


def test_secrets_in_tool_arguments_are_redacted_at_any_depth(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    dep = deployment_factory(_config(make_config), clock=FakeClock())
    run = dep.run(scenario=SECRET_TOOL, run_id="r-secret")
    assert run.outcome is not None and run.outcome.termination == "final_answer"
    text = captured.text()
    for secret in SECRETS:
        assert secret not in text
    (tool,) = [f for f in captured.fields if f["event"] == "tool_finished"]
    assert tool["tool"] == "crm_sync"
    assert tool["arguments"] == {
        "customer": "C-42",
        "api_key": "[REDACTED]",
        "auth": {"headers": {"Authorization": "[REDACTED]", "X-Trace": "trace-7"}},
        "items": [{"name": "primary", "password": "[REDACTED]"}],
    }
    # The run itself saw the real arguments: redaction is for the observers only.
    assert "hunter2-secret" in json.dumps(run.messages, ensure_ascii=False)


def test_configurable_redaction_list_and_mask(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    cfg = _config(make_config, redact_keys=["customer"], redact_patterns=[], mask="***")
    dep = deployment_factory(cfg, clock=FakeClock())
    dep.run(scenario=SECRET_TOOL, run_id="r-custom")
    (tool,) = [f for f in captured.fields if f["event"] == "tool_finished"]
    assert tool["arguments"]["customer"] == "***"
    # Only the configured list applies now: api_key is no longer masked.
    assert tool["arguments"]["api_key"] == "sk-live-ABCDEF1234567890"


def test_the_models_api_key_never_appears(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LW_TEST_KEY", "plainkey-7f3a9c")
    cfg = make_config(
        model={"api_key_env": "LW_TEST_KEY"},
        # content on: the user's text is logged, and the key in it must still be masked
        plugins={"enabled": ["max_steps", "logging"], "logging": {"capture_content": True}},
    )
    dep = deployment_factory(cfg, clock=FakeClock())
    dep.run("my key is plainkey-7f3a9c, what now?", scenario="refund", run_id="r-key")
    assert "plainkey-7f3a9c" not in captured.text()
    assert captured.fields[0]["user"] == "my key is [REDACTED], what now?"


def test_unparseable_arguments_are_masked_as_text() -> None:
    plugin = LoggingPlugin()
    r = plugin.redactor
    raw = '{"api_key": "abc123", "q": "x", oops'
    assert r.json_text(raw) == '{"api_key": "[REDACTED]", "q": "x", oops'


def test_redactor_key_matching() -> None:
    r = Redactor()
    data = {
        "tokens": {"total": 5},
        "max_tokens": 9,
        "github_token": "g",
        "X-Api-Key": "k",
        "Authorization": "Bearer abc",
        "nested": [{"deep": {"client_secret": "s"}}],
        "password": None,
    }
    assert r(data) == {
        "tokens": {"total": 5},
        "max_tokens": 9,
        "github_token": "[REDACTED]",
        "X-Api-Key": "[REDACTED]",
        "Authorization": "[REDACTED]",
        "nested": [{"deep": {"client_secret": "[REDACTED]"}}],
        "password": None,
    }
    assert r.text("curl -H 'Authorization: Bearer abcdefgh123' ?token=xyz&n=1") == (
        "curl -H 'Authorization: [REDACTED]' ?token=[REDACTED]&n=1"
    )
    assert r.text("key sk-abcdefghijklmnop0123 used") == "key [REDACTED] used"


# ---------------------------------------------------------------------------------------------
# Format, settings, robustness
# ---------------------------------------------------------------------------------------------


def test_format_kv_quotes_what_needs_quoting() -> None:
    line = format_kv(
        {
            "a": "plain",
            "b": "two words",
            "c": 'q"uote',
            "d": None,
            "e": True,
            "f": 1.5,
            "g": ["x", "y"],
            "h": {"k": 1},
            "i": "",
            "j": "a=b",
        }
    )
    assert line == (
        'a=plain b="two words" c="q\\"uote" d=null e=true f=1.5 g=["x","y"] h={"k":1} i="" j="a=b"'
    )


def test_verdict_record_built_from_a_hand_made_run(captured: Capture) -> None:
    plugin = LoggingPlugin()
    run = Run("hi", clock=FakeClock(), run_id="r-unit", scenario="s")
    plugin.on_guard_triggered(
        run, verdict=warn("2 steps left", plugin="max_steps", limit=10), hook="before_model", step=7
    )
    plugin.on_guard_triggered(
        run,
        verdict=stop("repeat_call", plugin="repeat_call", soft=True, token="t0ken-secret"),
        hook="before_tool",
        step=8,
    )
    first, second = captured.fields
    assert first == {
        "event": "guard_triggered",
        "run_id": "r-unit",
        "scenario": "s",
        "step": 7,
        "hook": "before_model",
        "plugin": "max_steps",
        "kind": "warn",
        "severity": "warn",
        "reason": None,
        "soft": None,
        "message": "2 steps left",
        "evidence": {"limit": 10},
        "elapsed_s": 0.0,
    }
    assert second["severity"] == "soft_stop" and second["soft"] is True
    assert second["evidence"] == {"token": "[REDACTED]"}
    assert [r.levelno for r in captured.records] == [logging.WARNING, logging.WARNING]


def test_events_and_levels_are_settings(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    cfg = _config(
        make_config,
        events=["run_started", "step_finished", "run_stopped"],
        level="DEBUG",
        logger="loopwarden.audit",
    )
    logger = logging.getLogger("loopwarden.audit")
    logger.addHandler(captured)
    logger.setLevel(logging.DEBUG)
    try:
        dep = deployment_factory(cfg, clock=FakeClock())
        dep.run(scenario="refund", run_id="r-ev")
    finally:
        logger.removeHandler(captured)
    assert [f["event"] for f in captured.fields] == [
        "run_started",
        "step_finished",
        "step_finished",
        "step_finished",
        "run_stopped",
    ]
    assert {r.name.rsplit(".", 1)[0] for r in captured.records} == {"loopwarden.audit"}
    assert {r.levelno for r in captured.records} == {logging.DEBUG}


def test_logger_must_live_under_loopwarden(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    with pytest.raises(ConfigError) as err:
        deployment_factory(_config(make_config, logger="myapp"))
    assert "plugins.logging.logger" in str(err.value)


def test_a_failing_log_handler_never_changes_the_run(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    monkeypatch: pytest.MonkeyPatch,
    captured: Capture,
    tmp_path: Any,
) -> None:
    baseline = (
        deployment_factory(make_config(plugins={"enabled": ["max_steps"]}), clock=FakeClock())
        .run(scenario="refund")
        .record()
    )
    # a fresh shop: the same refund again would be answered as a duplicate
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path / "second"))
    dep = deployment_factory(_config(make_config), clock=FakeClock())
    plugin = dep.plugins.get("logging")

    def broken(fields: Any) -> str:
        raise RuntimeError("disk full")

    monkeypatch.setattr(plugin, "render", broken)
    record = dep.run(scenario="refund").record()
    assert comparable(record) == comparable(baseline)
    assert record["termination"] == "final_answer" and not captured.records


def test_a_silent_logger_costs_no_work(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dep = deployment_factory(_config(make_config), clock=FakeClock())
    plugin = dep.plugins.get("logging")
    calls: list[str] = []
    monkeypatch.setattr(plugin, "emit", lambda event, *a, **k: calls.append(event))
    logger = logging.getLogger("loopwarden.events")
    old = logger.level
    try:
        logger.setLevel(logging.CRITICAL)
        dep.run(scenario="refund")
        assert calls == []
        logger.setLevel(logging.INFO)
        dep.run(scenario="refund")
    finally:
        logger.setLevel(old)
    assert calls[0] == "run_started" and calls[-1] == "run_stopped"
