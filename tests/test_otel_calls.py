"""What one step of the shipped stack with the otel plugin calls, and the counters it keeps in
the process (issue 35: telemetry that costs little).

Call counts come from cProfile (deterministic; the time itself is measured in
bench/overhead.py, ``otel_us_per_step``): calls per step are the difference between a long and
a short run of the bench's workload (support/calls.py).  A step of that workload is one model
call and one tool call: with a recording SDK it makes exactly the conventions' two spans and
three histogram points, and nothing that the plugin could build once; on the API's no-op
providers it builds nothing at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import Counter, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider
from support.calls import bench_common, calls_per_step, play
from support.otel import Telemetry

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.plugins.otel import OTel
from loopwarden.tools import ToolRegistry, tool


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.shutdown()


def _shipped_with(otel: OTel) -> Deployment:
    """The bench's workload deployment (support.calls.shipped_deployment) plus ``otel``."""
    w = bench_common()
    path = default_config_path()
    data = w.bench_config_data(load_toml(path))
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "otel"]
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(w.lookup_ctx)])
    return Deployment(parse_config(data, path=str(path)), tools=tools, plugins={"otel": otel})


def _per_step(otel: OTel) -> dict[str, float]:
    dep = _shipped_with(otel)
    try:
        return calls_per_step(dep)
    finally:
        dep.close()


def test_a_recorded_step_makes_two_spans_and_three_points(telemetry: Telemetry) -> None:
    per_step = _per_step(
        OTel(tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
    )
    # the conventions' chat span per model call and execute_tool span per tool call
    assert per_step["__init__.py:start_span <- otel.py:on_model_responded"] == 1
    assert per_step["__init__.py:start_span <- otel.py:on_tool_finished"] == 1
    # the duration and the input and output tokens: the only measurements the SDK takes
    assert per_step["instrument.py:record <- otel.py:on_model_responded"] == 3
    assert per_step["measurement_consumer.py:consume_measurement"] == 3
    # the tool-call counter is a tally in the process, read when a reader collects
    assert per_step.get("instrument.py:add", 0) == 0
    assert per_step["instruments.py:add <- otel.py:on_tool_finished"] == 1
    # what every call shares is built once: no attribute cut, no tool or model set per step
    assert per_step.get("attributes.py:scalar", 0) == 0
    assert per_step["attributes.py:chat"] == 1  # a cache look-up
    assert per_step["attributes.py:tool"] == 1
    assert per_step.get("__init__.py:get_tracer", 0) == 0


def test_noop_providers_cost_no_telemetry_work_per_step() -> None:
    per_step = _per_step(
        OTel(tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
    )
    assert per_step["otel.py:on_model_responded"] == 1
    assert per_step["otel.py:on_tool_finished"] == 1
    # nothing that a no-op provider would discard: no attributes, no measurement, no span
    for key in ("attributes.py:chat", "attributes.py:tool", "instrument.py:record"):
        assert per_step.get(key, 0) == 0, key
    assert not any(k.endswith(":start_span") for k in per_step if per_step[k])


def test_every_step_is_still_recorded(telemetry: Telemetry) -> None:
    dep = _shipped_with(
        OTel(tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
    )
    try:
        run = play(dep, 7)
    finally:
        dep.close()
    chats, tools = telemetry.spans("chat"), telemetry.spans("execute_tool")
    assert len(chats) == run.step == 8 and len(tools) == 7
    assert [s.attributes["gen_ai.tool.call.id"] for s in tools] == [
        m["tool_call_id"] for m in run.messages if m.get("role") == "tool"
    ]
    (duration,) = telemetry.points("gen_ai.client.operation.duration")
    assert duration.count == 8
    usage = {
        p.attributes["gen_ai.token.type"]: p for p in telemetry.points("gen_ai.client.token.usage")
    }
    assert usage["input"].count == usage["output"].count == 8
    assert usage["input"].sum == run.usage.prompt
    assert telemetry.counter("loopwarden_tool_calls") == {
        frozenset({("tool", "lookup"), ("outcome", "ok")}): 7
    }


# -- the counters kept in the process ------------------------------------------------------


def _runs_counted(reader: InMemoryMetricReader) -> dict[frozenset[tuple[str, Any]], float]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        frozenset(p.attributes.items()): p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "loopwarden_runs"
        for p in m.data.data_points
    }


def test_plugins_on_one_meter_provider_count_together(telemetry: Telemetry) -> None:
    # the SDK keeps the first observable counter of a name (and its callback): a second
    # plugin's counts must still reach it, as they reached a shared synchronous counter
    deps = [
        _shipped_with(
            OTel(
                tracer_provider=telemetry.tracer_provider,
                meter_provider=telemetry.meter_provider,
            )
        )
        for _ in range(2)
    ]
    try:
        for dep in deps:
            play(dep, 2)
    finally:
        for dep in deps:
            dep.close()
    assert _runs_counted(telemetry.reader) == {frozenset({("termination", "final_answer")}): 2}
    assert telemetry.counter("loopwarden_tool_calls") == {
        frozenset({("tool", "lookup"), ("outcome", "ok")}): 4
    }


def test_a_delta_reader_gets_what_happened_since_its_last_collection() -> None:
    delta = AggregationTemporality.DELTA
    reader = InMemoryMetricReader(preferred_temporality={Counter: delta, ObservableCounter: delta})
    provider = MeterProvider(metric_readers=[reader])
    dep = _shipped_with(OTel(tracer_provider=NoOpTracerProvider(), meter_provider=provider))
    try:
        play(dep, 1)
        assert _runs_counted(reader) == {frozenset({("termination", "final_answer")}): 1}
        play(dep, 1)
        play(dep, 1)
        assert _runs_counted(reader) == {frozenset({("termination", "final_answer")}): 2}
    finally:
        dep.close()
        provider.shutdown()


class _PlainMeter:
    """A meter with synchronous instruments only (no observable counters)."""

    def __init__(self) -> None:
        self.added: list[tuple[str, float, dict[str, Any]]] = []

    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return _Sink()

    def create_counter(self, name: str, **kwargs: Any) -> Any:
        meter = self

        class _Counter:
            def add(self, amount: float, attributes: dict[str, Any]) -> None:
                meter.added.append((name, amount, attributes))

        return _Counter()


class _Sink:
    def record(self, *args: Any, **kwargs: Any) -> None:
        pass


class _PlainMeterProvider:
    def __init__(self) -> None:
        self.meter = _PlainMeter()

    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return self.meter


def test_a_meter_without_observable_counters_counts_synchronously() -> None:
    provider = _PlainMeterProvider()
    dep = _shipped_with(OTel(tracer_provider=NoOpTracerProvider(), meter_provider=provider))
    try:
        play(dep, 2)
    finally:
        dep.close()
    added = provider.meter.added
    assert ("loopwarden_runs", 1, {"termination": "final_answer"}) in added
    assert [a for a in added if a[0] == "loopwarden_tool_calls"] == [
        ("loopwarden_tool_calls", 1, {"tool": "lookup", "outcome": "ok"})
    ] * 2
