"""The otel plugin's parts, by role (:mod:`loopwarden.plugins.otel` decides *when* a run's
events become a span, an event or a measurement; these make them):

* :mod:`.attributes` -- the attribute values: scalars, keyed hashes standing in for content,
  evidence, captured message content (redacted, cut), the verdict and breaker events, the
  attributes a run's chat calls share;
* :mod:`.export` -- the tracer and meter: the application's providers, or SDK providers of the
  plugin's own shipping over OTLP/HTTP, guarded against a collector that is down;
* :mod:`.instruments` -- the GenAI histograms and loopwarden's counters (counted in the
  process, read by observable counters when a reader collects).

Only :mod:`.export` and :mod:`.instruments` touch the ``opentelemetry`` packages, and only
inside functions called when a plugin is created -- never at ``import loopwarden`` or when
the docs read the settings model.  The API (``opentelemetry-api``) is enough for the global
providers; an exporter the settings name needs the SDK and ``opentelemetry-exporter-otlp-
proto-http`` (the extra ``loopwarden[otel]`` brings all three).
"""

from __future__ import annotations

from loopwarden.plugins._otel.attributes import (
    CallAttributes,
    Content,
    Digest,
    breaker_attributes,
    evidence_attributes,
    run_end_attributes,
    run_start_attributes,
    scalar,
    server_attributes,
    verdict_attributes,
)
from loopwarden.plugins._otel.export import Providers, providers
from loopwarden.plugins._otel.instruments import Instruments

__all__ = [
    "CallAttributes",
    "Content",
    "Digest",
    "Instruments",
    "Providers",
    "breaker_attributes",
    "evidence_attributes",
    "providers",
    "run_end_attributes",
    "run_start_attributes",
    "scalar",
    "server_attributes",
    "verdict_attributes",
]
