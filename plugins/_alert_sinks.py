"""The alerting plugin's sinks and their delivery (log, stderr, webhook, callable).

Split from :mod:`loopwarden.plugins.alerting` (which re-exports the public names): the plugin
decides *what* to alert and *when* (severity, de-duplication, rate limit, loop rate); this
module *delivers* -- each queued sink from one background thread, through a bounded queue, a
failing sink logged once, never raised into a run.
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
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, field_validator

from loopwarden import PluginSettings
from loopwarden.plugin import PositiveSeconds
from loopwarden.redaction import MASK, Redactor
from loopwarden.sanitize import escape_controls

__all__ = [
    "SEVERITIES",
    "CallableSink",
    "CallableSinkConfig",
    "LogSink",
    "LogSinkConfig",
    "Severity",
    "Sink",
    "SinkConfig",
    "StderrSink",
    "StderrSinkConfig",
    "WebhookSink",
    "WebhookSinkConfig",
    "build_sink",
    "http_module",
]

log = logging.getLogger("loopwarden.plugins.alerting")
_SINK_REDACTOR = Redactor()  # masks credentials in sink failure lines

Severity = Literal["warn", "soft_stop", "hard_stop"]
SEVERITIES: tuple[str, ...] = ("warn", "soft_stop", "hard_stop")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


# ---------------------------------------------------------------------------------------------
# Sink settings (the tables of [plugins.alerting] sinks)
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
    timeout_s: PositiveSeconds = Field(default=5.0, description="HTTP timeout per alert, seconds")
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
            log.warning(
                "alert sink %s failed: %s (further failures are not logged until it recovers)",
                self.label,
                self.describe(exc),
            )

    def describe(self, exc: BaseException) -> str:
        """``exc`` as text for a log line, secrets masked (a sink may know credentials)."""
        return _SINK_REDACTOR.text(f"{type(exc).__name__}: {exc}")

    def _succeeded(self) -> None:
        with self._lock:
            self.delivered += 1
            was_failing = self._failing
            self._failing = False
        if was_failing:
            log.info(
                "alert sink %s delivers again (%d failure(s) so far)", self.label, self.failures
            )

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
                log.warning(
                    "alert sink %s is falling behind: its queue is full, alerts are "
                    "dropped (reported once)",
                    self.label,
                )

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
            log.warning(
                "alert sink %s: %d alert(s) not delivered within %.1fs of closing",
                self.label,
                max(0, self._queue.unfinished_tasks - 1),
                timeout,
            )
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
        secrets = [
            parts.username,
            parts.password,
            parts.fragment,
            *(v for _k, v in parse_qsl(parts.query)),
        ]
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


def build_sink(
    config: LogSinkConfig | StderrSinkConfig | WebhookSinkConfig | CallableSinkConfig,
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
    text = (
        f"[{alert.get('severity')}] {alert.get('reason')} by {alert.get('plugin')} "
        f"run={alert.get('run_id')}"
    )
    if alert.get("scenario"):
        text += f" scenario={alert.get('scenario')}"
    if alert.get("step") is not None:
        text += f" step={alert.get('step')}"
    text += f": {alert.get('message')}"
    if alert.get("suppressed"):
        text += f" (+{alert['suppressed']} suppressed)"
    return escape_controls(text)  # one line, whatever the model or a tool wrote
