"""How a run ends: the :class:`~loopwarden.RunOutcome` for each way the step machine stops,
and the conversation history the next run of the same conversation starts from.

Pure functions of the run and the ``[run]`` settings (the fallback answer, the texts), apart
from the machine so that its turns read as control flow; the drivers' watchdog uses
:func:`best_effort` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwarden.clock import DEADLINE_SLACK_S
from loopwarden.exceptions import ModelError
from loopwarden.run import Run, RunOutcome

if TYPE_CHECKING:
    from loopwarden.config import RunConfig
    from loopwarden.events import ModelRequest, ModelResponse, ToolCall
    from loopwarden.verdicts import Stop

__all__: list[str] = []


def best_effort(settings: RunConfig, run: Run) -> str:
    """The answer a run ends with when the model gave none: its latest content, else its
    last observation, else the configured fallback."""
    if run.best_answer:
        return run.best_answer
    if run.last_observation:
        return settings.texts.best_effort.format(observation=run.last_observation[:1000])
    return settings.fallback_answer


def hard(
    settings: RunConfig,
    run: Run,
    stop: Stop,
    extra: dict[str, Any] | None = None,
    *,
    normal: bool = False,
    blocked: ToolCall | None = None,
) -> RunOutcome:
    """A hard stop: the stop's own answer, else -- for a stop in ``before_tool`` on a
    declared side effect (``blocked``), which the model's latest text may announce as done
    -- ``[run.texts] side_effect_blocked``, else the best effort.  The answer counts as
    present only from a plugin whose stops are ``normal`` endings (a terminal tool's
    hand-off): a guard's substitute answer is not the model's (docs/contracts.md)."""
    evidence = dict(stop.evidence)
    if extra:
        evidence.update(extra)
    if stop.answer is not None:
        answer, present = stop.answer, normal
    elif blocked is not None and blocked.side_effect and blocked.error is None:
        text = settings.texts.side_effect_blocked
        answer, present = text.format(name=blocked.name, reason=stop.reason), False
    else:
        answer, present = best_effort(settings, run), False
    return RunOutcome(
        termination=stop.reason,
        soft=False,
        stopped_by=stop.plugin,
        evidence=evidence,
        final_answer=answer,
        final_answer_present=present,
        message=stop.message,
    )


def vetoed(settings: RunConfig, run: Run, stop: Stop, *, normal: bool = False) -> RunOutcome:
    """A hard stop on an answer: the model's text is withheld, here and in later turns; the
    stop's ``answer`` (present only from a ``normal`` ending), else the fallback."""
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
        final_answer=stop.answer if stop.answer is not None else settings.fallback_answer,
        final_answer_present=stop.answer is not None and normal,
        message=stop.message,
    )


def soft_end(settings: RunConfig, run: Run, stop: Stop, response: ModelResponse) -> RunOutcome:
    """The end of a soft stop's final tool-less turn: the model's wrap-up answer."""
    content = (response.content or "").strip()
    return RunOutcome(
        termination=stop.reason,
        soft=True,
        stopped_by=stop.plugin,
        evidence=dict(stop.evidence),
        final_answer=content or best_effort(settings, run),
        final_answer_present=bool(content),
        message=stop.message,
    )


def model_failed(
    settings: RunConfig,
    run: Run,
    request: ModelRequest,
    err: BaseException,
    took: float,
    text: str,
) -> RunOutcome:
    """The outcome of a failed model call: ``cancelled`` when the run was cancelled,
    ``timeout`` when the call overran the time a plugin gave it (``request.timeout``),
    else ``model_error``.  ``text`` is the error, already redacted."""
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
        and took >= request.timeout - DEADLINE_SLACK_S
    ):
        termination = "timeout"
        evidence.update(limit_s=round(request.timeout, 3), elapsed_s=round(run.elapsed, 3))
    return RunOutcome(
        termination=termination,
        evidence=evidence,
        final_answer=best_effort(settings, run),
        error=text,
    )


def settled_history(settings: RunConfig, run: Run, outcome: RunOutcome) -> list[dict[str, Any]]:
    """The run's messages as the conversation's next turn must see them: every tool call
    answered, and the answer the user was given (a fallback, a best effort) as the last
    word.  The run's own transcript (``run.messages``) stays what happened."""
    msgs = list(run.messages)
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if m.get("role") == "assistant":
            answered = {x.get("tool_call_id") for x in msgs[i + 1 :] if x.get("role") == "tool"}
            text = settings.texts.not_executed.format(reason=outcome.termination)
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
