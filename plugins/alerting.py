"""alerting: tell operators when guards fire, and when loops become frequent.

Every verdict becomes an alert with a severity (``warn`` for warnings and skips, ``soft_stop``,
``hard_stop``), routed to each sink whose ``min_severity`` it reaches.  Sinks:

``log``        a record on the ``loopwarden.alerts`` logger (WARNING, ERROR for hard stops)
``stderr``     one human-readable line on standard error
``webhook``    the alert as JSON, POSTed with a timeout (httpx, or httpx2 where only that is
               installed -- the ``openai`` package brings one of them)
``callable``   a Python function named ``module:attr``, called with the alert dict

Rules, all measured on the run's clock:

* **de-duplication** -- one alert per (reason, plugin) per ``dedup_window_s``; the next alert
  for that key says how many were suppressed;
* **rate limit** -- at most ``rate_limit`` alerts per ``rate_window_s`` in all;
* **circuit breakers** -- a fleet-wide breaker of the ``circuit_breaker`` plugin that opens
  or closes raises an alert of its own (``kind = "breaker"``, reason ``breaker_opened`` /
  ``breaker_closed``, severity ``warn``), from the run whose call changed it;
* **threshold** -- "more than ``threshold_runs`` of the last ``threshold_window`` runs stopped
  on a loop guard" raises one alert of its own (reason ``loop_rate``).

Sinks never slow a run: webhook and callable sinks deliver from one background thread each,
through a bounded queue (a full queue drops the alert and says so once); the run only enqueues.
A failing sink is logged once (and once more when it recovers), never raised into the run.
``close()`` -- called when the deployment closes -- delivers what is queued, waiting at most
``close_timeout_s``.

The alert JSON::

    {"source": "loopwarden", "kind": "verdict", "reason": "repeat_call",
     "plugin": "repeat_call", "severity": "hard_stop", "verdict": "stop", "soft": false,
     "run_id": "...", "scenario": "always-not-found", "step": 3, "hook": "before_tool",
     "message": "...", "evidence": {...}, "suppressed": 0, "timestamp": "2026-...Z"}
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pydantic import Field, PositiveInt, model_validator

from loopwarden import Plugin, PluginSettings, signals
from loopwarden.plugin import PositiveSeconds, Seconds, check_templates
from loopwarden.plugins._alert_sinks import (
    SEVERITIES,
    CallableSink,
    CallableSinkConfig,
    LogSink,
    LogSinkConfig,
    Severity,
    Sink,
    SinkConfig,
    StderrSink,
    StderrSinkConfig,
    WebhookSink,
    WebhookSinkConfig,
    build_sink,
    http_module,
)
from loopwarden.reasons import LOOP_REASONS, NORMAL_ENDINGS
from loopwarden.redaction import DEFAULT_REDACT_KEYS, Redactor, model_api_key
from loopwarden.sanitize import jsonable as _jsonable
from loopwarden.verdicts import Stop

if TYPE_CHECKING:
    from loopwarden.run import DeploymentView, Run, RunOutcome
    from loopwarden.store import BreakerView
    from loopwarden.verdicts import Verdict

__all__ = [
    "SEVERITIES",
    "Alerting",
    "AlertingSettings",
    "CallableSink",
    "CallableSinkConfig",
    "LogSink",
    "LogSinkConfig",
    "Sink",
    "StderrSink",
    "StderrSinkConfig",
    "WebhookSink",
    "WebhookSinkConfig",
    "build_sink",
    "http_module",
]

log = logging.getLogger("loopwarden.plugins.alerting")


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def _default_sinks() -> list[SinkConfig]:
    return [LogSinkConfig()]


class AlertingSettings(PluginSettings):
    sinks: list[SinkConfig] = Field(
        default_factory=_default_sinks,
        description="where alerts go: tables with type = log | stderr | webhook | callable",
    )
    dedup_window_s: Seconds = Field(
        default=300.0,
        description="one alert per (reason, plugin) per window, on the run's clock (0: off)",
    )
    rate_limit: PositiveInt = Field(default=20, description="at most this many alerts ...")
    rate_window_s: PositiveSeconds = Field(default=60.0, description="... per this many seconds")
    threshold_runs: PositiveInt = Field(
        default=3, description="threshold rule: alert when MORE than this many runs ..."
    )
    threshold_window: PositiveInt = Field(
        default=10, description="... of the last this many runs stopped on a loop guard"
    )
    threshold_reasons: list[str] = Field(
        default_factory=lambda: list(LOOP_REASONS),
        description="stop reasons that count as 'stopped on a loop guard'",
    )
    threshold_severity: Severity = Field(
        default="hard_stop", description="severity of the threshold alert"
    )
    threshold_message: str = Field(
        default="{count} of the last {window} runs stopped on a loop guard ({reasons}); the "
        "prompt or the tool descriptions probably need fixing",
        description="text of the threshold alert ({count}, {window}, {threshold}, {reasons})",
    )
    quiet_reasons: list[str] = Field(
        default_factory=lambda: [r for r in NORMAL_ENDINGS if r != "final_answer"],
        description="stop reasons that are normal endings, never alerted (a terminal tool's "
        "successful hand-off)",
    )
    core_stop_reasons: list[str] = Field(
        default_factory=lambda: ["model_error", "error"],
        description="terminations without a verdict (the model or the loop failed) that alert "
        "as hard stops",
    )
    message: str = Field(
        default="{plugin}: {severity} ({reason}) in run {run_id} at step {step}",
        description="alert text when the verdict has no message ({plugin}, {severity}, "
        "{reason}, {run_id}, {scenario}, {step})",
    )
    redact_keys: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REDACT_KEYS),
        description="evidence keys whose values are masked at any depth",
    )
    max_keys: PositiveInt = Field(
        default=1000, description="de-duplication keys remembered (oldest forgotten first)"
    )
    close_timeout_s: Seconds = Field(
        default=5.0, description="when the deployment closes, wait this long for delivery"
    )

    @model_validator(mode="after")
    def _check_templates(self) -> AlertingSettings:
        check_templates(
            self,
            ("message",),
            dict(plugin="p", severity="s", reason="r", run_id="i", scenario="c", step=1),
        )
        check_templates(
            self, ("threshold_message",), dict(count=1, window=2, threshold=1, reasons="r")
        )
        return self


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------


class AlertLimiter:
    """De-duplication per key and a global rate limit, on whatever clock the caller reads.

    Deployment-wide by nature (it spans runs), so it lives on the plugin, behind a lock, with
    at most ``max_keys`` keys (least recently alerted forgotten first).
    """

    def __init__(
        self, dedup_window: float, rate_limit: int, rate_window: float, max_keys: int = 1000
    ) -> None:
        self.dedup_window = dedup_window
        self.rate_limit = rate_limit
        self.rate_window = rate_window
        self.max_keys = max_keys
        #: key -> [time of the last alert sent (or None), alerts suppressed since]
        self._keys: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()
        self._sent: deque[float] = deque(maxlen=rate_limit)
        self._lock = threading.Lock()
        self.suppressed = 0

    def admit(self, key: tuple[str, str], now: float) -> int | None:
        """None to suppress; else the number of alerts for ``key`` suppressed before this."""
        with self._lock:
            entry = self._keys.get(key)
            if entry is None:
                entry = self._keys[key] = [None, 0]
                while len(self._keys) > self.max_keys:
                    self._keys.popitem(last=False)
            last = entry[0]
            if last is not None and self.dedup_window > 0 and now - last < self.dedup_window:
                entry[1] += 1
                self.suppressed += 1
                return None
            while self._sent and now - self._sent[0] >= self.rate_window:
                self._sent.popleft()
            if len(self._sent) >= self.rate_limit:
                entry[1] += 1
                self.suppressed += 1
                return None
            earlier = int(entry[1])
            entry[0], entry[1] = now, 0
            self._keys.move_to_end(key)
            self._sent.append(now)
            return earlier


class LoopRate:
    """The threshold rule: how many of the last ``window`` runs stopped on a loop guard."""

    def __init__(self, window: int, reasons: list[str]) -> None:
        self.reasons = frozenset(reasons)
        self._recent: deque[str | None] = deque(maxlen=window)
        self.count = 0
        self._lock = threading.Lock()

    def add(self, termination: str) -> tuple[int, int, dict[str, int]]:
        """Record one finished run; return (loop runs, runs seen, loop reasons) in the window."""
        hit = termination if termination in self.reasons else None
        with self._lock:
            recent = self._recent
            if recent.maxlen is not None and len(recent) == recent.maxlen and recent[0]:
                self.count -= 1
            recent.append(hit)
            if hit:
                self.count += 1
            count, seen = self.count, len(recent)
            reasons = dict(Counter(r for r in recent if r)) if hit else {}
        return count, seen, reasons


# ---------------------------------------------------------------------------------------------
# The plugin
# ---------------------------------------------------------------------------------------------


class Alerting(Plugin[AlertingSettings]):
    """Routes verdict alerts to sinks by severity, with de-duplication, a rate limit and a
    loop-rate threshold."""

    name = "alerting"
    Settings = AlertingSettings

    def __init__(self, settings: AlertingSettings | None = None) -> None:
        super().__init__(settings)
        s = self.settings
        self.sinks: list[Sink] = [build_sink(c) for c in s.sinks]
        self.limiter = AlertLimiter(s.dedup_window_s, s.rate_limit, s.rate_window_s, s.max_keys)
        self.loop_rate = LoopRate(s.threshold_window, s.threshold_reasons)
        self.redactor = Redactor(s.redact_keys)
        #: every alert handed to at least one sink (bounded; for tests and introspection)
        self.sent: deque[dict[str, Any]] = deque(maxlen=100)

    def connect(self, deployment: DeploymentView) -> None:
        self.redactor.add_literal(model_api_key(deployment))
        deployment.connect(signals.guard_triggered, self.on_guard_triggered)
        deployment.connect(signals.run_stopped, self.on_run_stopped)
        deployment.connect(signals.breaker_changed, self.on_breaker_changed)

    def close(self) -> None:
        """Deliver queued alerts (at most ``close_timeout_s`` in all) and stop the workers."""
        deadline = time.monotonic() + self.settings.close_timeout_s
        for sink in self.sinks:
            sink.close(max(0.0, deadline - time.monotonic()))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued alert was handled (delivered or failed)."""
        deadline = time.monotonic() + timeout
        return all(s.flush(max(0.0, deadline - time.monotonic())) for s in self.sinks)

    # -- receivers ------------------------------------------------------------------------

    def on_guard_triggered(
        self, run: Run, *, verdict: Verdict, hook: str, step: int, **_: Any
    ) -> None:
        reason = verdict.reason if isinstance(verdict, Stop) else verdict.kind
        if reason in self.settings.quiet_reasons:
            return
        alert = self._alert(
            run,
            kind="verdict",
            reason=reason,
            plugin=verdict.plugin,
            severity=verdict.severity,
            step=step,
            hook=hook,
            message=verdict.message,
            evidence=verdict.evidence,
        )
        alert["verdict"] = verdict.kind
        alert["soft"] = bool(getattr(verdict, "soft", False))
        self.dispatch(run, alert)

    def on_breaker_changed(self, run: Run, *, breaker: BreakerView, message: str, **_: Any) -> None:
        """A fleet-wide circuit breaker opened or closed: an alert of severity ``warn``
        (reason ``breaker_opened`` / ``breaker_closed``); going half-open is not alerted."""
        if breaker.changed not in ("opened", "reopened", "closed"):
            return
        reason = "breaker_closed" if breaker.changed == "closed" else "breaker_opened"
        if reason in self.settings.quiet_reasons:
            return
        alert = self._alert(
            run,
            kind="breaker",
            reason=reason,
            plugin="circuit_breaker",
            severity="warn",
            step=run.step,
            hook=None,
            message=message,
            evidence={
                "breaker": breaker.target,
                "breaker_name": breaker.name,
                "scope": breaker.scope,
                "key": breaker.scope_key,
                "state": breaker.state,
                "change": breaker.changed,
                "tripped": breaker.tripped,
            },
        )
        self.dispatch(run, alert)

    def on_run_stopped(self, run: Run, *, outcome: RunOutcome, **_: Any) -> None:
        s = self.settings
        if outcome.stopped_by is None and outcome.termination in s.core_stop_reasons:
            alert = self._alert(
                run,
                kind="run",
                reason=outcome.termination,
                plugin="loopwarden",
                severity="hard_stop",
                step=run.step,
                hook=None,
                message=outcome.error or outcome.message,
                evidence=outcome.evidence,
            )
            self.dispatch(run, alert)
        count, seen, reasons = self.loop_rate.add(outcome.termination)
        if reasons and count > s.threshold_runs:
            text = s.threshold_message.format(
                count=count,
                window=seen,
                threshold=s.threshold_runs,
                reasons=", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
            )
            alert = self._alert(
                run,
                kind="threshold",
                reason="loop_rate",
                plugin=self.name,
                severity=s.threshold_severity,
                step=run.step,
                hook=None,
                message=text,
                evidence={
                    "loop_runs": count,
                    "runs": seen,
                    "window": s.threshold_window,
                    "threshold": s.threshold_runs,
                    "reasons": reasons,
                },
            )
            self.dispatch(run, alert)

    # -- building and routing -------------------------------------------------------------

    def _alert(
        self,
        run: Run,
        *,
        kind: str,
        reason: str,
        plugin: str,
        severity: str,
        step: int | None,
        hook: str | None,
        message: str | None,
        evidence: Mapping[str, Any],
    ) -> dict[str, Any]:
        if not message:
            message = self.settings.message.format(
                plugin=plugin,
                severity=severity,
                reason=reason,
                run_id=run.run_id,
                scenario=run.scenario,
                step=step,
            )
        return {
            "source": "loopwarden",
            "kind": kind,
            "reason": reason,
            "plugin": plugin,
            "severity": severity,
            "run_id": run.run_id,
            "scenario": run.scenario,
            "step": step,
            "hook": hook,
            "message": self.redactor.text(message),
            "evidence": _jsonable(self.redactor(dict(evidence))),
            "suppressed": 0,
            # wall-clock metadata for the receiver; windows use the run's clock
            "timestamp": datetime.now(timezone.utc)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z"),
        }

    def dispatch(self, run: Run, alert: dict[str, Any]) -> bool:
        """Apply the rules and hand ``alert`` to the sinks that take its severity."""
        targets = [s for s in self.sinks if s.accepts(alert["severity"])]
        if not targets:
            return False
        earlier = self.limiter.admit((alert["reason"], alert["plugin"]), run.clock.now())
        if earlier is None:
            return False
        alert["suppressed"] = earlier
        self.sent.append(alert)
        for sink in targets:
            try:
                sink.submit(alert)
            except Exception as exc:  # a sink's own bug: count it like a delivery failure
                sink._failed(exc)
        return True
