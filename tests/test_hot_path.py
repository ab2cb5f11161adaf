"""The hot path's fast versions give exactly what the straightforward versions gave.

Each reference below is the implementation as it was before it was made cheap; the property
tests compare them on arbitrary input (ASCII, CJK, whitespace of every kind, nested JSON).
The worker threads that run blocking tools under a deadline are tested at the end.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
import threading
from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.detectors import Feed

from loopwarden.engine.execution import _ToolThreads
from loopwarden.events import ModelResponse, ToolCall, ToolResult
from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, Fingerprinter, canonical_arguments
from loopwarden.models.tokens import estimate_text
from loopwarden.plugins._text import token_set
from loopwarden.plugins.no_progress import NoProgress, NoProgressSettings
from loopwarden.plugins.stall import Stall, StallSettings

# -- references (the code before optimisation) -----------------------------------------------

_WS = re.compile(r"\s+")


def _ref_canon(value: Any, volatile: frozenset[str]) -> Any:
    if isinstance(value, str):
        return _WS.sub(" ", value).strip().casefold()
    if isinstance(value, dict):
        return {
            str(k): _ref_canon(v, volatile)
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            if str(k).casefold() not in volatile
        }
    if isinstance(value, (list, tuple)):
        return [_ref_canon(v, volatile) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _ref_canonical(arguments: Any) -> str:
    vol = frozenset(k.casefold() for k in DEFAULT_VOLATILE_KEYS)
    return json.dumps(
        _ref_canon(arguments, vol), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )


def _ref_fingerprint(name: str, arguments: Any) -> str:
    digest = hashlib.blake2b(_ref_canonical(arguments).encode("utf-8"), digest_size=8)
    return f"{name}:{digest.hexdigest()}"


_CJK_EST = re.compile(
    "[\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31bf"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)


def _ref_estimate_text(text: str) -> int:
    if not text:
        return 0
    cjk = len(_CJK_EST.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


_CJK_TOK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(f"[{_CJK_TOK}]|[^\\W{_CJK_TOK}]+")


def _ref_token_set(text: str, max_chars: int = 4000) -> frozenset[str]:
    return frozenset(t.casefold() for t in _TOKEN.findall(text[:max_chars]))


# -- strategies --------------------------------------------------------------------------------

_chars = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x1d\x85\xa0\u2028\u3000_-.,:;'\"\\ßİﬁΣσς")),
    st.sampled_from(list("订单查询物流比特扫地机はカ한글")),
)
texts = st.text(_chars, max_size=60)
keys = st.one_of(texts, st.sampled_from(["Request_ID", "nonce", "order_id", "Timestamp"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), texts)
json_like = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(keys, st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(json_like)
def test_canonical_arguments_match_the_reference(arguments: Any) -> None:
    assert canonical_arguments(arguments) == _ref_canonical(arguments)
    assert Fingerprinter().canonical(arguments) == _ref_canonical(arguments)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=12), json_like)
def test_fingerprints_match_the_reference(name: str, arguments: Any) -> None:
    try:
        expected = _ref_fingerprint(name, arguments)
    except UnicodeEncodeError:  # lone surrogates: both ways refuse them
        return
    assert Fingerprinter()(name, arguments) == expected


def test_fingerprint_examples() -> None:
    fp = Fingerprinter()
    a = fp("query_order", {"order_id": " 88231 ", "request_id": "r1"})
    b = fp("query_order", {"request_id": "r2", "order_id": "88231"})
    assert a == b == _ref_fingerprint("query_order", {"order_id": "88231"})
    assert fp("q", {"x": 1.0}) == fp("q", {"x": 1}) != fp("q", {"x": 1.5})
    assert fp("q", {1: "a", "1": "b"}) == _ref_fingerprint("q", {1: "a", "1": "b"})
    assert fp("q", {"1": "b", 1: "a"}) == _ref_fingerprint("q", {"1": "b", 1: "a"})
    assert fp("q", {"b": [{"z": 1, "a": 2}], "a": None}) == _ref_fingerprint(
        "q", {"a": None, "b": [{"a": 2, "z": 1}]}
    )
    assert fp("q", "raw {not json") == _ref_fingerprint("q", "raw {not json")


@settings(max_examples=400, deadline=None)
@given(texts)
def test_estimate_text_matches_the_reference(text: str) -> None:
    assert estimate_text(text) == _ref_estimate_text(text)


@settings(max_examples=400, deadline=None)
@given(texts, st.integers(min_value=1, max_value=80))
def test_token_set_matches_the_reference(text: str, max_chars: int) -> None:
    assert token_set(text, max_chars) == _ref_token_set(text, max_chars)
    assert token_set(text) == _ref_token_set(text)


def test_token_set_examples() -> None:
    assert token_set("Checking Order 88231, again!") == {"checking", "order", "88231", "again"}
    assert token_set("查询订单 88231") == {"查", "询", "订", "单", "88231"}
    assert token_set("İstanbul STRASSE straße") == _ref_token_set("İstanbul STRASSE straße")


# -- blocking tools under a deadline run on reused worker threads --------------------------------


def _run_job(
    pool: _ToolThreads, fn: Any, *args: Any, context: contextvars.Context | None = None
) -> tuple[bool, Any]:
    done = threading.Event()
    box: list[tuple[bool, Any]] = []

    def finished(ok: bool, payload: Any) -> None:
        box.append((ok, payload))
        done.set()

    pool.submit(context or contextvars.Context(), fn, args, "probe", finished, lambda: False)
    assert done.wait(10)
    return box[0]


def test_an_idle_worker_takes_the_next_call() -> None:
    pool = _ToolThreads(idle_s=30)
    first = _run_job(pool, lambda: (threading.get_ident(), threading.current_thread().name))
    second = _run_job(pool, lambda: (threading.get_ident(), threading.current_thread().name))
    assert first[0] and second[0]
    assert first[1][0] == second[1][0] != threading.get_ident()  # one thread, reused
    assert first[1][1] == "loopwarden-tool-probe"  # named after the tool while it runs


def test_each_call_gets_its_own_context_and_exceptions_are_delivered() -> None:
    pool = _ToolThreads(idle_s=30)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    assert _run_job(pool, var.set, "leaked")[0]
    assert _run_job(pool, var.get) == (True, "unset")

    def boom() -> None:
        raise KeyError("inside the tool")

    ok, exc = _run_job(pool, boom)
    assert not ok and isinstance(exc, KeyError)
    assert _run_job(pool, lambda: 7) == (True, 7)  # the worker survived


def test_an_abandoned_worker_ends_when_its_tool_returns_and_is_not_reused() -> None:
    pool = _ToolThreads(idle_s=30)
    release, started = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def blocking() -> str:
        threads.append(threading.current_thread())
        started.set()
        release.wait(10)
        return "late"

    delivered = threading.Event()
    pool.submit(
        contextvars.Context(), blocking, (), "slow", lambda ok, v: delivered.set(), lambda: True
    )  # the waiter gave up
    assert started.wait(10)
    other = _run_job(pool, threading.current_thread)  # the busy worker is not handed it
    assert other[1] is not threads[0]
    release.set()
    threads[0].join(10)
    assert not threads[0].is_alive() and delivered.is_set()


def test_idle_workers_end_after_idle_s() -> None:
    pool = _ToolThreads(idle_s=0.01)
    ok, thread = _run_job(pool, threading.current_thread)
    thread.join(10)
    assert ok and not thread.is_alive()
    assert _run_job(pool, lambda: "fresh")[1] == "fresh"  # a new worker starts on demand


# -- the detectors' constant-work checks decide exactly as the straightforward ones did ----------

_VOCAB = [
    "订单",
    "88231",
    "order",
    "status",
    "shipped",
    "not",
    "found",
    "物流",
    "SF1234567890",
    "again",
    "the",
    "same",
    "result",
    "查询",
]
_words = st.lists(st.sampled_from(_VOCAB), max_size=7)


def _verdict_view(v: Any) -> Any:
    if v is None:
        return None
    return (v.kind, getattr(v, "soft", None), getattr(v, "message", None), dict(v.evidence))


class _RefStall:
    """The stall check as it was: max() over every recent result."""

    def __init__(self, s: StallSettings) -> None:
        self.s, self.recent, self.streak = s, deque(maxlen=s.window), 0
        self.same_fp: str | None = None  # the streak's call, while each round repeats it

    def after_tool(self, call: ToolCall, result: ToolResult, step: int) -> Any:
        if result.skipped:
            return None
        s = self.s
        tokens = _ref_token_set(result.content, s.max_chars)
        fp = call.fingerprint
        best = 0.0
        for d, t, _ in self.recent:
            if d == result.digest or (not tokens and not t):
                sim = 1.0
            else:
                sim = len(tokens & t) / len(tokens | t)
            best = max(best, sim)
            if best >= 1.0:
                break
        # a call that may change state is progress, unless it is the same call again with the
        # same result (the 0.3 rule: it evidently changed nothing)
        changed_world = (
            result.ok
            and call.may_change_state
            and not any(d == result.digest and f == fp for d, _, f in self.recent)
        )
        stalled = bool(self.recent) and best >= s.similarity and not changed_world
        again = any(d == result.digest and f == fp for d, _, f in self.recent)
        self.recent.append((result.digest, tokens, fp))
        if not stalled:
            self.streak = 0
            self.same_fp = None
            return None
        if self.streak == 0:
            self.same_fp = fp if again else None
        elif not again or fp != self.same_fp:
            self.same_fp = None
        self.streak += 1
        # one call answered the same way again and again: a repeat (same_call_stop_after)
        threshold = (
            max(s.stop_after, s.same_call_stop_after) if self.same_fp is not None else s.stop_after
        )
        # (with "any" every stalled round is strong: strong == streak, rule "repeat")
        evidence = dict(
            count=self.streak,
            streak=self.streak,
            strong=self.streak,
            threshold=threshold,
            same_call=self.same_fp is not None,
            sweep_threshold=s.sweep_stop_after,
            similarity=round(best, 3),
            similarity_threshold=s.similarity,
            window=s.window,
            tool=call.name,
            fingerprint=call.fingerprint,
            signature=call.signature(),
            digest=result.digest,
            step=step,
            rule="repeat",
        )
        fields = dict(count=self.streak, tool=call.name)
        if self.streak >= threshold:
            return ("stop", s.soft, s.stop_message.format(**fields), evidence)
        if s.warn_after is not None and self.streak == s.warn_after:
            return ("warn", None, s.message.format(**fields), evidence)
        return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(_VOCAB[:5]), max_size=5),
            st.sampled_from(["lookup", "lookup", "refund"]),
            st.booleans(),
            st.booleans(),
        ),
        max_size=25,
    ),
    st.sampled_from([0.5, 2 / 3, 0.75, 0.8, 0.9, 1.0]),
    st.integers(min_value=1, max_value=6),
)
def test_stall_decides_as_the_reference(
    events: list[tuple[list[str], str, bool, bool]], similarity: float, window: int
) -> None:
    # "any": the reference predates the different-calls rule; this pins the similarity check
    s = StallSettings(
        similarity=similarity, window=window, stop_after=4, warn_after=2, different_calls="any"
    )
    plugin, ref = Stall(s), _RefStall(s)
    feed = Feed(plugin)
    for words, name, ok, skip in events:
        feed.run.step += 1
        call = feed.call(name, {"order_id": "1"} if name == "refund" else {"key": "k"})
        result = ToolResult(content=" ".join(words), ok=ok, skipped=skip)
        got = plugin.after_tool(feed.run, call, result)
        assert _verdict_view(got) == ref.after_tool(call, result, feed.run.step)


def test_stall_similarity_exactly_at_the_size_bound_counts() -> None:
    # {a, b} against {a, b, c, d}: Jaccard 0.5 = min/max, so with similarity = 0.5 it stalls
    s = StallSettings(similarity=0.5, window=3, stop_after=3, warn_after=1)
    feed = Feed(Stall(s))
    plugin = feed.plugin
    call = feed.call("lookup", {"key": "k"})
    assert plugin.after_tool(feed.run, call, ToolResult(content="a b c d")) is None
    verdict = plugin.after_tool(feed.run, call, ToolResult(content="a b"))
    assert verdict is not None and verdict.evidence["similarity"] == 0.5


class _RefNoProgress:
    """The no_progress check as it was: every similarity of the window scanned."""

    def __init__(self, s: NoProgressSettings) -> None:
        self.s, self.contents, self.warned = s, deque(maxlen=s.window), False

    def after_response(self, content: str, calls: bool, step: int) -> Any:
        content = content.strip()
        if not content or not calls:
            return None
        s = self.s
        tokens = _ref_token_set(content, s.max_chars)
        sim = None
        if self.contents:
            prev = self.contents[-1][0]
            sim = 1.0 if not tokens and not prev else len(tokens & prev) / len(tokens | prev)
        self.contents.append([tokens, sim, step, 0])
        if len(self.contents) < s.window:
            return None
        sims = [c[1] for c in self.contents][1:]
        if any(x is None or x < s.threshold for x in sims):
            self.warned = False
            return None
        lowest = min(x for x in sims if x is not None)
        new = sum(c[3] for c in self.contents) - self.contents[-1][3]
        evidence = dict(
            similarities=[round(x, 3) for x in sims if x is not None],
            threshold=s.threshold,
            window=s.window,
            new_results=new,
            steps=[c[2] for c in self.contents],
        )
        fields = dict(count=s.window, similarity=round(lowest, 2))
        if new == 0:
            return ("stop", s.soft, s.stop_message.format(**fields), evidence)
        if s.warn_on_similar and not self.warned:
            self.warned = True
            return ("warn", None, s.message.format(**fields), evidence)
        return None

    def new_result(self) -> None:
        if self.contents:
            self.contents[-1][3] += 1


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(_VOCAB[:5]), max_size=5),
            st.booleans(),
            st.sampled_from(["r1", "r2", "r3", "r4"]),
            st.booleans(),
        ),
        max_size=25,
    ),
    st.sampled_from([0.5, 0.7, 1.0]),
    st.integers(min_value=2, max_value=4),
)
def test_no_progress_decides_as_the_reference(
    events: list[tuple[list[str], bool, str, bool]], threshold: float, window: int
) -> None:
    s = NoProgressSettings(threshold=threshold, window=window, result_memory=2)
    plugin, ref = NoProgress(s), _RefNoProgress(s)
    feed = Feed(plugin)
    seen: list[str] = []
    for words, has_calls, observation, skip in events:
        feed.run.step += 1
        call = feed.call("lookup", {"key": "k"})
        response = ModelResponse(content=" ".join(words), calls=[call] if has_calls else [])
        got = plugin.after_response(feed.run, response)
        assert _verdict_view(got) == ref.after_response(" ".join(words), has_calls, feed.run.step)
        result = ToolResult(content=observation, skipped=skip)
        plugin.after_tool(feed.run, call, result)
        if not skip:  # the reference's memory of digests: the last result_memory, LRU
            if result.digest in seen:
                seen.remove(result.digest)
            else:
                ref.new_result()
            seen.append(result.digest)
            del seen[: -s.result_memory]


# -- json_loads: json.loads without its Python frames ------------------------------------------


def _outcome(fn: Any, text: str) -> Any:
    try:
        return ("ok", fn(text))
    except json.JSONDecodeError as exc:
        return ("error", str(exc), exc.pos)
    except RecursionError:
        return ("recursion",)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400)
@given(
    _json_values,
    st.sampled_from(["", " ", "\n\t ", "\ufeff"]),
    st.sampled_from(["", " ", "\r\n", " x", "}", ",1", "\u3000"]),
)
def test_json_loads_matches_json_loads(value: Any, head: str, tail: str) -> None:
    from loopwarden.sanitize import json_loads

    text = head + json.dumps(value, ensure_ascii=False) + tail
    assert _outcome(json_loads, text) == _outcome(json.loads, text)


@settings(max_examples=300)
@given(st.text(alphabet='{}[]",:0123456789.eE+- \ntrufalsn\\u\ud800', max_size=40))
def test_json_loads_matches_json_loads_on_any_text(text: str) -> None:
    from loopwarden.sanitize import json_loads

    assert _outcome(json_loads, text) == _outcome(json.loads, text)
