"""Helpers for the OpenTelemetry tests: an SDK pipeline kept in memory, a real OTLP/HTTP
receiver, and providers that fail on purpose.

* :class:`Telemetry` -- a ``TracerProvider`` with the SDK's ``InMemorySpanExporter`` and a
  ``MeterProvider`` with an ``InMemoryMetricReader`` (never the global providers: tests stay
  independent), with lookups by span name and metric name;
* :func:`otlp_receiver` -- a real HTTP server on 127.0.0.1 that takes what the official OTLP/HTTP
  exporter posts to ``/v1/traces`` and ``/v1/metrics`` and decodes it with opentelemetry-proto;
* :class:`ExplodingTracerProvider` / :class:`ExplodingMeterProvider` -- providers whose every
  call raises: an observer built on them must still never change a run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class Telemetry:
    """An in-memory SDK pipeline for traces and metrics."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, prefix: str = "") -> list[ReadableSpan]:
        """Finished spans whose name starts with ``prefix``, in the order they ended."""
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        found = self.spans(prefix)
        assert len(found) == 1, [s.name for s in found]
        return found[0]

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` (all scopes), as the reader collects them now."""
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        out.extend(m.data.data_points)
        return out

    def metric_names(self) -> set[str]:
        data = self.reader.get_metrics_data()
        if data is None:
            return set()
        return {
            m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }

    def counter(self, name: str) -> dict[frozenset[tuple[str, Any]], float]:
        """A counter's values by label set."""
        return {frozenset(p.attributes.items()): p.value for p in self.points(name)}

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@dataclass
class Received:
    """What the receiver decoded: spans and metric names, and the raw requests."""

    traces: list[Any] = field(default_factory=list)  # ExportTraceServiceRequest
    metrics: list[Any] = field(default_factory=list)  # ExportMetricsServiceRequest
    content_types: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[Any]:
        with self.lock:
            return [
                span
                for req in self.traces
                for rs in req.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]

    def metric_names(self) -> set[str]:
        with self.lock:
            return {
                m.name
                for req in self.metrics
                for rm in req.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            }


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = self.server.received
        if self.path == "/v1/traces":
            req: Any = ExportTraceServiceRequest()
            req.ParseFromString(body)
            with got.lock:
                got.traces.append(req)
        elif self.path == "/v1/metrics":
            req = ExportMetricsServiceRequest()
            req.ParseFromString(body)
            with got.lock:
                got.metrics.append(req)
        else:
            self.send_response(404)
            self.end_headers()
            return
        got.content_types.append(self.headers.get("Content-Type") or "")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received = Received()


@contextmanager
def otlp_receiver() -> Iterator[tuple[Received, str]]:
    """A local OTLP/HTTP receiver: ``(received, base_url)``; decodes protobuf bodies."""
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.received, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Boom:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"telemetry backend down ({name})")


class ExplodingTracerProvider:
    """A tracer provider whose tracer raises on every call."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _Boom()


class _BoomInstrument:
    def add(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("metrics backend down")

    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("metrics backend down")


class _BoomMeter:
    def create_counter(self, *args: Any, **kwargs: Any) -> Any:
        return _BoomInstrument()

    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return _BoomInstrument()


class ExplodingMeterProvider:
    """A meter provider whose instruments raise on every measurement."""

    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return _BoomMeter()
