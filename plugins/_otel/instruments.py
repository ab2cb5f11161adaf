"""The otel plugin's metric instruments: the GenAI client histograms (a point per model call)
and loopwarden's counters, counted in the process and read by observable counters when a
reader collects.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loopwarden.plugins.metrics import MetricsSettings, _definitions

if TYPE_CHECKING:
    from loopwarden.verdicts import Verdict

__all__ = ["Instruments", "counter_names"]

log = logging.getLogger("loopwarden.plugins.otel")

#: the metrics plugin's counters this plugin mirrors (in-process name)
MIRRORED = (
    "runs_total",
    "guard_firings_total",
    "agent.loop_detected",
    "tool_calls_total",
    "scope_refusals_total",
    "record_write_failures_total",
)


def counter_names(namespace: str = "loopwarden") -> dict[str, tuple[str, str]]:
    """In-process name -> (OTel counter name, description): the metrics plugin's Prometheus
    names without the ``_total`` an exporter to Prometheus adds, and the same labels."""
    defs = {d.name: d for d in _definitions(MetricsSettings())}
    out: dict[str, tuple[str, str]] = {}
    for key in MIRRORED:
        d = defs[key]
        out[key] = (f"{namespace}_{d.prom_name}" if d.namespaced else d.prom_name, d.help)
    out["ledger_answers_total"] = (
        f"{namespace}_ledger_answers",
        "Tool calls answered by the side-effect ledger, by tool and source (conversation, shared).",
    )
    return out


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


class _Tally:
    """One counter's values by label set, kept in the process and read by an observable
    counter when a reader collects: counting is a dict update under a lock, where the SDK's
    synchronous ``Counter.add`` takes a measurement through its whole pipeline (attributes
    cleaned, hashed, aggregated) on every call -- the same exported series (a monotonic sum,
    per label set), paid once per collection instead of once per tool call."""

    __slots__ = ("_lock", "_observation", "_values")

    def __init__(self, observation: Any) -> None:
        self._lock = threading.Lock()
        self._observation = observation
        self._values: dict[tuple[tuple[str, Any], ...], float] = {}

    def add(self, amount: float, labels: tuple[tuple[str, Any], ...]) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0) + amount

    def observe(self, options: Any = None) -> list[Any]:
        """The totals as observations, one per label set (keys in any order are one set)."""
        totals: dict[tuple[tuple[str, Any], ...], float] = {}
        with self._lock:
            for labels, value in self._values.items():
                key = tuple(sorted(labels))
                totals[key] = totals.get(key, 0) + value
        return [self._observation(value, dict(labels)) for labels, value in totals.items()]


class _Synchronous:
    """A synchronous counter behind :class:`_Tally`'s face, for a meter that makes no
    observable counters."""

    __slots__ = ("_counter",)

    def __init__(self, counter: Any) -> None:
        self._counter = counter

    def add(self, amount: float, labels: tuple[tuple[str, Any], ...]) -> None:
        self._counter.add(amount, dict(labels))


#: counters key (a meter provider, or :data:`~.export.GLOBAL_METER`) -> counter name -> its
#: tally: the SDK keeps the first observable counter of a name on a meter (and its callback),
#: so every plugin writing to one provider counts into the same tally, as into one SDK counter
_TALLIES: weakref.WeakKeyDictionary[Any, dict[str, _Tally]] = weakref.WeakKeyDictionary()
_TALLIES_LOCK = threading.Lock()


def _counter(meter: Any, key: Any, name: str, description: str) -> _Tally | _Synchronous:
    """The counter ``name`` on ``meter``: the tally shared by ``key`` (made with its observable
    counter on first use), else -- a meter without observable counters -- a synchronous one."""
    with _TALLIES_LOCK:
        try:
            shared = _TALLIES.setdefault(key, {}) if key is not None else {}
        except TypeError:  # a provider that cannot be weakly referenced: counters of its own
            shared = {}
        tally = shared.get(name)
        if tally is not None:
            return tally
        try:
            from opentelemetry.metrics import Observation

            tally = _Tally(Observation)
            meter.create_observable_counter(
                name, callbacks=[tally.observe], description=description
            )
        except Exception:  # not an OTel meter's full face: count through its plain counter
            log.debug("otel: no observable counter %s; a synchronous one", name, exc_info=True)
            return _Synchronous(meter.create_counter(name, description=description))
        shared[name] = tally
        return tally


class Instruments:
    """The metric instruments: the GenAI client histograms, and loopwarden's counters under
    the names and labels of the metrics plugin's Prometheus series."""

    def __init__(
        self, meter: Any, counters: Mapping[str, tuple[str, str]], key: Any = None
    ) -> None:
        """``key``: what the counters are shared by (:attr:`Providers.counters_key`)."""
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
        #: in-process name (as the metrics plugin reads it) -> the counter
        self.counters: dict[str, _Tally | _Synchronous] = {
            k: _counter(meter, key, name, help_text) for k, (name, help_text) in counters.items()
        }

    def add(self, key: str, amount: float = 1, **labels: Any) -> None:
        self.counters[key].add(amount, tuple(labels.items()))

    def count_verdict(self, verdict: Verdict, reason: str, loop: frozenset[str]) -> None:
        """A guard's firing; a loop detector's (``loop``: plugin names or stop reasons) also as
        ``agent.loop_detected``, a budget's stop of a scope as a scope refusal."""
        self.add("guard_firings_total", plugin=verdict.plugin, reason=reason, kind=verdict.kind)
        if verdict.plugin in loop or reason in loop:
            self.add("agent.loop_detected", plugin=verdict.plugin, reason=reason)
        evidence = verdict.evidence
        if (
            verdict.kind == "stop"
            and isinstance(evidence.get("scope"), str)
            and verdict.plugin != "circuit_breaker"  # a paused tool, not a budget refusing
        ):
            self.add(
                "scope_refusals_total",
                scope=evidence["scope"],
                window=str(evidence.get("window")),
                reason=reason,
            )
