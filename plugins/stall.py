"""stall: tool results stop bringing anything new.

Each real tool result (skipped calls' synthetic observations are ignored) is compared with the
last ``window`` results: the same digest, or a token-set Jaccard similarity at or above
``similarity`` (CJK characters one by one, words otherwise), makes it a stalled result and
adds one to ``run.stall_rounds``; a novel result resets the streak.  ``warn_after`` stalled
results in a row warn; ``stop_after`` in a row stop the run with ``stall``.  This catches an
agent that explores "different" searches that all return the same nothing.

A successful call of a tool not declared ``read_only`` (a side effect) changed the world: that
is progress however much its confirmation resembles the last one (updating three reservations
echoes three near-identical reservation records), so it resets the streak.

State per run is bounded: ``window`` (digest, token set) pairs and a counter.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.plugins._text import jaccard, token_set

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

    @model_validator(mode="after")
    def _check(self) -> StallSettings:
        if self.warn_after is not None and self.warn_after >= self.stop_after:
            raise ValueError(
                f"warn_after ({self.warn_after}) must be below stop_after ({self.stop_after})"
            )
        for key in ("message", "stop_message"):
            try:
                getattr(self, key).format(count=2, tool="t")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"{key}: bad template field {exc}") from None
        return self


@dataclass(slots=True)
class _State:
    recent: deque[tuple[str, frozenset[str]]]
    streak: int = 0


class Stall(Plugin[StallSettings]):
    """Stops runs whose tool results keep repeating earlier ones."""

    name = "stall"
    Settings = StallSettings

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
        best = 0.0
        for d, t in st.recent:
            best = max(best, 1.0 if d == digest else jaccard(tokens, t))
            if best >= 1.0:
                break
        changed_world = result.ok and call.tool is not None and not call.read_only
        stalled = bool(st.recent) and best >= s.similarity and not changed_world
        st.recent.append((digest, tokens))
        if not stalled:
            st.streak = 0
            return None
        st.streak += 1
        run.stall_rounds += 1
        evidence: dict[str, Any] = dict(
            streak=st.streak, threshold=s.stop_after, similarity=round(best, 3),
            similarity_threshold=s.similarity, window=s.window, tool=call.name,
            fingerprint=call.fingerprint, digest=digest, step=run.step,
        )
        fields = dict(count=st.streak, tool=call.name)
        if st.streak >= s.stop_after:
            return self.stop("stall", soft=s.soft, message=s.stop_message.format(**fields),
                             **evidence)
        if s.warn_after is not None and st.streak == s.warn_after:
            return self.warn(s.message.format(**fields), **evidence)
        return None
