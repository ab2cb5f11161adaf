"""The guarded agent loop: one step machine, driven synchronously or asynchronously.

:meth:`Engine.machine` is a generator that holds the whole loop logic.  It never calls a model
or a tool itself: it *yields* an effect (:class:`CallModel`, :class:`RunTool`) and receives its
outcome.  :func:`drive` (sync), :func:`adrive` (async) and the replay driver execute those
effects -- so ``run()``, ``arun()`` and ``loopwarden replay`` share one implementation of the
contract.  How a tool call is executed (deadlines, worker threads) lives in
:mod:`loopwarden.execution`.

Over 500 lines, on purpose: the machine, the verdict handling it applies at each hook and the
two drivers must be read together -- every path through a run ends in one ``RunOutcome``
here.  (Splitting the model turn and the tool turn into sub-generators is the next step.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from loopwarden import execution, signals
from loopwarden._deadline import (
    WATCHDOG,
    await_within,
)
from loopwarden.events import (
    ErrorKind,
    ModelRequest,
    ModelResponse,
    ProposedCall,
    ToolCall,
    ToolResult,
    Usage,
)
from loopwarden.exceptions import ModelError, ToolError
from loopwarden.fingerprint import Fingerprinter
from loopwarden.run import Run, RunOutcome
from loopwarden.sanitize import clean_text, loads_arguments
from loopwarden.tokens import estimate_tools
from loopwarden.tools import ToolContext, format_validation_error
from loopwarden.verdicts import Resolution, Stop, resolve

if TYPE_CHECKING:
    from loopwarden.config import RunConfig
    from loopwarden.models import Model
    from loopwarden.pluginmanager import Hooks
    from loopwarden.redaction import Redactor
    from loopwarden.store import LedgerEntry
    from loopwarden.tools import Tool

__all__ = ["CallModel", "Engine", "Failed", "RunTool", "adrive", "drive", "parse_calls"]

log = logging.getLogger("loopwarden.loop")

CORE = "loopwarden"  # the plugin name on notes the loop writes itself
_DEADLINE_SLACK_S = 0.05  # a call that ended this close to its deadline overran it
_ERROR_CHARS = 2000  # the longest error text kept in a record
WATCHDOG_SLACK_S = 1.0  # how long past its deadline a run may go before the watchdog ends it


def _clip_error(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ...[truncated]"


_SCHEMA_CACHE_SIZE = 64  # tool-schema lists whose token estimate an engine remembers


@dataclass(slots=True)
class CallModel:
    """Effect: call the model with ``request``; send back a ModelResponse or Failed."""

    request: ModelRequest


@dataclass(slots=True)
class RunTool:
    """Effect: execute ``call`` with validated ``arguments``; send back a ToolResult."""

    call: ToolCall
    tool: Tool
    arguments: dict[str, Any]
    ctx: ToolContext


@dataclass(slots=True)
class Failed:
    """The effect raised ``error``."""

    error: BaseException


Effect = CallModel | RunTool
Machine = Generator[Effect, Any, RunOutcome]


def _to_text(value: Any) -> str:
    """A tool's return value as the observation text -- whatever the value: one whose
    ``__str__`` raises, or an int too long to print (``10**5000``), gives a placeholder."""
    if isinstance(value, str):
        return value
    if value is None:
        return "(no output)"
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except Exception:  # not JSON, or its __str__ / __repr__ raise: third-party objects
        return _safe_str(value)


class Engine:
    """The loop logic for one deployment (shared by all its runs; holds no run state)."""

    def __init__(self, hooks: Hooks, settings: RunConfig, shadow: Collection[str] = ()) -> None:
        self.hooks = hooks
        self.settings = settings
        self.mode = settings.mode
        #: plugins in shadow mode: their verdicts are recorded and signalled, never honoured
        self.shadow = frozenset(shadow)
        self.texts = settings.texts
        self.fingerprint = Fingerprinter(settings.volatile_keys)
        #: masks secrets in error texts (the deployment sets one that knows the model's key)
        self.redactor: Redactor | None = None
        # id(schema list) -> (that list, its estimated tokens); the list is kept so that its
        # id cannot be reused by another list while cached; bounded (cleared when full)
        self._tools_tokens: dict[int, tuple[list[dict[str, Any]], int]] = {}

    # -- helpers -------------------------------------------------------------------------

    def start(self, run: Run) -> None:
        """Seed the run: the conversation so far (or the system prompt), then the user."""
        history = run.conversation.messages
        if history:
            for m in history:
                run.add_message(m)
        elif self.settings.system_prompt:
            run.add_message({"role": "system", "content": self.settings.system_prompt})
        run.user = clean_text(run.user)
        run.add_message({"role": "user", "content": run.user})

    def _schemas(self, run: Run) -> tuple[list[dict[str, Any]], int]:
        tools = run.tools
        if tools is None:
            return [], 0
        schemas = tools.schemas()  # cached by the registry until it changes
        if not schemas:
            return [], 0
        cache = self._tools_tokens
        hit = cache.get(id(schemas))
        if hit is not None and hit[0] is schemas:
            return schemas, hit[1]
        n = estimate_tools(schemas, run.estimator)
        if len(cache) >= _SCHEMA_CACHE_SIZE:
            cache.clear()
        cache[id(schemas)] = (schemas, n)
        return schemas, n

    def _note(self, run: Run, hook: str, res: Resolution) -> Resolution:
        """Record every verdict, keep every warning, queue warnings for the next request;
        return the resolution the run honours (without the verdicts of shadowed plugins).

        The machine skips the call when ``res.verdicts`` is empty (the common case).
        """
        if not res.verdicts:
            return res
        shadow = self.shadow
        shadowed = bool(shadow) and any(v.plugin in shadow for v in res.verdicts)
        for v in res.verdicts:
            entry: dict[str, Any] = {
                "step": run.step,
                "hook": hook,
                "plugin": v.plugin,
                "kind": v.kind,
            }
            if isinstance(v, Stop):
                entry["reason"] = v.reason
                entry["soft"] = v.soft
            if shadowed and v.plugin in shadow:
                entry["shadow"] = True
                if v.message:
                    entry["message"] = v.message
                run.verdicts.append(entry)
                if isinstance(v, Stop) and run.shadow_stop is None:
                    run.shadow_stop = {
                        k: entry[k] for k in ("step", "hook", "plugin", "reason", "soft")
                    }
                    run.shadow_stop["evidence"] = dict(v.evidence)
                signals.send(
                    signals.guard_triggered, run, verdict=v, hook=hook, step=run.step, shadow=True
                )
                continue
            run.verdicts.append(entry)
            signals.send(signals.guard_triggered, run, verdict=v, hook=hook, step=run.step)
        if shadowed:
            res = resolve(v for v in res.verdicts if v.plugin not in shadow)
        for w in res.warnings:
            message = w.message
            if message:
                self._warn(run, w.plugin, message)
        return res

    def _warn(self, run: Run, plugin: str, message: str) -> None:
        run.warnings.append({"step": run.step, "plugin": plugin, "message": message})
        if message not in run.pending_notes:
            run.pending_notes.append(message)

    def _request(self, run: Run, final: bool) -> ModelRequest:
        notes, run.pending_notes = run.pending_notes, []
        role, prefix = self.settings.warning_role, self.settings.warning_prefix
        for n in notes:
            run.add_message({"role": role, "content": prefix + n})
        schemas, schema_tokens = self._schemas(run)
        request = ModelRequest(
            messages=run.messages,
            tools=schemas,
            tool_choice="auto",
            step=run.step + 1,
            notes=notes,
            estimated_tokens=run.context_tokens + schema_tokens,
            cancel=run.cancel,
        )
        if final:
            self._make_final(run, request)
        return request

    def _make_final(self, run: Run, request: ModelRequest) -> None:
        stop = run.stopping
        text = self.settings.wrap_up_instruction
        if stop is not None and stop.message:
            text = f"{stop.message} {text}"
        run.add_message(
            {"role": self.settings.warning_role, "content": self.settings.warning_prefix + text}
        )
        request.notes.append(text)
        request.tool_choice = "none"
        request.final = True
        _, schema_tokens = self._schemas(run)
        request.estimated_tokens = run.context_tokens + schema_tokens

    def parse_calls(self, run: Run, response: ModelResponse) -> list[ToolCall]:
        """The response's proposed calls parsed into :class:`ToolCall` objects, as
        ``after_response`` and ``before_tool`` see them (see :func:`parse_calls`)."""
        return self._parse_calls(run, response)

    def _parse_calls(self, run: Run, response: ModelResponse) -> list[ToolCall]:
        calls = []
        for i, pc in enumerate(response.tool_calls):
            call_id = pc.id or f"call_{run.step}_{i}"
            err: ErrorKind | None = None
            detail: str | None = None
            parsed: Any = None
            raw: Any = pc.arguments
            if isinstance(raw, dict):  # adapters that hand over parsed arguments: re-read
                try:  # as text, so that they are checked (depth, surrogates) like text
                    raw = json.dumps(raw, ensure_ascii=False, default=str)
                except (ValueError, TypeError, RecursionError) as exc:
                    raw, err, detail = "{}", "malformed_arguments", f"not encodable: {exc}"
            if raw is None:  # some providers send null for a call without arguments
                parsed, raw = {}, ""
            elif not isinstance(raw, str):
                raw = clean_text(repr(raw))
                err, detail = "malformed_arguments", "arguments are not JSON text"
            elif err is None:
                raw = clean_text(raw)
                try:
                    parsed = loads_arguments(raw) if raw.strip() else {}
                except ValueError as exc:  # also too deep, or a number Python refuses
                    err, detail = "malformed_arguments", str(exc)
            pc.arguments = raw  # plugins always see JSON text, as ProposedCall promises
            if err is None and not isinstance(parsed, dict):
                err, detail = "malformed_arguments", "arguments must be a JSON object"
            tool = run.tools.get(pc.name) if run.tools is not None else None
            args: dict[str, Any] | None = parsed if isinstance(parsed, dict) else None
            if err is None and tool is None:
                err = "unknown_tool"
            if err is None and tool is not None and args is not None:
                try:
                    args = tool.validate(args)
                except ValidationError as exc:
                    err, detail = "invalid_arguments", format_validation_error(exc)
            fp_args: Any = args if args is not None else raw
            call = ToolCall(
                name=pc.name,
                arguments=args,
                raw_arguments=raw,
                id=call_id,
                step=run.step,
                index=i,
                fingerprint=self.fingerprint(
                    pc.name, fp_args, tool.normalize_arguments if tool is not None else True
                ),
                tool=tool,
                error=err,
                error_detail=detail,
            )
            if tool is not None:
                call.timeout = tool.timeout_s
                if err is None and tool.side_effect and args is not None:
                    call.idempotency_key = tool.idempotency_key(
                        args, self.fingerprint.volatile_keys
                    )
            calls.append(call)
        return calls

    def _invalid_result(self, run: Run, call: ToolCall) -> ToolResult:
        t = self.texts
        if call.error == "unknown_tool":
            available = ", ".join(run.tools.names) if run.tools is not None else "(none)"
            text = t.unknown_tool.format(name=call.name, available=available)
        elif call.error == "malformed_arguments":
            text = t.malformed_arguments.format(name=call.name, detail=call.error_detail)
        else:
            text = t.invalid_arguments.format(name=call.name, detail=call.error_detail)
        return ToolResult(content=text, ok=False, error=call.error)

    def _close_calls(self, run: Run, calls: list[ToolCall], reason: str) -> None:
        """Answer calls that will not run, so the conversation stays well-formed."""
        text = self.texts.not_executed.format(reason=reason)
        for call in calls:
            run.add_message({"role": "tool", "tool_call_id": call.id, "content": text})

    def _clip(self, text: str) -> str:
        text = clean_text(text)
        limit = self.settings.max_observation_chars
        if limit is not None and len(text) > limit:
            return text[:limit] + f"\n...[truncated {len(text) - limit} characters]"
        return text

    # -- endings -------------------------------------------------------------------------

    def _best_effort(self, run: Run) -> str:
        if run.best_answer:
            return run.best_answer
        if run.last_observation:
            return self.texts.best_effort.format(observation=run.last_observation[:1000])
        return self.settings.fallback_answer

    def _hard(self, run: Run, stop: Stop, extra: dict[str, Any] | None = None) -> RunOutcome:
        evidence = dict(stop.evidence)
        if extra:
            evidence.update(extra)
        if stop.answer is not None:
            answer, present = stop.answer, True
        else:
            answer, present = self._best_effort(run), False
        return RunOutcome(
            termination=stop.reason,
            soft=False,
            stopped_by=stop.plugin,
            evidence=evidence,
            final_answer=answer,
            final_answer_present=present,
            message=stop.message,
        )

    def _vetoed(self, run: Run, stop: Stop) -> RunOutcome:
        evidence = dict(stop.evidence)
        if run.stopping is not None:
            evidence.setdefault("after_stop", run.stopping.reason)
        last = run.messages[-1] if run.messages else None
        if last is not None and last.get("role") == "assistant":
            # the withheld text must not reach the model again in a later turn either
            run.messages[-1] = {**last, "content": None}
        return RunOutcome(
            termination=stop.reason,
            soft=False,
            stopped_by=stop.plugin,
            evidence=evidence,
            final_answer=stop.answer if stop.answer is not None else self.settings.fallback_answer,
            final_answer_present=stop.answer is not None,
            message=stop.message,
        )

    def _soft_end(self, run: Run, response: ModelResponse) -> RunOutcome:
        stop = run.stopping
        assert stop is not None  # only called while a soft stop is honoured
        content = (response.content or "").strip()
        return RunOutcome(
            termination=stop.reason,
            soft=True,
            stopped_by=stop.plugin,
            evidence=dict(stop.evidence),
            final_answer=content or self._best_effort(run),
            final_answer_present=bool(content),
            message=stop.message,
        )

    def _model_failed(
        self, run: Run, request: ModelRequest, err: BaseException, took: float
    ) -> RunOutcome:
        """The outcome of a failed model call: ``cancelled`` when the run was cancelled,
        ``timeout`` when the call overran the time a plugin gave it (``request.timeout``),
        else ``model_error``.  The error text is redacted."""
        text = self.redact(run, f"{type(err).__name__}: {err}")
        evidence: dict[str, Any] = {"error": text}
        if isinstance(err, ModelError):
            evidence.update(kind=err.kind, status=err.status)
        termination = "model_error"
        if run.cancel.is_set():
            termination = "cancelled"
            evidence["reason"] = run.cancel.reason
        elif (
            isinstance(err, ModelError)
            and err.kind == "timeout"
            and request.timeout is not None
            and took >= request.timeout - _DEADLINE_SLACK_S
        ):
            termination = "timeout"
            evidence.update(limit_s=round(request.timeout, 3), elapsed_s=round(run.elapsed, 3))
        return RunOutcome(
            termination=termination,
            evidence=evidence,
            final_answer=self._best_effort(run),
            error=text,
        )

    def redact(self, run: Run, text: str) -> str:
        """``text`` with secrets masked -- the model's API key, bearer credentials, ``sk-``
        keys -- and cut to :data:`_ERROR_CHARS` (error texts go to records, logs, alerts)."""
        redactor = self.redactor
        if redactor is None:
            from loopwarden.redaction import Redactor

            redactor = self.redactor = Redactor()
        return _clip_error(redactor.text(_clip_error(text, 2 * _ERROR_CHARS)), _ERROR_CHARS)

    def _settled_history(self, run: Run, outcome: RunOutcome) -> list[dict[str, Any]]:
        """The run's messages as the conversation's next turn must see them: every tool call
        answered, and the answer the user was given (a fallback, a best effort) as the last
        word.  The run's own transcript (``run.messages``) stays what happened."""
        msgs = list(run.messages)
        for i in range(len(msgs) - 1, -1, -1):
            m = msgs[i]
            if m.get("role") == "assistant":
                answered = {x.get("tool_call_id") for x in msgs[i + 1 :] if x.get("role") == "tool"}
                text = self.texts.not_executed.format(reason=outcome.termination)
                msgs.extend(
                    {"role": "tool", "tool_call_id": tc["id"], "content": text}
                    for tc in m.get("tool_calls") or ()
                    if tc.get("id") not in answered
                )
                break
        answer = (outcome.final_answer or "").strip()
        last = msgs[-1] if msgs else None
        said = (
            last is not None
            and last.get("role") == "assistant"
            and not last.get("tool_calls")
            and (last.get("content") or "").strip() == answer
        )
        if answer and not said:
            msgs.append({"role": "assistant", "content": outcome.final_answer})
        return msgs

    def finish(self, run: Run, outcome: RunOutcome) -> RunOutcome:
        """Close the run: set its outcome, call every ``on_stop``, send ``run_stopped``.

        Only once: when the watchdog finished the run first, its outcome stands."""
        with run.finish_lock:
            if run.outcome is not None:
                return run.outcome
            run.ended_at = run.clock.now()
            run.outcome = outcome
        conversation = run.conversation
        conversation.messages = self._settled_history(run, outcome)
        conversation.runs += 1
        failures = self.hooks.on_stop(run, outcome)
        run.errors.extend(failures)
        if signals.run_stopped.receivers:  # the record is built only for a listener
            signals.send(signals.run_stopped, run, outcome=outcome, record=run.record())
        return outcome

    # -- the machine ---------------------------------------------------------------------

    def machine(self, run: Run) -> Machine:
        """The loop as a generator of effects; returns the (not yet finished) outcome."""
        hooks = self.hooks
        signals.send(signals.run_started, run)
        res = hooks.on_start(run)
        if res.verdicts:
            res = self._note(run, "on_start", res)
        if res.stop is not None:
            if not res.stop.soft:
                return self._hard(run, res.stop)
            run.stopping = res.stop
        # Side effects that happened (or may have: a timeout) are remembered for the whole
        # conversation; failures only for this run -- the user's next message may have fixed
        # what made them fail.
        ledger = run.conversation.side_effects
        failed_here: dict[str, ToolResult] = {}
        while True:
            if run.cancel.is_set():
                return RunOutcome(
                    termination="cancelled",
                    evidence={"reason": run.cancel.reason},
                    final_answer=self._best_effort(run),
                )
            final = run.stopping is not None
            request = self._request(run, final)
            res = hooks.before_model(run, request)
            if res.verdicts:
                res = self._note(run, "before_model", res)
            stop = res.stop
            if stop is not None:
                if not stop.soft:
                    if run.stopping is not None:
                        return self._hard(
                            run,
                            run.stopping,
                            {
                                "final_turn_refused_by": stop.plugin,
                                "final_turn_refused_reason": stop.reason,
                            },
                        )
                    return self._hard(run, stop)
                if not final:
                    run.stopping = stop
                    self._make_final(run, request)
                    final = True
            t0 = run.clock.now()
            response = yield CallModel(request)
            if not isinstance(response, (ModelResponse, Failed)) or (
                isinstance(response, ModelResponse) and not _well_formed(response)
            ):
                response = Failed(
                    ModelError(
                        f"the model returned {type(response).__name__} {response!r:.200}, "
                        "not a well-formed ModelResponse",
                        kind="malformed",
                    )
                )
            if isinstance(response, Failed):
                return self._model_failed(run, request, response.error, run.clock.now() - t0)
            run.step += 1
            if response.model is not None and not isinstance(response.model, str):
                response.model = None  # a server's odd "model" field is not passed on
            if response.usage is not None:
                run.usage.add(response.usage)
            _clean_response(response)
            content = response.content
            if content and content.strip():
                run.best_answer = content
            if final:  # tools were disabled: proposed calls are ignored, but kept as JSON text
                calls = []
                for pc in response.tool_calls:
                    if not isinstance(pc.arguments, str):
                        try:
                            text = json.dumps(pc.arguments, ensure_ascii=False, default=str)
                        except (ValueError, TypeError, RecursionError):
                            text = "{}"
                        pc.arguments = clean_text(text)
            else:
                calls = self._parse_calls(run, response)
            response.calls = calls
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.raw_arguments},
                    }
                    for c in calls
                ]
            run.add_message(message)
            if signals.model_responded.receivers:
                signals.send(
                    signals.model_responded,
                    run,
                    request=request,
                    response=response,
                    duration_s=run.clock.now() - t0,
                )
            res = hooks.after_response(run, response)
            if res.verdicts:
                res = self._note(run, "after_response", res)
            if (final or not calls) and res.stop is not None and not res.stop.soft:
                # A hard stop on an answer is a veto (an output guard, or a guard that failed
                # and fails closed): the model's text is withheld.
                return self._vetoed(run, res.stop)
            if final:
                return self._soft_end(run, response)
            if not calls:
                text = (content or "").strip()
                return RunOutcome(
                    termination="final_answer",
                    final_answer=text or self._best_effort(run),
                    final_answer_present=bool(text),
                )
            run.tool_calls += len(calls)
            stop = res.stop
            if stop is not None:
                self._close_calls(run, calls, stop.reason)
                if not stop.soft:
                    return self._hard(run, stop)
                run.stopping = stop
                if signals.step_finished.receivers:
                    signals.send(signals.step_finished, run, step=run.step)
                continue
            for i, call in enumerate(calls):
                if run.cancel.is_set():
                    self._close_calls(run, calls[i:], "cancelled")
                    break
                res = hooks.before_tool(run, call)
                if res.verdicts:
                    res = self._note(run, "before_tool", res)
                stop = res.stop
                if stop is not None:
                    self._close_calls(run, calls[i:], stop.reason)
                    if not stop.soft:
                        return self._hard(run, stop)
                    run.stopping = stop
                    break
                skip = res.skip
                if skip is not None:
                    result = ToolResult(
                        content=skip.observation, skipped=True, skipped_by=skip.plugin
                    )
                elif call.error is not None or call.tool is None or call.arguments is None:
                    result = self._invalid_result(run, call)
                elif (
                    call.idempotency_key is not None
                    and (
                        earlier := ledger.get(call.idempotency_key)
                        or failed_here.get(call.idempotency_key)
                    )
                    is not None
                    and not earlier.retryable
                ):
                    result = self._side_effect_replay(call, earlier)
                elif (
                    call.idempotency_key is not None
                    and run.shared is not None
                    and (entry := run.shared.claim(run, call)) is not None
                ):
                    # the shared ledger: another run executed (or is executing) this key
                    result = self._shared_replay(run, call, entry)
                    if entry.state == "done":
                        ledger[call.idempotency_key] = result
                else:
                    ctx = ToolContext(run.run_id, run.clock, run.cancel)
                    if call.timeout is not None:
                        ctx.deadline = run.clock.now() + call.timeout
                    result = yield RunTool(call, call.tool, call.arguments, ctx)
                    run.tools_executed += 1
                    if call.idempotency_key is not None:
                        # Every executed side effect is remembered, whatever its outcome; only a
                        # failure that stays retryable (after_tool plugins may spend a retry
                        # budget and clear the flag on this very object) runs again.
                        done = result.ok or result.error in ("timeout", "cancelled")
                        (ledger if done else failed_here)[call.idempotency_key] = result
                        if run.shared is not None:
                            run.shared.finish(run, call, result)
                result.content = self._clip(result.content)
                run.add_message(
                    {"role": "tool", "tool_call_id": call.id, "content": result.content}
                )
                if result.ok and not result.skipped:
                    run.last_observation = result.content
                if signals.tool_finished.receivers:
                    signals.send(signals.tool_finished, run, call=call, result=result)
                res = hooks.after_tool(run, call, result)
                if res.verdicts:
                    res = self._note(run, "after_tool", res)
                stop = res.stop
                if stop is not None:
                    self._close_calls(run, calls[i + 1 :], stop.reason)
                    if not stop.soft:
                        return self._hard(run, stop)
                    run.stopping = stop
                    break
            if signals.step_finished.receivers:
                signals.send(signals.step_finished, run, step=run.step)

    # -- tool execution ------------------------------------------------------------------

    def tool_result(self, eff: RunTool, value: Any, started: float, run: Run) -> ToolResult:
        """Turn a tool's return value into a result (late results become timeouts)."""
        call, ctx = eff.call, eff.ctx
        now = run.clock.now()
        if ctx.deadline is not None and now >= ctx.deadline:
            return self.timeout_result(call, now - started)
        return ToolResult(content=_to_text(value), duration_s=now - started, value=value)

    def timeout_result(self, call: ToolCall, elapsed: float) -> ToolResult:
        # An abandoned side effect may still complete: its outcome is unknown, so it is never
        # retried automatically.
        return ToolResult(
            content=self.texts.tool_timeout.format(name=call.name, seconds=call.timeout or elapsed),
            ok=False,
            error="timeout",
            retryable=not call.side_effect,
            duration_s=elapsed,
        )

    def _side_effect_replay(self, call: ToolCall, earlier: ToolResult) -> ToolResult:
        """The synthetic observation for a side effect already executed with this key."""
        t = self.texts
        if earlier.ok:
            text = t.side_effect_replayed.format(name=call.name, content=earlier.content)
        elif earlier.error in ("timeout", "cancelled"):
            text = t.side_effect_unknown.format(name=call.name, content=earlier.content)
        else:
            text = t.side_effect_failed.format(name=call.name, content=earlier.content)
        return ToolResult(
            content=text,
            ok=earlier.ok,
            error=earlier.error,
            skipped=True,
            skipped_by=CORE,
            value=earlier.value,
        )

    def _shared_replay(self, run: Run, call: ToolCall, entry: LedgerEntry) -> ToolResult:
        """The observation for a side effect the shared ledger already holds: recorded by
        another run, in progress there, possibly taken effect, or a store that failed closed."""
        t = self.texts
        recorded = entry.result or {}
        content = str(recorded.get("content", ""))
        state = entry.state
        if state == "running" and run.shared is not None and run.shared.stale(entry):
            state = "unknown"
        error: ErrorKind
        if state == "done":
            text = t.shared_side_effect_done.format(name=call.name, content=content)
            return ToolResult(content=text, skipped=True, skipped_by=CORE)
        if state == "unknown":
            text, error = (
                t.shared_side_effect_unknown.format(name=call.name, content=content),
                "unknown_outcome",
            )
        elif state == "running":
            text, error = (
                t.shared_side_effect_in_progress.format(name=call.name, content=content),
                "in_progress",
            )
        else:
            text, error = (
                t.store_unavailable.format(name=call.name, content=content),
                "store_unavailable",
            )
        return ToolResult(content=text, ok=False, error=error, skipped=True, skipped_by=CORE)

    def error_result(self, eff: RunTool, exc: BaseException, elapsed: float) -> ToolResult:
        call = eff.call
        if isinstance(exc, ToolError):
            return ToolResult(
                content=_to_text(exc.message),
                ok=False,
                error="tool_error",
                retryable=exc.retryable,
                duration_s=elapsed,
            )
        if eff.ctx.cancel.cancelled:
            return ToolResult(
                content=self.texts.tool_cancelled.format(name=call.name),
                ok=False,
                error="cancelled",
                duration_s=elapsed,
            )
        return ToolResult(
            content=f"ERROR: {type(exc).__name__}: {_safe_str(exc)}",
            ok=False,
            error="exception",
            retryable=eff.tool.is_retryable(exc),
            duration_s=elapsed,
        )

    def _cancelled_before(self, eff: RunTool) -> ToolResult:
        return ToolResult(
            content=self.texts.tool_cancelled.format(name=eff.call.name),
            ok=False,
            error="cancelled",
        )

    def run_tool_sync(self, eff: RunTool, run: Run) -> ToolResult:
        """Execute one tool call in a synchronous run (see :mod:`loopwarden.execution`)."""
        return execution.run_tool_sync(self, eff, run)

    async def run_tool_async(self, eff: RunTool, run: Run) -> ToolResult:
        """Execute one tool call in an async run (see :mod:`loopwarden.execution`)."""
        return await execution.run_tool_async(self, eff, run)


