"""The guarded agent loop: one step machine of effects.

:meth:`Engine.machine` is a generator that holds the whole loop logic.  It never calls a model
or a tool itself: it *yields* an effect (:class:`CallModel`, :class:`RunTool`) and receives its
outcome.  Each step is a model turn and, when the model proposed calls, a tool turn -- two
sub-generators the machine delegates to with ``yield from``.  The drivers execute the effects:
:func:`~loopwarden.engine.drivers.drive` (sync), :func:`~loopwarden.engine.drivers.adrive`
(async), the replay driver and the framework adapters, so
``run()``, ``arun()`` and ``loopwarden replay`` share one implementation of the contract.

Around the machine, in modules of their own: the effects (:mod:`loopwarden.engine.effects`), the
drivers and the watchdog (:mod:`loopwarden.engine.drivers`), parsing proposed calls and the
observations for calls that do not run (:mod:`loopwarden.engine.calls`, with :func:`parse_calls`),
and tool execution with its results and worker threads (:mod:`loopwarden.engine.execution`).  This
module re-exports the public names of the effects and of the call parsing, which sit below it.
The drivers sit above the machine (they import it): ``drive`` and ``adrive`` keep their old
path here (0.2) by a name lookup on first use (:func:`__getattr__`), never an import, so the
machine imports nothing of what drives it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection, Generator
from typing import TYPE_CHECKING, Any

from loopwarden import signals
from loopwarden.engine import execution
from loopwarden.engine.calls import (
    clean_response,
    ignore_proposals,
    invalid_result,
    note_ledger_answer,
    parse_calls,
    parse_proposals,
    shared_replay,
    side_effect_replay,
    well_formed,
)
from loopwarden.engine.effects import CallModel, Effect, Failed, Machine, RunTool
from loopwarden.engine.outcomes import (
    best_effort,
    hard,
    model_failed,
    settled_history,
    soft_end,
    vetoed,
)
from loopwarden.events import IN_DOUBT, ModelRequest, ModelResponse, ToolCall, ToolResult
from loopwarden.exceptions import ModelError
from loopwarden.fingerprint import AnswerMasks, Fingerprinter
from loopwarden.models.tokens import estimate_tools
from loopwarden.notes import instruction_text
from loopwarden.run import Run, RunOutcome
from loopwarden.sanitize import clean_text
from loopwarden.tools import ToolContext
from loopwarden.verdicts import Resolution, Stop, resolve

if TYPE_CHECKING:
    from loopwarden.config import RunConfig
    from loopwarden.engine.pluginmanager import Hooks
    from loopwarden.redaction import Redactor

__all__ = ["CallModel", "Engine", "Failed", "RunTool", "parse_calls"]

#: names this module answers for :mod:`loopwarden.engine.drivers` (their 0.2 path)
_DRIVERS = frozenset({"adrive", "drive"})


def __getattr__(name: str) -> Any:
    """``drive`` / ``adrive`` from :mod:`loopwarden.engine.drivers`, looked up on first use:
    the old path keeps working while the machine imports nothing above it."""
    if name not in _DRIVERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("loopwarden.engine.drivers"), name)
    globals()[name] = value
    return value


log = logging.getLogger("loopwarden.loop")

_ERROR_CHARS = 2000  # the longest error text kept in a record
_SCHEMA_CACHE_SIZE = 64  # tool-schema lists whose token estimate an engine remembers
#: what a model turn ends with: the run's outcome, or the calls for the tool turn
ModelTurn = Generator[Effect, Any, RunOutcome | list[ToolCall]]
#: what a tool turn ends with: the run's outcome, or None to go on
ToolTurn = Generator[Effect, Any, RunOutcome | None]


def _clip_error(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ...[truncated]"


class Engine:
    """The loop logic for one deployment (shared by all its runs; holds no run state)."""

    def __init__(self, hooks: Hooks, settings: RunConfig, shadow: Collection[str] = ()) -> None:
        self.settings = settings
        self.mode = settings.mode
        #: plugins in shadow mode: their verdicts are recorded and signalled, never honoured,
        #: and whatever else their hooks change (a deadline, a delay, a cleared flag) is
        #: undone and recorded as a shadow effect (see Hooks.shadowing)
        self.shadow = frozenset(shadow)
        self.hooks = hooks.shadowing(self.shadow) if self.shadow else hooks
        self.texts = settings.texts
        self.fingerprint = Fingerprinter(settings.volatile_keys)
        #: what tool answers say, volatile parts masked: every detector's result digest
        self.answers = AnswerMasks(settings.volatile_patterns, enabled=settings.mask_volatile)
        #: masks secrets in error texts (the deployment sets one that knows the model's key)
        self.redactor: Redactor | None = None
        # id(schema list) -> (that list, its estimated tokens); the list is kept so that its
        # id cannot be reused by another list while cached; bounded (cleared when full)
        self._tools_tokens: dict[int, tuple[list[dict[str, Any]], int]] = {}

    # -- tool execution: the drivers call run_tool_sync / run_tool_async (a subclass may wrap
    # them); the three result builders are kept for drivers written against 0.1 --------------

    def run_tool_sync(self, eff: RunTool, run: Run) -> ToolResult:
        """Execute one tool call in a synchronous run (:mod:`loopwarden.engine.execution`)."""
        return execution.run_tool_sync(self.texts, eff, run)

    async def run_tool_async(self, eff: RunTool, run: Run) -> ToolResult:
        """Execute one tool call in an async run (:mod:`loopwarden.engine.execution`)."""
        return await execution.run_tool_async(self.texts, eff, run)

    def tool_result(self, eff: RunTool, value: Any, started: float, run: Run) -> ToolResult:
        """Turn a tool's return value into a result (late results become timeouts)."""
        return execution.tool_result(self.texts, eff, value, started, run)

    def timeout_result(self, call: ToolCall, elapsed: float) -> ToolResult:
        """The result of a call abandoned at its deadline."""
        return execution.timeout_result(self.texts, call, elapsed)

    def error_result(self, eff: RunTool, exc: BaseException, elapsed: float) -> ToolResult:
        """The result of a tool that raised."""
        return execution.error_result(self.texts, eff, exc, elapsed)

    # -- helpers -------------------------------------------------------------------------

    def start(self, run: Run) -> None:
        """Seed the run: the conversation so far (or the system prompt), then the user."""
        history = run.conversation.messages
        if history:
            run._add_history(history)
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
        # a note's instruction form: data that is not a short identifier withheld, so tool
        # and model text never rise to the note's role (loopwarden.notes); records keep all
        notes = [instruction_text(n) for n in run.pending_notes]
        run.pending_notes = []
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
            max_output_tokens=run.max_output_tokens,
            cancel=run.cancel,
        )
        if final:
            self._make_final(run, request)
        return request

    def _make_final(self, run: Run, request: ModelRequest) -> None:
        stop = run.stopping
        text = self.settings.wrap_up_instruction
        if stop is not None and stop.message:
            text = f"{instruction_text(stop.message)} {text}"
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
        return parse_proposals(run, response, self.fingerprint)

    def _close_calls(self, run: Run, calls: list[ToolCall], reason: str) -> None:
        """Answer calls that will not run, so the conversation stays well-formed."""
        text = self.texts.not_executed.format(reason=reason)
        for call in calls:
            run.add_message({"role": "tool", "tool_call_id": call.id, "content": text})

    def _clip(self, text: str) -> str:
        if not text.isascii():  # clean_text leaves ASCII text as it is
            text = clean_text(text)
        limit = self.settings.max_observation_chars
        if limit is not None and len(text) > limit:
            return text[:limit] + f"\n...[truncated {len(text) - limit} characters]"
        return text

    # -- endings -------------------------------------------------------------------------

    def redact(self, run: Run, text: str) -> str:
        """``text`` with secrets masked -- the model's API key, bearer credentials, ``sk-``
        keys -- and cut to :data:`_ERROR_CHARS` (error texts go to records, logs, alerts)."""
        redactor = self.redactor
        if redactor is None:
            from loopwarden.redaction import Redactor

            redactor = self.redactor = Redactor()
        return _clip_error(redactor.text(_clip_error(text, 2 * _ERROR_CHARS)), _ERROR_CHARS)

    def finish(self, run: Run, outcome: RunOutcome) -> RunOutcome:
        """Close the run: set its outcome, call every ``on_stop``, send ``run_stopped``.

        Only once: when the watchdog finished the run first, its outcome stands."""
        with run.finish_lock:
            if run.outcome is not None:
                return run.outcome
            run.ended_at = run.clock.now()
            run.outcome = outcome
        conversation = run.conversation
        conversation._settle(settled_history(self.settings, run, outcome), run)
        conversation.runs += 1
        failures = self.hooks.on_stop(run, outcome)
        run.errors.extend(failures)
        if signals.run_stopped.receivers:  # the record is built only for a listener
            signals.send(signals.run_stopped, run, outcome=outcome, record=run.record())
        return outcome

    # -- the machine ---------------------------------------------------------------------

    def _hard(self, run: Run, stop: Stop) -> RunOutcome:
        """The outcome of a hard stop (see :func:`loopwarden.engine.outcomes.hard`)."""
        return hard(self.settings, run, stop, normal=self.hooks.ends_runs_normally(stop.plugin))

    def machine(self, run: Run) -> Machine:
        """The loop as a generator of effects; returns the (not yet finished) outcome."""
        hooks = self.hooks
        signals.send(signals.run_started, run)
        res = hooks.on_start(run)
        if res.verdicts:
            res = self._note(run, "on_start", res)
            stop = res.stop
            if stop is not None:
                if not stop.soft:
                    return self._hard(run, stop)
                run.stopping = stop
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
                    final_answer=best_effort(self.settings, run),
                )
            calls = yield from self._model_turn(run)
            if isinstance(calls, RunOutcome):
                return calls
            if calls:
                ended = yield from self._tool_turn(run, calls, ledger, failed_here)
                if ended is not None:
                    return ended
            if signals.step_finished.receivers:
                signals.send(signals.step_finished, run, step=run.step)

    def _model_turn(self, run: Run) -> ModelTurn:
        """``before_model``, the model call, ``after_response``: returns the run's outcome
        when this turn ends the run, else the calls for the tool turn (none when a soft stop
        in ``after_response`` leaves them unexecuted)."""
        hooks = self.hooks
        final = run.stopping is not None
        request = self._request(run, final)
        res = hooks.before_model(run, request)
        stop = None
        if res.verdicts:  # the common case has none: no property reads, no checks
            res = self._note(run, "before_model", res)
            stop = res.stop
        if stop is not None:
            if not stop.soft:
                if run.stopping is not None:
                    return hard(
                        self.settings,
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
        usable = isinstance(response, ModelResponse) and well_formed(response)
        if not usable:
            if not isinstance(response, Failed):
                response = Failed(
                    ModelError(
                        f"the model returned {type(response).__name__} {response!r:.200}, "
                        "not a well-formed ModelResponse",
                        kind="malformed",
                    )
                )
            err, took = response.error, run.clock.now() - t0
            text = self.redact(run, f"{type(err).__name__}: {err}")
            return model_failed(self.settings, run, request, err, took, text)
        run.step += 1
        if response.model is not None and not isinstance(response.model, str):
            response.model = None  # a server's odd "model" field is not passed on
        if response.usage is not None:
            run.usage.add(response.usage)
        clean_response(response)
        content = response.content
        if content and content.strip():
            run.best_answer = content
        # tools disabled: proposed calls are ignored (kept as JSON text)
        calls = (
            ignore_proposals(response)
            if final
            else parse_proposals(run, response, self.fingerprint)
        )
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
        if type(response) is not ModelResponse and getattr(response, "cut_by", None) is not None:
            # a streamed answer an on_model_delta stop cut (loopwarden.engine.streaming): that stop
            # is honoured with the after_response verdicts, as if this hook had returned it
            res = resolve((response.cut_by, *res.verdicts))
            cut = res.stop
            if cut is not None and cut.soft:  # a cut answer is no final answer
                if final:
                    return vetoed(self.settings, run, cut)
                run.stopping = cut  # the tool-less wrap-up turn answers instead
                return []
        stop = res.stop if res.verdicts else None
        if (final or not calls) and stop is not None and not stop.soft:
            # A hard stop on an answer is a veto (an output guard, or a guard that failed
            # and fails closed): the model's text is withheld.
            return vetoed(
                self.settings, run, stop, normal=self.hooks.ends_runs_normally(stop.plugin)
            )
        if final and run.stopping is not None:  # the soft stop's wrap-up turn
            return soft_end(self.settings, run, run.stopping, response)
        if not calls:
            text = (content or "").strip()
            return RunOutcome(
                termination="final_answer",
                final_answer=text or best_effort(self.settings, run),
                final_answer_present=bool(text),
            )
        run.tool_calls += len(calls)
        if stop is not None:
            self._close_calls(run, calls, stop.reason)
            if not stop.soft:
                return self._hard(run, stop)
            run.stopping = stop
            return []
        return calls

    def _tool_turn(
        self,
        run: Run,
        calls: list[ToolCall],
        ledger: dict[str, ToolResult],
        failed_here: dict[str, ToolResult],
    ) -> ToolTurn:
        """``before_tool``, the call (executed, skipped, refused or answered from a ledger),
        ``after_tool`` for each proposed call in turn: returns the run's outcome when a hard
        stop ends the run, else None (a soft stop or a cancellation leaves the rest unrun)."""
        hooks = self.hooks
        texts = self.texts
        for i, call in enumerate(calls):
            if run.cancel.is_set():
                self._close_calls(run, calls[i:], "cancelled")
                return None
            res = hooks.before_tool(run, call)
            skip = None
            if res.verdicts:  # the common case has none: no property reads, no checks
                res = self._note(run, "before_tool", res)
                stop = res.stop
                if stop is not None:
                    self._close_calls(run, calls[i:], stop.reason)
                    if not stop.soft:
                        return self._hard(run, stop)
                    run.stopping = stop
                    return None
                skip = res.skip
            if skip is not None:
                result = ToolResult(content=skip.observation, skipped=True, skipped_by=skip.plugin)
            elif call.error is not None or call.tool is None or call.arguments is None:
                result = invalid_result(texts, run, call)
            elif (
                call.idempotency_key is not None
                and (
                    earlier := ledger.get(call.idempotency_key)
                    or failed_here.get(call.idempotency_key)
                )
                is not None
                and not earlier.retryable
            ):
                result = side_effect_replay(texts, call, earlier)
                note_ledger_answer(run, call, "conversation", earlier)
            elif (
                call.idempotency_key is not None
                and run.shared is not None
                and (entry := run.shared.claim(run, call)) is not None
            ):
                # the shared ledger: another run executed (or is executing) this key
                result = shared_replay(texts, run, call, entry)
                note_ledger_answer(run, call, "shared", entry)
                if entry.state == "done":
                    ledger[call.idempotency_key] = result
            else:
                ctx = ToolContext(run.run_id, run.clock, run.cancel)
                if call.timeout is not None:
                    ctx.deadline = run.clock.now() + call.timeout
                result = yield RunTool(call, call.tool, call.arguments, ctx)
                run.tools_executed += result.attempts  # the runtime's retries execute too
                if call.idempotency_key is not None:
                    # Every executed side effect is remembered, whatever its outcome; only a
                    # failure that stays retryable (after_tool plugins may spend a retry
                    # budget and clear the flag on this very object) runs again.
                    done = result.ok or result.error in IN_DOUBT
                    (ledger if done else failed_here)[call.idempotency_key] = result
                    if run.shared is not None:
                        run.shared.finish(run, call, result)
            result.content = self._clip(result.content)
            run.add_message({"role": "tool", "tool_call_id": call.id, "content": result.content})
            if result.ok and not result.skipped:
                run.last_observation = result.content
            if signals.tool_finished.receivers:
                signals.send(signals.tool_finished, run, call=call, result=result)
            if result._digest is None:
                result._masks = self.answers
            res = hooks.after_tool(run, call, result)
            if not res.verdicts:
                continue
            res = self._note(run, "after_tool", res)
            stop = res.stop
            if stop is not None:
                self._close_calls(run, calls[i + 1 :], stop.reason)
                if not stop.soft:
                    return self._hard(run, stop)
                run.stopping = stop
                return None
        return None
