"""The otel plugin: GenAI spans, verdict events and metrics through the real OpenTelemetry SDK
(in-memory exporter and reader), OTLP/HTTP to a real local receiver, and never a changed run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support.cli import loopwarden

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.trace import SpanKind, StatusCode
from support.observability import ALWAYS_NOT_FOUND, SECRET_TOOL, repeat_guard
from support.otel import (
    ExplodingMeterProvider,
    ExplodingTracerProvider,
    Telemetry,
    otlp_receiver,
)

from loopwarden import Deployment, FakeClock, Run
from loopwarden.config import Config
from loopwarden.demo.shop import Shop
from loopwarden.engine.pluginmanager import load_plugins
from loopwarden.events import ModelRequest
from loopwarden.exceptions import ModelError
from loopwarden.plugins.metrics import Metrics, MetricsSettings
from loopwarden.plugins.otel import CAPTURE_ENV, OTel, OTelSettings, counter_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REFUND = "refund"


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.shutdown()


@pytest.fixture(autouse=True)
def _no_capture_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)


Factory = Callable[..., Deployment]


def _otel(t: Telemetry, **settings: Any) -> OTel:
    return OTel(
        OTelSettings.model_validate(settings),
        tracer_provider=t.tracer_provider,
        meter_provider=t.meter_provider,
    )


def _deployment(
    make_config: Callable[..., Config],
    factory: Factory,
    otel: OTel | None,
    *,
    extra: tuple[str, ...] = (),
    run: dict[str, Any] | None = None,
    store: Path | None = None,
) -> Deployment:
    names, objects = repeat_guard()
    enabled = ["max_steps", *names, *extra]
    if otel is not None:
        enabled.append("otel")
        objects["otel"] = otel
    tables: dict[str, Any] = {
        "plugins": {"enabled": enabled, "max_steps": {"max_steps": 10}},
    }
    if run is not None:
        tables["run"] = run
    kwargs: dict[str, Any] = {}
    if store is not None:  # a shop and a ledger of its own: runs compared share neither
        tables["store"] = {"url": f"sqlite:///{store}.store"}
        kwargs["tools"] = Shop(store, now=_Now()).tools()
    return factory(make_config(**tables), plugins=objects, clock=FakeClock(), **kwargs)


class _Now:
    """The shop's wall clock: a fixed day, moving on 20 s per reading."""

    def __init__(self) -> None:
        self.now = datetime(2026, 6, 25, 10, 30, tzinfo=timezone(timedelta(hours=8)))

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=20)
        return self.now


def _tree(t: Telemetry) -> tuple[Any, list[Any], list[Any]]:
    run_span = t.one("invoke_agent")
    return run_span, t.spans("chat"), t.spans("execute_tool")


def _comparable(run: Run) -> dict[str, Any]:
    record = run.record()
    for key in ("run_id", "conversation_id", "elapsed_s"):
        record.pop(key)
    return record


# -- the span tree of a runaway run and of a healthy one ----------------------------------------


