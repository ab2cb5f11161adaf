"""no_progress at hook level: similar wording, corroborated by tool results that bring nothing
new."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError
from support.detectors import Feed, kinds

from loopwarden.plugins._text import jaccard, token_set
from loopwarden.plugins.no_progress import NoProgress, NoProgressSettings
from loopwarden.testing import make_tool_result
from loopwarden.verdicts import Stop, Warn


def feed(**settings: Any) -> Feed:
    """no_progress with the similar-wording warning on (off by default since issue 31: the
    tests below check the warning itself; see the next test for the default)."""
    settings.setdefault("warn_on_similar", True)
    return Feed(NoProgress(NoProgressSettings(**settings)))


def test_similar_wording_with_new_results_is_not_warned_about_by_default() -> None:
    f = Feed(NoProgress(NoProgressSettings()))
    verdicts = []
    for i in range(5):
        c = f.call("lookup", {"key": str(i)})
        verdicts.append(f.respond("Let me check the next record.", [c]))
        f.after(c, make_tool_result(f"record {i}"))
    assert verdicts == [None] * 5


def turn(
    f: Feed, content: str, result: str = "same result", *, is_skipped: bool = False
) -> str | None:
    """One model turn with one lookup; returns the after_response verdict kind."""
    c = f.call("lookup", {"key": "k"})
    v = f.respond(content, [c])
    if not isinstance(v, Stop):
        f.after(
            c,
            make_tool_result(result, skipped=True, skipped_by="other")
            if is_skipped
            else make_tool_result(result),
        )
    return kinds([v])[0]


# -- tokenization ----------------------------------------------------------------------------


def test_token_sets_are_characters_for_cjk_and_words_otherwise() -> None:
    assert token_set("我查一下订单。") == frozenset("我查一下订单")
    assert token_set("Checking the ORDER, again!") == {"checking", "the", "order", "again"}
    assert token_set("查询订单 88231 status") == frozenset("查询订单") | {"88231", "status"}
    assert token_set("") == frozenset()


def test_jaccard() -> None:
    a, b = frozenset("abcd"), frozenset("cdef")
    assert jaccard(a, b) == pytest.approx(2 / 6)
    assert jaccard(frozenset(), frozenset()) == 1.0
    assert jaccard(a, frozenset()) == 0.0


# -- the rule --------------------------------------------------------------------------------

SAME_EN = "Let me check the order status once more."
SAME_ZH = "我再查一下订单的状态。"


@pytest.mark.parametrize("content", [SAME_EN, SAME_ZH])
def test_similar_contents_without_new_results_stop(content: str) -> None:
    f = feed()
    got = [turn(f, content) for _ in range(4)]
    # turn 3: the window holds turns 1-3 and turn 1's result was new -> warn only;
    # turn 4: nothing new since turn 2 -> stop
    assert got == [None, None, "warn", "stop:no_progress"]
    stop = f.verdicts[-1]
    assert isinstance(stop, Stop) and stop.soft
    assert stop.evidence["new_results"] == 0
    assert stop.evidence["similarities"] == [1.0, 1.0]
    assert stop.evidence["threshold"] == 0.7
    assert stop.evidence["steps"] == [2, 3, 4]


def test_similar_contents_with_new_results_only_warn_once_per_streak() -> None:
    f = feed()
    got = [turn(f, SAME_EN, result=f"new result {i}") for i in range(6)]
    assert got == [None, None, "warn", None, None, None]
    assert isinstance(f.verdicts[0], Warn)
    assert f.verdicts[0].evidence["new_results"] == 2


def test_a_dissimilar_content_breaks_the_streak_and_rearms_the_warning() -> None:
    f = feed()
    got = [turn(f, SAME_EN, result=f"r{i}") for i in range(3)]
    got.append(turn(f, "Now the refund policy, a different topic entirely.", result="x"))
    got += [turn(f, SAME_EN, result=f"s{i}") for i in range(3)]
    assert got == [None, None, "warn", None, None, None, "warn"]


def test_progressing_wording_is_not_similar() -> None:
    f = feed()
    got = [
        turn(f, "checking order 88231's details", "same"),
        turn(f, "checking order 88231's logistics", "same"),
        turn(f, "checking order 88231's refund", "same"),
    ]
    assert got == [None, None, None]


def test_cjk_progressing_wording_is_not_similar() -> None:
    f = feed()
    got = [turn(f, "我先查订单。"), turn(f, "拿到运单号了，查物流。"), turn(f, "再看看退货政策。")]
    assert got == [None, None, None]


def _words(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


@pytest.mark.parametrize(
    ("second", "similar"),
    [
        # {w0..w7} vs {w0..w6, x, y}: 7 / 10 = 0.7, exactly at the threshold
        (_words(7) + " x y", True),
        # {w0..w7} vs {w0..w5, x, y, z}: 6 / 11 < 0.7
        (_words(6) + " x y z", False),
    ],
)
def test_threshold_boundary(second: str, similar: bool) -> None:
    first = _words(8)
    f = feed()
    got = [turn(f, first), turn(f, second), turn(f, first)]
    sim = jaccard(token_set(first), token_set(second))
    assert (sim >= 0.7) is similar
    assert got[-1] == ("warn" if similar else None)


@pytest.mark.parametrize(("window", "stops_at"), [(2, 3), (3, 4), (4, 5)])
def test_window_boundaries(window: int, stops_at: int) -> None:
    """N-1 similar contents: nothing; N: judged (the first result was new: warn); N+1: stop."""
    f = feed(window=window)
    got = [turn(f, SAME_EN) for _ in range(window + 1)]
    assert got.index("stop:no_progress") + 1 == stops_at
    assert got[: window - 1] == [None] * (window - 1)


def test_empty_contents_are_skipped() -> None:
    f = feed()
    got = []
    for content in [SAME_EN, "", SAME_EN, "   ", SAME_EN, "", SAME_EN]:
        got.append(turn(f, content))
    # the empty turns neither break nor extend the similar streak
    assert [g for g in got if g is not None] == ["warn", "stop:no_progress"]
    assert got[4] == "warn" and got[6] == "stop:no_progress"


def test_skipped_results_are_not_new() -> None:
    f = feed()
    got = [turn(f, SAME_EN, result=f"synthetic {i}", is_skipped=True) for i in range(3)]
    assert got == [None, None, "stop:no_progress"]


def test_parallel_results_in_one_turn_count_as_new_once_each() -> None:
    f = feed()
    turn(f, SAME_EN, "a")
    c1, c2 = f.call("lookup", {"key": "k"}, index=0), f.call("lookup", {"key": "2"}, index=1)
    assert f.respond(SAME_EN, [c1, c2]) is None
    f.after(c1, make_tool_result("a"))  # this call's answer before
    f.after(c2, make_tool_result("b"))  # new
    v = f.respond(SAME_EN, [f.call("lookup", {"key": "3"})])
    assert isinstance(v, Warn) and v.evidence["new_results"] == 2


def test_a_turn_without_tool_calls_is_the_final_answer_and_not_judged() -> None:
    f = feed()
    turn(f, SAME_EN)
    turn(f, SAME_EN)
    assert f.respond(SAME_EN, []) is None


def test_hard_stop_and_custom_texts() -> None:
    f = feed(soft=False, stop_message="stuck x{count} at {similarity}")
    got = [turn(f, SAME_ZH) for _ in range(4)]
    stop = f.verdicts[-1]
    assert got[-1] == "stop:no_progress"
    assert isinstance(stop, Stop) and not stop.soft
    assert stop.message == "stuck x3 at 1.0"


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        NoProgressSettings(threshold=0)
    with pytest.raises(ValidationError):
        NoProgressSettings(window=1)
    with pytest.raises(ValidationError, match="message"):
        NoProgressSettings(message="{nope}")


def test_state_stays_bounded_over_a_10000_step_feed() -> None:
    f = feed(result_memory=16)
    rng = random.Random(5)
    vocab = ["订单", "物流", "order", "status", "refund", "查询", "again", "退货"]
    for i in range(10_000):
        content = " ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 6)))
        c = f.call("lookup", {"key": str(i)})
        f.respond(content, [c])
        f.after(c, make_tool_result(str(rng.randrange(100))))
    st = f.run.state["no_progress"]
    assert len(st.contents) <= 3
    assert len(st.seen) <= 16
    assert all(isinstance(c.tokens, frozenset) for c in st.contents)
