"""logging: one structured log record per run event, with secrets redacted.

Subscribes to the run signals (it implements no hook, so it can never change a run) and writes
one record per event through the standard :mod:`logging` module -- run start, each model call
with its tokens, each tool call with its duration, each verdict, run stop -- as ``key=value``
pairs or as one JSON object per line (``format``).  Records go to loggers under
``loopwarden.events`` (``.run``, ``.model``, ``.tool``, ``.guard``, ``.step``); configure
handlers the usual way.  Each record also carries its fields as ``record.loopwarden`` (a dict)
for handlers that want structure without parsing.

Every record is one line whatever the model or a tool wrote: control characters, C1 codes,
U+2028 / U+2029 and bidi marks in any field are escaped in both formats (``\\u2028``), so
``str.splitlines()`` or a terminal can never find a forged line or run an escape sequence.

Conversations stay out of the logs unless asked for: the user's message, the model's text and
tool results are logged (as previews of ``preview_chars`` characters) only with
``capture_content = true`` -- off by default, as in the ``otel`` plugin's telemetry; without it
their fields are null, and records carry what operators act on: tools and their arguments
(redacted), tokens, durations, verdicts with their messages and evidence (masked), the stop.

Secrets never appear: values under keys named in ``redact_keys`` are masked at any depth of
tool arguments and evidence, ``key=value`` pairs and ``"key": "value"`` pairs (also inside
JSON-quoted text, such as a verdict message quoting a call) and API-key patterns are masked in
free text, and so is the value of the model's API-key environment variable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from loopwarden import Plugin, PluginSettings, signals
from loopwarden.redaction import (
    DEFAULT_REDACT_KEYS,
    DEFAULT_SECRET_PATTERNS,
    MASK,
    Redactor,
    model_api_key,
)
from loopwarden.sanitize import json_line

if TYPE_CHECKING:
    from blinker import NamedSignal

    from loopwarden.events import ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.run import DeploymentView, Run, RunOutcome
    from loopwarden.verdicts import Verdict

__all__ = ["LoggingPlugin", "LoggingSettings", "format_kv"]

EventName = Literal[
    "run_started",
    "model_responded",
    "tool_finished",
    "guard_triggered",
    "step_finished",
    "run_stopped",
]
LevelName = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

DEFAULT_EVENTS: tuple[EventName, ...] = (
    "run_started",
    "model_responded",
    "tool_finished",
    "guard_triggered",
    "run_stopped",
)

_TOPIC: dict[str, str] = {
    "run_started": "run",
    "model_responded": "model",
    "tool_finished": "tool",
    "guard_triggered": "guard",
    "step_finished": "step",
    "run_stopped": "run",
}


class LoggingSettings(PluginSettings):
    format: Literal["kv", "json"] = Field(
        default="kv", description='"kv": key=value pairs; "json": one JSON object per record'
    )
    level: LevelName = Field(default="INFO", description="level of routine event records")
    guard_level: LevelName = Field(
        default="WARNING",
        description="level of verdict records, and of the stop record of a run a guard stopped",
    )
    logger: str = Field(
        default="loopwarden.events",
        description="parent logger name; records go to <logger>.run, .model, .tool, .guard, .step",
    )
    events: list[EventName] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        description="which events to log (step_finished is off by default: it adds little)",
    )
    capture_content: bool = Field(
        default=False,
        description="log the user's message, the model's text and tool results (previews of "
        "preview_chars characters, redacted); off: those fields are null",
    )
    preview_chars: int = Field(
        default=200,
        ge=0,
        description="with capture_content: characters of the user's message, model text and "
        "tool results to include (0: none)",
    )
    redact_keys: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REDACT_KEYS),
        description="field names whose values are masked at any depth (case-insensitive; "
        "a key ending in _<name> matches too)",
    )
    redact_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SECRET_PATTERNS),
        description="regular expressions for secrets masked inside any text",
    )
    mask: str = Field(default=MASK, description="what a redacted value is replaced with")

    @field_validator("logger")
    @classmethod
    def _under_loopwarden(cls, v: str) -> str:
        if v != "loopwarden" and not v.startswith("loopwarden."):
            raise ValueError('must be "loopwarden" or a logger name under "loopwarden."')
        return v


def _kv_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if value and not any(c in value for c in ' "=\\') and value.isprintable():
            return value  # isprintable: no control, line break or separator of any kind
        return json_line(value)
    return json_line(value, separators=(",", ":"), default=str)


def format_kv(fields: Mapping[str, Any]) -> str:
    """``key=value`` pairs; strings with spaces, quotes or ``=`` and nested values as JSON.

    One record is one line for every reader: model and tool text can carry characters that
    ``str.splitlines`` (and log viewers, terminals) take for line breaks or escape sequences
    -- ``\\x85``, U+2028, CSI ``\\x9b`` -- and json leaves them raw; they are escaped
    (:func:`loopwarden.sanitize.json_line`), so no field can forge a line of its own."""
    return " ".join(f"{_kv_value(k)}={_kv_value(v)}" for k, v in fields.items())


class LoggingPlugin(Plugin[LoggingSettings]):
    """Writes one structured, redacted log record per run event."""

    name = "logging"
    Settings = LoggingSettings

    def __init__(self, settings: LoggingSettings | None = None) -> None:
        super().__init__(settings)
        s = self.settings
        self.redactor = Redactor(s.redact_keys, s.redact_patterns, mask=s.mask)
        #: whether conversation text is logged (capture_content, and room for a preview)
        self._content = s.capture_content and s.preview_chars > 0
        self._level = logging.getLevelName(s.level)
        self._guard_level = logging.getLevelName(s.guard_level)
        self._loggers = {
            topic: logging.getLogger(f"{s.logger}.{topic}") for topic in set(_TOPIC.values())
        }

    # -- wiring ---------------------------------------------------------------------------

    def connect(self, deployment: DeploymentView) -> None:
        """Subscribe to the enabled events; mask the model's API key if it is set."""
        self.redactor.add_literal(model_api_key(deployment))
        table: dict[str, tuple[NamedSignal, Callable[..., Any]]] = {
            "run_started": (signals.run_started, self.on_run_started),
            "model_responded": (signals.model_responded, self.on_model_responded),
            "tool_finished": (signals.tool_finished, self.on_tool_finished),
            "guard_triggered": (signals.guard_triggered, self.on_guard_triggered),
            "step_finished": (signals.step_finished, self.on_step_finished),
            "run_stopped": (signals.run_stopped, self.on_run_stopped),
        }
        for event in dict.fromkeys(self.settings.events):
            signal, receiver = table[event]
            deployment.connect(signal, receiver)

    # -- output ---------------------------------------------------------------------------

    def _preview(self, text: str | None) -> str | None:
        if text is None or not self._content:
            return None
        clean = self.redactor.text(text)  # redact first: a cut must not hide a secret
        n = self.settings.preview_chars
        return clean if len(clean) <= n else clean[:n] + "…"

    def render(self, fields: Mapping[str, Any]) -> str:
        """The log line for ``fields`` in the configured format."""
        if self.settings.format == "json":
            return json_line(fields, default=str)
        return format_kv(fields)

    def emit(self, event: str, run: Run, level: int, **fields: Any) -> None:
        """Write one record: ``event``, the run's id and scenario, then ``fields`` (redacted)."""
        data: dict[str, Any] = {
            "event": event,
            "run_id": run.run_id,
            "scenario": run.scenario,
        }
        data.update(self.redactor(fields))
        data["elapsed_s"] = round(run.elapsed, 6)
        self._loggers[_TOPIC[event]].log(level, self.render(data), extra={"loopwarden": data})

    def wants(self, event: str, level: int) -> bool:
        """Whether a record would be written (checked first: no work for a silent logger)."""
        return self._loggers[_TOPIC[event]].isEnabledFor(level)

    # -- receivers ------------------------------------------------------------------------

    def on_run_started(self, run: Run, **_: Any) -> None:
        if not self.wants("run_started", self._level):
            return
        limits = run.limits
        self.emit(
            "run_started",
            run,
            self._level,
            profile=limits.name,
            model=run.model_name,
            max_steps=limits.max_steps,
            max_tokens=limits.max_tokens,
            max_seconds=limits.max_seconds,
            tools=len(run.tools) if run.tools is not None else 0,
            user=self._preview(run.user),
        )

    def on_model_responded(
        self,
        run: Run,
        *,
        request: ModelRequest,
        response: ModelResponse,
        duration_s: float,
        **_: Any,
    ) -> None:
        # self.wants(...), inline: the receivers run every step, mostly to find it silent
        if not self._loggers[_TOPIC["model_responded"]].isEnabledFor(self._level):
            return
        usage = response.usage
        self.emit(
            "model_responded",
            run,
            self._level,
            step=run.step,
            prompt_tokens=usage.prompt if usage is not None else None,
            completion_tokens=usage.completion if usage is not None else None,
            tokens=usage.total if usage is not None else None,
            run_tokens=run.usage.total,
            duration_s=round(duration_s, 6),
            tool_calls=[c.name for c in response.tool_calls],
            finish_reason=response.finish_reason,
            final=request.final,
            notes=len(request.notes),
            content=self._preview(response.content),
        )

    def on_tool_finished(self, run: Run, *, call: ToolCall, result: ToolResult, **_: Any) -> None:
        if not self._loggers[_TOPIC["tool_finished"]].isEnabledFor(self._level):
            return
        arguments: Any = call.arguments
        if arguments is None:  # unparseable: mask what can be found in the raw text
            arguments = self.redactor.json_text(call.raw_arguments)
        self.emit(
            "tool_finished",
            run,
            self._level,
            step=call.step,
            index=call.index,
            tool=call.name,
            arguments=arguments,
            ok=result.ok,
            error=result.error,
            retryable=result.retryable,
            skipped=result.skipped,
            skipped_by=result.skipped_by,
            duration_s=round(result.duration_s, 6),
            fingerprint=call.fingerprint,
            digest=result.digest,
            result=self._preview(result.content),
        )

    def on_guard_triggered(
        self, run: Run, *, verdict: Verdict, hook: str, step: int, **_: Any
    ) -> None:
        if not self.wants("guard_triggered", self._guard_level):
            return
        message = verdict.message
        self.emit(
            "guard_triggered",
            run,
            self._guard_level,
            step=step,
            hook=hook,
            plugin=verdict.plugin,
            kind=verdict.kind,
            severity=verdict.severity,
            reason=getattr(verdict, "reason", None),
            soft=getattr(verdict, "soft", None),
            message=message,
            evidence=dict(verdict.evidence),
        )

    def on_step_finished(self, run: Run, *, step: int, **_: Any) -> None:
        if not self.wants("step_finished", self._level):
            return
        self.emit(
            "step_finished",
            run,
            self._level,
            step=step,
            run_tokens=run.usage.total,
            tool_calls=run.tool_calls,
            context_tokens=run.context_tokens,
        )

    def on_run_stopped(
        self, run: Run, *, outcome: RunOutcome, record: Mapping[str, Any], **_: Any
    ) -> None:
        level = self._level if outcome.stopped_by is None else self._guard_level
        if not self.wants("run_stopped", level):
            return
        tokens = record.get("tokens") or {}
        self.emit(
            "run_stopped",
            run,
            level,
            termination=outcome.termination,
            soft=outcome.soft,
            stopped_by=outcome.stopped_by,
            steps=record.get("steps"),
            tool_calls=record.get("tool_calls"),
            prompt_tokens=tokens.get("prompt"),
            completion_tokens=tokens.get("completion"),
            tokens=tokens.get("total"),
            cost=record.get("cost"),
            duplicate_calls=record.get("duplicate_calls"),
            warnings=len(record.get("warnings") or ()),
            final_answer_present=outcome.final_answer_present,
            evidence=record.get("evidence"),
            errors=len(record.get("errors") or ()),
        )
