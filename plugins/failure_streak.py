"""failure_streak: tool call after tool call fails.

A real tool result (skipped calls' synthetic observations are ignored) is a failure when the
loop marked it failed (``result.ok`` is False: an exception, a timeout, an unknown tool, bad
arguments) or when its text looks like an error -- many tools report failures as ordinary
text.  The error-like patterns (``patterns``, regular expressions searched in the first
``scan_chars`` characters) default to ``ERROR``, ``NOT_FOUND``, ``TIMEOUT``, ``UNAVAILABLE`` as
words, and Python tracebacks.  A success resets the streak; ``warn_after`` failures in a row
warn, ``stop_after`` in a row stop the run with ``failure_streak``.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.plugin import check_patterns, check_templates

__all__ = ["DEFAULT_PATTERNS", "FailureStreak", "FailureStreakSettings"]

DEFAULT_PATTERNS: tuple[str, ...] = (
    r"\bERROR\b",
    r"\bNOT_FOUND\b",
    r"\bTIMEOUT\b",
    r"\bUNAVAILABLE\b",
    r"Traceback \(most recent call last\)",
)


class FailureStreakSettings(PluginSettings):
    """``[plugins.failure_streak]``."""

    stop_after: int = Field(
        default=3, ge=1, description="failed results in a row that stop the run"
    )
    warn_after: int | None = Field(
        default=2, ge=1,
        description="failed results in a row that warn (null: never warn); below stop_after",
    )
    patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PATTERNS),
        description="regular expressions that make a result's text a failure (searched in its "
        "first scan_chars characters); results with ok = false always are",
    )
    ignore_case: bool = Field(default=False, description="match the patterns case-insensitively")
    scan_chars: int = Field(
        default=500, ge=1, description="how much of a result's text the patterns look at"
    )
    soft: bool = Field(
        default=True,
        description="stop softly (one last tool-less turn to answer from what is known); "
        "false stops at once with the best-effort answer",
    )
    message: str = Field(
        default="Your last {count} tool calls failed (latest: {error}). Do not keep trying the "
        "same way; change approach or tell the user what is not possible.",
        description="the warning ({count}, {error}: first line of the latest failure, {tool})",
    )
    stop_message: str = Field(
        default="The last {count} tool calls all failed (latest: {error}).",
        description="why the run stops, put before the wrap-up instruction of a soft stop "
        "({count}, {error}, {tool})",
    )

    @field_validator("patterns")
    @classmethod
    def _compile(cls, v: list[str]) -> list[str]:
        return check_patterns(v)

    @model_validator(mode="after")
    def _check(self) -> FailureStreakSettings:
        if self.warn_after is not None and self.warn_after >= self.stop_after:
            raise ValueError(
                f"warn_after ({self.warn_after}) must be below stop_after ({self.stop_after})"
            )
        check_templates(self, ("message", "stop_message"), dict(count=2, error="e", tool="t"))
        return self


_EVIDENCE_FAILURES = 5  # the latest failures kept as evidence


@dataclass(slots=True)
class _State:
    failures: deque[dict[str, str]]  # the latest failures of the streak (evidence)
    streak: int = 0


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().split("\n", 1)[0].strip()
    return line[:limit] + "..." if len(line) > limit else line


class FailureStreak(Plugin[FailureStreakSettings]):
    """Stops runs whose tool calls keep failing."""

    name = "failure_streak"
    Settings = FailureStreakSettings

    def __init__(self, settings: FailureStreakSettings | None = None) -> None:
        super().__init__(settings)
        s = self.settings
        flags = re.IGNORECASE if s.ignore_case else 0
        self._error_text: re.Pattern[str] | None = (
            re.compile("|".join(f"(?:{p})" for p in s.patterns), flags) if s.patterns else None
        )

    def new_state(self) -> _State:
        return _State(failures=deque(maxlen=min(self.settings.stop_after, _EVIDENCE_FAILURES)))

    def failed(self, result: ToolResult) -> bool:
        """Whether ``result`` counts as a failure (see the module docstring)."""
        if not result.ok:
            return True
        pat = self._error_text
        if pat is None:
            return False
        return pat.search(result.content[: self.settings.scan_chars]) is not None

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        if result.skipped:
            return None
        st: _State = self.state(run)
        if not self.failed(result):
            st.streak = 0
            st.failures.clear()
            return None
        s = self.settings
        st.streak += 1
        error = _first_line(result.content)
        st.failures.append({"tool": call.name, "error": error, "kind": result.error or "text"})
        evidence: dict[str, Any] = dict(
            streak=st.streak, threshold=s.stop_after, failures=list(st.failures), step=run.step
        )
        fields = dict(count=st.streak, error=error, tool=call.name)
        if st.streak >= s.stop_after:
            return self.stop("failure_streak", soft=s.soft,
                             message=s.stop_message.format(**fields), **evidence)
        if s.warn_after is not None and st.streak == s.warn_after:
            return self.warn(s.message.format(**fields), **evidence)
        return None
