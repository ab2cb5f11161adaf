"""failure_streak at hook level: failed flags and error-like text, in a row."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError
from support.detectors import Feed, kinds

from loopwarden.plugins.failure_streak import FailureStreak, FailureStreakSettings
from loopwarden.testing import make_tool_result
from loopwarden.verdicts import Stop, Warn


def feed(**settings: Any) -> Feed:
    return Feed(FailureStreak(FailureStreakSettings(**settings)))


def results(f: Feed, *rs: Any) -> list[str | None]:
    out = []
    for i, r in enumerate(rs):
        c = f.call("lookup", {"key": str(i)})
        out.append(kinds([f.after(c, make_tool_result(r) if isinstance(r, str) else r)])[0])
    return out


def test_three_failures_in_a_row_stop_with_evidence() -> None:
    f = feed()
    got = results(
        f,
        make_tool_result("UNAVAILABLE: 503", error="tool_error"),
        make_tool_result("TIMEOUT", error="tool_error"),
        make_tool_result("boom", error="exception"),
    )
    assert got == [None, "warn", "stop:failure_streak"]
    stop = f.verdicts[-1]
    assert isinstance(stop, Stop) and stop.soft and stop.reason == "failure_streak"
    assert stop.evidence["streak"] == 3
    assert stop.evidence["threshold"] == 3
    assert [x["error"] for x in stop.evidence["failures"]] == [
        "UNAVAILABLE: 503",
        "TIMEOUT",
        "boom",
    ]
    assert stop.message == 'The last 3 tool calls all failed (latest: "boom").'  # data: quoted


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_stop_after_boundaries(n: int) -> None:
    """N-1 failures in a row: no stop; N: stop; N+1: stop."""
    f = feed(stop_after=n, warn_after=None)
    got = results(f, *[make_tool_result("x", error="tool_error")] * (n + 1))
    assert got == [None] * (n - 1) + ["stop:failure_streak"] * 2


@pytest.mark.parametrize(
    "text",
    [
        "ERROR: knowledge index is being rebuilt",
        "NOT_FOUND: 订单 99999 不存在",
        "upstream TIMEOUT after 10s",
        "服务 UNAVAILABLE，请稍后再试",
        'Traceback (most recent call last):\n  File "x.py", line 1',
    ],
)
def test_error_like_text_is_a_failure(text: str) -> None:
    f = feed(stop_after=1, warn_after=None)
    assert results(f, text) == ["stop:failure_streak"]


@pytest.mark.parametrize(
    "text",
    [
        '{"order_id": "88231", "status": "已签收"}',
        "No errors were found in your order.",
        "NO_RESULTS: 知识库中没有匹配的条目",
        "TIMEOUTS are rare",  # not the word TIMEOUT
        "error handling is fine",  # lower case: patterns are case-sensitive by default
    ],
)
def test_ordinary_text_is_not_a_failure(text: str) -> None:
    f = feed(stop_after=1, warn_after=None)
    assert results(f, text) == [None]


def test_patterns_are_configurable() -> None:
    f = feed(stop_after=1, warn_after=None, patterns=[r"^NO_RESULTS"], ignore_case=True)
    assert results(f, "no_results: nothing") == ["stop:failure_streak"]
    f2 = feed(stop_after=1, warn_after=None, patterns=[])
    assert results(f2, "ERROR: x") == [None]
    # the flag always counts
    assert results(f2, make_tool_result("x", error="tool_error")) == ["stop:failure_streak"]


def test_patterns_look_only_at_the_beginning() -> None:
    f = feed(stop_after=1, warn_after=None, scan_chars=20)
    assert results(f, "x" * 30 + " ERROR") == [None]


def test_a_success_resets_the_streak() -> None:
    f = feed()
    got = results(
        f,
        make_tool_result("a", error="tool_error"),
        make_tool_result("b", error="tool_error"),
        "fine",
        make_tool_result("c", error="tool_error"),
        make_tool_result("d", error="tool_error"),
        make_tool_result("e", error="tool_error"),
    )
    assert got == [None, "warn", None, None, "warn", "stop:failure_streak"]


def test_skipped_results_are_ignored() -> None:
    f = feed()
    got = results(
        f,
        make_tool_result("a", error="tool_error"),
        make_tool_result("ERROR: synthetic", skipped=True, skipped_by="other"),
        make_tool_result("ok", skipped=True, skipped_by="other"),
        make_tool_result("b", error="tool_error"),
        make_tool_result("c", error="tool_error"),
    )
    assert got == [None, None, None, "warn", "stop:failure_streak"]


def test_a_parallel_batch_is_one_round() -> None:
    f = feed()
    calls = [f.call("lookup", {"key": str(i)}, index=i) for i in range(3)]
    f.respond("", calls)
    got = [kinds([f.after(c, make_tool_result("ERROR", error="tool_error"))])[0] for c in calls]
    assert got == [None, None, None]  # one failed round, judged at its last call
    for turn in (2, 3):
        f.run.step = turn
        calls = [f.call("lookup", {"key": f"{turn}{i}"}, index=i) for i in range(3)]
        f.respond("", calls)
        got = [kinds([f.after(c, make_tool_result("ERROR", error="tool_error"))])[0] for c in calls]
    assert got == [None, None, "stop:failure_streak"]
    assert f.verdicts[-1].evidence["count"] == 3


def test_one_success_in_a_batch_resets_the_streak() -> None:
    f = feed()
    for turn in range(1, 6):
        f.run.step = turn
        calls = [f.call("lookup", {"key": f"{turn}{i}"}, index=i) for i in range(2)]
        f.respond("", calls)
        f.after(calls[0], make_tool_result("ERROR", error="tool_error"))
        assert f.after(calls[1], make_tool_result("found")) is None
    assert f.verdicts == []


def test_neutral_tools_neither_count_nor_reset() -> None:
    f = feed()
    got = []
    for i in range(3):
        got += kinds(
            [
                f.after(
                    f.call("lookup", {"key": str(i)}), make_tool_result("ERROR", error="tool_error")
                )
            ]
        )
        got += kinds(
            [f.after(f.call("think", {"thought": "hmm"}), make_tool_result("thought noted"))]
        )
    assert got == [None, None, "warn", None, "stop:failure_streak", None]


def test_warning_text() -> None:
    f = feed(message="{count} failed, last {tool}: {error}")
    results(
        f,
        make_tool_result("a", error="tool_error"),
        make_tool_result("NOT_FOUND: x\nmore", error="tool_error"),
    )
    warn = f.verdicts[-1]
    assert isinstance(warn, Warn) and warn.message == '2 failed, last lookup: "NOT_FOUND: x"'


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="bad regular expression"):
        FailureStreakSettings(patterns=["("])
    with pytest.raises(ValidationError, match="warn_after"):
        FailureStreakSettings(warn_after=4, stop_after=3)


def test_state_stays_bounded_over_a_10000_step_feed() -> None:
    f = feed(stop_after=10**9, warn_after=None)
    rng = random.Random(13)
    for i in range(10_000):
        r = (
            make_tool_result(f"ERROR {i}", error="tool_error")
            if rng.random() < 0.9 or i == 9_999
            else make_tool_result("fine")
        )
        f.after(f.call("lookup", {"key": str(i)}), r)
    st = f.run.conversation.state["failure_streak"]  # across_turns: the conversation's streak
    assert st.streak > 0
    assert len(st.failures) <= 5
    # the evidence it would report is bounded too
    f2 = feed(stop_after=3)
    for i in range(50):
        f2.after(f2.call("lookup", {"key": str(i)}), make_tool_result("x", error="tool_error"))
    assert len(f2.run.conversation.state["failure_streak"].failures) == 3


def test_the_streak_carries_on_into_the_next_user_turn() -> None:
    f = feed()
    for _ in range(2):
        f.after(
            f.call("book", {"amount": 1}),
            make_tool_result("ERROR: payment does not add up", error="tool_error"),
        )
    nxt = Feed(f.plugin)
    nxt.run.conversation = f.run.conversation  # the user answered: the next run
    assert kinds(
        [
            nxt.after(
                nxt.call("book", {"amount": 2}),
                make_tool_result("ERROR: again", error="tool_error"),
            )
        ]
    ) == ["stop:failure_streak"]
    alone = Feed(FailureStreak(FailureStreakSettings(across_turns=False)))
    for _ in range(2):
        alone.after(
            alone.call("book", {"amount": 1}), make_tool_result("ERROR", error="tool_error")
        )
    fresh = Feed(alone.plugin)
    assert (
        fresh.after(
            fresh.call("book", {"amount": 2}), make_tool_result("ERROR", error="tool_error")
        )
        is None
    )


def test_one_call_failing_the_same_way_stops_at_the_fifth() -> None:
    """A compiler that is not installed, run again and again: a repeat, judged by how often it
    repeats -- warned at the second failure, stopped at the fifth identical call, not the
    third (agents retry a few times and move on; loops repeat five times or more)."""
    f = feed()
    got = []
    for line in (12, 15, 18, 21, 24):
        c = f.call("bash", {"command": "gcc -o app main.c"})
        text = f"/bin/bash: line {line}: gcc: command not found"
        got.append(kinds([f.after(c, make_tool_result(text))])[0])
    assert got == [None, "warn", None, None, "stop:failure_streak"]
    stop = f.verdicts[-1]
    assert isinstance(stop, Stop) and stop.evidence["same_call"] is True
    assert stop.evidence["threshold"] == 5
    # the same failures from calls that differ: a streak, stopped at stop_after (3)
    f = feed()
    got = []
    for i, line in enumerate((12, 15, 18)):
        c = f.call("bash", {"command": f"gcc -O{i} -o app main.c"})
        text = f"/bin/bash: line {line}: gcc: command not found"
        got.append(kinds([f.after(c, make_tool_result(text))])[0])
    assert got == [None, "warn", "stop:failure_streak"]
