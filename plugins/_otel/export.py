"""The tracer and meter of the otel plugin: the application's providers (or the ones given),
else SDK providers of the plugin's own that ship over OTLP/HTTP -- each export bounded, and
skipped while the collector is down, so a collector that is down never holds a run or a close.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GLOBAL_METER", "Health", "Providers", "providers"]

log = logging.getLogger("loopwarden.plugins.otel")

INSTRUMENTATION = "loopwarden"


class _Global:
    """The global meter provider as a key (:attr:`Providers.counters_key`)."""


#: the counters key of every plugin on the global meter provider: one set for the process,
#: whether a plugin was made before the application set its provider (on the API's proxy
#: meter) or after
GLOBAL_METER = _Global()


@dataclass
class Providers:
    """The tracer and meter the plugin writes to (None: the API's no-op one, which would
    discard everything -- the plugin then builds nothing for it), what it must shut down on
    close, and what the meter's counters are shared by: every plugin on one meter provider
    counts into the same counters (:mod:`.instruments`)."""

    tracer: Any
    meter: Any
    owned: list[Any] = field(default_factory=list)
    counters_key: Any = None

    def close(self) -> None:
        for provider in self.owned:
            try:
                provider.shutdown()
            except Exception:  # an exporter failing at shutdown never breaks a close
                log.warning("otel: shutting down %r failed", provider, exc_info=True)
        self.owned.clear()


#: after a failed export, batches are dropped at once for this long (the collector is down)
DOWN_FOR_S = 30.0
#: the SDK's loggers whose lines an export of ours would print (one per retry)
_EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)
_QUIET = threading.local()  # set while one of our exports runs on this thread


class _Quiet(logging.Filter):
    """Drops the SDK's lines while one of our exports runs on the thread: the collector's
    failure is logged once, by :class:`Health`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_QUIET, "active", False)


_FILTER = _Quiet()


class Health:
    """The collector as the plugin's exporters see it: a failed export marks it down for
    :data:`DOWN_FOR_S` (batches are dropped at once meanwhile, so no run waits on retries);
    each outage is logged once, and its end once."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.down_until = 0.0
        self.failures = 0
        self._lock = threading.Lock()

    def export(self, kind: str, call: Any) -> bool:
        """Run ``call()`` (an export) unless the collector is down; True when it succeeded."""
        if time.monotonic() < self.down_until:
            return False
        _QUIET.active = True
        try:
            ok, why = bool(call()), ""
        except Exception as exc:  # an exporter that raises is a failed export
            ok, why = False, f"{type(exc).__name__}: {exc}"
        finally:
            _QUIET.active = False
        with self._lock:
            if ok:
                if self.failures:
                    log.warning("otel: the collector at %s answers again", self.endpoint)
                self.failures = 0
                return True
            self.down_until = time.monotonic() + DOWN_FOR_S
            self.failures += 1
            first = self.failures == 1
        if first:  # an error (telemetry is lost), once per outage
            log.error(
                "otel: exporting %s to %s failed%s; telemetry is dropped while the collector "
                "does not answer (tried again every %gs), the runs go on",
                kind,
                self.endpoint,
                f" ({why})" if why else "",
                DOWN_FOR_S,
            )
        return False


def _guarded_exporters(endpoint: str | None, timeout_s: float) -> tuple[Any, Any, Health]:
    """The OTLP/HTTP span and metric exporters, each export bounded by ``timeout_s`` (its
    retries included) and skipped while the collector is down (:class:`Health`)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    base = endpoint.rstrip("/") if endpoint else None
    spans = OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None, timeout=timeout_s)
    metrics = OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None, timeout=timeout_s)
    health = Health(base or "the OTLP endpoint of the OTEL_EXPORTER_OTLP_* variables")
    for name in _EXPORT_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)

    class GuardedSpans(SpanExporter):  # type: ignore[misc, unused-ignore]
        def export(self, batch: Any) -> Any:
            ok = health.export("spans", lambda: spans.export(batch) is SpanExportResult.SUCCESS)
            return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

        def shutdown(self) -> None:
            spans.shutdown()  # type: ignore[no-untyped-call, unused-ignore]

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    class GuardedMetrics(MetricExporter):  # type: ignore[misc, unused-ignore]
        def __init__(self) -> None:
            super().__init__(
                preferred_temporality=metrics._preferred_temporality,
                preferred_aggregation=metrics._preferred_aggregation,
            )

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            ok = health.export(
                "metrics",
                lambda: (
                    metrics.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
                    is MetricExportResult.SUCCESS
                ),
            )
            return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            metrics.shutdown(timeout_millis=timeout_millis, **kwargs)

    return GuardedSpans(), GuardedMetrics(), health


def providers(
    exporter: str,
    endpoint: str | None,
    service_name: str,
    version: str,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    export_timeout_s: float = 2.0,
) -> Providers:
    """The tracer and meter: the given providers, else the global ones (``exporter =
    "global"``), else SDK providers of the plugin's own shipping to an OTLP/HTTP endpoint."""
    from opentelemetry import metrics, trace

    if exporter == "otlp" and tracer_provider is None and meter_provider is None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": service_name})
        span_exporter, metric_exporter, _ = _guarded_exporters(endpoint, export_timeout_s)
        tp = TracerProvider(resource=resource)
        tp.add_span_processor(BatchSpanProcessor(span_exporter))
        reader = PeriodicExportingMetricReader(metric_exporter)
        mp = MeterProvider(resource=resource, metric_readers=[reader])
        tracer_provider, meter_provider = tp, mp
        owned: list[Any] = [tp, mp]
    else:
        owned = []
    from opentelemetry.metrics import NoOpMeter
    from opentelemetry.trace import NoOpTracer

    tracer = (
        tracer_provider.get_tracer(INSTRUMENTATION, version)
        if tracer_provider is not None
        else trace.get_tracer(INSTRUMENTATION, version)
    )
    meter = (
        meter_provider.get_meter(INSTRUMENTATION, version)
        if meter_provider is not None
        else metrics.get_meter(INSTRUMENTATION, version)
    )
    global_meter = meter_provider is None or meter_provider is metrics.get_meter_provider()
    return Providers(
        None if type(tracer) is NoOpTracer else tracer,
        None if type(meter) is NoOpMeter else meter,
        owned,
        GLOBAL_METER if global_meter else meter_provider,
    )
