"""stall at hook level: observation novelty by digest or token Jaccard, in a row."""

from __future__ import annotations

import random
from typing import Any

import pytest
from detector_helpers import Feed, fail, kinds, ok, skipped
from pydantic import ValidationError

from loopwarden import ToolResult
from loopwarden.plugins.stall import Stall, StallSettings
from loopwarden.verdicts import Stop, Warn


def feed(**settings: Any) -> Feed:
    return Feed(Stall(StallSettings(**settings)))


def observe(f: Feed, *results: Any) -> list[str | None]:
    out = []
    for i, r in enumerate(results):
        c = f.call("lookup", {"key": str(i)})
        out.append(kinds([f.after(c, r if not isinstance(r, str) else ok(r))])[0])
    return out


NOTHING = "NO_RESULTS: 知识库中没有匹配的条目"


def test_the_same_nothing_three_times_in_a_row_stops() -> None:
    f = feed()
    got = observe(f, NOTHING, NOTHING, NOTHING, NOTHING)
    assert got == [None, None, "warn", "stop:stall"]
    assert f.run.stall_rounds == 3
    stop = f.verdicts[-1]
    assert isinstance(stop, Stop) and stop.soft
    assert stop.evidence["streak"] == 3
    assert stop.evidence["threshold"] == 3
    assert stop.evidence["similarity"] == 1.0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_stop_after_boundaries(n: int) -> None:
    """N-1 stalled results in a row: no stop; N: stop; N+1: stop."""
    f = feed(stop_after=n, warn_after=None)
    got = observe(f, *([NOTHING] * (n + 2)))
    assert got == [None] * n + ["stop:stall", "stop:stall"]


def test_a_novel_result_resets_the_streak() -> None:
    f = feed(different_calls="any")
    got = observe(f, "a", "a", "b", "a", "fresh news", "a", "a")
    # 'a' matches one of the last K results, 'b' and 'fresh news' are new
    assert got == [None, None, None, None, None, None, "warn"]


def test_near_duplicates_count_english() -> None:
    base = " ".join(f"item{i}" for i in range(10))
    near = base + " trace"  # Jaccard 10/11 = 0.909
    far = " ".join(f"item{i}" for i in range(8)) + " other1 other2"  # 8/12
    f = feed(different_calls="any")
    assert observe(f, base, near) == [None, None]
    assert f.run.stall_rounds == 1
    f2 = feed(different_calls="any")
    assert observe(f2, base, far) == [None, None]
    assert f2.run.stall_rounds == 0


def test_near_duplicates_count_cjk() -> None:
    a = "订单八八二三一已签收签收人本人快递员王师傅"
    b = a + "。"  # punctuation only: the same character set
    c = "订单八八二三二运输中到达杭州转运中心"
    f = feed(different_calls="any")
    observe(f, a, b, c)
    assert f.run.stall_rounds == 1


def test_only_the_last_k_results_are_compared() -> None:
    f = feed(window=2)
    got = observe(f, "a", "b", "c", "a")  # 'a' left the window of 2
    assert got == [None] * 4
    assert f.run.stall_rounds == 0


def test_skipped_results_are_ignored() -> None:
    f = feed()
    got = observe(f, NOTHING, NOTHING, skipped("synthetic"), skipped("synthetic"), NOTHING)
    assert got == [None, None, None, None, "warn"]
    assert f.run.stall_rounds == 2


def test_repeated_failures_stall_too() -> None:
    f = feed()
    got = observe(f, *[fail("NOT_FOUND: 订单 99999 不存在")] * 4)
    assert got[-1] == "stop:stall"


def test_parallel_results_in_one_turn_are_counted_one_by_one() -> None:
    f = feed()
    calls = [f.call("lookup", {"key": str(i)}, index=i) for i in range(4)]
    f.respond("", calls)
    got = [kinds([f.after(c, ok(NOTHING))])[0] for c in calls]
    assert got == [None, None, "warn", "stop:stall"]