def parse_calls(
    run: Run, response: ModelResponse, settings: RunConfig | None = None
) -> list[ToolCall]:
    """Parse ``response.tool_calls`` exactly as the loop does: arguments decoded and validated
    against ``run.tools`` (an unknown tool or bad arguments set ``call.error``), and
    ``fingerprint`` (with ``settings.volatile_keys``), ``idempotency_key`` and ``timeout``
    computed -- for the test kit and the framework adapters, which must see the calls the
    plugins see.  ``settings`` defaults to the run's deployment's ``[run]`` table."""
    if settings is None:
        from loopwarden.config import RunConfig

        dep = run.deployment
        settings = dep.config.run if dep is not None else RunConfig()
    parser = Engine(None, settings)  # type: ignore[arg-type]  # parsing calls no hook
    return parser.parse_calls(run, response)


def _well_formed(response: Any) -> bool:
    """Content is text or None, and every proposed call is a ProposedCall with a str name
    (a model adapter is third-party code: its response is checked, not trusted)."""
    if response.content is not None and not isinstance(response.content, str):
        return False
    usage = response.usage
    if usage is not None and not (
        isinstance(usage, Usage)
        and all(type(n) is int and n >= 0 for n in (usage.prompt, usage.completion, usage.cached))
    ):
        return False
    calls = response.tool_calls
    if not isinstance(calls, list):
        return False
    return all(
        isinstance(c, ProposedCall) and isinstance(c.name, str) and isinstance(c.id, str)
        for c in calls
    )


