"""repeat_call at hook level: skip, then stop; the window rule; retries; tool natures; and the
fingerprint canonicalization it relies on (property tests)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError
from support.detectors import Feed, kinds

from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, Fingerprinter
from loopwarden.plugins.repeat_call import RepeatCall, RepeatCallSettings
from loopwarden.testing import make_tool_result
from loopwarden.verdicts import Skip, Stop, Warn

FINGERPRINT = Fingerprinter()


#: the thresholds these tests of the mechanics were written for (stop at the 3rd identical
#: call, 2 repeats within 5 calls, no earlier stop for a text that stands still): the
#: defaults stop later since issue 45 (tests/test_precision3_repeat_call.py tests those)
MECHANICS = dict(stop_at_repeat=2, window=5, window_count=2, still_text_stop_at_repeat=None)


def feed(**settings: Any) -> Feed:
    return Feed(RepeatCall(RepeatCallSettings(**{**MECHANICS, **settings})))


# -- read-only, deterministic, successful -------------------------------------------------


def test_first_repeat_is_skipped_with_the_earlier_observation_and_a_hint() -> None:
    f = feed()
    c1 = f.call("lookup", {"key": "88231"})
    assert f.tool(c1, make_tool_result('{"status": "signed"}')) == (None, None)
    c2 = f.call("lookup", {"key": "88231"})
    v = f.before(c2)
    assert isinstance(v, Skip)
    assert v.plugin == "repeat_call"
    assert v.observation.startswith('{"status": "signed"}')
    assert "already made" in v.observation
    assert v.message is not None and "already made" in v.message and "lookup" in v.message
    assert v.evidence["fingerprint"] == c1.fingerprint
    assert v.evidence["signature"] == 'lookup({"key": "88231"})'
    assert v.evidence["count"] == 2
    assert v.evidence["threshold"] == 2
    assert f.field("duplicate_calls") == 1


def test_second_repeat_stops_softly_with_evidence() -> None:
    f = feed()
    verdicts = [f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))[0] for _ in range(3)]
    assert kinds(verdicts) == [None, "skip", "stop:repeat_call"]
    stop = verdicts[2]
    assert isinstance(stop, Stop)
    assert stop.soft is True
    assert stop.evidence["rule"] == "repeat"
    assert stop.evidence["count"] == 3
    assert stop.evidence["repeats"] == 2
    assert stop.evidence["tool"] == "lookup"
    assert stop.message is not None and '"lookup({\\"key\\": \\"a\\"})"' in stop.message
    assert f.field("duplicate_calls") == 2


@pytest.mark.parametrize("n", [1, 2, 3])
def test_stop_at_repeat_boundaries(n: int) -> None:
    """Repeats 1..N-1 are skipped, repeat N stops, and N+1 stops again (were it to happen)."""
    f = feed(stop_at_repeat=n, window=10, window_count=10)
    first = f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))[0]
    got = [f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))[0] for _ in range(n + 1)]
    assert first is None
    assert kinds(got) == ["skip"] * (n - 1) + ["stop:repeat_call", "stop:repeat_call"]


def test_hard_stop_when_soft_is_off() -> None:
    f = feed(soft=False)
    verdicts = [f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))[0] for _ in range(3)]
    assert isinstance(verdicts[2], Stop) and verdicts[2].soft is False


def test_canonically_equal_arguments_are_the_same_call() -> None:
    f = feed()
    f.tool(f.call("lookup", {"key": "Order 88231"}), make_tool_result("A"))
    v = f.before(f.call("lookup", {"key": "  order\t88231 ", "request_id": "r-9"}))
    assert isinstance(v, Skip)


def test_different_arguments_are_not_repeats() -> None:
    f = feed()
    verdicts = [
        f.tool(f.call("lookup", {"key": str(i)}), make_tool_result(str(i)))[0] for i in range(20)
    ]
    assert verdicts == [None] * 20
    assert f.field("duplicate_calls") == 0


def test_skip_observation_is_not_nested_across_repeats() -> None:
    """The skip's own synthetic result never replaces the earlier real observation."""
    f = feed(stop_at_repeat=3, window_count=5)
    f.tool(f.call("lookup", {"key": "a"}), make_tool_result("REAL"))
    s1, _ = f.tool(f.call("lookup", {"key": "a"}), make_tool_result("unused"))
    s2, _ = f.tool(f.call("lookup", {"key": "a"}), make_tool_result("unused"))
    assert isinstance(s1, Skip) and isinstance(s2, Skip)
    assert s2.observation == s1.observation
    assert s2.observation.count("REAL") == 1


