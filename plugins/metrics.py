"""metrics: counters and histograms of runs, guard firings, steps, tokens and budget use.

In-process by default: read them with :meth:`Metrics.value`, :meth:`Metrics.histogram` and
:meth:`Metrics.snapshot` (``deployment.plugins.get("metrics")``).  With ``prometheus = true``
the same metrics are mirrored into a prometheus-client registry (the optional extra
``loopwarden[prometheus]``): :meth:`Metrics.exposition` renders the text format, and
``prometheus_port`` serves it over HTTP.  Without prometheus-client the plugin says so once and
stays in-process.

=========================  =========  ==========================  ================================
in-process name            kind       labels                      Prometheus name
=========================  =========  ==========================  ================================
``runs_total``             counter    termination                 loopwarden_runs_total
``guard_firings_total``    counter    plugin, reason, kind        loopwarden_guard_firings_total
``agent.loop_detected``    counter    plugin, reason              agent_loop_detected_total
``tool_calls_total``       counter    tool, outcome               loopwarden_tool_calls_total
``model_calls_total``      counter    --                          loopwarden_model_calls_total
``tokens_total``           counter    kind (prompt, completion)   loopwarden_tokens_total
``steps_per_run``          histogram  --                          loopwarden_steps_per_run
``tokens_per_run``         histogram  --                          loopwarden_tokens_per_run
``run_seconds``            histogram  --                          loopwarden_run_seconds
``budget_use_ratio``       histogram  budget (steps, tokens,      loopwarden_budget_use_ratio
                                      seconds)
``scope_spend_total``      counter    scope, window, kind (runs,  loopwarden_scope_spend_total
                                      model_calls, tool_calls,
                                      tokens, cost)
``scope_refusals_total``   counter    scope, window, reason       loopwarden_scope_refusals_total
``circuit_breakers_open``  gauge      target (tool, server),      loopwarden_circuit_breakers_open
                                      breaker (its name)
=========================  =========  ==========================  ================================

``record_write_failures_total`` (a counter without labels; Prometheus
``loopwarden_record_write_failures_total``) counts run records that ``run_record`` could not
write (the ``record-failed`` signal).

Tool calls to names the deployment does not have are counted under ``tool="(unknown)"``, so
model output cannot grow the label set.  A guard firing is any verdict (warn, skip, stop); its
``reason`` is the stop reason, or the verdict kind for warnings and skips.
``agent.loop_detected`` counts the firings of the loop detectors (``loop_detectors``: by plugin
name or stop reason).  ``budget_use_ratio`` is what a run used of each limit it had (its
profile's, else the ``max_steps`` / ``token_budget`` / ``timeout`` plugin's setting): 1.0 means
the whole budget.  ``scope_spend_total`` is what runs charged to the shared budgets of the
``spend_limits`` plugin (labelled by scope *name* -- ``tenant``, never the tenant itself -- so
the label set stays bounded); ``scope_refusals_total`` counts the stops whose evidence names a
scope (a shared or conversation budget refusing).  ``circuit_breakers_open`` is how many of
the ``circuit_breaker`` plugin's breakers of a tool or MCP server this process last saw open
(opened by one of its runs, or skipping one of its calls; no longer once one of its calls
finds it closed), set when a breaker changes and at the end of every run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from loopwarden import Plugin, PluginSettings, signals
from loopwarden.exceptions import LoopwardenError
from loopwarden.plugins._metrics import HistogramValue, MetricsRegistry, _Def, _Prometheus
from loopwarden.reasons import LOOP_REASONS

if TYPE_CHECKING:
    from loopwarden.events import ModelResponse, ToolCall, ToolResult
    from loopwarden.run import DeploymentView, Run, RunOutcome
    from loopwarden.verdicts import Verdict

__all__ = [
    "HistogramValue",
    "Metrics",
    "MetricsRegistry",
    "MetricsSettings",
    "PrometheusUnavailable",
]

log = logging.getLogger("loopwarden.plugins.metrics")

UNKNOWN_TOOL = "(unknown)"

INSTALL_HINT = (
    "prometheus-client is not installed: pip install 'loopwarden[prometheus]'. Metrics stay "
    "in-process (read them with Metrics.value / histogram / snapshot)."
)


class PrometheusUnavailable(LoopwardenError):
    """Prometheus exposition was asked for, but prometheus-client is missing or turned off."""


def _buckets(v: list[float]) -> list[float]:
    if not v or sorted(v) != v or len(set(v)) != len(v):
        raise ValueError("must be a non-empty, strictly increasing list")
    return v


class MetricsSettings(PluginSettings):
    loop_detectors: list[str] = Field(
        default_factory=lambda: list(LOOP_REASONS),
        description="plugin names or stop reasons whose firings count as agent.loop_detected",
    )
    step_buckets: list[float] = Field(
        default_factory=lambda: [1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 25.0, 50.0],
        description="histogram buckets of steps per run",
    )
    token_buckets: list[float] = Field(
        default_factory=lambda: [500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5],
        description="histogram buckets of tokens per run",
    )
    seconds_buckets: list[float] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0],
        description="histogram buckets of run duration (on the run's clock)",
    )
    ratio_buckets: list[float] = Field(
        default_factory=lambda: [0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0],
        description="histogram buckets of budget use (used / limit)",
    )
    prometheus: bool = Field(
        default=False,
        description="mirror the metrics into a prometheus-client registry (optional extra)",
    )
    prometheus_namespace: str = Field(
        default="loopwarden", description="prefix of the Prometheus metric names"
    )
    prometheus_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="serve /metrics on this port (needs prometheus = true; none: do not serve)",
    )
    prometheus_addr: str = Field(
        default="127.0.0.1", description="address the /metrics server binds to"
    )

    @field_validator("step_buckets", "token_buckets", "seconds_buckets", "ratio_buckets")
    @classmethod
    def _check_buckets(cls, v: list[float]) -> list[float]:
        return _buckets(v)


# ---------------------------------------------------------------------------------------------
# The plugin
# ---------------------------------------------------------------------------------------------


def _definitions(s: MetricsSettings) -> list[_Def]:
    return [
        _Def(
            "runs_total",
            "counter",
            "Runs by termination (stop reason).",
            ("termination",),
            prom_name="runs",
        ),
        _Def(
            "guard_firings_total",
            "counter",
            "Verdicts returned by plugins, by plugin, reason and kind (warn, skip, stop).",
            ("plugin", "reason", "kind"),
            prom_name="guard_firings",
        ),
        _Def(
            "agent.loop_detected",
            "counter",
            "Loop-detector firings (agent.loop_detected).",
            ("plugin", "reason"),
            prom_name="agent_loop_detected",
            namespaced=False,
        ),
        _Def(
            "tool_calls_total",
            "counter",
            "Tool calls by tool and outcome (ok, error, skipped).",
            ("tool", "outcome"),
            prom_name="tool_calls",
        ),
        _Def("model_calls_total", "counter", "Model calls.", prom_name="model_calls"),
        _Def(
            "tokens_total",
            "counter",
            "Tokens used, by kind (prompt, completion).",
            ("kind",),
            prom_name="tokens",
        ),
        _Def(
            "steps_per_run",
            "histogram",
            "Model turns per run.",
            buckets=tuple(s.step_buckets),
            prom_name="steps_per_run",
        ),
        _Def(
            "tokens_per_run",
            "histogram",
            "Tokens (prompt + completion) per run.",
            buckets=tuple(s.token_buckets),
            prom_name="tokens_per_run",
        ),
        _Def(
            "run_seconds",
            "histogram",
            "Run duration in seconds (on the run's clock).",
            buckets=tuple(s.seconds_buckets),
            prom_name="run_seconds",
        ),
        _Def(
            "budget_use_ratio",
            "histogram",
            "What a run used of each limit it had (1.0: the whole budget).",
            ("budget",),
            buckets=tuple(s.ratio_buckets),
            prom_name="budget_use_ratio",
        ),
        _Def(
            "scope_spend_total",
            "counter",
            "What runs charged to shared budgets, by scope name, window and kind.",
            ("scope", "window", "kind"),
            prom_name="scope_spend",
        ),
        _Def(
            "scope_refusals_total",
            "counter",
            "Stops by a scoped budget, by scope name, window and stop reason.",
            ("scope", "window", "reason"),
            prom_name="scope_refusals",
        ),
        _Def(
            "record_write_failures_total",
            "counter",
            "Run records that could not be written (run_record).",
            prom_name="record_write_failures",
        ),
        _Def(
            "circuit_breakers_open",
            "gauge",
            "Fleet-wide circuit breakers open as this process last saw them, by target "
            "(tool, server) and breaker (the tool's or server's name).",
            ("target", "breaker"),
            prom_name="circuit_breakers_open",
        ),
    ]


#: the counters the per-step receivers increment (their keys are built in place)
_MODEL_CALLS, _TOKENS, _TOOL_CALLS = "model_calls_total", "tokens_total", "tool_calls_total"

#: budget -> the run's profile limit for it
_PROFILE_FIELDS: dict[str, str] = {
    "steps": "max_steps",
    "tokens": "max_tokens",
    "seconds": "max_seconds",
}


def _positive(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _budget_limits(run: Run) -> dict[str, float]:
    """The limits this run had: its profile's, else what the budget plugins enforce (the
    ``budget_limits`` hook)."""
    enforced: dict[str, Any] = {}
    if run.deployment is not None:
        try:
            enforced = run.deployment.hooks.budget_limits(run)
        except Exception:  # other plugins' hooks: never break the metrics on them
            log.debug("budget_limits failed", exc_info=True)
    limits: dict[str, float] = {}
    for budget, profile_field in _PROFILE_FIELDS.items():
        value = _positive(getattr(run.limits, profile_field)) or _positive(enforced.get(budget))
        if value is not None:
            limits[budget] = value
    return limits


class Metrics(Plugin[MetricsSettings]):
    """Counts runs, guard firings, tool and model calls; histograms of steps, tokens, time
    and budget use.  In-process, optionally mirrored to Prometheus."""

    name = "metrics"
    Settings = MetricsSettings

    def __init__(self, settings: MetricsSettings | None = None) -> None:
        super().__init__(settings)
        s = self.settings
        defs = _definitions(s)
        self.registry = MetricsRegistry(defs)
        self._loop = frozenset(s.loop_detectors)
        #: (target, name) of every circuit breaker the gauge has shown
        self._breaker_pairs: set[tuple[str, str]] = set()
        self._breakers_lock = threading.Lock()
        self.prometheus: _Prometheus | None = None
        if s.prometheus:
            try:
                self.prometheus = _Prometheus(defs, s.prometheus_namespace)
            except ImportError:
                log.warning("metrics: prometheus = true, but %s", INSTALL_HINT)

    # -- read API -------------------------------------------------------------------------

    def value(self, name: str, **labels: Any) -> float:
        """A counter's value: ``value("runs_total", termination="max_steps")``."""
        return self.registry.value(name, **labels)

    def total(self, name: str, **labels: Any) -> float:
        """A counter summed over the labels not given: ``total("guard_firings_total")``."""
        return self.registry.total(name, **labels)

    def histogram(self, name: str, **labels: Any) -> HistogramValue:
        """A histogram's count, sum and buckets: ``histogram("steps_per_run")``."""
        return self.registry.histogram(name, **labels)

    def snapshot(self) -> dict[str, Any]:
        """Every series as JSON-able data."""
        return self.registry.snapshot()

    def exposition(self) -> str:
        """The Prometheus text format (needs ``prometheus = true`` and prometheus-client)."""
        if self.prometheus is None:
            if not self.settings.prometheus:
                raise PrometheusUnavailable(
                    "metrics: Prometheus exposition is off; set prometheus = true in "
                    "[plugins.metrics]"
                )
            raise PrometheusUnavailable(f"metrics: {INSTALL_HINT}")
        return self.prometheus.text()

    # -- wiring ---------------------------------------------------------------------------

    def connect(self, deployment: DeploymentView) -> None:
        deployment.connect(signals.model_responded, self.on_model_responded)
        deployment.connect(signals.tool_finished, self.on_tool_finished)
        deployment.connect(signals.guard_triggered, self.on_guard_triggered)
        deployment.connect(signals.run_stopped, self.on_run_stopped)
        deployment.connect(signals.record_failed, self.on_record_failed)
        deployment.connect(signals.breaker_changed, self.on_breaker_changed)
        port = self.settings.prometheus_port
        if self.prometheus is not None and port is not None and self.prometheus.server is None:
            try:
                self.prometheus.serve(port, self.settings.prometheus_addr)
            except OSError as exc:
                log.warning(
                    "metrics: cannot serve Prometheus metrics on %s:%s: %s",
                    self.settings.prometheus_addr,
                    port,
                    exc,
                )

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.close()

    def _inc(self, name: str, amount: float = 1.0, **labels: Any) -> None:
        self.registry.inc(name, amount, **labels)
        if self.prometheus is not None:
            self.prometheus.inc(name, amount, labels)

    def _observe(self, name: str, value: float, **labels: Any) -> None:
        self.registry.observe(name, value, **labels)
        if self.prometheus is not None:
            self.prometheus.observe(name, value, labels)

    # -- receivers ------------------------------------------------------------------------

    # The two per-step receivers count through MetricsRegistry.add: keys ready-made, one lock.

    def on_model_responded(self, run: Run, *, response: ModelResponse, **_: Any) -> None:
        usage = response.usage
        if usage is None:
            self.registry.add(((_MODEL_CALLS, (), 1.0),))
        else:
            self.registry.add(
                (
                    (_MODEL_CALLS, (), 1.0),
                    (_TOKENS, ("prompt",), usage.prompt),
                    (_TOKENS, ("completion",), usage.completion),
                )
            )
        prom = self.prometheus
        if prom is not None:
            prom.inc(_MODEL_CALLS, 1.0, {})
            if usage is not None:
                prom.inc(_TOKENS, usage.prompt, {"kind": "prompt"})
                prom.inc(_TOKENS, usage.completion, {"kind": "completion"})

    def on_tool_finished(self, run: Run, *, call: ToolCall, result: ToolResult, **_: Any) -> None:
        outcome = "skipped" if result.skipped else ("ok" if result.ok else "error")
        # A name the model invented is not a label: label values must stay a bounded set.
        tool = call.name if call.tool is not None else UNKNOWN_TOOL
        if type(tool) is not str:
            tool = str(tool)
        self.registry.add(((_TOOL_CALLS, (tool, outcome), 1.0),))
        if self.prometheus is not None:
            self.prometheus.inc(_TOOL_CALLS, 1.0, {"tool": tool, "outcome": outcome})

    def on_guard_triggered(self, run: Run, *, verdict: Verdict, **_: Any) -> None:
        reason = str(getattr(verdict, "reason", None) or verdict.kind)
        self._inc("guard_firings_total", plugin=verdict.plugin, reason=reason, kind=verdict.kind)
        if verdict.plugin in self._loop or reason in self._loop:
            self._inc("agent.loop_detected", plugin=verdict.plugin, reason=reason)
        evidence = verdict.evidence
        if (
            verdict.kind == "stop"
            and isinstance(evidence.get("scope"), str)
            and verdict.plugin != "circuit_breaker"  # a paused tool, not a budget refusing
        ):
            self._inc(
                "scope_refusals_total",
                scope=evidence["scope"],
                window=str(evidence.get("window")),
                reason=reason,
            )

    def _breaker_gauge(self, run: Run) -> None:
        """Set ``circuit_breakers_open`` from the circuit_breaker plugin's view: the breakers
        this process last saw open, per target and name (0 for those seen before)."""
        plugins = getattr(getattr(run, "deployment", None), "plugins", None)
        seen = getattr(plugins.get("circuit_breaker"), "seen_open", None) if plugins else None
        if not isinstance(seen, dict):
            return
        counts: dict[tuple[str, str], int] = {}
        for view in list(seen.values()):
            pair = (str(view.target), str(view.name))
            counts[pair] = counts.get(pair, 0) + 1
        with self._breakers_lock:
            pairs = self._breaker_pairs | set(counts)
            self._breaker_pairs = pairs
        for target, name in sorted(pairs):
            value = float(counts.get((target, name), 0))
            self.registry.set("circuit_breakers_open", value, target=target, breaker=name)
            if self.prometheus is not None:
                self.prometheus.set(
                    "circuit_breakers_open", value, {"target": target, "breaker": name}
                )

    def on_breaker_changed(self, run: Run, **_: Any) -> None:
        self._breaker_gauge(run)

    def on_record_failed(self, run: Run, **_: Any) -> None:
        self._inc("record_write_failures_total")

    def on_run_stopped(
        self, run: Run, *, outcome: RunOutcome, record: Mapping[str, Any], **_: Any
    ) -> None:
        self._inc("runs_total", termination=outcome.termination)
        steps = float(record.get("steps") or 0)
        tokens = float((record.get("tokens") or {}).get("total") or 0)
        seconds = float(record.get("elapsed_s") or 0.0)
        self._observe("steps_per_run", steps)
        self._observe("tokens_per_run", tokens)
        self._observe("run_seconds", seconds)
        used = {"steps": steps, "tokens": tokens, "seconds": seconds}
        self._breaker_gauge(run)
        for budget, limit in _budget_limits(run).items():
            self._observe("budget_use_ratio", used[budget] / limit, budget=budget)
        plugins = getattr(getattr(run, "deployment", None), "plugins", None)
        charged = getattr(plugins.get("spend_limits"), "charged", None) if plugins else None
        if callable(charged):
            for entry in charged(run):
                for kind, amount in entry.items():
                    if kind not in ("scope", "window") and amount:
                        self._inc(
                            "scope_spend_total",
                            float(amount),
                            scope=entry["scope"],
                            window=entry["window"],
                            kind=kind,
                        )
