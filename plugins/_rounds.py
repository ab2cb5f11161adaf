"""Rounds: the tool calls of one model turn (a parallel batch) judged as one.

A detector that counts "in a row" should count turns, not calls: twelve flight searches sent in
one batch are one attempt.  :class:`Rounds` lives in a detector's per-run state; the detector
calls :meth:`Rounds.batch` from ``after_response`` (the turn's size) and :meth:`Rounds.enter`
from ``after_tool`` for every result: it says whether the result opens a new round and whether
it closes one (the batch's last call is in).  Without an ``after_response`` for the call's turn
(a hook fed on its own, as in unit tests) every call is a round of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopwarden import ToolCall

__all__ = ["Rounds"]


@dataclass(slots=True)
class Rounds:
    batch_step: int = -1  # the model turn whose batch size is known
    batch_size: int = 1
    step: int = -1  # the round being judged
    seen: int = 0  # its results so far

    def batch(self, step: int, size: int) -> None:
        """The model turn ``step`` proposed ``size`` calls."""
        self.batch_step, self.batch_size = step, max(1, size)

    def enter(self, call: ToolCall) -> tuple[bool, bool]:
        """Count ``call``'s result in; return (opens a new round, closes the round)."""
        batched = self.batch_step == call.step
        new = not batched or call.step != self.step
        if new:
            self.step, self.seen = call.step, 0
        self.seen += 1
        size = self.batch_size if batched else 1
        return new, call.index >= size - 1 or self.seen >= size
