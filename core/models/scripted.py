"""The scripted model: plays a scenario's turns, offline and deterministic.

Each :meth:`complete` returns the next turn (:meth:`stream` the same turn, its text in
pieces).  After the last turn, ``then`` decides: ``repeat_last``, ``cycle`` or ``final``
(answer ``final_text``).  It always obeys a request without tools or with
``tool_choice="none"`` by answering ``final_text``, and with ``on_warning = "final"`` it
answers ``final_text`` as soon as a request carries a guard's warning.  Usage is estimated
with the project's token estimator over the actual request, so token growth is as quadratic
as a real run's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator

from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, Usage
from loopwarden.models.scenario import ScriptConfig
from loopwarden.models.tokens import TextEstimator, estimate_messages, estimate_text, estimate_tools

__all__ = ["PIECE_CHARS", "ScriptedModel"]

#: characters per streamed text delta (``stream``): a few words, as real endpoints send
PIECE_CHARS = 8


class ScriptedModel:
    """Plays one script; make one per run (it keeps its position)."""

    def __init__(
        self,
        script: ScriptConfig,
        *,
        name: str = "scripted",
        estimator: TextEstimator = estimate_text,
    ) -> None:
        #: the scripted turns it plays, in order
        self.script = script
        #: the model name runs record
        self.name = name
        #: counts the prompt tokens of each request (usage is estimated, not billed)
        self.estimator = estimator
        #: model calls made so far
        self.calls = 0
        self._pos = 0
        self._lock = threading.Lock()
        #: every request it was sent, in order (what a test may inspect)
        self.requests: list[ModelRequest] = []

    def _final(self) -> tuple[str | None, list[ProposedCall]]:
        return self.script.final_text, []

    def _next_turn(self) -> tuple[str | None, list[ProposedCall]]:
        turns = self.script.turns
        if self._pos < len(turns):
            turn = turns[self._pos]
            self._pos += 1
        elif not turns or self.script.then == "final":
            return self._final()
        elif self.script.then == "cycle":
            turn = turns[self._pos % len(turns)]
            self._pos += 1
        else:  # repeat_last
            turn = turns[-1]
        calls = [
            ProposedCall(
                name=c.name,
                arguments=c.arguments
                if isinstance(c.arguments, str)
                else json.dumps(c.arguments, ensure_ascii=False),
                id=c.id or "",
            )
            for c in turn.tool_calls
        ]
        return turn.content, calls

    def complete(self, request: ModelRequest) -> ModelResponse:
        """The next scripted turn as the response to ``request``."""
        with self._lock:
            self.calls += 1
            self.requests.append(request)
            tools_off = request.tool_choice == "none" or not request.tools
            if tools_off or (self.script.on_warning == "final" and request.notes):
                content, calls = self._final()
            else:
                content, calls = self._next_turn()
        prompt = request.estimated_tokens or (
            estimate_messages(request.messages, self.estimator)
            + estimate_tools(request.tools, self.estimator)
        )
        completion = self.estimator(content or "") + sum(
            self.estimator(c.name) + self.estimator(c.arguments) + 3 for c in calls
        )
        return ModelResponse(
            content=content,
            tool_calls=calls,
            usage=Usage(prompt=prompt, completion=max(completion, 1)),
            finish_reason="tool_calls" if calls else "stop",
            model=self.name,
        )

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """:meth:`complete`, for async runs."""
        return self.complete(request)

    def stream(self, request: ModelRequest) -> Iterator[str | ModelResponse]:
        """The turn :meth:`complete` answers, streamed: its text in pieces of
        :data:`PIECE_CHARS` characters, then the whole response (the same usage: a streamed
        scenario ends with the record of the unstreamed one)."""
        response = self.complete(request)
        text = response.content or ""
        for i in range(0, len(text), PIECE_CHARS):
            yield text[i : i + PIECE_CHARS]
        yield response

    async def astream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """:meth:`stream` for async runs."""
        for item in self.stream(request):
            yield item
