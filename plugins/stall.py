"""stall: tool results stop bringing anything new.

Each real tool result (skipped calls' synthetic observations are ignored) is compared with the
last ``window`` results: the same digest, or a token-set Jaccard similarity at or above
``similarity`` (CJK characters one by one, words otherwise), makes it a stalled result and
adds one to the run record's ``stall_rounds``; a novel result resets the streak.
``warn_after`` stalled results in a row warn; ``stop_after`` in a row stop the run with
``stall``.  This catches an agent that explores "different" searches that all return the
same nothing.

The same answer to a *different* question is news, not a stall: four products each "in
stock", five flights each "available" -- checking several items one by one is healthy.  So a
result that repeats the result of a different call (another fingerprint) only counts when it
says nothing: a failure, or text matching ``empty_patterns`` (no results, not found, an empty
list).  ``different_calls = "any"`` counts every repeat, the strictest reading.

Evidence has two strengths.  A result that repeats an earlier result of the *same* call, or
an empty result of the same tool whose query was only rephrased (free-text arguments changed),
is strong: ``warn_after`` / ``stop_after`` rounds.  An empty answer to a *different* query --
another date, airport or id, a sweep that a healthy agent makes ("no flight that day") -- is
weak: only ``sweep_warn_after`` / ``sweep_stop_after`` rounds of nothing else stop the run.
Empty means a failure -- flagged, or read from the text by ``failure_shapes`` (``Invalid
action!``, ``Could not find X. Similar: [...]``; :mod:`loopwarden.plugins._failures`) -- text
matching ``empty_patterns``, or JSON that holds nothing (``[]``, ``{}``, objects whose values
are all null or empty).

A streak that is one call answered the same way again and again (the same tool and arguments,
the same result) is a repeat: agents retry a few times before they move on, and the loops that
must be stopped repeat five times or more, so such a streak stops at ``same_call_stop_after``
stalled rounds (4: the fifth identical call, as ``repeat_call`` stops) instead of
``stop_after``; it warns as any streak does.

A parallel batch (the tool calls of one model turn) is one round: it is stalled when every
result in it is, and strong when one of them is.  The run record's ``stall_rounds`` counts
stalled rounds.

A successful call that may change state (:attr:`loopwarden.ToolCall.may_change_state`: a side
effect, or a tool whose nature is not declared, such as a coding agent's ``bash``) changed the
world: that is progress however much its confirmation resembles the last one (updating three
reservations echoes three near-identical reservation records; a test run after an edit), so it
resets the streak -- unless it is the same call as a recent one with the same result, which
evidently changed nothing.

State per run is bounded: ``window`` (digest, token set, call) entries and a few counters.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from loopwarden import (
    ModelResponse,
    Plugin,
    PluginSettings,
    Run,
    ToolCall,
    ToolResult,
    Verdict,
    hookimpl,
)
from loopwarden.notes import render_note, tool_name
from loopwarden.plugin import check_patterns, check_templates
from loopwarden.plugins._failures import FailureShapes, check_shapes, shapes_field
from loopwarden.plugins._rounds import Rounds
from loopwarden.plugins._text import free_text_differs, structurally_empty, token_set
from loopwarden.stash import StashKey

__all__ = ["Stall", "StallSettings"]


class StallSettings(PluginSettings):
    """``[plugins.stall]``."""

    window: int = Field(
        default=5, ge=1, description="a result is compared with this many earlier results (K)"
    )
    similarity: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="token-set Jaccard similarity at or above which a result repeats an earlier "
        "one (an equal digest always does)",
    )
    stop_after: int = Field(
        default=3,
        ge=1,
        description="stalled rounds in a row that stop the run (strong "
        "evidence: the same call's result again, or a rephrased query's empty result)",
    )
    warn_after: int | None = Field(
        default=2,
        ge=1,
        description="stalled rounds in a row that warn (null: never warn); below stop_after",
    )
    same_call_stop_after: int = Field(
        default=4,
        ge=1,
        description="stalled rounds that stop the run when every one is the same call "
        "answered the same way again (the higher of this and stop_after applies; 4: the "
        "fifth identical call)",
    )
    sweep_stop_after: int = Field(
        default=0,
        ge=0,
        description="stalled rounds in a row that stop the run when they are only empty "
        "answers to different queries (another date, code or id: weak evidence); 0 (the "
        "default): a sweep is warned about, never stopped -- max_steps bounds it",
    )
    sweep_warn_after: int | None = Field(
        default=4,
        ge=1,
        description="such weak rounds in a row that warn (null: never); below sweep_stop_after",
    )
    soft: bool = Field(
        default=True,
        description="stop softly (one last tool-less turn to answer from what is known); "
        "false stops at once with the best-effort answer",
    )
    different_calls: Literal["empty_only", "any"] = Field(
        default="empty_only",
        description="a result repeating the result of a different call counts as stalled only "
        "when it is empty-like (a failure, or matching empty_patterns): the same answer to "
        'another question is news; "any" counts it always',
    )
    empty_patterns: list[str] = Field(
        default_factory=lambda: [
            r"\bNO_?RESULTS?\b",
            r"\bNOT_?FOUND\b",
            r"\bno (results?|matches|records?)\b",
            r"\bnothing (was )?found\b",
            r"^\s*(\[\s*\]|\{\s*\}|null|none|n/a)?\s*$",
            "没有(匹配|找到|相关|结果|记录)",
            "未找到",
            "无(结果|记录|匹配)",
            "查无",
        ],
        description="regular expressions (searched case-insensitively in the first max_chars "
        "characters) that mark a result as saying nothing",
    )
    failure_shapes: dict[str, str] = shapes_field()
    max_chars: int = Field(
        default=4000, ge=1, description="only this many characters of a result are compared"
    )
    message: str = Field(
        default="Your last {count} tool results brought nothing new. Change approach, or answer "
        "from what you already know.",
        description="the warning ({count}: stalled results in a row, {tool})",
    )
    stop_message: str = Field(
        default="The last {count} tool results brought nothing new.",
        description="why the run stops, put before the wrap-up instruction of a soft stop "
        "({count}, {tool})",
    )

    @field_validator("empty_patterns")
    @classmethod
    def _compile(cls, patterns: list[str]) -> list[str]:
        return check_patterns(patterns)

    @field_validator("failure_shapes")
    @classmethod
    def _compile_shapes(cls, v: dict[str, str]) -> dict[str, str]:
        return check_shapes(v)

    @model_validator(mode="after")
    def _check(self) -> StallSettings:
        if self.warn_after is not None and self.warn_after >= self.stop_after:
            raise ValueError(
                f"warn_after ({self.warn_after}) must be below stop_after ({self.stop_after})"
            )
        if (
            self.sweep_warn_after is not None
            and self.sweep_stop_after
            and self.sweep_warn_after >= self.sweep_stop_after
        ):
            raise ValueError(
                f"sweep_warn_after ({self.sweep_warn_after}) must be below sweep_stop_after "
                f"({self.sweep_stop_after})"
            )
        check_templates(self, ("message", "stop_message"), dict(count=2, tool="t"))
        return self


@dataclass(slots=True)
class _State:
    #: (digest, token set, call fingerprint, tool name, arguments) of the latest results
    recent: deque[tuple[str, frozenset[str], str, str, dict[str, Any] | None]]
    streak: int = 0  # stalled rounds in a row
    strong: int = 0  # ... of which strong
    rounds: Rounds = field(default_factory=Rounds)
    round_stalled: bool = True  # every result so far stalled
    round_strong: bool = False  # one of them strongly
    round_best: float = 0.0
    round_digest: str | None = None  # the round's latest real result (None: nothing real yet)
    round_same: bool = True  # every result of the round repeats the same call's own result
    round_fp: str | None = None  # the round's call, while it has one fingerprint
    same_fp: str | None = None  # the streak's call, while every round is that call again


class Stall(Plugin[StallSettings]):
    """Stops runs whose tool results keep repeating earlier ones."""

    name = "stall"
    Settings = StallSettings

    def __init__(self, settings: StallSettings | None = None) -> None:
        super().__init__(settings)
        #: stalled rounds in a run (the record's ``stall_rounds``)
        self.stalled = StashKey[int]()
        patterns = self.settings.empty_patterns
        self._empty = (
            re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE) if patterns else None
        )
        self._shapes = FailureShapes(self.settings.failure_shapes)

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, int]:
        return {"stall_rounds": run.stash.get(self.stalled, 0)}

    def _says_nothing(self, result: ToolResult, failed_in_text: bool) -> bool:
        if not result.ok or failed_in_text:
            return True
        head = result.content[: self.settings.max_chars]
        return (self._empty is not None and bool(self._empty.search(head))) or (
            structurally_empty(head)
        )

    def new_state(self) -> _State:
        return _State(recent=deque(maxlen=self.settings.window))

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> None:
        """Note the size of this turn's batch: its calls are judged as one round."""
        st: _State = self.state(run)
        st.rounds.batch(run.step, len(response.calls))

    def _similarity(
        self, st: _State, digest: str, tokens: frozenset[str], call: ToolCall, empty: bool
    ) -> tuple[float, bool]:
        """The best similarity with a comparable earlier result, and whether it is strong
        evidence (the same call, or a rephrased query of the same tool)."""
        s = self.settings
        fp = call.fingerprint
        any_call = s.different_calls == "any" or empty
        best, strong = 0.0, False
        n, threshold = len(tokens), s.similarity
        for d, t, f, name, args in st.recent:
            same = f == fp
            if not same and not any_call:
                continue
            if d == digest:
                sim = 1.0
            else:
                m = len(t)
                if n != m and (n / m if n < m else m / n) < threshold:
                    continue  # Jaccard <= min/max: this pair cannot reach the threshold
                if n or m:  # jaccard(tokens, t), inlined
                    inter = len(tokens & t)
                    sim = inter / (n + m - inter)
                else:
                    sim = 1.0
                if sim < threshold:
                    continue
            is_strong = (
                same
                or s.different_calls == "any"
                or (name == call.name and free_text_differs(args, call.arguments))
            )
            if sim > best or (is_strong and not strong):
                best = max(best, sim)
                strong = strong or is_strong
            if strong and best >= 1.0:
                break
        return best, strong

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        st: _State = self.state(run)
        new_round, last = st.rounds.enter(call)
        if new_round:
            st.round_stalled, st.round_strong, st.round_best = True, False, 0.0
            st.round_digest = None
            st.round_same, st.round_fp = True, None
        tool = call.tool
        # skipped calls' synthetic observations never count, nor a hand-off's or a wait's
        # answer (undeclared tools whose repeats are expected)
        if not result.skipped and not (tool is not None and tool.likely_repeatable):
            self._observe(st, call, result)
        if not last or st.round_digest is None:
            return None  # judged once its last call is in, if anything real was in it
        if not st.round_stalled:
            st.streak = st.strong = 0
            st.same_fp = None
            return None
        st.round_stalled = False  # judged: later calls of this turn start nothing new
        same = st.round_same and st.round_fp is not None
        if st.streak == 0:
            st.same_fp = st.round_fp if same else None
        elif not same or st.round_fp != st.same_fp:
            st.same_fp = None
        st.streak += 1
        st.strong += 1 if st.round_strong else 0
        run.stash[self.stalled] = run.stash.get(self.stalled, 0) + 1
        return self._verdict(run, call, st, st.round_digest)

    def _observe(self, st: _State, call: ToolCall, result: ToolResult) -> None:
        """Compare ``result`` with the recent ones and fold it into the round."""
        s = self.settings
        digest = result.digest
        tokens = token_set(result.said, s.max_chars)  # volatile parts masked
        fp = call.fingerprint
        # A call that may change state is progress -- unless it is the same call again with
        # the same result (``cd repo/`` once more): then it evidently changed nothing; nor
        # did a failure read from its text (``Invalid action!``: the action was refused).
        failed_in_text = result.ok and self._shapes.match(result.content[: s.max_chars]) is not None
        again = any(d == digest and f == fp for d, _, f, _, _ in st.recent)
        changed_world = result.ok and not failed_in_text and call.may_change_state and not again
        st.round_same = st.round_same and again and st.round_fp in (None, fp)
        st.round_fp = fp
        best, strong = 0.0, False
        if not changed_world and st.recent:  # (a change is progress: nothing to compare)
            best, strong = self._similarity(
                st, digest, tokens, call, self._says_nothing(result, failed_in_text)
            )
        stalled = best >= s.similarity and not changed_world
        st.recent.append((digest, tokens, fp, call.name, call.arguments))
        st.round_stalled = st.round_stalled and stalled
        st.round_strong = st.round_strong or (stalled and strong)
        st.round_best = max(st.round_best, best)
        st.round_digest = digest

    def _verdict(self, run: Run, call: ToolCall, st: _State, digest: str) -> Verdict | None:
        s = self.settings
        threshold = (
            max(s.stop_after, s.same_call_stop_after) if st.same_fp is not None else s.stop_after
        )
        evidence: dict[str, Any] = dict(
            count=st.streak,
            streak=st.streak,
            strong=st.strong,
            threshold=threshold,
            same_call=st.same_fp is not None,
            sweep_threshold=s.sweep_stop_after,
            similarity=round(st.round_best, 3),
            similarity_threshold=s.similarity,
            window=s.window,
            tool=call.name,
            fingerprint=call.fingerprint,
            signature=call.signature(),
            digest=digest,
            step=run.step,
            rule="repeat" if st.round_strong else "sweep",
        )
        fields = dict(count=st.streak, tool=tool_name(call))  # a made-up name: quoted
        if st.strong >= threshold or (s.sweep_stop_after and st.streak >= s.sweep_stop_after):
            return self.stop(
                "stall", soft=s.soft, message=render_note(s.stop_message, **fields), **evidence
            )
        if (s.warn_after is not None and st.strong == s.warn_after and st.round_strong) or (
            s.sweep_warn_after is not None and st.streak == s.sweep_warn_after
        ):
            return self.warn(render_note(s.message, **fields), **evidence)
        return None
