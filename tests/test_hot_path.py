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
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, Fingerprinter, canonical_arguments
from loopwarden.loop import _ToolThreads
from loopwarden.plugins._text import token_set
from loopwarden.tokens import estimate_text

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
    return json.dumps(_ref_canon(arguments, vol), sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))


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
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), texts
)
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
        "q", {"a": None, "b": [{"a": 2, "z": 1}]})
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


def _run_job(pool: _ToolThreads, fn: Any, *args: Any,
             context: contextvars.Context | None = None) -> tuple[bool, Any]:
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
    pool.submit(contextvars.Context(), blocking, (), "slow", lambda ok, v: delivered.set(),
                lambda: True)  # the waiter gave up
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
