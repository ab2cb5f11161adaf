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

import contextlib
import importlib
import importlib.util
import json
import logging
import queue
import sys
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from loopwarden import Plugin, PluginSettings, signals
from loopwarden._util import jsonable as _jsonable
from loopwarden.plugin import check_templates
from loopwarden.reasons import LOOP_REASONS, NORMAL_ENDINGS
from loopwarden.redaction import DEFAULT_REDACT_KEYS, MASK, Redactor, model_api_key
from loopwarden.verdicts import Stop

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment
    from loopwarden.run import Run, RunOutcome
    from loopwarden.verdicts import Verdict

__all__ = [
    "SEVERITIES",
    "Alerting",
    "AlertingSettings",
    "CallableSink",
    "LogSink",
    "Sink",
    "StderrSink",
    "WebhookSink",
    "http_module",
]

log = logging.getLogger("loopwarden.plugins.alerting")
_SINK_REDACTOR = Redactor()  # masks credentials in sink failure lines

Severity = Literal["warn", "soft_stop", "hard_stop"]
SEVERITIES: tuple[str, ...] = ("warn", "soft_stop", "hard_stop")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}



# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


class _SinkBase(PluginSettings):
    min_severity: Severity = Field(
        default="soft_stop", description="the lowest severity this sink receives"
    )


class LogSinkConfig(_SinkBase):
    type: Literal["log"] = "log"
    logger: str = Field(default="loopwarden.alerts", description="logger name for alert records")


class StderrSinkConfig(_SinkBase):
    type: Literal["stderr"] = "stderr"


class _QueuedSinkConfig(_SinkBase):
    queue_size: PositiveInt = Field(
        default=100, description="alerts waiting for delivery; more are dropped (and logged once)"
    )