def test_custom_texts() -> None:
    f = feed(repeat_hint="dup {name} #{count}", repeat_observation="<{observation}|{hint}>")
    f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))
    v = f.before(f.call("lookup", {"key": "a"}))
    assert isinstance(v, Skip)
    assert v.message == "dup lookup #2"
    assert v.observation == "<A|dup lookup #2>"


def test_deterministic_but_not_read_only_is_warned_not_skipped() -> None:
    f = feed()
    f.tool(f.call("recompute", {"key": "a"}), make_tool_result("A"))
    v = f.before(f.call("recompute", {"key": "a"}))
    assert isinstance(v, Warn)


# -- parallel calls in one turn --------------------------------------------------------------


def test_parallel_duplicates_in_one_turn() -> None:
    f = feed()
    a = [f.call("lookup", {"key": "a"}, index=i) for i in range(3)]
    b = f.call("lookup", {"key": "b"}, index=3)
    verdicts = f.turn(
        "checking",
        (a[0], make_tool_result("A")),
        (b, make_tool_result("B")),
        (a[1], make_tool_result("A")),
        (a[2], make_tool_result("A")),
    )
    assert kinds(verdicts) == ["skip", "stop:repeat_call"]
    assert f.field("duplicate_calls") == 2


# -- failures and retries ------------------------------------------------------------------


def test_non_retryable_failure_is_skipped_then_stopped() -> None:
    f = feed()
    f.tool(
        f.call("lookup", {"key": "99999"}),
        make_tool_result("NOT_FOUND: order 99999\ndetails", error="tool_error"),
    )
    v = f.before(f.call("lookup", {"key": "99999"}))
    assert isinstance(v, Skip)
    assert v.message is not None
    assert 'already failed with "NOT_FOUND: order 99999";' in v.message
    assert "do not retry it" in v.message
    assert v.observation.startswith("NOT_FOUND: order 99999")
    assert v.evidence["rule"] == "failed"
    f.after(
        f.call("lookup", {"key": "99999"}),
        make_tool_result(v.observation, skipped=True, skipped_by="repeat_call"),
    )
    s = f.before(f.call("lookup", {"key": "99999"}))
    assert isinstance(s, Stop) and s.reason == "repeat_call"
    assert f.field("duplicate_calls") == 2


def test_non_retryable_failure_of_a_non_deterministic_tool_is_skipped() -> None:
    f = feed()
    f.tool(f.call("clock"), make_tool_result("UNAVAILABLE: no clock", error="tool_error"))
    assert isinstance(f.before(f.call("clock")), Skip)


def test_unknown_tool_repeated_is_skipped_then_stopped() -> None:
    f = feed()
    verdicts = [
        f.tool(
            f.call("no_such_tool", {"x": 1}),
            make_tool_result("ERROR: unknown tool", error="tool_error"),
        )[0]
        for _ in range(3)
    ]
    assert kinds(verdicts) == [None, "skip", "stop:repeat_call"]


def test_retryable_failures_are_retries_until_the_retry_budget_is_spent() -> None:
    """A retry is allowed while the last result says retryable; once retry_policy turns it
    off, the non-retryable rule applies: skip, then stop."""
    f = feed()
    call = lambda: f.call("lookup", {"key": "a"})  # noqa: E731
    assert f.tool(call(), make_tool_result("503", error="tool_error", retryable=True)) == (
        None,
        None,
    )
    assert f.tool(call(), make_tool_result("503", error="tool_error", retryable=True)) == (
        None,
        None,
    )
    assert f.field("duplicate_calls") == 0
    # the retry_policy plugin spent the budget: result.retryable was set to False
    assert f.tool(call(), make_tool_result("503", error="tool_error", retryable=False)) == (
        None,
        None,
    )
    v = f.before(call())
    assert isinstance(v, Skip) and 'already failed with "503"' in (v.message or "")
    f.after(call(), make_tool_result(v.observation, skipped=True, skipped_by="other"))
    assert kinds([f.before(call())]) == ["stop:repeat_call"]


