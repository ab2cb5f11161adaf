"""stall: tool results stop bringing anything new.

Each real tool result (skipped calls' synthetic observations are ignored) is compared with the
last ``window`` results: the same digest, or a token-set Jaccard similarity at or above
``similarity`` (CJK characters one by one, words otherwise), makes it a stalled result and
adds one to ``run.stall_rounds``; a novel result resets the streak.  ``warn_after`` stalled
results in a row warn; ``stop_after`` in a row stop the run with ``stall``.  This catches an
agent that explores "different" searches that all return the same nothing.

The same answer to a *different* question is news, not a stall: four products each "in
stock", five flights each "available" -- checking several items one by one is healthy.  So a
result that repeats the result of a different call (another fingerprint) only counts when it
says nothing: a failure, or text matching ``empty_patterns`` (no results, not found, an empty
list).  ``different_calls = "any"`` counts every repeat, the strictest reading.

A successful call of a tool not declared ``read_only`` (a side effect) changed the world: that
is progress however much its confirmation resembles the last one (updating three reservations
echoes three near-identical reservation records), so it resets the streak.

State per run is bounded: ``window`` (digest, token set) pairs and a counter.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.plugin import check_patterns, check_templates
from loopwarden.plugins._text import token_set

__all__ = ["Stall", "StallSettings"]


class StallSettings(PluginSettings):
    """``[plugins.stall]``."""

    window: int = Field(
        default=5, ge=1, description="a result is compared with this many earlier results (K)"
    )
    similarity: float = Field(
        default=0.9, gt=0, le=1,
        description="token-set Jaccard similarity at or above which a result repeats an earlier "
        "one (an equal digest always does)",
    )
    stop_after: int = Field(
        default=3, ge=1, description="stalled results in a row that stop the run"
    )
    warn_after: int | None = Field(
        default=2, ge=1,
        description="stalled results in a row that warn (null: never warn); below stop_after",
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
        "another question is news; \"any\" counts it always",
    )
    empty_patterns: list[str] = Field(
        default_factory=lambda: [
            r"\bNO_?RESULTS?\b", r"\bNOT_?FOUND\b", r"\bno (results?|matches|records?)\b",
            r"\bnothing (was )?found\b", r"^\s*(\[\s*\]|\{\s*\}|null|none|n/a)?\s*$",
            "没有(匹配|找到|相关|结果|记录)", "未找到", "无(结果|记录|匹配)", "查无",
        ],
        description="regular expressions (searched case-insensitively in the first max_chars "
        "characters) that mark a result as saying nothing",
    )
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

    @model_validator(mode="after")
    def _check(self) -> StallSettings:
        if self.warn_after is not None and self.warn_after >= self.stop_after:
            raise ValueError(
                f"warn_after ({self.warn_after}) must be below stop_after ({self.stop_after})"
            )
        check_templates(self, ("message", "stop_message"), dict(count=2, tool="t"))
        return self


@dataclass(slots=True)
class _State:
    recent: deque[tuple[str, frozenset[str], str]]  # (digest, token set, call fingerprint)
    streak: int = 0


class Stall(Plugin[StallSettings]):
    """Stops runs whose tool results keep repeating earlier ones."""

    name = "stall"
    Settings = StallSettings

    def __init__(self, settings: StallSettings | None = None) -> None:
        super().__init__(settings)
        patterns = self.settings.empty_patterns
        self._empty = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE) \
            if patterns else None

    def _says_nothing(self, result: ToolResult) -> bool:
        if not result.ok:
            return True
        return self._empty is not None and bool(
            self._empty.search(result.content[: self.settings.max_chars]))

    def new_state(self) -> _State:
        return _State(recent=deque(maxlen=self.settings.window))

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        if result.skipped:
            return None
        s = self.settings
        st: _State = self.state(run)
        digest = result.digest
        tokens = token_set(result.content, s.max_chars)
        changed_world = result.ok and call.tool is not None and not call.read_only
        fp = call.fingerprint
        # A repeat of another call's result counts only when the result says nothing.
        any_call = s.different_calls == "any" or self._says_nothing(result)
        best = 0.0  # the highest similarity -- exact whenever it reaches the threshold
        if not changed_world:  # (a side effect is progress: nothing to compare)
            n, threshold = len(tokens), s.similarity
            for d, t, f in st.recent:
                if f != fp and not any_call:
                    continue
                if d == digest:
                    best = 1.0
                    break
                m = len(t)
                if n != m and (n / m if n < m else m / n) < threshold:
                    continue  # Jaccard <= min/max: this pair cannot reach the threshold
                if n or m:  # jaccard(tokens, t), inlined
                    inter = len(tokens & t)
                    sim = inter / (n + m - inter)
                else:
                    sim = 1.0
                if sim > best:
                    best = sim
                    if best >= 1.0:
                        break
        stalled = bool(st.recent) and best >= s.similarity and not changed_world
        st.recent.append((digest, tokens, fp))
        if not stalled:
            st.streak = 0
            return None
        st.streak += 1
        run.stall_rounds += 1
        evidence: dict[str, Any] = dict(
            streak=st.streak, threshold=s.stop_after, similarity=round(best, 3),
            similarity_threshold=s.similarity, window=s.window, tool=call.name,
            fingerprint=call.fingerprint, signature=call.signature(), digest=digest,
            step=run.step,
        )
        fields = dict(count=st.streak, tool=call.name)
        if st.streak >= s.stop_after:
            return self.stop("stall", soft=s.soft, message=s.stop_message.format(**fields),
                             **evidence)
        if s.warn_after is not None and st.streak == s.warn_after:
            return self.warn(s.message.format(**fields), **evidence)
        return None