def _clean_response(response: ModelResponse) -> None:
    """Replace lone surrogates in the model's text, call names and ids (see
    :func:`loopwarden.sanitize.clean_text`): they could not be stored, printed or sent back."""
    if response.content:
        response.content = clean_text(response.content)
    for pc in response.tool_calls:
        pc.name = clean_text(pc.name)
        pc.id = clean_text(pc.id)
        if isinstance(pc.arguments, str):
            pc.arguments = clean_text(pc.arguments)


def _internal_error(engine: Engine, run: Run, exc: BaseException) -> RunOutcome:
    kind = "cancelled" if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else "error"
    text = engine.redact(run, f"{type(exc).__name__}: {_safe_str(exc)}")
    return RunOutcome(termination=kind, evidence={"error": text}, error=text)


def _safe_str(value: object) -> str:
    """``str(value)``, or a placeholder when that raises (third-party objects; an int longer
    than Python prints)."""
    try:
        return str(value)
    except Exception as exc:
        if isinstance(value, int):
            return f"<an integer of {value.bit_length()} bits, too long to print>"
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


async def _model_within(aw: Awaitable[Any], request: ModelRequest, run: Run) -> Any:
    """Await a model call, abandoning it when ``request.timeout`` passes or the run is
    cancelled (a watchdog for any async model, the built-in client bounds itself too)."""
    if request.timeout is None:
        return await aw
    ending, value = await await_within(aw, request.timeout + _DEADLINE_SLACK_S, run.cancel)
    if ending == "ok":
        return value
    if ending == "cancelled":
        raise ModelError("the run was cancelled during the model call", kind="cancelled")
    raise ModelError(f"the model did not answer within {request.timeout:.3f}s", kind="timeout")