def test_runaway_run_span_tree_attributes_and_verdict_events(
    make_config: Callable[..., Config], deployment_factory: Factory, telemetry: Telemetry
) -> None:
    dep = _deployment(make_config, deployment_factory, _otel(telemetry))
    tracer = telemetry.tracer_provider.get_tracer("caller")
    with tracer.start_as_current_span("POST /chat") as caller:
        run = dep.run(scenario=ALWAYS_NOT_FOUND)
    record = run.record()
    assert record["termination"] == "repeat_call"

    root, chats, tools = _tree(telemetry)
    # the run span nests inside the caller's span, in the same trace
    assert root.parent is not None
    assert root.parent.span_id == caller.get_span_context().span_id
    assert root.context.trace_id == caller.get_span_context().trace_id
    assert root.name == "invoke_agent loopwarden"
    assert root.kind is SpanKind.INTERNAL
    a = root.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "loopwarden"
    assert a["gen_ai.conversation.id"] == record["conversation_id"]
    assert a["loopwarden.run_id"] == record["run_id"]
    assert a["loopwarden.termination"] == "repeat_call"
    assert a["loopwarden.stopped_by"] == "repeat_call"
    assert a["error.type"] == "repeat_call"
    assert a["loopwarden.cost"] == 0.0
    assert a["gen_ai.usage.input_tokens"] == record["tokens"]["prompt"]
    assert a["gen_ai.usage.output_tokens"] == record["tokens"]["completion"]
    assert a["loopwarden.steps"] == record["steps"] == len(chats)
    assert root.status.status_code is StatusCode.ERROR

    # one chat span per model call, one execute_tool span per call that reached the tool
    # turn's end (the third identical call was stopped in before_tool: no span)
    for span in chats + tools:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time
    assert [s.attributes["loopwarden.step"] for s in chats] == list(range(1, record["steps"] + 1))
    assert all(s.kind is SpanKind.CLIENT for s in chats)
    assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)
    assert (
        sum(s.attributes["gen_ai.usage.input_tokens"] for s in chats)
        == a["gen_ai.usage.input_tokens"]
    )
    assert len(tools) == record["tool_calls"] - 1
    call_ids = [
        m["tool_call_id"] for m in run.messages if m.get("role") == "tool"
    ]  # the stopped call is answered "not executed" too
    assert [s.attributes["gen_ai.tool.call.id"] for s in tools] == call_ids[: len(tools)]
    assert {s.attributes["gen_ai.tool.name"] for s in tools} == {"query_order"}
    assert {s.name for s in tools} == {"execute_tool query_order"}

    # every verdict is an event on the run span, in order, with the standard evidence keys
    events = [e for e in root.events if e.name == "loopwarden.verdict"]
    assert [
        (e.attributes["loopwarden.verdict.plugin"], e.attributes["loopwarden.verdict.action"])
        for e in events
    ] == [(v["plugin"], v["kind"]) for v in record["verdicts"]]
    last = events[-1].attributes
    assert last["loopwarden.verdict.reason"] == "repeat_call"
    assert last["loopwarden.verdict.soft"] is record["soft"] is True  # wrap-up turn
    assert last["loopwarden.verdict.shadow"] is False
    assert last["loopwarden.verdict.hook"] == "before_tool"
    assert last["loopwarden.evidence.count"] == record["evidence"]["count"]
    assert last["loopwarden.evidence.threshold"] == record["evidence"]["threshold"]
    # no capture_content: the call's signature and the message leave only hashed
    assert "loopwarden.evidence.signature" not in last
    assert last["loopwarden.evidence.signature.chars"] == len(record["evidence"]["signature"])
    assert "loopwarden.verdict.message" not in last and last["loopwarden.verdict.message.hash"]
    assert "loopwarden.evidence.fingerprint" not in last  # not a standard key
    assert "loopwarden.verdict.soft" not in events[0].attributes  # a skip has no softness
    # no content without the opt-in
    assert not any(k.startswith("gen_ai.input") for s in chats for k in s.attributes)


