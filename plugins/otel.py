"""otel: OpenTelemetry traces and metrics after the GenAI semantic conventions.

An observer (the optional extra ``loopwarden[otel]``): it never changes a run.  Per run:

* one ``invoke_agent`` span (kind INTERNAL), the child of the span current where the run
  started -- a web request's, a framework's own agent span -- with ``gen_ai.agent.name``
  (the framework agent's name under an adapter, :data:`AGENT_NAME`; else ``agent_name``),
  ``gen_ai.conversation.id``, ``gen_ai.request.model``, and at the end the stop reason
  (``loopwarden.termination``), ``loopwarden.stopped_by``, ``loopwarden.cost``, the tokens
  (``gen_ai.usage.input_tokens`` / ``output_tokens``), steps and tool calls; a run that did not
  end normally (anything but the model's own answer or a terminal hand-off) carries
  ``error.type`` = its stop reason and an ERROR status;
* a ``chat`` span (kind CLIENT) per model call, from ``before_model`` to the answer:
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.*``,
  ``gen_ai.response.finish_reasons``; a failed call carries ``error.type``;
* an ``execute_tool`` span per tool call that gets a result -- executed, skipped by a guard,
  invalid, or answered by the side-effect ledger: ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``gen_ai.tool.description``, ``error.type`` on a failure, ``loopwarden.tool.outcome`` (ok,
  error, skipped); a call answered
  by the ledger has ``loopwarden.ledger.answered = true`` and ``loopwarden.ledger.source``
  (a call a stop verdict holds back has no span: the verdict's event says why);
* under a framework that writes GenAI spans of its own for the run (an adapter sets
  :data:`FRAMEWORK_SPANS` in the run's meta: pydantic-ai's instrumentation), no ``chat`` /
  ``execute_tool`` spans nor ``gen_ai.client.*`` metrics -- the framework's are the only ones
  -- and the run span's token totals as ``loopwarden.usage.*``;
* every verdict a ``loopwarden.verdict`` event on the run span: ``loopwarden.verdict.plugin``,
  ``.action`` (warn, skip, stop), ``.reason``, ``.soft``, ``.shadow``, ``.hook``, ``.step``,
  ``.message``, and the standard evidence keys as ``loopwarden.evidence.<key>``.  Without
  ``capture_content`` the message and the content-holding evidence (``signature``: a call's
  arguments) leave only as a keyed hash and a length (``loopwarden.verdict.message.hash`` /
  ``.chars``, ``loopwarden.evidence.signature.hash`` / ``.chars``): names, counts and hashes;
* a fleet-wide circuit breaker that a run's call opened, made half-open or closed a
  ``loopwarden.circuit_breaker`` event on that run's span: ``loopwarden.breaker.change``,
  ``.state``, ``.target`` (tool, server), ``.name``, ``.scope``, ``.key_hash``, ``.failures``,
  ``.rule``.

Message content (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.tool.call.arguments`` / ``.result``) is recorded only when the operator opts in --
``capture_content = true``, or the conventions' own switch
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true``, ``SPAN_ONLY`` or
``SPAN_AND_EVENT``) when the setting is unset -- and is
redacted like the logs (secret keys at any depth, API-key patterns, the model's key).

Metrics: ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration`` (histograms,
the conventions' buckets; their counts and sums are the model calls and the tokens), and
loopwarden's counters under the names and labels of the ``metrics`` plugin's Prometheus series
-- ``loopwarden_runs`` (termination), ``loopwarden_guard_firings`` (plugin, reason, kind: stops,
skips and warnings), ``agent_loop_detected`` (plugin, reason), ``loopwarden_tool_calls`` (tool,
outcome), ``loopwarden_scope_refusals`` (scope, window, reason: budget refusals),
``loopwarden_record_write_failures`` (an OTel exporter to Prometheus adds ``_total``) -- plus
``loopwarden_ledger_answers`` (tool, source).

Where it writes: the tracer and meter providers the application set globally (``exporter =
"global"``, the default: loopwarden adds spans to the application's traces, and records
nothing until a provider is set); ``exporter = "otlp"`` makes SDK providers of its own that ship
to an OTLP/HTTP ``endpoint`` (default: the ``OTEL_EXPORTER_OTLP_*`` variables, else
``http://localhost:4318``), flushed when the deployment closes.  See docs/observability.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from loopwarden import Plugin, PluginSettings, hookimpl, signals
from loopwarden._version import __version__
from loopwarden.plugin import PositiveSeconds
from loopwarden.plugins.metrics import UNKNOWN_TOOL, MetricsSettings, _definitions
from loopwarden.reasons import LOOP_REASONS
from loopwarden.redaction import (
    DEFAULT_REDACT_KEYS,
    DEFAULT_SECRET_PATTERNS,
    MASK,
    Redactor,
    model_api_key,
)

if TYPE_CHECKING:
    from loopwarden.events import ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.plugins._otel import Instruments, Providers
    from loopwarden.run import DeploymentView as Deployment
    from loopwarden.run import Run, RunOutcome
    from loopwarden.store import BreakerView
    from loopwarden.verdicts import Verdict

__all__ = ["AGENT_NAME", "CAPTURE_ENV", "FRAMEWORK_SPANS", "OTel", "OTelSettings", "counter_names"]

log = logging.getLogger("loopwarden.plugins.otel")

#: the GenAI conventions' opt-in switch for message content
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: the run ``meta`` key an adapter sets when the framework writes GenAI spans of its own for
#: the run's model and tool calls (pydantic-ai's instrumentation): then loopwarden writes no
#: ``chat`` / ``execute_tool`` spans nor ``gen_ai.client.*`` metrics for them (they would be
#: counted twice) -- its ``invoke_agent`` span, a child of the framework's agent span, keeps
#: the verdicts and the stop, its token totals as ``loopwarden.usage.*``
FRAMEWORK_SPANS = "framework_spans"
#: the run ``meta`` key naming the framework's agent (an adapter sets it): the run span's
#: ``gen_ai.agent.name`` and name, instead of ``agent_name``
AGENT_NAME = "agent_name"

INSTALL_HINT = (
    "OpenTelemetry is not installed: pip install 'loopwarden[otel]'. The otel plugin records "
    "nothing."
)

#: endings that are not failures: no error.type on the run span
NORMAL_ENDINGS = frozenset({"final_answer", "terminal_tool"})

#: the metrics plugin's counters this plugin mirrors (in-process name)
MIRRORED = (
    "runs_total",
    "guard_firings_total",
    "agent.loop_detected",
    "tool_calls_total",
    "scope_refusals_total",
    "record_write_failures_total",
)


class OTelSettings(PluginSettings):
    exporter: Literal["global", "otlp"] = Field(
        default="global",
        description='"global": the tracer and meter providers the application set; "otlp": '
        "providers of the plugin's own, shipping over OTLP/HTTP to endpoint",
    )
    endpoint: str | None = Field(
        default=None,
        description='OTLP/HTTP base URL for exporter = "otlp" (/v1/traces and /v1/metrics are '
        "added; none: the OTEL_EXPORTER_OTLP_* variables, else http://localhost:4318)",
    )
    service_name: str = Field(
        default="loopwarden",
        description='service.name of the plugin\'s own providers (exporter = "otlp")',
    )
    export_timeout_s: PositiveSeconds = Field(
        default=2.0,
        description="the longest one export to the collector may take, its retries included "
        '(exporter = "otlp"); after a failure, batches are dropped at once for 30 s, and the '
        "failure is logged once -- a collector that is down never holds a run or a close",
    )
    traces: bool = Field(default=True, description="record spans")
    metrics: bool = Field(default=True, description="record metrics")
    agent_name: str = Field(
        default="loopwarden", description="gen_ai.agent.name (and the invoke_agent span's name)"
    )
    provider_name: str | None = Field(
        default=None,
        description="gen_ai.provider.name (none: the [model] provider -- openai, or "
        "loopwarden.scripted for the scripted model)",
    )
    capture_content: bool | None = Field(
        default=None,
        description="record message content, redacted (none: the conventions' switch "
        f"{CAPTURE_ENV} = true, SPAN_ONLY or SPAN_AND_EVENT)",
    )
    content_chars: int = Field(
        default=2000, ge=0, description="characters kept of each captured content text"
    )
    namespace: str = Field(
        default="loopwarden",
        description="prefix of loopwarden's counter names (as the metrics plugin's "
        "prometheus_namespace)",
    )
    loop_detectors: list[str] = Field(
        default_factory=lambda: list(LOOP_REASONS),
        description="plugin names or stop reasons whose firings count as agent_loop_detected",
    )
    redact_keys: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REDACT_KEYS),
        description="field names whose values are masked in captured content and evidence",
    )
    redact_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SECRET_PATTERNS),
        description="regular expressions for secrets masked inside any text",
    )
    mask: str = Field(default=MASK, description="what a redacted value is replaced with")

    @model_validator(mode="after")
    def _otlp_only(self) -> OTelSettings:
        if self.exporter != "otlp":
            defaults = {"endpoint": None, "service_name": "loopwarden", "export_timeout_s": 2.0}
            stray = [k for k, v in defaults.items() if getattr(self, k) != v]
            if stray:
                raise ValueError(
                    f'{", ".join(stray)}: only used with exporter = "otlp" (the global '
                    "providers are configured by the application)"
                )
        return self


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


#: values of the switch that put content on spans: the first instrumentations' ``true``, and
#: the modes of opentelemetry-util-genai (``EVENT_ONLY`` asks for events, which this plugin
#: does not write: no content)
CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})


def _capture_default() -> bool:
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in CAPTURE_VALUES


class _RunSpans:
    """One run's open span and the start times of the call in progress."""

    __slots__ = ("ctx", "input_len", "model_t0", "span", "tool_t0")

    def __init__(self, span: Any, ctx: Any) -> None:
        self.span = span
        self.ctx = ctx
        self.model_t0 = 0
        self.tool_t0 = 0
        self.input_len = 0


