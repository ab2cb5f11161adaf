"""The tool turn: each proposed call of one step, from ``before_tool`` to ``after_tool``.

:class:`ToolTurn` is one of the two units the step machine (:meth:`Engine.machine
<loopwarden.engine.loop.Engine.machine>`) is made of, the model turn
(:class:`loopwarden.engine.calls.ModelTurn`) the other.  For each call the model proposed, in
order: ``before_tool`` (a stop ends the turn, a skip answers for the call); then the call is
answered without running when it is invalid, or a side effect already executed with its
idempotency key -- earlier in this conversation, or by another run the shared ledger *claims*
it for -- else the turn yields a :class:`~loopwarden.engine.effects.RunTool` effect that the
driver executes (:mod:`loopwarden.engine.execution`) and records the result in the ledgers
(the shared one *finished*); the observation is clipped and added to the conversation,
``tool_finished`` is sent and ``after_tool`` is called.

The unit is built once per engine over what it needs, passed in -- the hooks, the ``[run]``
settings and texts and the verdict handling (:class:`~loopwarden.engine.guards.Guards`), and
the answer masks -- and never reaches back into the engine; it holds no run state.  The
observations it writes for calls that do not run are functions of the texts, here too.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from loopwarden import signals
from loopwarden.engine.effects import Effect, NotStarted, RunTool
from loopwarden.engine.guards import CORE, Guards, Turn
from loopwarden.events import IN_DOUBT, ErrorKind, ToolCall, ToolResult
from loopwarden.fingerprint import AnswerMasks
from loopwarden.run import Run, RunOutcome
from loopwarden.sanitize import clean_text
from loopwarden.tools import ToolContext

if TYPE_CHECKING:
    from loopwarden.config import Texts
    from loopwarden.store import LedgerEntry

__all__ = [
    "ToolSteps",
    "ToolTurn",
    "invalid_result",
    "ledger_answer",
    "note_ledger_answer",
    "shared_replay",
    "side_effect_replay",
]

#: what a tool turn ends with: the run's outcome, or None to go on
ToolSteps = Generator[Effect, Any, RunOutcome | None]


class ToolTurn(Turn):
    """Runs the proposed calls of one step (see the module doc)."""

    __slots__ = ("answers",)

    def __init__(self, guards: Guards, answers: AnswerMasks) -> None:
        super().__init__(guards)
        #: what tool answers say, volatile parts masked: every detector's result digest
        self.answers = answers

    def clip(self, text: str) -> str:
        """An observation as the model sees it: cleaned, cut to ``max_observation_chars``."""
        if not text.isascii():  # clean_text leaves ASCII text as it is
            text = clean_text(text)
        limit = self.settings.max_observation_chars
        if limit is not None and len(text) > limit:
            return text[:limit] + f"\n...[truncated {len(text) - limit} characters]"
        return text

    def __call__(
        self,
        run: Run,
        calls: list[ToolCall],
        ledger: dict[str, ToolResult],
        failed_here: dict[str, ToolResult],
    ) -> ToolSteps:
        """``before_tool``, the call (executed, skipped, refused or answered from a ledger),
        ``after_tool`` for each proposed call in turn: returns the run's outcome when a hard
        stop ends the run, else None (a soft stop or a cancellation leaves the rest unrun)."""
        hooks = self.hooks
        texts = self.texts
        guards = self.guards
        for i, call in enumerate(calls):
            if run.cancel.is_set():
                guards.close_calls(run, calls[i:], "cancelled")
                return None
            res = hooks.before_tool(run, call)
            skip = None
            if res.verdicts:  # the common case has none: no property reads, no checks
                res = guards.note(run, "before_tool", res)
                stop = res.stop
                if stop is not None:
                    guards.close_calls(run, calls[i:], stop.reason)
                    if not stop.soft:
                        return guards.hard(run, stop, call)
                    run.stopping = stop
                    return None
                skip = res.skip
            if skip is not None:
                result = ToolResult(content=skip.observation, skipped=True, skipped_by=skip.plugin)
            elif call.error is not None or call.tool is None or call.arguments is None:
                result = invalid_result(texts, run, call)
            elif call.idempotency_key is not None and (
                (recorded := ledger_answer(texts, run, call, ledger, failed_here)) is not None
            ):
                result = recorded
            else:
                ctx = ToolContext(run.run_id, run.clock, run.cancel)
                if call.timeout is not None:
                    ctx.deadline = run.clock.now() + call.timeout
                try:
                    result = yield RunTool(call, call.tool, call.arguments, ctx)
                except NotStarted:
                    # the driver abandoned the call unstarted (the run was cancelled while
                    # this step ran): the claim above stands for nothing -- release it
                    if call.idempotency_key is not None and run.shared is not None:
                        run.shared.release(run, call)
                    raise
                run.tools_executed += result.attempts  # the runtime's retries execute too
                if call.idempotency_key is not None:
                    # Every executed side effect is remembered, whatever its outcome; only a
                    # failure that stays retryable (after_tool plugins may spend a retry
                    # budget and clear the flag on this very object) runs again.  A call
                    # cancelled before the tool started (attempts 0) executed nothing.
                    if result.attempts:
                        done = result.ok or result.error in IN_DOUBT
                        (ledger if done else failed_here)[call.idempotency_key] = result
                    if run.shared is not None:
                        run.shared.finish(run, call, result)
            result.content = self.clip(result.content)
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
            res = guards.note(run, "after_tool", res)
            stop = res.stop
            if stop is not None:
                guards.close_calls(run, calls[i + 1 :], stop.reason)
                if not stop.soft:
                    return guards.hard(run, stop)
                run.stopping = stop
                return None
        return None


# -- observations for calls that do not run ---------------------------------------------------


def ledger_answer(
    t: Texts,
    run: Run,
    call: ToolCall,
    ledger: dict[str, ToolResult],
    failed_here: dict[str, ToolResult],
) -> ToolResult | None:
    """The answer for a side effect already executed with ``call``'s idempotency key --
    earlier in this conversation (``ledger``; a failure of this run, ``failed_here``, unless
    retryable), or by another run the shared ledger knows -- noted on the run; None when the
    call is to run (the shared ledger then holds its claim).  The tool turn and the gateway's
    split tool turn both ask it."""
    key = call.idempotency_key
    if key is None:
        return None
    earlier = ledger.get(key) or failed_here.get(key)
    if earlier is not None and not earlier.retryable:
        result = side_effect_replay(t, call, earlier)
        note_ledger_answer(run, call, "conversation", earlier)
        return result
    if run.shared is not None and (entry := run.shared.claim(run, call)) is not None:
        # the shared ledger: another run executed (or is executing) this key
        result = shared_replay(t, run, call, entry)
        note_ledger_answer(run, call, "shared", entry)
        if entry.state == "done":
            ledger[key] = result
        return result
    return None


def invalid_result(t: Texts, run: Run, call: ToolCall) -> ToolResult:
    """The observation for an unknown tool or malformed / invalid arguments."""
    if call.error == "unknown_tool":
        available = ", ".join(run.tools.names) if run.tools is not None else "(none)"
        text = t.unknown_tool.format(name=call.name, available=available)
    elif call.error == "malformed_arguments":
        text = t.malformed_arguments.format(name=call.name, detail=call.error_detail)
    else:
        text = t.invalid_arguments.format(name=call.name, detail=call.error_detail)
    return ToolResult(content=text, ok=False, error=call.error)


def side_effect_replay(t: Texts, call: ToolCall, earlier: ToolResult) -> ToolResult:
    """The synthetic observation for a side effect already executed with this key."""
    if earlier.ok:
        text = t.side_effect_replayed.format(name=call.name, content=earlier.content)
    elif earlier.error in IN_DOUBT:
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


def note_ledger_answer(
    run: Run, call: ToolCall, source: str, earlier: ToolResult | LedgerEntry
) -> None:
    """Record on the run that ``call`` was answered from a record instead of running: its
    tool is *declared* a side effect, and its idempotency key was already executed -- earlier
    in this conversation (``source = "conversation"``) or by another run sharing the store's
    ledger (``"shared"``, within the ledger's scope)."""
    tool = call.tool
    keys = list(tool.idempotency_keys) if tool is not None and tool.idempotency_keys else None
    if isinstance(earlier, ToolResult):
        state = "done" if earlier.ok else "unknown" if earlier.error in IN_DOUBT else "failed"
        where = "earlier in this conversation"
    else:
        state = earlier.state
        if state == "running" and run.shared is not None and run.shared.stale(earlier):
            state = "unknown"
        where = "by another run sharing the ledger"
    run.ledger_answers.append(
        {
            "step": call.step,
            "tool": call.name,
            "call_id": call.id,
            "source": source,
            "state": state,
            "idempotency_keys": keys,
            "why": f"{call.name} is declared a side effect; the same "
            f"{'arguments ' + ', '.join(keys) if keys else 'arguments'} were executed {where}",
        }
    )


def shared_replay(t: Texts, run: Run, call: ToolCall, entry: LedgerEntry) -> ToolResult:
    """The observation for a side effect the shared ledger already holds: recorded by
    another run, in progress there, possibly taken effect, or a store that failed closed."""
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