def test_retries_do_not_count_toward_the_window_rule() -> None:
    f = feed()
    verdicts = [
        f.tool(
            f.call("lookup", {"key": "a"}),
            make_tool_result("429", error="tool_error", retryable=True),
        )[0]
        for _ in range(6)
    ]
    assert verdicts == [None] * 6


def test_retry_then_success_then_repeat_is_skipped() -> None:
    f = feed()
    f.tool(
        f.call("lookup", {"key": "a"}), make_tool_result("503", error="tool_error", retryable=True)
    )
    f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))
    v = f.before(f.call("lookup", {"key": "a"}))
    assert isinstance(v, Skip) and v.observation.startswith("A")


# -- non-deterministic tools ---------------------------------------------------------------


def test_non_deterministic_tool_with_changing_results_is_never_a_repeat() -> None:
    f = feed()
    verdicts: list[Any] = []
    for i in range(12):
        verdicts.extend(f.tool(f.call("clock"), make_tool_result(f"10:{i:02d}")))
    assert verdicts == [None] * 24
    assert f.field("duplicate_calls") == 0


def test_non_deterministic_tool_with_unchanged_result_warns_then_stops() -> None:
    f = feed()
    got = [f.tool(f.call("clock"), make_tool_result("10:00")) for _ in range(3)]
    assert [b for b, _ in got] == [None, None, None]  # never skipped
    assert kinds([a for _, a in got]) == [None, "warn", "stop:repeat_call"]
    warn = got[1][1]
    assert isinstance(warn, Warn) and "same result" in warn.message
    assert f.field("duplicate_calls") == 2


def test_a_changed_result_resets_the_repeat_count() -> None:
    f = feed()
    results = ["1", "1", "2", "2", "3"]
    after = [f.tool(f.call("clock"), make_tool_result(r))[1] for r in results]
    assert kinds(after) == [None, "warn", None, "warn", None]


# -- side effects --------------------------------------------------------------------------


def test_side_effect_repeats_are_never_skipped_but_the_window_rule_stops_them() -> None:
    f = feed()
    seq = ["refund", "lookup", "refund", "lookup2", "refund"]
    verdicts = []
    for i, name in enumerate(seq):
        c = (
            f.call("refund", {"order_id": "88231"})
            if name == "refund"
            else f.call("lookup", {"key": str(i)})
        )
        verdicts.append(f.tool(c, make_tool_result("done"))[0])
    assert kinds(verdicts) == [None, None, None, None, "stop:repeat_call"]
    stop = verdicts[-1]
    assert isinstance(stop, Stop)
    assert stop.evidence["rule"] == "window"
    assert stop.evidence["window_count"] == 2  # repeats (the first call is not one)
    assert stop.evidence["window"] == 5
    assert f.field("duplicate_calls") == 2


# -- the window rule -----------------------------------------------------------------------


def _window_feed(pattern: str, **settings: Any) -> list[str | None]:
    """Feed a pattern like 'A..A.A' of side-effect call A and distinct fillers '.'."""
    f = feed(**settings)
    out = []
    for i, ch in enumerate(pattern):
        c = (
            f.call("refund", {"order_id": "A"})
            if ch == "A"
            else f.call("lookup", {"key": f"filler{i}"})
        )
        out.append(kinds([f.tool(c, make_tool_result("r"))[0]])[0])
    return out


@pytest.mark.parametrize(
    ("pattern", "stops_at"),
    [
        ("A.A....A", None),  # 1 repeat within the last 5: N-1
        ("A..AA", 4),  # 2 repeats within the last 5: N
        ("AAAA", 2),  # N+1 would also stop
        ("A.A.A", 4),  # interleaved
        ("A....A....A", None),  # never 2 repeats within any 5
    ],
)
def test_window_rule_boundaries(pattern: str, stops_at: int | None) -> None:
    """The window counts repeats with nothing new in between (every filler here answers
    "r", the side effect's own answer: nothing new)."""
    got = _window_feed(pattern)
    stops = [i for i, k in enumerate(got) if k == "stop:repeat_call"]
    assert (stops[0] if stops else None) == stops_at