class OTel(Plugin[OTelSettings]):
    """OpenTelemetry spans (invoke_agent, chat, execute_tool), verdict events and metrics."""

    name = "otel"
    Settings = OTelSettings

    def __init__(
        self,
        settings: OTelSettings | None = None,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        """``tracer_provider`` / ``meter_provider``: write to these instead (tests, or an
        application that keeps its providers out of the globals)."""
        super().__init__(settings)
        s = self.settings
        self.redactor = Redactor(s.redact_keys, s.redact_patterns, mask=s.mask)
        self.capture = s.capture_content if s.capture_content is not None else _capture_default()
        self._loop = frozenset(s.loop_detectors)
        self._provider = s.provider_name or "openai"
        self.providers: Providers | None = None
        self.instruments: Instruments | None = None
        try:
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

            from loopwarden.plugins import _otel

            self.providers = _otel.providers(
                s.exporter,
                s.endpoint,
                s.service_name,
                __version__,
                tracer_provider,
                meter_provider,
                s.export_timeout_s,
            )
            if s.metrics:
                self.instruments = _otel.Instruments(
                    self.providers.meter, counter_names(s.namespace)
                )
        except ImportError:
            log.warning("otel: %s", INSTALL_HINT)
            return
        self._otel = _otel
        self._digest = _otel.Digest()
        self._kind_client = SpanKind.CLIENT
        self._kind_internal = SpanKind.INTERNAL
        self._error = Status(StatusCode.ERROR)
        self._status = Status
        self._code_error = StatusCode.ERROR
        self._in_context = set_span_in_context
        self._tracer = self.providers.tracer if s.traces else None

    # -- wiring ---------------------------------------------------------------------------

    def connect(self, deployment: Deployment) -> None:
        if self.providers is None:
            return
        self.redactor.add_literal(model_api_key(deployment))
        if self.settings.provider_name is None:
            model = getattr(getattr(deployment, "config", None), "model", None)
            provider = getattr(model, "provider", "openai")
            self._provider = "loopwarden.scripted" if provider == "scripted" else str(provider)
        deployment.connect(signals.run_started, self.on_run_started)
        deployment.connect(signals.model_responded, self.on_model_responded)
        deployment.connect(signals.tool_finished, self.on_tool_finished)
        deployment.connect(signals.guard_triggered, self.on_guard_triggered)
        deployment.connect(signals.run_stopped, self.on_run_stopped)
        deployment.connect(signals.record_failed, self.on_record_failed)
        deployment.connect(signals.breaker_changed, self.on_breaker_changed)

    def close(self) -> None:
        if self.providers is not None:
            self.providers.close()

    def force_flush(self) -> None:
        """Ship what the plugin's own providers hold (``exporter = "otlp"``) now."""
        if self.providers is not None:
            for provider in self.providers.owned:
                provider.force_flush()

    # -- the start of calls: hooks that never return a verdict -----------------------------
    # Signals have no "call started" event; these two hooks only note the time.

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> None:
        try:
            st: _RunSpans | None = run.state.get(self.name)
            if st is not None:
                st.model_t0 = time.time_ns()
                st.input_len = len(request.messages)
        except Exception:  # an observer never breaks a run
            log.debug("otel: before_model failed", exc_info=True)

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> None:
        try:
            st: _RunSpans | None = run.state.get(self.name)
            if st is not None:
                st.tool_t0 = time.time_ns()
        except Exception:  # an observer never breaks a run
            log.debug("otel: before_tool failed", exc_info=True)

    # -- helpers --------------------------------------------------------------------------

    def _text(self, text: str | None) -> str:
        clean = self.redactor.text(text or "")  # redact first: a cut must not hide a secret
        n = self.settings.content_chars
        return clean if len(clean) <= n else clean[:n] + "…"

    def _messages(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Messages in the conventions' parts format, redacted, as JSON."""
        out: list[dict[str, Any]] = []
        for m in messages:
            role = str(m.get("role"))
            parts: list[dict[str, Any]] = []
            if role == "tool":
                parts.append(
                    {
                        "type": "tool_call_response",
                        "id": m.get("tool_call_id"),
                        "response": self._text(m.get("content")),
                    }
                )
            elif m.get("content"):
                parts.append({"type": "text", "content": self._text(m.get("content"))})
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                parts.append(
                    {
                        "type": "tool_call",
                        "id": tc.get("id"),
                        "name": fn.get("name"),
                        "arguments": self._text(self.redactor.json_text(fn.get("arguments", ""))),
                    }
                )
            out.append({"role": role, "parts": parts})
        return json.dumps(out, ensure_ascii=False)

    def _base(self, operation: str, run: Run) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": self._provider,
        }
        if run.model_name:
            attrs["gen_ai.request.model"] = run.model_name
        return attrs

    # -- receivers ------------------------------------------------------------------------

    def on_run_started(self, run: Run, **_: Any) -> None:
        tracer = self._tracer
        if tracer is None:
            run.state[self.name] = _RunSpans(None, None)
            return
        attrs = self._base("invoke_agent", run)
        agent = run.meta.get(AGENT_NAME)
        agent = agent if isinstance(agent, str) and agent else self.settings.agent_name
        attrs["gen_ai.agent.name"] = agent
        attrs["gen_ai.conversation.id"] = run.conversation.id
        attrs["loopwarden.run_id"] = run.run_id
        attrs["loopwarden.mode"] = run.mode
        if run.limits.name:
            attrs["loopwarden.profile"] = run.limits.name
        if run.scenario:
            attrs["loopwarden.scenario"] = self._otel.scalar(run.scenario)
        # the parent is the span current here (the caller's): the default context
        span = tracer.start_span(
            f"invoke_agent {agent}", kind=self._kind_internal, attributes=attrs
        )
        # children of a span that records nothing (sampled out) are not even created
        run.state[self.name] = _RunSpans(
            span, self._in_context(span) if span.is_recording() else None
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
        st: _RunSpans | None = run.state.get(self.name)
        if st is None:
            return
        end = time.time_ns()
        start, st.model_t0 = st.model_t0 or end - int(duration_s * 1e9), 0
        if run.meta.get(FRAMEWORK_SPANS):  # the framework's own chat span and metrics say it
            return
        attrs = self._base("chat", run)
        if response.model:
            attrs["gen_ai.response.model"] = response.model
        usage = response.usage
        inst = self.instruments
        if inst is not None:
            # model calls and tokens: these histograms' count and sum (no counters per step)
            inst.duration.record(duration_s, attrs)
            if usage is not None:
                inst.token_usage.record(usage.prompt, {**attrs, "gen_ai.token.type": "input"})
                inst.token_usage.record(usage.completion, {**attrs, "gen_ai.token.type": "output"})
        tracer = self._tracer
        if tracer is None or st.ctx is None:  # sampled out: no child spans either
            return
        if usage is not None:
            attrs["gen_ai.usage.input_tokens"] = usage.prompt
            attrs["gen_ai.usage.output_tokens"] = usage.completion
        if response.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = (response.finish_reason,)
        if request.max_output_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = request.max_output_tokens
        attrs["loopwarden.step"] = run.step
        if request.final:
            attrs["loopwarden.final_turn"] = True
        if self.capture:
            messages = request.messages
            attrs["gen_ai.input.messages"] = self._messages(messages[: st.input_len or None])
            attrs["gen_ai.output.messages"] = self._messages(messages[-1:])
        model = run.model_name
        span = tracer.start_span(
            f"chat {model}" if model else "chat",
            context=st.ctx,
            kind=self._kind_client,
            attributes=attrs,
            start_time=start,
        )
        span.end(end_time=end)

    def on_tool_finished(self, run: Run, *, call: ToolCall, result: ToolResult, **_: Any) -> None:
        st: _RunSpans | None = run.state.get(self.name)
        if st is None:
            return
        outcome = "skipped" if result.skipped else ("ok" if result.ok else "error")
        ledger = run.ledger_answers
        answered = bool(ledger) and ledger[-1].get("call_id") == call.id
        inst = self.instruments
        if inst is not None:
            tool = call.name if call.tool is not None else UNKNOWN_TOOL
            inst.add("tool_calls_total", tool=tool, outcome=outcome)
            if answered:
                inst.add("ledger_answers_total", tool=tool, source=ledger[-1].get("source"))
        tracer = self._tracer
        if tracer is None or st.ctx is None or run.meta.get(FRAMEWORK_SPANS):
            return
        end = time.time_ns()
        start, st.tool_t0 = st.tool_t0 or end - int(result.duration_s * 1e9), 0
        name = self._otel.scalar(call.name, 200)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": self._otel.scalar(call.id, 200),
            "gen_ai.tool.type": "function",
            "loopwarden.step": call.step,
            "loopwarden.tool.outcome": outcome,
        }
        description = call.tool.description if call.tool is not None else None
        if description and description != call.name:
            attrs["gen_ai.tool.description"] = self._otel.scalar(description, 1000)
        if result.skipped_by:
            attrs["loopwarden.tool.skipped_by"] = result.skipped_by
        if result.attempts != 1:
            attrs["loopwarden.tool.attempts"] = result.attempts
        if answered:
            attrs["loopwarden.ledger.answered"] = True
            attrs["loopwarden.ledger.source"] = str(ledger[-1].get("source"))
        error = call.error or (result.error if not result.ok else None)
        if error:
            attrs["error.type"] = str(error)
        if self.capture:
            raw = call.raw_arguments if call.arguments is None else json.dumps(call.arguments)
            attrs["gen_ai.tool.call.arguments"] = self._text(self.redactor.json_text(raw))
            attrs["gen_ai.tool.call.result"] = self._text(result.content)
        span = tracer.start_span(
            f"execute_tool {name}",
            context=st.ctx,
            kind=self._kind_internal,
            attributes=attrs,
            start_time=start,
        )
        if error:
            span.set_status(self._error)
        span.end(end_time=end)

    def on_guard_triggered(
        self, run: Run, *, verdict: Verdict, hook: str, step: int, **extra: Any
    ) -> None:
        reason = str(getattr(verdict, "reason", None) or verdict.kind)
        inst = self.instruments
        if inst is not None:
            inst.add("guard_firings_total", plugin=verdict.plugin, reason=reason, kind=verdict.kind)
            if verdict.plugin in self._loop or reason in self._loop:
                inst.add("agent.loop_detected", plugin=verdict.plugin, reason=reason)
            evidence = verdict.evidence
            if (
                verdict.kind == "stop"
                and isinstance(evidence.get("scope"), str)
                and verdict.plugin != "circuit_breaker"  # a paused tool, not a budget refusing
            ):
                inst.add(
                    "scope_refusals_total",
                    scope=evidence["scope"],
                    window=str(evidence.get("window")),
                    reason=reason,
                )
        st: _RunSpans | None = run.state.get(self.name)
        if st is None or st.span is None:
            return
        attrs: dict[str, Any] = {
            "loopwarden.verdict.plugin": verdict.plugin,
            "loopwarden.verdict.action": verdict.kind,
            "loopwarden.verdict.reason": reason,
            "loopwarden.verdict.shadow": bool(extra.get("shadow")),
            "loopwarden.verdict.hook": hook,
            "loopwarden.verdict.step": step,
        }
        soft = getattr(verdict, "soft", None)
        if soft is not None:
            attrs["loopwarden.verdict.soft"] = soft
        # a message quotes what the guard saw (a call's arguments): content, so without
        # capture_content only its hash and length leave the process (as the evidence's)
        digest = None if self.capture else self._digest
        if verdict.message:
            if digest is None:
                attrs["loopwarden.verdict.message"] = self._otel.scalar(
                    self.redactor.text(verdict.message)
                )
            else:
                attrs.update(digest.content("loopwarden.verdict.message", verdict.message))
        attrs.update(self._otel.evidence_attributes(verdict.evidence, self.redactor, digest))
        st.span.add_event("loopwarden.verdict", attrs)

    def on_breaker_changed(self, run: Run, *, breaker: BreakerView, **_: Any) -> None:
        """A ``loopwarden.circuit_breaker`` event on the run span whose call changed a
        fleet-wide breaker: names and counts (the scope's key -- a tenant -- is hashed)."""
        st: _RunSpans | None = run.state.get(self.name)
        if st is None or st.span is None:
            return
        tripped = breaker.tripped or {}
        attrs: dict[str, Any] = {
            "loopwarden.breaker.change": str(breaker.changed),
            "loopwarden.breaker.state": breaker.state,
            "loopwarden.breaker.target": breaker.target,
            "loopwarden.breaker.name": breaker.name,
            "loopwarden.breaker.scope": breaker.scope,
            "loopwarden.breaker.key_hash": hashlib.blake2b(
                breaker.scope_key.encode("utf-8", "replace"), digest_size=8
            ).hexdigest(),
            "loopwarden.breaker.failures": int(tripped.get("failures", breaker.failures)),
        }
        if tripped.get("rule"):
            attrs["loopwarden.breaker.rule"] = str(tripped["rule"])
        st.span.add_event("loopwarden.circuit_breaker", attrs)

    def on_record_failed(self, run: Run, **_: Any) -> None:
        if self.instruments is not None:
            self.instruments.add("record_write_failures_total")

    def on_run_stopped(
        self, run: Run, *, outcome: RunOutcome, record: Mapping[str, Any], **_: Any
    ) -> None:
        if self.instruments is not None:
            self.instruments.add("runs_total", termination=outcome.termination)
        st: _RunSpans | None = run.state.get(self.name)
        if st is None:
            return
        end = time.time_ns()
        if st.model_t0 and outcome.stopped_by is None and outcome.error:
            self._failed_chat(run, st, outcome, end)  # the call in progress failed
        if st.span is None:
            return
        span, st.span = st.span, None
        tokens = record.get("tokens") or {}
        # under a framework's own spans, its spans carry the usage: ours would count it twice
        usage = "loopwarden.usage" if run.meta.get(FRAMEWORK_SPANS) else "gen_ai.usage"
        attrs: dict[str, Any] = {
            "loopwarden.termination": outcome.termination,
            "loopwarden.soft": outcome.soft,
            "loopwarden.steps": run.step,
            "loopwarden.tool_calls": run.tool_calls,
            "loopwarden.final_answer_present": outcome.final_answer_present,
            f"{usage}.input_tokens": int(tokens.get("prompt") or 0),
            f"{usage}.output_tokens": int(tokens.get("completion") or 0),
            "loopwarden.cost": float(record.get("cost") or 0.0),
        }
        if outcome.stopped_by is not None:
            attrs["loopwarden.stopped_by"] = outcome.stopped_by
        if record.get("cost_currency"):
            attrs["loopwarden.cost_currency"] = str(record["cost_currency"])
        if run.ledger_answers:
            attrs["loopwarden.ledger_answers"] = len(run.ledger_answers)
        shadow = run.shadow_stop
        if shadow:
            attrs["loopwarden.shadow_stop.reason"] = str(shadow.get("reason"))
            attrs["loopwarden.shadow_stop.plugin"] = str(shadow.get("plugin"))
        normal = outcome.termination in NORMAL_ENDINGS or (
            outcome.stopped_by is not None
            and run.deployment is not None
            and run.deployment.hooks.ends_runs_normally(outcome.stopped_by)
        )
        if not normal:
            attrs["error.type"] = outcome.termination
        if self.capture and outcome.final_answer:
            attrs["gen_ai.output.messages"] = json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": self._text(outcome.final_answer)}],
                    }
                ],
                ensure_ascii=False,
            )
        span.set_attributes(attrs)
        if not normal:
            span.set_status(self._status(self._code_error, f"stopped: {outcome.termination}"))
        span.end(end_time=end)

    def _failed_chat(self, run: Run, st: _RunSpans, outcome: RunOutcome, end: int) -> None:
        """The chat span of the model call that failed and ended the run."""
        kind = outcome.evidence.get("kind")
        error = str(kind) if isinstance(kind, str) and kind else outcome.termination
        if run.meta.get(FRAMEWORK_SPANS):
            return
        attrs = self._base("chat", run)
        attrs["error.type"] = error
        if self.instruments is not None:
            self.instruments.duration.record((end - st.model_t0) / 1e9, attrs)
        tracer = self._tracer
        if tracer is None or st.ctx is None:
            return
        model = run.model_name
        span = tracer.start_span(
            f"chat {model}" if model else "chat",
            context=st.ctx,
            kind=self._kind_client,
            attributes=attrs,
            start_time=st.model_t0,
        )
        span.set_status(self._status(self._code_error, str(self._otel.scalar(outcome.error or ""))))
        span.end(end_time=end)
