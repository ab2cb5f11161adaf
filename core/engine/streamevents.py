"""The events a streamed run yields (:mod:`loopwarden.engine.streaming` re-exports them, and
is where callers import them from): text deltas, tool calls proposed / executed / skipped,
verdicts, an answer cut mid-stream and, always last, the end of the run with its record.

Plain frozen values, built by the streaming drivers from the run's signals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from loopwarden.events import ToolCall, ToolResult
from loopwarden.run import Run, RunOutcome
from loopwarden.verdicts import Verdict

__all__ = [
    "ResponseCut",
    "RunEnd",
    "StreamEvent",
    "TextDelta",
    "ToolCallExecuted",
    "ToolCallProposed",
    "ToolCallSkipped",
    "VerdictIssued",
]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the model's answer for model turn ``step``, as it arrived."""

    #: the model turn (0-based, as ``run.step`` during it)
    step: int
    #: the piece of text
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallProposed:
    """The model proposed ``call`` (parsed; ``before_tool`` has not run yet)."""

    #: the model turn that proposed it
    step: int
    #: the parsed call
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolCallExecuted:
    """``call`` ran; ``result`` is what the model sees (``result.ok`` False on a failure)."""

    #: the model turn that proposed it
    step: int
    #: the call
    call: ToolCall
    #: its result
    result: ToolResult


@dataclass(frozen=True, slots=True)
class ToolCallSkipped:
    """``call`` did not run: a plugin's skip verdict (``why="verdict"``, ``by`` the plugin),
    the side-effect ledger answered it (``"ledger"``: its key was already executed), or it
    was invalid (``"invalid"``: unknown tool, bad arguments)."""

    #: the model turn that proposed it
    step: int
    #: the call
    call: ToolCall
    #: the observation the model sees instead of the tool's output
    result: ToolResult
    #: why it did not run
    why: Literal["verdict", "ledger", "invalid"]
    #: who decided: the plugin, or ``loopwarden`` (the ledger, validation)
    by: str


@dataclass(frozen=True, slots=True)
class VerdictIssued:
    """A plugin returned ``verdict`` from ``hook`` (``shadow``: recorded, not honoured)."""

    #: the model turn it came in
    step: int
    #: the hook that returned it
    hook: str
    #: the verdict
    verdict: Verdict
    #: computed in shadow mode: recorded, not honoured
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class ResponseCut:
    """The answer of model turn ``step`` was cut mid-stream after ``tokens`` estimated output
    tokens: ``reason`` is ``max_output_tokens``, ``timeout``, ``cancelled`` or ``verdict``
    (an ``on_model_delta`` stop by ``by``)."""

    #: the model turn whose answer was cut
    step: int
    #: ``max_output_tokens``, ``timeout``, ``cancelled`` or ``verdict``
    reason: str
    #: estimated output tokens when it was cut
    tokens: int
    #: the plugin whose ``on_model_delta`` stop cut it (``verdict`` only)
    by: str | None = None


@dataclass(frozen=True, slots=True)
class RunEnd:
    """The run ended (always the last event): its outcome and its record."""

    #: the finished run
    run: Run
    #: how it ended
    outcome: RunOutcome
    #: its run record (docs/contracts.md)
    record: dict[str, Any]


StreamEvent = (
    TextDelta
    | ToolCallProposed
    | ToolCallExecuted
    | ToolCallSkipped
    | VerdictIssued
    | ResponseCut
    | RunEnd
)