def test_healthy_run_span_tree_has_no_error_and_no_verdicts(
    make_config: Callable[..., Config], deployment_factory: Factory, telemetry: Telemetry
) -> None:
    dep = _deployment(make_config, deployment_factory, _otel(telemetry))
    run = dep.run(scenario=REFUND)
    record = run.record()
    assert record["termination"] == "final_answer"
    root, chats, tools = _tree(telemetry)
    assert root.parent is None  # no caller span: a trace of its own
    assert "error.type" not in root.attributes
    assert root.status.status_code is StatusCode.UNSET
    assert root.attributes["loopwarden.termination"] == "final_answer"
    assert "loopwarden.stopped_by" not in root.attributes
    assert [e.name for e in root.events] == []
    assert len(chats) == record["steps"] == 4
    assert chats[-1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert [s.attributes["gen_ai.tool.name"] for s in tools] == [
        "query_order",
        "search_knowledge",
        "get_current_time",
        "apply_refund",
    ]
    assert all(s.attributes["loopwarden.tool.outcome"] == "ok" for s in tools)
    assert all(s.status.status_code is StatusCode.UNSET for s in tools)
    assert all("gen_ai.tool.call.arguments" not in s.attributes for s in tools)
    assert {s.attributes["gen_ai.provider.name"] for s in chats} == {"openai"}


def test_async_run_nests_under_the_callers_span(
    make_config: Callable[..., Config], deployment_factory: Factory, telemetry: Telemetry
) -> None:
    dep = _deployment(make_config, deployment_factory, _otel(telemetry))
    tracer = telemetry.tracer_provider.get_tracer("caller")

    async def main() -> list[int]:
        async def one(i: int) -> int:
            with tracer.start_as_current_span(f"request {i}") as span:
                await dep.arun(scenario=REFUND)
                return span.get_span_context().span_id

        return list(await asyncio.gather(one(0), one(1)))

    callers = asyncio.run(main())
    roots = telemetry.spans("invoke_agent")
    assert sorted(r.parent.span_id for r in roots) == sorted(callers)
    # each run's chat spans belong to its own run span
    by_root = {r.context.span_id: 0 for r in roots}
    for chat in telemetry.spans("chat"):
        by_root[chat.parent.span_id] += 1
    assert list(by_root.values()) == [4, 4]


def test_ledger_answer_is_marked_on_the_tool_span_and_counted(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    telemetry: Telemetry,
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "refund_twice.toml"
    call = (
        '{ name = "apply_refund", arguments = { order_id = "88231", reason = "七天无理由退货" } }'
    )
    scenario.write_text(
        textwrap.dedent(
            f"""
            name = "refund-twice"
            user = "退款"
            [model]
            turns = [
              {{ content = "提交退款", tool_calls = [{call}] }},
              {{ content = "再提交一次", tool_calls = [{call}] }},
              {{ content = "好了" }},
            ]
            then = "final"
            final_text = "好了"
            """
        ),
        encoding="utf-8",
    )
    dep = _deployment(make_config, deployment_factory, _otel(telemetry))
    run = dep.run(scenario=str(scenario))
    assert len(run.ledger_answers) == 1
    first, second = telemetry.spans("execute_tool apply_refund")
    assert "loopwarden.ledger.answered" not in first.attributes
    assert second.attributes["loopwarden.ledger.answered"] is True
    assert second.attributes["loopwarden.ledger.source"] == "conversation"
    assert second.attributes["loopwarden.tool.outcome"] == "skipped"
    assert telemetry.one("invoke_agent").attributes["loopwarden.ledger_answers"] == 1
    assert telemetry.counter("loopwarden_ledger_answers") == {
        frozenset({("tool", "apply_refund"), ("source", "conversation")}): 1
    }


class _DownModel:
    def complete(self, request: ModelRequest) -> Any:
        raise ModelError("upstream 503", kind="http", status=503)


def test_failed_model_call_is_a_chat_span_with_error_type(
    make_config: Callable[..., Config], deployment_factory: Factory, telemetry: Telemetry
) -> None:
    dep = _deployment(make_config, deployment_factory, _otel(telemetry))
    run = dep.run("你好", model=_DownModel())
    assert run.record()["termination"] == "model_error"
    chat = telemetry.one("chat")
    assert chat.attributes["error.type"] == "http"
    assert chat.status.status_code is StatusCode.ERROR
    root = telemetry.one("invoke_agent")
    assert chat.parent.span_id == root.context.span_id
    assert root.attributes["error.type"] == "model_error"
    failed = [
        p
        for p in telemetry.points("gen_ai.client.operation.duration")
        if p.attributes.get("error.type") == "http"
    ]
    assert len(failed) == 1 and failed[0].count == 1


# -- content: only on opt-in, redacted ---------------------------------------------------------


@pytest.mark.parametrize("switch", ["true", "SPAN_ONLY", "setting"])
def test_content_only_on_opt_in_and_redacted(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    switch: str,
) -> None:
    if switch != "setting":
        monkeypatch.setenv(CAPTURE_ENV, switch)
        otel = _otel(telemetry)
    else:
        otel = _otel(telemetry, capture_content=True)
    dep = _deployment(make_config, deployment_factory, otel)
    run = dep.run(scenario=SECRET_TOOL)
    assert run.record()["termination"] == "final_answer"
    dumped = json.dumps(
        [dict(s.attributes) for s in telemetry.spans()], ensure_ascii=False, default=str
    )
    for secret in ("sk-live-ABCDEF1234567890", "tok_abcdefgh12345", "hunter2-secret"):
        assert secret not in dumped
    tool = telemetry.one("execute_tool")
    args = json.loads(tool.attributes["gen_ai.tool.call.arguments"])
    assert args["customer"] == "C-42" and args["api_key"] == "[REDACTED]"
    assert tool.attributes["gen_ai.tool.call.result"] == "OK: synced C-42"
    first = telemetry.spans("chat")[0]
    inputs = json.loads(first.attributes["gen_ai.input.messages"])
    assert inputs[-1] == {"role": "user", "parts": [{"type": "text", "content": run.user}]}
    outputs = json.loads(first.attributes["gen_ai.output.messages"])
    assert outputs[0]["role"] == "assistant"
    assert [p["type"] for p in outputs[0]["parts"]] == ["text", "tool_call"]
    assert "[REDACTED]" in outputs[0]["parts"][1]["arguments"]


def test_setting_false_overrides_the_env_switch(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CAPTURE_ENV, "true")
    dep = _deployment(make_config, deployment_factory, _otel(telemetry, capture_content=False))
    dep.run(scenario=SECRET_TOOL)
    monkeypatch.setenv(CAPTURE_ENV, "EVENT_ONLY")  # events are not written: no content
    dep = _deployment(make_config, deployment_factory, _otel(telemetry))
    dep.run(scenario=SECRET_TOOL)
    assert all(
        not k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.tool.call.a"))
        for s in telemetry.spans()
        for k in s.attributes
    )


# -- metrics ------------------------------------------------------------------------------------


def test_genai_metrics_and_counters_match_the_metrics_plugin(
    make_config: Callable[..., Config], deployment_factory: Factory, telemetry: Telemetry
) -> None:
    dep = _deployment(make_config, deployment_factory, _otel(telemetry), extra=("metrics",))
    runs = [dep.run(scenario=s) for s in (REFUND, ALWAYS_NOT_FOUND)]
    usage = telemetry.points("gen_ai.client.token.usage")
    by_type = {p.attributes["gen_ai.token.type"]: p for p in usage}
    assert by_type["input"].sum == sum(r.usage.prompt for r in runs)
    assert by_type["output"].sum == sum(r.usage.completion for r in runs)
    assert by_type["input"].attributes["gen_ai.operation.name"] == "chat"
    (duration,) = telemetry.points("gen_ai.client.operation.duration")
    assert duration.count == sum(r.step for r in runs)

    # loopwarden's own counters: the metrics plugin's series, under its Prometheus names
    m: Metrics = dep.plugins.get("metrics")
    snapshot = m.snapshot()
    names = counter_names()
    for key, (otel_name, _) in names.items():
        if key == "ledger_answers_total":
            continue
        expected = {
            frozenset((k, v) for k, v in row["labels"].items()): row["value"]
            for row in snapshot[key]
        }
        assert telemetry.counter(otel_name) == expected, key
    assert telemetry.counter("loopwarden_runs") == {
        frozenset({("termination", "final_answer")}): 1,
        frozenset({("termination", "repeat_call")}): 1,
    }


def test_counter_names_are_the_prometheus_names() -> None:
    pytest.importorskip("prometheus_client")
    m = Metrics(MetricsSettings(prometheus=True))
    m.prometheus.inc("record_write_failures_total", 1, {})  # type: ignore[union-attr]
    exposed = {line.split()[2] for line in m.exposition().splitlines() if line.startswith("# TYPE")}
    for key, (name, _) in counter_names().items():
        if key != "ledger_answers_total":
            assert name in exposed or f"{name}_total" in exposed, name


# -- never changes a run -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_records_are_the_same_with_and_without_the_plugin(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    telemetry: Telemetry,
    mode: str,
    tmp_path: Path,
) -> None:
    for i, scenario in enumerate((REFUND, ALWAYS_NOT_FOUND, SECRET_TOOL)):
        base = _deployment(
            make_config,
            deployment_factory,
            None,
            run={"mode": mode},
            store=tmp_path / f"{i}-base.sqlite3",
        )
        traced = _deployment(
            make_config,
            deployment_factory,
            _otel(telemetry, capture_content=True),
            run={"mode": mode},
            store=tmp_path / f"{i}-otel.sqlite3",
        )
        a, b = base.run(scenario=scenario), traced.run(scenario=scenario)
        assert a.messages == b.messages, scenario
        assert _comparable(a) == _comparable(b), scenario
    roots = telemetry.spans("invoke_agent")
    assert len(roots) == 3
    events = [e.attributes for r in roots for e in r.events]
    assert events  # the runaway run's verdicts
    for e in events:  # max_steps is essential: never shadowed
        shadowed = mode == "shadow" and e["loopwarden.verdict.plugin"] != "max_steps"
        assert e["loopwarden.verdict.shadow"] is shadowed
    if mode == "shadow":  # what would have stopped the run is on its span
        (runaway,) = [r for r in roots if "loopwarden.shadow_stop.reason" in r.attributes]
        assert runaway.attributes["loopwarden.shadow_stop.reason"] == "repeat_call"


def test_a_failing_telemetry_backend_never_breaks_a_run(
    make_config: Callable[..., Config], deployment_factory: Factory, tmp_path: Path
) -> None:
    otel = OTel(tracer_provider=ExplodingTracerProvider(), meter_provider=ExplodingMeterProvider())
    for i, scenario in enumerate((REFUND, ALWAYS_NOT_FOUND)):
        base = _deployment(
            make_config, deployment_factory, None, store=tmp_path / f"{i}-base.sqlite3"
        )
        broken = _deployment(
            make_config, deployment_factory, otel, store=tmp_path / f"{i}-otel.sqlite3"
        )
        a, b = base.run(scenario=scenario), broken.run(scenario=scenario)
        assert _comparable(a) == _comparable(b), scenario
        assert b.errors == []


def test_without_opentelemetry_the_plugin_says_so_and_records_nothing(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for mod in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    otel = OTel()
    assert "pip install 'loopwarden[otel]'" in caplog.text
    dep = _deployment(make_config, deployment_factory, otel)
    assert dep.run(scenario=REFUND).record()["termination"] == "final_answer"


# -- shipping: OTLP/HTTP to a real receiver; the global providers; config by name -------------


def test_otlp_http_exporter_ships_spans_and_metrics_to_a_receiver(
    make_config: Callable[..., Config], deployment_factory: Factory
) -> None:
    with otlp_receiver() as (received, url):
        names, objects = repeat_guard()
        config = make_config(
            plugins={
                "enabled": ["max_steps", *names, "otel"],
                "otel": {"exporter": "otlp", "endpoint": url, "service_name": "shop-agent"},
            }
        )
        dep = deployment_factory(config, plugins=objects, clock=FakeClock())
        run = dep.run(scenario=ALWAYS_NOT_FOUND)
        dep.close()  # shuts the plugin's providers down: everything is flushed
        spans = received.spans()
        assert received.content_types and set(received.content_types) == {"application/x-protobuf"}
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name.split()[0], []).append(span)
    (root,) = by_name["invoke_agent"]
    assert len(by_name["chat"]) == run.step
    assert all(s.parent_span_id == root.span_id for s in by_name["chat"] + by_name["execute_tool"])
    assert all(s.trace_id == root.trace_id for s in spans)
    attrs = {kv.key: kv.value for kv in root.attributes}
    assert attrs["loopwarden.termination"].string_value == "repeat_call"
    assert attrs["gen_ai.usage.input_tokens"].int_value == run.usage.prompt
    verdicts = [e for e in root.events if e.name == "loopwarden.verdict"]
    assert len(verdicts) == len(run.verdicts)
    resource = received.traces[0].resource_spans[0].resource
    assert {kv.key: kv.value.string_value for kv in resource.attributes}["service.name"] == (
        "shop-agent"
    )
    assert {"gen_ai.client.token.usage", "loopwarden_runs"} <= received.metric_names()


def test_enabled_by_name_writes_to_the_applications_global_provider(tmp_path: Path) -> None:
    """In a fresh interpreter: the global provider can be set only once per process."""
    config = tmp_path / "config.toml"
    config.write_text('[model]\nprovider = "scripted"\n[plugins]\nenabled = ["otel"]\n')
    code = textwrap.dedent(
        f"""
        import json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from loopwarden import Deployment
        from loopwarden.config import load_config

        dep = Deployment(load_config({str(config)!r}))  # the plugin is made before the provider
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        with trace.get_tracer("app").start_as_current_span("job") as job:
            run = dep.run(scenario="refund")
        spans = exporter.get_finished_spans()
        root = [s for s in spans if s.name.startswith("invoke_agent")][0]
        print(json.dumps({{
            "names": sorted({{s.name.split()[0] for s in spans}}),
            "parent_is_job": root.parent.span_id == job.get_span_context().span_id,
            "provider": root.attributes["gen_ai.provider.name"],
            "termination": root.attributes["loopwarden.termination"],
        }}))
        """
    )
    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {
        "names": ["chat", "execute_tool", "invoke_agent", "job"],
        "parent_is_job": True,
        "provider": "loopwarden.scripted",
        "termination": "final_answer",
    }


# -- the docs' set-ups and the bench ------------------------------------------------------------


def _otel_section() -> str:
    text = (Path(__file__).parent.parent / "docs" / "observability.md").read_text("utf-8")
    return text[text.index("\n## OpenTelemetry") :]


def test_the_docs_backend_setups_are_valid_plugin_tables(
    make_config: Callable[..., Config],
) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", _otel_section(), flags=re.S)
    assert len(blocks) == 2  # Jaeger, Tempo (Logfire is Python: the global providers)
    for block in blocks:
        assert len(block.strip().splitlines()) == 3
        data = tomllib.loads(block)
        plugins = load_plugins(make_config(plugins={"enabled": ["otel"], **data["plugins"]}))
        otel = plugins.get("otel")
        assert otel.settings.exporter == "otlp"
        otel.close()
    (python,) = re.findall(r"```python\n(.*?)```", _otel_section(), flags=re.S)
    assert len(python.strip().splitlines()) == 3


def test_overhead_bench_reports_the_otel_variant() -> None:
    bench = Path(__file__).parent.parent / "bench" / "overhead.py"
    proc = subprocess.run(
        [sys.executable, str(bench), "--quick", "--json", "--sizes", "10"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    row = data["us_per_step"]["10"]
    for variant in ("otel_api", "otel_sdk"):
        assert row[variant] > 0
        assert isinstance(data["otel_us_per_step"][variant]["10"], float)


def test_otlp_settings_without_the_otlp_exporter_are_an_error(
    make_config: Callable[..., Config],
) -> None:
    from loopwarden.exceptions import ConfigError

    with pytest.raises(ConfigError) as err:
        load_plugins(
            make_config(plugins={"enabled": ["otel"], "otel": {"endpoint": "http://x:4318"}})
        )
    assert "endpoint" in str(err.value) and 'exporter = "otlp"' in str(err.value)


class _CountingSampler:
    """The SDK's parent-based sampler, counting the spans it is asked about."""

    def __init__(self, root_sampled: bool) -> None:
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

        self.inner = ParentBased(ALWAYS_ON if root_sampled else ALWAYS_OFF)
        self.asked = 0

    def should_sample(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        return self.inner.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "counting"


@pytest.mark.parametrize("sampled", [True, False])
def test_a_trace_the_sampler_drops_makes_no_child_spans(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    telemetry: Telemetry,
    sampled: bool,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    sampler = _CountingSampler(sampled)
    provider = TracerProvider(sampler=sampler)  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(telemetry.exporter))
    otel = OTel(tracer_provider=provider, meter_provider=telemetry.meter_provider)
    run = _deployment(make_config, deployment_factory, otel).run(scenario=REFUND)
    spans = 1 + run.step + run.tool_calls  # invoke_agent, chat per step, execute_tool per call
    assert sampler.asked == (spans if sampled else 1)
    assert len(telemetry.spans()) == (spans if sampled else 0)
    # the metrics do not depend on sampling
    (duration,) = telemetry.points("gen_ai.client.operation.duration")
    assert duration.count == run.step


PRIVATE = {"query": "refund for jane.doe@example.com, SSN 123-45-6789"}


def _private_loop(tmp_path: Path) -> str:
    """A runaway run whose repeated call holds an e-mail address and an SSN."""
    path = tmp_path / "private.toml"
    path.write_text(
        'name = "private"\nuser = "help"\n[model]\nturns = [\n'
        '  { tool_calls = [{ name = "search_knowledge", arguments = '
        + "{ "
        + ", ".join(f"{k} = {json.dumps(v)}" for k, v in PRIVATE.items())
        + ' } }] },\n]\nthen = "repeat_last"\nfinal_text = "done"\n'
        '[tools.search_knowledge]\nresults = ["nothing found"]\n',
        encoding="utf-8",
    )
    return str(path)


def _exported_text(t: Telemetry) -> str:
    """Every attribute of every span and span event, as text."""
    parts = []
    for span in t.spans():
        parts.extend(f"{k}={v}" for k, v in span.attributes.items())
        for event in span.events:
            parts.extend(f"{k}={v}" for k, v in event.attributes.items())
    return "\n".join(parts)


@pytest.mark.parametrize("capture", [False, True])
def test_a_repeat_stop_exports_no_arguments_without_capture_content(
    make_config: Callable[..., Config],
    deployment_factory: Factory,
    telemetry: Telemetry,
    tmp_path: Path,
    capture: bool,
) -> None:
    """A repeat_call stop on a call holding an e-mail and an SSN: without capture_content no
    span, attribute or event carries them -- the verdict's message and its evidence's
    signature leave as a hash and a length (equal calls, equal hashes); with the opt-in
    they are exported (redacted)."""
    dep = _deployment(make_config, deployment_factory, _otel(telemetry, capture_content=capture))
    run = dep.run(scenario=_private_loop(tmp_path))
    record = run.record()
    assert record["termination"] == "repeat_call"
    assert "123-45-6789" in record["evidence"]["signature"]  # the record keeps it, locally
    exported = _exported_text(telemetry)
    for secret in ("123-45-6789", "jane.doe@example.com"):
        assert (secret in exported) is capture
    events = [e.attributes for e in telemetry.one("invoke_agent").events]
    stop = [e for e in events if e["loopwarden.verdict.action"] == "stop"][-1]
    if capture:
        assert "123-45-6789" in stop["loopwarden.evidence.signature"]
    else:
        hashes = {
            e["loopwarden.evidence.signature.hash"]
            for e in events
            if "loopwarden.evidence.signature.hash" in e
        }
        assert len(hashes) == 1  # the same call each time: one hash, nothing else
        assert stop["loopwarden.evidence.count"] == record["evidence"]["count"]
        assert stop["loopwarden.verdict.message.chars"] > 0


class _DeadCollector:
    """A collector that is down: it accepts each connection, reads the request line and
    closes the connection without an answer (the client sees a dropped connection, as from a
    crashed or restarting collector); ``requests`` holds each request line."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            conn.settimeout(5)
            try:
                line = conn.recv(200).split(b"\r\n", 1)[0].decode("ascii", "replace")
            except OSError:
                line = ""
            self.requests.append(line)
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_collector_that_is_down_keeps_a_short_run_short_with_one_log_line(
    tmp_path: Path,
) -> None:
    """``loopwarden run`` with the OTLP exporter pointed at a collector that is down: the
    run's record as usual, exactly one line on stderr (not the SDK's eight retry lines), and
    one export tried -- its retries within ``export_timeout_s`` (2 s) -- after which the
    collector is skipped: the metrics are never sent, and the close does not wait on their
    retries (~15 s before).  Attempts are counted, not timed."""
    collector = _DeadCollector()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        '[plugins]\nenabled = ["max_steps", "otel"]\n[plugins.otel]\nexporter = "otlp"\n'
        f'endpoint = "http://127.0.0.1:{collector.port}"\n',
        encoding="utf-8",
    )
    try:
        proc = loopwarden("run", "--config", str(cfg), "--scenario", "refund", "--json")
    finally:
        collector.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["termination"] == "final_answer"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "otel: exporting" in lines[0] and f"127.0.0.1:{collector.port}" in lines[0]
    assert collector.requests, "nothing was exported: the test proves nothing"
    assert all(r.startswith("POST /v1/traces") for r in collector.requests), collector.requests
    assert len(collector.requests) <= 4  # 2 attempts in 2 s (the client reconnects once each)
