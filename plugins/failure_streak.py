"""failure_streak: tool call after tool call fails.

A real tool result (skipped calls' synthetic observations are ignored) is a failure when the
loop marked it failed (``result.ok`` is False: an exception, a timeout, an unknown tool, bad
arguments) or when its text looks like an error -- many tools report failures as ordinary
text.  The error-like patterns (``patterns``, regular expressions searched in the first
``scan_chars`` characters) default to ``ERROR``, ``NOT_FOUND``, ``TIMEOUT``, ``UNAVAILABLE`` as
words, a result that starts with ``Error:``, and Python tracebacks.  Tools that answer in text
with no error flag at all (text-action environments, encyclopedia search, a bare shell) fail
in recognisable *shapes* -- ``Invalid action!``, ``Could not find X. Similar: [...]``,
``command not found``, ``No such file or directory`` -- read from the result's first line by
``failure_shapes`` (:mod:`loopwarden.plugins._failures`: a result that states its own status,
an exit code or a JSON error field, is judged by it, never by its text).  A success resets the
streak; ``warn_after`` failed rounds in a row warn, ``stop_after`` in a row stop the run with
``failure_streak``.

A parallel batch (the tool calls of one model turn) is one round: it failed when every result
in it failed, and one success in it resets the streak.  Results of ``neutral_tools`` -- tools
that do nothing in the world (``think``, ``calculate``) -- neither count nor reset: thinking
between two failures does not make the next one a first.

A streak is evidence of a loop only while nothing changed in between.  A failed call that may
change state (:attr:`loopwarden.ToolCall.may_change_state`: a side effect, or a tool whose
nature is not declared, such as a coding agent's ``bash``) and fails *differently* from the
failure before it is an agent trying things -- install, edit, run again and meet the next error
-- so its round starts a new streak instead of extending the old one; the same failure again
(the same output, or a failure of the same shape: ``Could not find X`` then ``Could not find
Y``) extends it.  Failures of read-only tools (a lookup that finds nothing, with
one id after another) extend the streak whatever they say.

A streak that is one call failing the same way again and again -- the same tool and arguments,
the same failure -- is a repeat: the evidence that an agent will not escape it is how often it
repeats, and agents do retry a failing command a few times before moving on (a compiler that
is not installed, run four times).  Such a streak stops at ``same_call_stop_after`` (5, the
fifth identical call, as ``repeat_call`` stops) instead of ``stop_after``; it warns as any
streak does.  Streaks of different calls -- different actions each answered ``Invalid
action!`` -- stop at ``stop_after``.

With ``across_turns`` (default) the streak carries on through the conversation's next user
turn: a booking that fails, is discussed with the user, and fails again with the same kind of
error is the same streak.  Only a success resets it.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

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
from loopwarden.sanitize import first_line as _first_line

__all__ = ["DEFAULT_PATTERNS", "FailureStreak", "FailureStreakSettings"]

DEFAULT_PATTERNS: tuple[str, ...] = (
    r"\bERROR\b",
    r"^\s*[Ee]rror\s*:",  # a result that starts "Error: ..." (many tools report failures so)
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
        default=2,
        ge=1,
        description="failed results in a row that warn (null: never warn); below stop_after",
    )
    same_call_stop_after: int = Field(
        default=5,
        ge=1,
        description="a streak of one call (the same tool and arguments) failing the same way "
        "each time stops here instead of at stop_after (the higher of the two applies): a "
        "repeat, judged by how often it repeats",
    )
    patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PATTERNS),
        description="regular expressions that make a result's text a failure (searched in its "
        "first scan_chars characters); results with ok = false always are",
    )
    failure_shapes: dict[str, str] = shapes_field()
    ignore_case: bool = Field(default=False, description="match the patterns case-insensitively")
    across_turns: bool = Field(
        default=True,
        description="the streak carries on into the conversation's next user turn (only a "
        "success resets it); false: every run starts afresh",
    )
    neutral_tools: list[str] = Field(
        default_factory=lambda: ["think", "calculate"],
        description="tools whose results neither count as failures nor reset the streak "
        "(no-op tools: thinking, arithmetic)",
    )
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
        description="the warning ({count}, {error}: first line of the latest failure, quoted as "
        "data; {tool}: a registered tool's name, a made-up one quoted)",
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

    @field_validator("failure_shapes")
    @classmethod
    def _compile_shapes(cls, v: dict[str, str]) -> dict[str, str]:
        return check_shapes(v)

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
class _Streak:
    failures: deque[dict[str, str]]  # the latest failures of the streak (evidence)
    streak: int = 0  # failed rounds in a row
    last_digest: str | None = None  # the output of the streak's latest failure
    #: (call fingerprint, failure) of the streak's first failure, and whether every failure
    #: since was the same call failing the same way
    first_key: tuple[str, str] | None = None
    same_call: bool = True
    latest_tool: str = ""  # the latest failure's tool, for a note (see loopwarden.notes)


@dataclass(slots=True)
class _State:
    own: _Streak  # the run's streak (without across_turns)
    rounds: Rounds = field(default_factory=Rounds)
    round_failed: bool = True  # every counted result so far failed
    round_counted: int = 0  # results that counted (not skipped, not neutral)
    round_news: bool = False  # a state-changing call failed differently: a new streak


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
        self._neutral = frozenset(s.neutral_tools)
        self._shapes = FailureShapes(s.failure_shapes)

    def _new_streak(self) -> _Streak:
        return _Streak(failures=deque(maxlen=min(self.settings.stop_after, _EVIDENCE_FAILURES)))

    def new_state(self) -> _State:
        return _State(own=self._new_streak())

    def new_conversation_state(self) -> _Streak:
        return self._new_streak()

    def failed(self, result: ToolResult) -> bool:
        """Whether ``result`` counts as a failure (see the module docstring)."""
        return self.failure(result) is not None

    def failure(self, result: ToolResult) -> str | None:
        """The kind of failure ``result`` is -- the loop's error kind, ``"text"`` for an
        error-like pattern, or the name of a failure shape -- or None for a success."""
        if not result.ok:
            return result.error or "error"
        pat = self._error_text
        if pat is not None and pat.search(result.content[: self.settings.scan_chars]):
            return "text"
        return self._shapes.match(result.content)

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> None:
        """Note the size of this turn's batch: its calls are judged as one round."""
        st: _State = self.state(run)
        st.rounds.batch(run.step, len(response.calls))

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        st: _State = self.state(run)
        box: _Streak = self.conversation_state(run) if self.settings.across_turns else st.own
        new_round, last = st.rounds.enter(call)
        if new_round:
            st.round_failed, st.round_counted, st.round_news = True, 0, False
        if not result.skipped and call.name not in self._neutral:
            st.round_counted += 1
            kind = self.failure(result)
            if kind is not None:
                # a failure of a shape is the same failure whatever its wording
                shaped = result.ok and kind != "text"
                same_as = f"shape:{kind}" if shaped else result.digest
                if call.may_change_state and same_as != box.last_digest:
                    st.round_news = True
                box.last_digest = same_as
                key = (call.fingerprint, same_as)
                if box.first_key is None:
                    box.first_key, box.same_call = key, True
                elif key != box.first_key:
                    box.same_call = False
                box.latest_tool = tool_name(call)
                box.failures.append(
                    {
                        "tool": call.name,
                        "error": _first_line(result.content),
                        "kind": kind,
                    }
                )
            else:
                st.round_failed = False
        if not last:
            return None  # the round is judged once its last call is in
        if not st.round_counted:
            return None  # nothing in this round counted either way
        if not st.round_failed:
            box.streak = 0
            box.failures.clear()
            box.last_digest = None
            box.latest_tool = ""
            box.first_key, box.same_call = None, True
            return None
        st.round_counted = 0  # judged
        s = self.settings
        if st.round_news and box.streak:
            # a state-changing call failed in a new way: the agent is trying things
            box.streak = 0
            while len(box.failures) > 1:
                box.failures.popleft()
            box.first_key, box.same_call = None, True
        if box.first_key is None:  # (the round's failures started this streak afresh)
            box.first_key = (call.fingerprint, box.last_digest or "")
        box.streak += 1
        # (one failure is no repeat yet: a streak of one call is judged so from its second)
        repeat = box.same_call and box.streak >= 2
        threshold = max(s.stop_after, s.same_call_stop_after) if repeat else s.stop_after
        latest = box.failures[-1] if box.failures else {"tool": call.name, "error": ""}
        error = latest["error"]
        evidence: dict[str, Any] = dict(
            count=box.streak,
            streak=box.streak,
            threshold=threshold,
            same_call=repeat,
            failures=list(box.failures),
            tool=latest["tool"],
            step=run.step,
        )
        # the error line and a made-up tool name are model / tool text: quoted as data
        fields = dict(count=box.streak, error=error, tool=box.latest_tool or tool_name(call))
        if box.streak >= threshold:
            return self.stop(
                "failure_streak",
                soft=s.soft,
                message=render_note(s.stop_message, **fields),
                **evidence,
            )
        if s.warn_after is not None and box.streak == s.warn_after:
            return self.warn(render_note(s.message, **fields), **evidence)
        return None
