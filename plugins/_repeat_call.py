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
        default=2,
        ge=1,
        description="the repeat of one call (by fingerprint) that stops the run; earlier "
        "repeats are skipped or warned about (1: the first repeat already stops)",
    )
    window: int = Field(
        default=5, ge=2, description="the window rule looks at this many most recent tool calls"
    )
    window_count: int = Field(
        default=3,
        ge=2,
        description="the same fingerprint this many times within the last `window` tool calls "
        "stops the run, even with other calls in between",
    )
    shape_streak: int | None = Field(
        default=5,
        ge=3,
        description="the same call this many times in a row (no other call in between), "
        "its answers the same apart from their numbers, stops the run -- a status that never "
        "settles; shape_streak - 2 in a row warn (unset: off)",
    )
    ignored_failure_warnings: int = Field(
        default=5,
        ge=1,
        description="an identical failure with successful calls in between is weak evidence: "
        "it is warned about once, and stops the run only when the same failing call is made "
        "this many more times after the warning (the identical failure in a row, nothing "
        "succeeding in between, stops at stop_at_repeat)",
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
        default="{name} returned the same result again; calling it again will not bring new "
        "information. Answer from it or change approach.",
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
    shape: str = ""  # its last answer with every number masked
    streak: int = 0  # times in a row (no other call between) with answers of one shape
    successes: int = 0  # the run's successful results when its last result came
    weak: int = 0  # identical failures with successes in between, after the first


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
    successes: int = 0  # real successful results so far
    last_fp: str | None = None  # the fingerprint of the latest real result
