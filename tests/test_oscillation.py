"""oscillation at hook level, and its incremental detector against a brute-force check."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.detectors import Feed, kinds

from loopwarden.plugins.oscillation import CycleDetector, Oscillation, OscillationSettings
from loopwarden.testing import make_tool_result
from loopwarden.verdicts import Stop, Warn


def brute_force_period(
    symbols: Sequence[str], lo: int = 2, hi: int = 4, cycles: int = 2
) -> int | None:
    """The smallest period lo..hi whose last `cycles` repetitions end the sequence, with at
    least two distinct symbols in the cycle -- by slicing the whole history."""
    s = list(symbols)
    for p in range(lo, hi + 1):
        if len(s) >= p * cycles:
            tail = s[-p:]
            if s[-p * cycles :] == tail * cycles and len(set(tail)) > 1:
                return p
    return None


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from("ABCD"), max_size=60),
    st.integers(2, 4),
    st.integers(0, 3),
    st.integers(2, 3),
)
def test_detector_matches_brute_force(symbols: list[str], lo: int, extra: int, cycles: int) -> None:
    hi = lo + extra
    det = CycleDetector(lo, hi, cycles, window=hi * cycles)
    for i, sym in enumerate(symbols):
        det.push(sym)
        assert det.period() == brute_force_period(symbols[: i + 1], lo, hi, cycles), i


@given(st.lists(st.sampled_from("AB"), min_size=1, max_size=6), st.integers(2, 4))
def test_detector_finds_every_planted_cycle(cycle: list[str], reps: int) -> None:
    if len(set(cycle)) < 2 or len(cycle) < 2 or len(cycle) > 4:
        return
    det = CycleDetector()
    for sym in ["X", "Y", "Z"] + cycle * reps:
        det.push(sym)
    found = det.period()
    assert found is not None and len(cycle) % found == 0


# -- the plugin --------------------------------------------------------------------------------


def feed(**settings: Any) -> Feed:
    return Feed(Oscillation(OscillationSettings(**settings)))


def play(f: Feed, keys: str) -> list[str | None]:
    """One turn per character: lookup(key=<char>)."""
    out = []
    for k in keys:
        c = f.call("lookup", {"key": k})
        v = f.respond(f"looking up {k}", [c])
        out.append(kinds([v])[0])
        if not isinstance(v, Stop):
            f.tool(c, make_tool_result(f"value of {k}"))
    return out


def test_period_two_warns_at_two_full_cycles_then_stops() -> None:
    f = feed()
    got = play(f, "ABABA")
    assert got == [None, None, None, "warn", "stop:oscillation"]
    assert f.field("oscillation_hits") == 2
    warn, stop = f.verdicts
    assert isinstance(warn, Warn)
    assert warn.message.startswith(
        'You are alternating between "lookup(key=\\"A\\")" -> "lookup(key=\\"B\\")" with no '
        "new information"
    )
    assert warn.evidence["period"] == 2
    assert isinstance(stop, Stop) and stop.soft
    assert stop.evidence["hits"] == 2 and stop.evidence["threshold"] == 2
    assert stop.evidence["window"] == 8


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ("ABA", [None] * 3),  # N-1: one and a half cycles
        ("ABAB", [None, None, None, "warn"]),  # N
        ("ABCABC", [None] * 5 + ["warn"]),  # period 3
        ("ABCDABCD", [None] * 7 + ["warn"]),  # period 4
        ("ABCDEABCDE", [None] * 10),  # period 5: beyond max_period
        ("AAAAAA", [None] * 6),  # one symbol: repeat_call's business
        ("AABAAB", [None] * 5 + ["warn"]),
        ("ABACABAD", [None] * 8),
    ],
)
def test_periods_and_boundaries(keys: str, expected: list[str | None]) -> None:
    assert play(feed(), keys) == expected


def test_stop_at_hit_one_and_hard_stop() -> None:
    f = feed(stop_at_hit=1, soft=False)
    assert play(f, "ABAB")[-1] == "stop:oscillation"
    assert isinstance(f.verdicts[-1], Stop) and not f.verdicts[-1].soft


def test_later_hit_after_a_break_still_stops() -> None:
    f = feed()
    assert play(f, "ABAB")[-1] == "warn"
    assert play(f, "CDEFG") == [None] * 5
    assert play(f, "HGH") == [None, None, "stop:oscillation"]


def test_parallel_calls_in_one_turn_count_one_by_one_with_one_hit_per_turn() -> None:
    f = feed()
    calls = [f.call("lookup", {"key": k}, index=i) for i, k in enumerate("ABABAB")]
    v = f.respond("", calls)
    assert kinds([v]) == ["warn"]
    assert f.field("oscillation_hits") == 1
    v2 = f.respond("", [f.call("lookup", {"key": "A"})])
    assert kinds([v2]) == ["stop:oscillation"]


def test_cjk_arguments_are_shown_in_the_message() -> None:
    f = feed()
    for k in ["订单", "物流", "订单", "物流"]:
        c = f.call("lookup", {"key": k})
        f.respond("查一下", [c])
        f.tool(c, make_tool_result("结果"))
    warn = f.verdicts[-1]
    assert isinstance(warn, Warn)
    assert '"lookup(key=\\"订单\\")" -> "lookup(key=\\"物流\\")"' in warn.message


def test_non_deterministic_calls_with_new_results_do_not_oscillate() -> None:
    f = feed()
    out = []
    for i in range(10):
        c = f.call("clock") if i % 2 == 0 else f.call("lookup", {"key": "status"})
        out.append(f.respond("polling", [c]))
        f.tool(c, make_tool_result(f"t={i}" if i % 2 == 0 else "pending"))
    assert out == [None] * 10


def test_non_deterministic_calls_with_unchanged_results_do_oscillate() -> None:
    f = feed()
    out = []
    for i in range(6):
        c = f.call("clock") if i % 2 == 0 else f.call("lookup", {"key": "status"})
        out.append(kinds([f.respond("polling", [c])])[0])
        # the cycle of calls as answered warns in after_tool, one hook earlier
        out.append(kinds([f.tool(c, make_tool_result("same" if i % 2 == 0 else "pending"))[1]])[0])
    assert "warn" in out


def test_final_turn_without_calls_is_ignored() -> None:
    f = feed()
    play(f, "ABA")
    assert f.respond("final answer", []) is None


def test_custom_message() -> None:
    f = feed(message="cycle {cycle} (period {period}, hit {hits})")
    play(f, "ABAB")
    assert f.verdicts[-1].message == (
        'cycle "lookup(key=\\"A\\")" -> "lookup(key=\\"B\\")" (period 2, hit 1)'
    )


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="window"):
        OscillationSettings(window=6, max_period=4, cycles=2)
    with pytest.raises(ValidationError, match="min_period"):
        OscillationSettings(min_period=4, max_period=3)
    with pytest.raises(ValidationError, match="message"):
        OscillationSettings(message="{oops}")


def test_state_stays_bounded_over_a_10000_step_feed() -> None:
    f = feed(stop_at_hit=10**9)
    rng = random.Random(3)
    for i in range(10_000):
        if rng.random() < 0.2:
            c = f.call("clock")
        else:
            c = f.call("lookup", {"key": str(rng.randrange(5000))})
        f.respond("step", [c])
        f.tool(c, make_tool_result(str(i)))
    st = f.run.state["oscillation"]
    assert len(st.detector.last(10**6)) <= 8
    long_window = 28 * 2  # max_long_period * cycles: calls as answered
    assert len(st.answered.last(10**6)) <= long_window
    assert len(st.labels) <= 8 + long_window  # every symbol of both windows, no more
    assert len(st.last_digest) <= 8