def test_window_rule_applies_to_skippable_calls_too() -> None:
    f = feed(stop_at_repeat=9)
    seq = ["a", "x", "a", "y", "a"]
    # the fillers x and y say the same thing: nothing new between the repeats of a
    verdicts = [
        f.tool(f.call("lookup", {"key": k}), make_tool_result(k if k == "a" else "filler"))[0]
        for k in seq
    ]
    assert kinds(verdicts) == [None, None, "skip", None, "stop:repeat_call"]
    assert isinstance(verdicts[-1], Stop) and verdicts[-1].evidence["rule"] == "window"


# -- skipped results are not tool results -----------------------------------------------------


def test_a_call_skipped_by_another_plugin_has_no_result_to_repeat() -> None:
    f = feed()
    c1 = f.call("lookup", {"key": "a"})
    assert f.before(c1) is None
    f.after(c1, make_tool_result("tool cap reached", skipped=True, skipped_by="tool_calls"))
    assert f.before(f.call("lookup", {"key": "a"})) is None  # not a repeat of a result


# -- settings and bounded state -------------------------------------------------------------


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="window_count"):
        RepeatCallSettings(window=3, window_count=4)
    with pytest.raises(ValidationError, match="repeat_hint"):
        RepeatCallSettings(repeat_hint="{nope}")
    with pytest.raises(ValidationError):
        RepeatCallSettings(stop_at_repeat=0)


def test_state_stays_bounded_over_a_10000_step_feed() -> None:
    f = feed(max_fingerprints=64)
    rng = random.Random(7)
    for i in range(10_000):
        name = rng.choice(["lookup", "clock", "refund"])
        args = (
            {"key": str(rng.randrange(500))}
            if name == "lookup"
            else ({"order_id": str(i)} if name == "refund" else {})
        )
        f.tool(f.call(name, args), make_tool_result("x" * rng.randrange(10_000)))
    st = f.run.state["repeat_call"]
    assert len(st.entries) <= 64
    assert len(st.window) <= 5
    assert all(len(e.content) <= 4000 for e in st.entries.values())


# -- fingerprint canonicalization (properties) ------------------------------------------------

_ALPHA = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 订单扫地机-_:"
_words = st.text(alphabet=_ALPHA, max_size=12)
_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda k: k.casefold() not in DEFAULT_VOLATILE_KEYS
)
_leaves = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _words
_json = st.recursive(
    _leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)
_args = st.dictionaries(_keys, _json, max_size=5)


def _map(value: Any, *, on_str: Any = None, on_dict: Any = None) -> Any:
    if isinstance(value, str):
        return on_str(value) if on_str else value
    if isinstance(value, list):
        return [_map(v, on_str=on_str, on_dict=on_dict) for v in value]
    if isinstance(value, dict):
        d = {k: _map(v, on_str=on_str, on_dict=on_dict) for k, v in value.items()}
        return on_dict(d) if on_dict else d
    return value


@given(_args, st.randoms(use_true_random=False))
def test_fingerprint_ignores_key_order(args: dict[str, Any], rnd: random.Random) -> None:
    def shuffle(d: dict[str, Any]) -> dict[str, Any]:
        items = list(d.items())
        rnd.shuffle(items)
        return dict(items)

    assert FINGERPRINT("t", _map(args, on_dict=shuffle)) == FINGERPRINT("t", args)


@given(_args, st.sampled_from([" ", "  ", "\t", "\n", " \r\n "]))
def test_fingerprint_ignores_whitespace(args: dict[str, Any], ws: str) -> None:
    def spread(s: str) -> str:
        return ws + s.replace(" ", " " + ws) + ws

    assert FINGERPRINT("t", _map(args, on_str=spread)) == FINGERPRINT("t", args)


@given(_args)
def test_fingerprint_ignores_case(args: dict[str, Any]) -> None:
    assert FINGERPRINT("t", _map(args, on_str=str.upper)) == FINGERPRINT("t", args)
    assert FINGERPRINT("t", _map(args, on_str=str.swapcase)) == FINGERPRINT("t", args)


@given(
    _args,
    st.sampled_from(DEFAULT_VOLATILE_KEYS),
    _json,
    st.randoms(use_true_random=False),
    st.booleans(),
)
def test_fingerprint_ignores_volatile_keys_at_any_depth(
    args: dict[str, Any], key: str, value: Any, rnd: random.Random, upper: bool
) -> None:
    vkey = key.upper() if upper else key

    def add(d: dict[str, Any]) -> dict[str, Any]:
        if rnd.random() < 0.5:
            return {**d, vkey: value}
        return d

    noisy = _map({**args, vkey: value}, on_dict=add)
    assert FINGERPRINT("t", noisy) == FINGERPRINT("t", args)