class WebhookSinkConfig(_QueuedSinkConfig):
    type: Literal["webhook"] = "webhook"
    url: str = Field(description="where the alert JSON is POSTed (http:// or https://)")
    timeout_s: PositiveFloat = Field(default=5.0, description="HTTP timeout per alert, seconds")
    headers: dict[str, str] = Field(
        default_factory=dict, description="extra HTTP headers (e.g. an Authorization token)"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v


class CallableSinkConfig(_QueuedSinkConfig):
    type: Literal["callable"] = "callable"
    target: str = Field(description='"module:attr" of a function called with the alert dict')

    @field_validator("target")
    @classmethod
    def _module_attr(cls, v: str) -> str:
        mod, _, attr = v.partition(":")
        if not mod or not attr:
            raise ValueError('must be "module:attr"')
        return v


SinkConfig = Annotated[
    LogSinkConfig | StderrSinkConfig | WebhookSinkConfig | CallableSinkConfig,
    Field(discriminator="type"),
]


def _default_sinks() -> list[SinkConfig]:
    return [LogSinkConfig()]


class AlertingSettings(PluginSettings):
    sinks: list[SinkConfig] = Field(
        default_factory=_default_sinks,
        description="where alerts go: tables with type = log | stderr | webhook | callable",
    )
    dedup_window_s: float = Field(
        default=300.0, ge=0,
        description="one alert per (reason, plugin) per window, on the run's clock (0: off)",
    )
    rate_limit: PositiveInt = Field(default=20, description="at most this many alerts ...")
    rate_window_s: PositiveFloat = Field(default=60.0, description="... per this many seconds")
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
    close_timeout_s: float = Field(
        default=5.0, ge=0, description="when the deployment closes, wait this long for delivery"
    )

    @model_validator(mode="after")
    def _check_templates(self) -> AlertingSettings:
        check_templates(self, ("message",), dict(plugin="p", severity="s", reason="r",
                                                  run_id="i", scenario="c", step=1))
        check_templates(self, ("threshold_message",),
                        dict(count=1, window=2, threshold=1, reasons="r"))
        return self


# ---------------------------------------------------------------------------------------------
# Sinks
# ---------------------------------------------------------------------------------------------


def http_module() -> tuple[ModuleType, str]:
    """The HTTP client library: ``httpx`` when importable, else ``httpx2`` (same API)."""
    for name in ("httpx", "httpx2"):
        try:
            return importlib.import_module(name), name
        except ImportError:
            continue
    raise ImportError("neither httpx nor httpx2 is installed (pip install httpx)")


def _http_available() -> str | None:
    for name in ("httpx", "httpx2"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


class Sink:
    """A destination for alerts.  ``submit`` must never block for long nor raise."""

    kind = "sink"

    def __init__(self, min_severity: str) -> None:
        self.min_rank = _RANK[min_severity]
        self.delivered = 0
        self.failures = 0
        self._failing = False
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return self.kind

    def accepts(self, severity: str) -> bool:
        return _RANK.get(severity, len(SEVERITIES)) >= self.min_rank

    def deliver(self, alert: Mapping[str, Any]) -> None:
        """Send one alert (may raise: the caller counts and logs the failure)."""
        raise NotImplementedError

    def submit(self, alert: Mapping[str, Any]) -> None:
        """Deliver now (fast sinks); queued sinks override this."""
        self._attempt(alert)

    def _attempt(self, alert: Mapping[str, Any]) -> None:
        try:
            self.deliver(alert)
        except Exception as exc:
            self._failed(exc)
        else:
            self._succeeded()

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            first = not self._failing
            self._failing = True
        if first:
            log.warning("alert sink %s failed: %s (further failures are not logged until "
                        "it recovers)", self.label, self.describe(exc))

    def describe(self, exc: BaseException) -> str:
        """``exc`` as text for a log line, secrets masked (a sink may know credentials)."""
        return _SINK_REDACTOR.text(f"{type(exc).__name__}: {exc}")

    def _succeeded(self) -> None:
        with self._lock:
            self.delivered += 1
            was_failing = self._failing
            self._failing = False
        if was_failing:
            log.info("alert sink %s delivers again (%d failure(s) so far)", self.label,
                     self.failures)

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted was handled; True when it was."""
        return True

    def close(self, timeout: float) -> None:
        """Deliver what is pending (at most ``timeout`` seconds), then release resources."""


class LogSink(Sink):
    """Alerts as log records (hard stops at ERROR, the rest at WARNING)."""

    kind = "log"

    def __init__(self, config: LogSinkConfig) -> None:
        super().__init__(config.min_severity)
        self.logger = logging.getLogger(config.logger)

    def deliver(self, alert: Mapping[str, Any]) -> None:
        level = logging.ERROR if alert.get("severity") == "hard_stop" else logging.WARNING
        self.logger.log(level, "ALERT %s", _summary(alert), extra={"alert": dict(alert)})


class StderrSink(Sink):
    """Alerts as one line each on standard error."""

    kind = "stderr"

    def __init__(self, config: StderrSinkConfig) -> None:
        super().__init__(config.min_severity)

    def deliver(self, alert: Mapping[str, Any]) -> None:
        stream = sys.stderr
        stream.write(f"loopwarden alert: {_summary(alert)}\n")
        stream.flush()


class QueuedSink(Sink):
    """A sink delivered from its own background thread, through a bounded queue."""

    def __init__(self, min_severity: str, queue_size: int) -> None:
        super().__init__(min_severity)
        self._queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.dropped = 0
        self._drop_reported = False

    def submit(self, alert: Mapping[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name=f"loopwarden-alert-{self.kind}", daemon=True
                )
                self._thread.start()
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            with self._lock:
                self.dropped += 1
                first = not self._drop_reported
                self._drop_reported = True
            if first:
                log.warning("alert sink %s is falling behind: its queue is full, alerts are "
                            "dropped (reported once)", self.label)

    def _work(self) -> None:
        try:
            self.start()
        except Exception as exc:  # cannot deliver at all: count every alert as failed
            self._failed(exc)
            self._drain_failed()
            return
        while True:
            alert = self._queue.get()
            try:
                if alert is None:
                    return
                self._attempt(alert)
            finally:
                self._queue.task_done()

    def _drain_failed(self) -> None:
        while True:
            alert = self._queue.get()
            self._queue.task_done()
            if alert is None:
                return
            with self._lock:
                self.failures += 1

    def start(self) -> None:
        """Prepare the sink in its worker thread (open clients); may raise."""

    def stop(self) -> None:
        """Release what :meth:`start` acquired (called from :meth:`close`)."""

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        cond = self._queue.all_tasks_done
        with cond:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                cond.wait(left)
        return True

    def close(self, timeout: float) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        drained = self.flush(timeout)
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # the worker ends after what it is doing
        if not drained:
            # A hung delivery: leave the daemon thread behind rather than hang the caller.
            log.warning("alert sink %s: %d alert(s) not delivered within %.1fs of closing",
                        self.label, max(0, self._queue.unfinished_tasks - 1), timeout)
            return
        thread.join(1.0)
        try:
            self.stop()
        except Exception:  # closing a client must not break the deployment's close
            log.debug("alert sink %s: error while closing", self.label, exc_info=True)


class WebhookSink(QueuedSink):
    """POSTs each alert as JSON to ``url``, with a timeout, from a background thread."""

    kind = "webhook"

    def __init__(self, config: WebhookSinkConfig) -> None:
        super().__init__(config.min_severity, config.queue_size)
        library = _http_available()
        if library is None:
            raise ImportError("the webhook sink needs httpx (or httpx2): pip install httpx")
        #: the HTTP library used: "httpx", or "httpx2" where only that is installed
        self.http_library = library
        self.url = config.url
        self.timeout_s = config.timeout_s
        self.headers = {"Content-Type": "application/json", **config.headers}
        self._client: Any = None

    @property
    def label(self) -> str:
        host = self.url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
        return f"webhook({host})"

    def describe(self, exc: BaseException) -> str:
        """The error without the URL's credentials: user info, query and fragment are
        replaced by the bare URL, and their values masked wherever else they appear."""
        from urllib.parse import parse_qsl, urlsplit

        parts = urlsplit(self.url)
        bare = f"{parts.scheme}://{parts.hostname or ''}"
        if parts.port:
            bare += f":{parts.port}"
        bare += parts.path
        text = f"{type(exc).__name__}: {exc}"
        for form in {self.url, self._normalised_url()}:
            text = text.replace(form, bare)
        secrets = [parts.username, parts.password, parts.fragment,
                   *(v for _k, v in parse_qsl(parts.query))]
        for x in secrets:  # short values too: in this text they are known to be credentials
            if x and len(x) >= 3:
                text = text.replace(x, MASK)
        return _SINK_REDACTOR.text(text)

    def _normalised_url(self) -> str:
        try:
            mod, _ = http_module()
            return str(mod.URL(self.url))
        except Exception:
            return self.url

    def start(self) -> None:
        mod, self.http_library = http_module()
        self._client = mod.Client(timeout=self.timeout_s, follow_redirects=False)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()

    def deliver(self, alert: Mapping[str, Any]) -> None:
        body = json.dumps(alert, ensure_ascii=False, default=str).encode("utf-8")
        response = self._client.post(self.url, content=body, headers=self.headers)
        response.raise_for_status()


class CallableSink(QueuedSink):
    """Calls a Python function (``module:attr``) with each alert, from a background thread."""

    kind = "callable"

    def __init__(self, config: CallableSinkConfig) -> None:
        super().__init__(config.min_severity, config.queue_size)
        self.target = config.target
        self.func = _import_callable(config.target)

    @property
    def label(self) -> str:
        return f"callable({self.target})"

    def deliver(self, alert: Mapping[str, Any]) -> None:
        self.func(dict(alert))


def _import_callable(target: str) -> Callable[[dict[str, Any]], Any]:
    mod_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    func: Callable[[dict[str, Any]], Any] = obj
    return func


def build_sink(config: LogSinkConfig | StderrSinkConfig | WebhookSinkConfig | CallableSinkConfig,
               ) -> Sink:
    """The sink object for one ``sinks`` table."""
    if isinstance(config, LogSinkConfig):
        return LogSink(config)
    if isinstance(config, StderrSinkConfig):
        return StderrSink(config)
    if isinstance(config, WebhookSinkConfig):
        return WebhookSink(config)
    return CallableSink(config)


def _summary(alert: Mapping[str, Any]) -> str:
    text = (f"[{alert.get('severity')}] {alert.get('reason')} by {alert.get('plugin')} "
            f"run={alert.get('run_id')}")
    if alert.get("scenario"):
        text += f" scenario={alert.get('scenario')}"
    if alert.get("step") is not None:
        text += f" step={alert.get('step')}"
    text += f": {alert.get('message')}"
    if alert.get("suppressed"):
        text += f" (+{alert['suppressed']} suppressed)"
    return text


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------


class AlertLimiter:
    """De-duplication per key and a global rate limit, on whatever clock the caller reads.

    Deployment-wide by nature (it spans runs), so it lives on the plugin, behind a lock, with
    at most ``max_keys`` keys (least recently alerted forgotten first).
    """

    def __init__(self, dedup_window: float, rate_limit: int, rate_window: float,
                 max_keys: int = 1000) -> None:
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

    def connect(self, deployment: Deployment) -> None:
        self.redactor.add_literal(model_api_key(deployment))
        deployment.connect(signals.guard_triggered, self.on_guard_triggered)
        deployment.connect(signals.run_stopped, self.on_run_stopped)

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

    def on_guard_triggered(self, run: Run, *, verdict: Verdict, hook: str, step: int,
                           **_: Any) -> None:
        reason = verdict.reason if isinstance(verdict, Stop) else verdict.kind
        if reason in self.settings.quiet_reasons:
            return
        alert = self._alert(
            run, kind="verdict", reason=reason, plugin=verdict.plugin,
            severity=verdict.severity, step=step, hook=hook, message=verdict.message,
            evidence=verdict.evidence,
        )
        alert["verdict"] = verdict.kind
        alert["soft"] = bool(getattr(verdict, "soft", False))
        self.dispatch(run, alert)

    def on_run_stopped(self, run: Run, *, outcome: RunOutcome, **_: Any) -> None:
        s = self.settings
        if outcome.stopped_by is None and outcome.termination in s.core_stop_reasons:
            alert = self._alert(
                run, kind="run", reason=outcome.termination, plugin="loopwarden",
                severity="hard_stop", step=run.step, hook=None,
                message=outcome.error or outcome.message, evidence=outcome.evidence,
            )
            self.dispatch(run, alert)
        count, seen, reasons = self.loop_rate.add(outcome.termination)
        if reasons and count > s.threshold_runs:
            text = s.threshold_message.format(
                count=count, window=seen, threshold=s.threshold_runs,
                reasons=", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
            )
            alert = self._alert(
                run, kind="threshold", reason="loop_rate", plugin=self.name,
                severity=s.threshold_severity, step=run.step, hook=None, message=text,
                evidence={"loop_runs": count, "runs": seen, "window": s.threshold_window,
                          "threshold": s.threshold_runs, "reasons": reasons},
            )
            self.dispatch(run, alert)

    # -- building and routing -------------------------------------------------------------

    def _alert(self, run: Run, *, kind: str, reason: str, plugin: str, severity: str,
               step: int | None, hook: str | None, message: str | None,
               evidence: Mapping[str, Any]) -> dict[str, Any]:
        if not message:
            message = self.settings.message.format(
                plugin=plugin, severity=severity, reason=reason, run_id=run.run_id,
                scenario=run.scenario, step=step,
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
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds").replace(
                "+00:00", "Z"),
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
