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
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id`` (the provider's
  id of the answer, :attr:`~loopwarden.events.ModelResponse.id`), ``gen_ai.usage.*``,
  ``gen_ai.response.finish_reasons``, ``server.address`` / ``server.port`` (the endpoint the
  model calls, :attr:`~loopwarden.run.Run.model_url`: also on the metrics' points); a failed
  call carries ``error.type``;
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

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from loopwarden import Plugin, PluginSettings, hookimpl, signals
from loopwarden._version import __version__
from loopwarden.plugin import PositiveSeconds
from loopwarden.plugins._otel.instruments import counter_names
from loopwarden.plugins.metrics import UNKNOWN_TOOL
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
    from loopwarden.plugins._otel import CallAttributes, Content, Instruments, Providers
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
            if s.metrics and self.providers.meter is not None:
                self.instruments = _otel.Instruments(
                    self.providers.meter, counter_names(s.namespace), self.providers.counters_key
                )
        except ImportError:
            log.warning("otel: %s", INSTALL_HINT)
            return
        self._otel = _otel
        self._digest = _otel.Digest()
        self._content: Content = _otel.Content(self.redactor, s.content_chars)
        self._calls: CallAttributes = _otel.CallAttributes(self._provider)
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
            self._calls.set_provider(self._provider)
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

    # -- receivers ------------------------------------------------------------------------

    def on_run_started(self, run: Run, **_: Any) -> None:
        tracer = self._tracer
        if tracer is None:
            run.state[self.name] = _RunSpans(None, None)
            return
        agent = run.meta.get(AGENT_NAME)
        agent = agent if isinstance(agent, str) and agent else self.settings.agent_name
        attrs = self._otel.run_start_attributes(run, self._provider, agent)
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
        start, st.model_t0 = st.model_t0, 0
        if run.meta.get(FRAMEWORK_SPANS):  # the framework's own chat span and metrics say it
            return
        inst, tracer = self.instruments, self._tracer
        ctx = st.ctx  # None: no child spans (no tracer, or the run's trace is sampled out)
        if inst is None and ctx is None:
            return
        end = time.time_ns()
        model = run.model_name
        base, tokens_in, tokens_out = self._calls.chat(model, response.model, run.model_url)
        usage = response.usage
        if inst is not None:
            # model calls and tokens: these histograms' count and sum (no counters per step)
            inst.duration.record(duration_s, base)
            if usage is not None:
                inst.token_usage.record(usage.prompt, tokens_in)
                inst.token_usage.record(usage.completion, tokens_out)
        if ctx is None or tracer is None:
            return
        attrs = base.copy()
        if response.id:
            attrs["gen_ai.response.id"] = response.id
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
            content = self._content
            attrs["gen_ai.input.messages"] = content.messages(messages[: st.input_len or None])
            attrs["gen_ai.output.messages"] = content.messages(messages[-1:])
        tracer.start_span(
            f"chat {model}" if model else "chat",
            context=ctx,
            kind=self._kind_client,
            attributes=attrs,
            start_time=start or end - int(duration_s * 1e9),
        ).end(end_time=end)

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
        ctx, tracer = st.ctx, self._tracer
        if ctx is None or tracer is None or run.meta.get(FRAMEWORK_SPANS):
            return
        end = time.time_ns()
        start, st.tool_t0 = st.tool_t0 or end - int(result.duration_s * 1e9), 0
        description = call.tool.description if call.tool is not None else None
        name, span_name, described = self._calls.tool(call.name, description)
        call_id = call.id
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id
            if type(call_id) is str and len(call_id) <= 200
            else self._otel.scalar(call_id, 200),
            "gen_ai.tool.type": "function",
            "loopwarden.step": call.step,
            "loopwarden.tool.outcome": outcome,
        }
        if described is not None:
            attrs["gen_ai.tool.description"] = described
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
            attrs["gen_ai.tool.call.arguments"] = self._content.arguments(raw)
            attrs["gen_ai.tool.call.result"] = self._content.text(result.content)
        span = tracer.start_span(
            span_name,
            context=ctx,
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
        if self.instruments is not None:
            self.instruments.count_verdict(verdict, reason, self._loop)
        st: _RunSpans | None = run.state.get(self.name)
        if st is None or st.span is None:
            return
        attrs = self._otel.verdict_attributes(
            verdict,
            reason,
            hook,
            step,
            bool(extra.get("shadow")),
            self.redactor,
            None if self.capture else self._digest,
        )
        st.span.add_event("loopwarden.verdict", attrs)

    def on_breaker_changed(self, run: Run, *, breaker: BreakerView, **_: Any) -> None:
        """A ``loopwarden.circuit_breaker`` event on the run span whose call changed a
        fleet-wide breaker: names and counts (the scope's key -- a tenant -- is hashed)."""
        st: _RunSpans | None = run.state.get(self.name)
        if st is None or st.span is None:
            return
        st.span.add_event("loopwarden.circuit_breaker", self._otel.breaker_attributes(breaker))

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
        normal = outcome.termination in NORMAL_ENDINGS or (
            outcome.stopped_by is not None
            and run.deployment is not None
            and run.deployment.hooks.ends_runs_normally(outcome.stopped_by)
        )
        answer = outcome.final_answer if self.capture else None
        attrs = self._otel.run_end_attributes(
            run,
            outcome,
            record,
            normal=normal,
            framework_spans=bool(run.meta.get(FRAMEWORK_SPANS)),
            answer=self._content.answer(answer) if answer else None,
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
        attrs = {**self._calls.chat(run.model_name, None, run.model_url)[0], "error.type": error}
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
