"""The hot path's fast versions give exactly what the straightforward versions gave.

Each reference below is the implementation as it was before it was made cheap; the property
tests compare them on arbitrary input (ASCII, CJK, whitespace of every kind, nested JSON).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, Fingerprinter, canonical_arguments
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
