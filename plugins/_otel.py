"""The otel plugin's OpenTelemetry side: providers, instruments, attribute values.

Split from :mod:`loopwarden.plugins.otel` (which decides *what* becomes a span, an event or a
measurement): this module holds everything that touches the ``opentelemetry`` packages, and
imports them only when a plugin is created -- never at ``import loopwarden`` or when the
docs read the settings model.  The API (``opentelemetry-api``) is enough for the global
providers; an exporter the settings name needs the SDK and ``opentelemetry-exporter-otlp-
proto-http`` (the extra ``loopwarden[otel]`` brings all three).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Digest", "Instruments", "Providers", "evidence_attributes", "scalar"]

log = logging.getLogger("loopwarden.plugins.otel")

INSTRUMENTATION = "loopwarden"

#: the GenAI conventions' advised bucket boundaries (gen_ai.client.token.usage)
TOKEN_BUCKETS = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
#: ... and for gen_ai.client.operation.duration (seconds)
DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)

#: the standard evidence keys (docs/contracts.md) carried by a verdict's span event
EVIDENCE_KEYS = (
    "count",
    "threshold",
    "signature",
    "tool",
    "limit",
    "spent",
    "scope",
    "window",
    "rule",
)

_MAX_ATTR_CHARS = 1000  # a string attribute longer than this is cut (evidence, messages)


def scalar(value: Any, limit: int = _MAX_ATTR_CHARS) -> str | bool | int | float:
    """``value`` as an OTel attribute value: bools and numbers as they are (a Decimal as a
    float), anything else as a string cut to ``limit`` characters."""
    if isinstance(value, (bool, int, float)):
        return value
    if type(value).__name__ == "Decimal":
        return float(value)
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


#: the standard evidence keys that hold content (a call's arguments, a sentence the model
#: wrote): without capture_content only their hash and length leave the process
CONTENT_EVIDENCE_KEYS = frozenset({"signature"})


class Digest:
    """A keyed hash of content for telemetry without ``capture_content``: equal texts get
    equal hashes within one deployment (a repeat is told apart in a trace), and a value with
    few possibilities (a 9-digit number) cannot be found by hashing every candidate -- the
    key is random per deployment and never leaves the process."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        self._key = os.urandom(16)

    def __call__(self, text: str) -> str:
        data = text.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, digest_size=8, key=self._key).hexdigest()

    def content(self, name: str, text: str) -> dict[str, Any]:
        """``<name>.hash`` and ``<name>.chars`` attributes standing in for ``text``."""
        return {f"{name}.hash": self(text), f"{name}.chars": len(text)}


def evidence_attributes(
    evidence: Mapping[str, Any], redact: Any, digest: Digest | None = None
) -> dict[str, Any]:
    """The standard evidence keys present in ``evidence``, redacted, as ``loopwarden.evidence.*``
    attributes (other keys stay in the run record: a span event is not an archive).  With a
    ``digest`` (content is not captured), a key that holds content gives only its hash and
    length: ``loopwarden.evidence.signature.hash`` / ``.chars``."""
    out: dict[str, Any] = {}
    for key in EVIDENCE_KEYS:
        value = evidence.get(key)
        if value is None:
            continue
        if digest is not None and key in CONTENT_EVIDENCE_KEYS:
            out.update(digest.content(f"loopwarden.evidence.{key}", str(value)))
        else:
            out[f"loopwarden.evidence.{key}"] = scalar(redact(value))
    return out


@dataclass
class Providers:
    """The tracer and meter the plugin writes to, and what it must shut down on close."""

    tracer: Any
    meter: Any
    owned: list[Any] = field(default_factory=list)

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
    return Providers(tracer, meter, owned)


class Instruments:
    """The metric instruments: the GenAI client histograms, and loopwarden's counters under
    the names and labels of the metrics plugin's Prometheus series."""

    def __init__(self, meter: Any, counters: Mapping[str, tuple[str, str]]) -> None:
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        #: in-process name (as the metrics plugin reads it) -> the OTel counter
        self.counters: dict[str, Any] = {
            key: meter.create_counter(name, description=help_text)
            for key, (name, help_text) in counters.items()
        }

    def add(self, key: str, amount: float = 1, **labels: Any) -> None:
        self.counters[key].add(amount, labels)