@given(_args, _keys, _json, _json)
def test_fingerprint_changes_with_a_real_value(
    args: dict[str, Any], key: str, a: Any, b: Any
) -> None:
    fp = Fingerprinter()
    assume(fp.canonical(a) != fp.canonical(b))
    assert fp("t", {**args, key: a}) != fp("t", {**args, key: b})


@given(_args)
def test_fingerprint_includes_the_tool_name(args: dict[str, Any]) -> None:
    assert FINGERPRINT("query_order", args) != FINGERPRINT("query_logistics", args)


def test_volatile_key_list_is_configurable() -> None:
    fp = Fingerprinter(["session"])
    assert fp("t", {"a": 1, "session": "x"}) == fp("t", {"a": 1, "session": "y"})
    assert fp("t", {"a": 1, "request_id": "x"}) != fp("t", {"a": 1, "request_id": "y"})


# -- epochs: a call that may change the world makes earlier results stale ----------------------


def test_a_lookup_after_a_side_effect_is_not_a_repeat() -> None:
    f = feed()
    f.tool(f.call("lookup", {"key": "88231"}), make_tool_result("status: paid"))
    f.tool(f.call("refund", {"order_id": "88231"}), make_tool_result("refunded"))
    # checking the work: the order must be looked up again, not answered from the old result
    assert f.tool(f.call("lookup", {"key": "88231"}), make_tool_result("status: refunded")) == (
        None,
        None,
    )
    v = f.before(f.call("lookup", {"key": "88231"}))
    assert isinstance(v, Skip) and v.observation.startswith("status: refunded")
    assert f.field("duplicate_calls") == 1


def test_a_failed_side_effect_changes_nothing() -> None:
    f = feed()
    f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))
    f.tool(
        f.call("refund", {"order_id": "a"}), make_tool_result("ERROR: refused", error="tool_error")
    )
    assert isinstance(f.before(f.call("lookup", {"key": "a"})), Skip)


def test_an_unchanged_poll_after_a_side_effect_is_information() -> None:
    """Re-running a check after changing a setting, and seeing the same result, tells the
    agent that the change did not help: not a repeat."""
    f = feed()
    after = []
    for i in range(4):
        after.append(f.tool(f.call("clock"), make_tool_result("speed: 0 Mbps"))[1])
        f.tool(f.call("refund", {"order_id": f"toggle{i}"}), make_tool_result("toggled"))
    assert after == [None] * 4
    assert f.field("duplicate_calls") == 0


def test_a_non_retryable_failure_may_be_tried_again_after_a_side_effect() -> None:
    f = feed()
    f.tool(f.call("lookup", {"key": "new"}), make_tool_result("NOT_FOUND: new", error="tool_error"))
    f.tool(f.call("refund", {"order_id": "create new"}), make_tool_result("created"))
    assert f.before(f.call("lookup", {"key": "new"})) is None


def test_the_window_rule_counts_within_one_epoch() -> None:
    f = feed(stop_at_repeat=9)
    verdicts = []
    for i in range(3):
        verdicts.append(f.tool(f.call("lookup", {"key": "a"}), make_tool_result("A"))[0])
        f.tool(f.call("refund", {"order_id": str(i)}), make_tool_result("done"))
    assert verdicts == [None, None, None]


def test_replayed_side_effects_count_across_epochs() -> None:
    """The loop replays a repeated side effect (a skipped result): it changes nothing, and the
    window rule stops the third one."""
    f = feed()
    c = f.call("refund", {"order_id": "88231"})
    assert f.tool(c, make_tool_result("refund RF1")) == (None, None)
    verdicts = []
    for _ in range(2):
        c = f.call("refund", {"order_id": "88231"})
        verdicts.append(f.before(c))
        f.after(
            c,
            make_tool_result(
                "refund was already executed: refund RF1", skipped=True, skipped_by="loopwarden"
            ),
        )
    assert kinds(verdicts) == [None, "stop:repeat_call"]