def _watch(engine: Engine, run: Run) -> Callable[[], None]:
    """Have the watchdog end ``run`` shortly after ``run.deadline`` unless it ended itself."""
    if run.deadline is None:
        return _nothing
    seconds = max(0.0, run.deadline - run.clock.now()) + WATCHDOG_SLACK_S

    def fire() -> None:
        if run.outcome is None:
            log.error(
                "run %s passed its deadline by %.1fs without reaching a check (a hook, "
                "tool or model call blocks): the watchdog ends it",
                run.run_id,
                WATCHDOG_SLACK_S,
            )
            engine.finish(
                run,
                RunOutcome(
                    termination="timeout",
                    evidence={
                        "watchdog": True,
                        "elapsed_s": round(run.elapsed, 3),
                        "deadline_s": round(run.deadline - run.started_at, 3)
                        if run.deadline is not None
                        else None,
                    },
                    final_answer=engine._best_effort(run),
                ),
            )

    return WATCHDOG.watch(seconds, fire)


def _nothing() -> None:
    pass


def drive(engine: Engine, run: Run, model: Model) -> RunOutcome:
    """Run the machine synchronously: call the model and the tools, finish the run."""
    gen = engine.machine(run)
    unwatch = _nothing
    try:
        eff: Effect = next(gen)
        unwatch = _watch(engine, run)
        while True:
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                gen.close()
                return run.outcome
            if isinstance(eff, CallModel):
                try:
                    value: Any = model.complete(eff.request)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = engine.run_tool_sync(eff, run)
            eff = gen.send(value)
    except StopIteration as done:
        return engine.finish(run, done.value)
    except BaseException as exc:
        if run.outcome is None:
            engine.finish(run, _internal_error(engine, run, exc))
        raise
    finally:
        unwatch()


async def adrive(engine: Engine, run: Run, model: Any) -> RunOutcome:
    """Run the machine asynchronously (models with ``acomplete`` are awaited)."""
    gen = engine.machine(run)
    acomplete = getattr(model, "acomplete", None)
    unwatch = _nothing
    try:
        eff: Effect = next(gen)
        unwatch = _watch(engine, run)
        while True:
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                gen.close()
                return run.outcome
            if isinstance(eff, CallModel):
                try:
                    if acomplete is not None:
                        aw: Awaitable[Any] = acomplete(eff.request)
                    else:
                        # a sync model in an async run: a daemon worker, so that a hung call
                        # never keeps asyncio.run() from exiting
                        aw = execution.daemon_thread(model.complete, eff.request, name="model")
                    value = await _model_within(aw, eff.request, run)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = await engine.run_tool_async(eff, run)
            eff = gen.send(value)
    except StopIteration as done:
        return engine.finish(run, done.value)
    except BaseException as exc:
        if run.outcome is None:
            engine.finish(run, _internal_error(engine, run, exc))
        raise
    finally:
        unwatch()