def test_warning_text_and_hard_stop() -> None:
    f = feed(soft=False, message="nothing new x{count} from {tool}")
    observe(f, NOTHING, NOTHING, NOTHING, NOTHING)
    warn, stop = f.verdicts
    assert isinstance(warn, Warn) and warn.message == "nothing new x2 from lookup"
    assert isinstance(stop, Stop) and not stop.soft


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="warn_after"):
        StallSettings(warn_after=3, stop_after=3)
    with pytest.raises(ValidationError):
        StallSettings(similarity=1.5)
    with pytest.raises(ValidationError, match="stop_message"):
        StallSettings(stop_message="{x}")


def test_state_stays_bounded_over_a_10000_step_feed() -> None:
    f = feed(stop_after=10**9, warn_after=None)
    rng = random.Random(11)
    for i in range(10_000):
        c = f.call("lookup", {"key": str(i)})
        f.after(c, ok(" ".join(str(rng.randrange(50)) for _ in range(rng.randrange(1, 40)))))
    st = f.run.state["stall"]
    assert len(st.recent) <= 5


def test_a_successful_side_effect_is_progress_however_similar_its_echo() -> None:
    f = feed()
    record = '{"reservation_id": "NM1VX1", "cabin": "business", "flights": ["HAT300"]}'
    got = [kinds([f.after(f.call("refund", {"order_id": str(i)}), ok(record))])[0]
           for i in range(5)]
    assert got == [None] * 5
    assert f.run.stall_rounds == 0
    # a failed side effect is compared like any result
    got = [kinds([f.after(f.call("refund", {"order_id": "x"}), fail("ERROR: refused"))])[0]
           for _ in range(4)]
    assert got == [None, None, "warn", "stop:stall"]


# -- the same answer to a different question is news ------------------------------------------


def observe_calls(f: Feed, *pairs: tuple[dict[str, Any], Any]) -> list[str | None]:
    out = []
    for args, r in pairs:
        c = f.call("lookup", args)
        out.append(kinds([f.after(c, r if not isinstance(r, str) else ok(r))])[0])
    return out


def test_the_same_answer_to_different_questions_is_not_a_stall() -> None:
    f = feed()
    got = observe_calls(f, *[({"sku": s}, "in stock") for s in ("A", "B", "C", "D", "E")])
    assert got == [None] * 5 and f.run.stall_rounds == 0
    f = feed()  # Chinese too
    got = observe_calls(f, *[({"order_id": o}, "已签收") for o in ("1", "2", "3", "4")])
    assert got == [None] * 4 and f.run.stall_rounds == 0


def test_empty_answers_to_different_questions_are_a_stall() -> None:
    for empty in (NOTHING, "[]", "No results for this query.", "未找到相关条目", "NOT_FOUND"):
        f = feed()
        got = observe_calls(f, *[({"q": q}, empty) for q in ("a", "b", "c", "d")])
        assert got == [None, None, "warn", "stop:stall"], empty


def test_failures_to_different_questions_are_a_stall() -> None:
    f = feed()
    bad = ToolResult(content="upstream said 503", ok=False, error="tool_error")
    got = observe_calls(f, *[({"q": q}, bad) for q in ("a", "b", "c", "d")])
    assert got == [None, None, "warn", "stop:stall"]


def test_the_same_call_with_the_same_answer_is_a_stall() -> None:
    f = feed()
    got = observe_calls(f, *[({"sku": "A"}, "in stock")] * 4)
    assert got == [None, None, "warn", "stop:stall"]


def test_any_counts_every_repeat_the_strict_reading() -> None:
    f = feed(different_calls="any")
    got = observe_calls(f, *[({"sku": s}, "in stock") for s in ("A", "B", "C", "D")])
    assert got == [None, None, "warn", "stop:stall"]


def test_empty_patterns_are_validated_and_configurable() -> None:
    f = feed(empty_patterns=[r"^sold out$"])
    got = observe_calls(f, *[({"sku": s}, "sold out") for s in ("A", "B", "C", "D")])
    assert got == [None, None, "warn", "stop:stall"]
    f = feed(empty_patterns=[])
    got = observe_calls(f, *[({"q": q}, NOTHING) for q in ("a", "b", "c", "d")])
    assert got == [None] * 4
