"""no_progress: the model keeps saying the same thing while its tools bring nothing new.

Each non-empty model content (in a turn that proposes tool calls) becomes a token set once:
CJK characters one by one, words otherwise (see :mod:`loopwarden.plugins._text`).  When the
last ``window`` contents are each at least ``threshold`` Jaccard-similar to the one before,
the wording has stalled.  Similar wording alone is weak evidence -- "checking order 88231's
details / logistics / refund" is progress -- so it is corroborated with the tool results that
arrived since the oldest of those contents: if none of them was new, the run stops with
``no_progress``; if some were new, the run goes on (``warn_on_similar = true``
warns once per streak: weak evidence, off by default).  Empty contents (usual in function
calling) are skipped, neither similar nor dissimilar.  A turn without tool calls is the final
answer and is not judged.

**What is new.**  Answers are compared with their volatile parts masked
(:mod:`loopwarden.fingerprint`); skipped calls bring nothing.  A *substantive* answer is new when
the run has not seen it from any call: different searches answered by the same document bring
nothing new.  An *acknowledgement* -- an answer of at most ``ack_max_chars`` characters
(``OK``, ``executed successfully``, ``Query OK, 0 rows affected (0.01 sec)``, ``in stock``,
``没有找到符合条件的房间。``), JSON that holds nothing, or a failure -- says only what became of
this call, so it is new when *this call* has not had it before: another statement acknowledged
is another step taken, another date without rooms is another date checked.

**Inside one streamed answer** (``on_model_delta``, streamed runs only): an answer that says
the same sentence ``stream_repeats`` times is degenerate -- a model stuck in a loop within one
turn, paid for token by token.  The stream is cut at that sentence and the run stops with
``no_progress`` (``rule = "repeated_sentence"``; soft per ``soft``: the tool-less wrap-up turn
answers instead of the cut text).  Sentences end at ``。！？!?.;；`` or a line break; shorter
than ``min_sentence_chars`` ones ("OK.", list numbers) are not counted.

State per run is bounded: ``window`` token sets, the last ``result_memory`` result digests, and
for a streamed answer one sentence being read and at most 256 distinct sentences counted.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from loopwarden import (
    ModelRequest,
    ModelResponse,
    Plugin,
    PluginSettings,
    Run,
    ToolCall,
    ToolResult,
    Verdict,
    hookimpl,
)
from loopwarden.events import ModelDelta
from loopwarden.plugin import check_templates
from loopwarden.plugins._text import jaccard, structurally_empty, token_set

__all__ = ["NoProgress", "NoProgressSettings"]


class NoProgressSettings(PluginSettings):
    """``[plugins.no_progress]``."""

    window: int = Field(default=3, ge=2, description="consecutive non-empty contents compared")
    threshold: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Jaccard similarity (CJK character sets, word sets otherwise) at or above "
        "which two consecutive contents count as the same",
    )
    warn_on_similar: bool = Field(
        default=False,
        description="warn (once per streak) when the contents are similar but tool results "
        "still bring something new -- weak evidence, off by default: an agent that words "
        "its turns alike while its tools answer new things is working (docs/defaults.md)",
    )
    soft: bool = Field(
        default=True,
        description="stop softly (one last tool-less turn to answer from what is known); "
        "false stops at once with the best-effort answer",
    )
    result_memory: int = Field(
        default=32,
        ge=1,
        description="result digests remembered to tell a new tool result from a seen one",
    )
    max_chars: int = Field(
        default=2000, ge=1, description="only this many characters of a content are compared"
    )
    ack_max_chars: int = Field(
        default=48,
        ge=0,
        description="a tool answer of at most this many characters (volatile parts masked), JSON "
        "holding nothing, or a failure is an acknowledgement: new when its call has not had it "
        "before; a longer answer is substantive content: new only when no call has had it "
        "before (0: every answer is judged per call, as an acknowledgement)",
    )
    message: str = Field(
        default="Your last {count} messages say nearly the same thing. Make sure the next step "
        "brings new information, or answer now.",
        description="the warning for similar contents with new results ({count}, "
        "{similarity}: the lowest similarity in the window)",
    )
    stop_message: str = Field(
        default="The run made no progress: {count} nearly identical messages and no new tool "
        "results.",
        description="why the run stops, put before the wrap-up instruction of a soft stop "
        "({count}, {similarity})",
    )

    stream_repeats: int | None = Field(
        default=4,
        ge=2,
        description="a sentence said this many times inside one streamed answer cuts the "
        "stream and stops the run (null: off)",
    )
    min_sentence_chars: int = Field(
        default=6, ge=1, description="shorter sentences are not counted as repeats"
    )
    repeat_message: str = Field(
        default="The answer repeated the same sentence {count} times; it was cut there.",
        description="why a streamed answer was cut ({count}, {sentence})",
    )

    @model_validator(mode="after")
    def _check(self) -> NoProgressSettings:
        check_templates(self, ("message", "stop_message"), dict(count=3, similarity=0.9))
        check_templates(self, ("repeat_message",), dict(count=3, sentence="..."))
        return self


@dataclass(slots=True)
class _Content:
    tokens: frozenset[str]
    similarity: float | None  # to the previous non-empty content
    step: int
    new_results: int = 0  # new tool results that arrived after this content


_SENTENCE_END = re.compile("[。！？!?.;；\n]")
_MAX_SENTENCE_CHARS = 400  # a longer "sentence" is counted in pieces of this size
_MAX_SENTENCES = 256  # distinct sentences counted per answer (later new ones are not)


@dataclass(slots=True)
class _Echo:
    """The sentences of the streamed answer being read (reset for each answer): the pieces
    of the sentence not yet ended (``size`` characters), and the counts of those that did."""

    step: int
    buf: list[str] = field(default_factory=list)
    size: int = 0
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _State:
    contents: deque[_Content]
    echo: _Echo | None = None
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    warned: bool = False
    similar: int = 0  # contents in a row, up to the latest, similar to the one before


class NoProgress(Plugin[NoProgressSettings]):
    """Stops runs whose wording and tool results have both stopped changing."""

    name = "no_progress"
    Settings = NoProgressSettings

    def new_state(self) -> _State:
        return _State(contents=deque(maxlen=self.settings.window))

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        content = (response.content or "").strip()
        if not content or not response.calls:
            return None
        s = self.settings
        st: _State = self.state(run)
        tokens = token_set(content, s.max_chars)
        contents = st.contents
        sim = jaccard(tokens, contents[-1].tokens) if contents else None
        contents.append(_Content(tokens, sim, run.step))
        st.similar = st.similar + 1 if sim is not None and sim >= s.threshold else 0
        if len(contents) < s.window:
            return None
        # the window's contents are each similar to the one before <=> the last window - 1
        # contents were (a counter: constant work, no scan of the window)
        if st.similar < s.window - 1:
            st.warned = False
            return None
        sims = [c.similarity for c in contents][1:]
        lowest = min(x for x in sims if x is not None)
        new = sum(c.new_results for c in st.contents) - st.contents[-1].new_results
        evidence: dict[str, Any] = dict(
            similarities=[round(x, 3) for x in sims if x is not None],
            threshold=s.threshold,
            window=s.window,
            new_results=new,
            steps=[c.step for c in st.contents],
        )
        fields = dict(count=s.window, similarity=round(lowest, 2))
        if new == 0:
            return self.stop(
                "no_progress", soft=s.soft, message=s.stop_message.format(**fields), **evidence
            )
        if s.warn_on_similar and not st.warned:
            st.warned = True
            return self.warn(s.message.format(**fields), **evidence)
        return None

    @hookimpl
    def on_model_delta(self, run: Run, request: ModelRequest, delta: ModelDelta) -> Verdict | None:
        """Count the sentences of a streamed answer; stop at the ``stream_repeats``-th
        saying of one (work bounded by the delta's length: the delta is searched for sentence
        ends and kept in pieces, not character by character)."""
        s = self.settings
        limit = s.stream_repeats
        if limit is None:
            return None
        st: _State = self.state(run)
        echo = st.echo
        if echo is None or echo.step != request.step or delta.index == 0:
            echo = st.echo = _Echo(request.step)
        text = delta.text
        end = len(text)
        pos = 0
        buf = echo.buf
        while pos < end:
            # the sentence ends at its first end mark, or when it reaches the size cap
            room = _MAX_SENTENCE_CHARS - echo.size
            mark = _SENTENCE_END.search(text, pos, min(end, pos + room))
            if mark is not None:
                cut = mark.end()
            elif pos + room <= end:
                cut = pos + room
            else:  # the sentence goes on in the next delta
                buf.append(text[pos:])
                echo.size += end - pos
                break
            buf.append(text[pos:cut])
            pos = cut
            sentence = "".join(buf).strip().casefold()
            buf.clear()
            echo.size = 0
            if len(sentence) < s.min_sentence_chars:
                continue
            counts = echo.counts
            n = counts.get(sentence, 0) + 1
            if n == 1 and len(counts) >= _MAX_SENTENCES:
                continue
            counts[sentence] = n
            if n >= limit:
                return self.stop(
                    "no_progress",
                    soft=s.soft,
                    message=s.repeat_message.format(count=n, sentence=sentence[:80]),
                    rule="repeated_sentence",
                    count=n,
                    threshold=limit,
                    signature=sentence[:120],
                    tokens=delta.tokens,
                )
        return None

    def _acknowledgement(self, result: ToolResult) -> bool:
        """Whether an answer only says what became of its call (see the module docstring)."""
        limit = self.settings.ack_max_chars
        said = result.said
        return not limit or not result.ok or len(said.strip()) <= limit or structurally_empty(said)

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        """Count a result as new when the run has not had this answer (its digest, volatile
        parts masked) recently -- from any call for substantive content, from this call
        (its fingerprint) for an acknowledgement.  Skips are not results."""
        if result.skipped:
            return
        st: _State = self.state(run)
        tool = call.tool
        if tool is not None and tool.likely_repeatable:
            # a hand-off or a wait: repeating it is the run ending, or time passing
            if st.contents:
                st.contents[-1].new_results += 1
            return
        digest = (
            f"{call.fingerprint}#{result.digest}"
            if self._acknowledgement(result)
            else result.digest
        )
        if digest in st.seen:
            st.seen.move_to_end(digest)
            return
        st.seen[digest] = None
        if len(st.seen) > self.settings.result_memory:
            st.seen.popitem(last=False)
        if st.contents:
            st.contents[-1].new_results += 1
