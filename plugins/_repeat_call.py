"""The repeat_call plugin's data: its settings (``[plugins.repeat_call]``, validated) and
what one run remembers of each call fingerprint (:class:`_Entry`, :class:`_Pending`,
:class:`_State`).

Split from :mod:`loopwarden.plugins.repeat_call` (which re-exports
:class:`RepeatCallSettings`): that module decides what a repeat is and what to do about it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from loopwarden import PluginSettings, ToolCall
from loopwarden.plugin import check_templates


class RepeatCallSettings(PluginSettings):
    """``[plugins.repeat_call]``."""

    stop_at_repeat: int = Field(
        default=4,
        ge=1,
        description="the repeat of one call (by fingerprint) with the same answer, nothing new "
        "having come in between, that stops the run (4: the fifth identical call); earlier "
        "repeats are skipped or warned about (1: the first repeat already stops)",
    )
    window: int = Field(
        default=10, ge=2, description="the window rule looks at this many most recent tool calls"
    )
    window_count: int = Field(
        default=4,
        ge=1,
        description="this many repeats of one fingerprint within the last `window` tool calls, "
        "nothing new having come in between, stop the run, even with other calls between them",
    )
    shape_streak: int | None = Field(
        default=5,
        ge=3,
        description="the same undeclared call this many times in a row (no other call in "
        "between), its answers the same apart from their numbers and shape_streak - 2 of them "
        "numbers that came back (not new: a status that never settles), stops the run; "
        "numbers that keep moving are progress; shape_streak - 2 in a row warn (unset: off)",
    )
    still_text_stop_at_repeat: int | None = Field(
        default=2,
        ge=1,
        description="a counted repeat made in a turn whose text is nearly the same as in the "
        "turn of the call's last answer (non-empty, Jaccard >= still_text_similarity) stops the "
        "run at this repeat: the model's own reasoning stands still too (null: such repeats "
        "stop at stop_at_repeat like any)",
    )
    still_text_similarity: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Jaccard similarity (CJK character sets, word sets otherwise) at or above "
        "which two turns' texts count as the same",
    )
    ignored_failure_warnings: int = Field(
        default=8,
        ge=1,
        description="an identical failure with new answers in between is weak evidence: "
        "it is warned about once, and stops the run only when the same failing call is made "
        "this many more times after the warning (the identical failure with nothing new in "
        "between stops at stop_at_repeat)",
    )
    soft: bool = Field(
        default=True,
        description="stop softly (one last tool-less turn to answer from what is known); "
        "false stops at once with the best-effort answer",
    )
    failures_across_turns: bool = Field(
        default=True,
        description="remember calls that failed with a non-retryable error for the rest of "
        "the conversation: after the next user message such a call runs again (the user may "
        "have changed something), but failing again counts as a repeat, warned and then "
        "stopped like one within a run (a successful change forgets them)",
    )
    max_fingerprints: int = Field(
        default=256,
        ge=1,
        description="fingerprints remembered per run, least recently used forgotten first "
        "(bounds memory)",
    )
    max_observation_chars: int = Field(
        default=4000,
        ge=1,
        description="how much of an earlier observation is kept to answer a skipped repeat",
    )
    repeat_hint: str = Field(
        default="This call ({name}) was already made, its result is above; answer from it or "
        "change approach.",
        description="warning for a skipped repeat of a successful call ({name}, {signature}, "
        "{count})",
    )
    repeat_observation: str = Field(
        default="{observation}\n\n[{hint}]",
        description="observation given instead of running a repeat of a successful call "
        "({observation}: the earlier one, {hint}, {name}, {signature}, {count})",
    )
    failed_hint: str = Field(
        default="This call ({name}) already failed with {error}; do not retry it. Answer from "
        "what you know or change approach.",
        description="warning for a skipped repeat of a call that failed with a non-retryable "
        "error ({name}, {signature}, {count}, {error}: the first line of the failure)",
    )
    failed_observation: str = Field(
        default="{observation}\n\n[{hint}]",
        description="observation given instead of running a repeat of a failed call "
        "({observation}: the earlier failure, {hint}, {name}, {signature}, {count}, {error})",
    )
    unchanged_hint: str = Field(
        default="{signature} returned the same result again ({count} calls); calling it again "
        "will not bring new information. Answer from it or change approach.",
        description="warning when a non-deterministic tool's result did not change "
        "({name}, {signature}, {count})",
    )
    stop_message: str = Field(
        default="The same call ({signature}) was made {count} times.",
        description="why the run stops, put before the wrap-up instruction of a soft stop "
        "({name}, {signature}, {count})",
    )

    @model_validator(mode="after")
    def _check(self) -> RepeatCallSettings:
        if self.window_count > self.window:
            raise ValueError(
                f"window_count ({self.window_count}) must not exceed window ({self.window})"
            )
        check_templates(
            self,
            (
                "repeat_hint",
                "repeat_observation",
                "failed_hint",
                "failed_observation",
                "unchanged_hint",
                "stop_message",
            ),
            dict(name="t", signature="t()", count=2, error="e", observation="o", hint="h"),
        )
        return self


@dataclass(slots=True)
class _Entry:
    """What is known about one fingerprint in one run."""

    seen: int = 0  # times proposed
    repeats: int = 0  # repeats detected (within the epoch of the last result)
    has_result: bool = False  # a real (not skipped) result arrived
    epoch: int = 0  # the epoch of that result
    ok: bool = True
    retryable: bool = False
    content: str = ""
    digest: str = ""
    carried: list[Any] | None = None  # its failure remembered from an earlier user turn
    shape: str = ""  # its last answer's shape, for the shape-streak rule ("": rule off)
    form: str = ""  # its last answer's shape (volatile parts and every number masked)
    streak: int = 0  # times in a row (no other call between) with answers of one shape
    stale: int = 0  # of them, answers whose numbers came back (not new)
    values: tuple[str, ...] = ()  # the answers (digests) of that streak, the latest few
    news: int = 0  # the run's new answers when its last result came
    weak: int = 0  # identical failures with new answers in between, after the first
    text: frozenset[str] = frozenset()  # the words of the turn of its last answer


@dataclass(slots=True)
class _Pending:
    """What before_tool decided about a call, for its after_tool."""

    call: ToolCall
    retry: bool  # an allowed retry of a retryable failure
    deferred: bool  # a non-deterministic call: judged by its result, in after_tool
    entry: _Entry | None = None  # its fingerprint's entry (nothing can evict it meanwhile)
    expected: bool = False  # a tool whose repeats are expected (a hand-off, a wait)


@dataclass(slots=True)
class _State:
    entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)
    window: deque[tuple[str, bool]] = field(default_factory=deque)
    #: before_tool's decisions for the current turn's calls, by (step, index), until their
    #: after_tool (all of a turn's calls are decided before any result in the gateway)
    pending: dict[tuple[int, int], _Pending] = field(default_factory=dict)
    epoch: int = 0  # bumped by every executed call that may change the world
    news: int = 0  # real answers so far that said something not said before in the run
    #: the answers said so far (comparison keys), least recently seen forgotten first
    said: OrderedDict[str, None] = field(default_factory=OrderedDict)
    last_fp: str | None = None  # the fingerprint of the latest real result
    text: frozenset[str] = frozenset()  # the words of the current turn's text (empty: none)
