"""Text helpers shared by the detectors: token sets and Jaccard similarity.

Tokens are CJK characters one by one (Chinese and Japanese have no spaces between words, so a
character set is what compares), and case-folded runs of letters and digits for everything
else; punctuation is ignored.  Pure CJK text thus becomes a character set, pure English text a
word set, and mixed text ("查询订单 88231") both.  Texts are clipped to ``max_chars`` first, so
the work per text is bounded however long an observation is.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["free_text_differs", "jaccard", "structurally_empty", "token_set"]

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")
# The same tokens for ASCII text (no CJK; casefold is lower, which keeps word boundaries).
_ASCII_TOKEN = re.compile(r"\w+", re.ASCII)


def token_set(text: str, max_chars: int = 4000) -> frozenset[str]:
    """The set of tokens of ``text`` (its first ``max_chars`` characters)."""
    text = text[:max_chars]
    if text.isascii():  # O(1) in CPython
        return frozenset(_ASCII_TOKEN.findall(text.lower()))
    return frozenset(map(str.casefold, _TOKEN.findall(text)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a & b| / |a | b|; two empty sets are identical (1.0)."""
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


_EMPTY_SCALARS = (None, "", "null", "none", "n/a")
_EMPTY_MAX_CHARS = 2000  # longer JSON is never "empty"; bounds the parse


def _empty_value(value: Any, depth: int = 0) -> bool:
    if isinstance(value, str):
        return value.strip().casefold() in _EMPTY_SCALARS
    if value is None:
        return True
    if isinstance(value, (list, dict)):
        if depth >= 4:
            return not value
        items = value.values() if isinstance(value, dict) else value
        return all(_empty_value(v, depth + 1) for v in items)
    return False


def structurally_empty(text: str) -> bool:
    """Whether ``text`` is JSON that holds nothing: ``[]``, ``{}``, ``null``, or containers
    whose values are all null / empty (``{"flights": [], "next": null}``)."""
    t = text.strip()
    if not t or len(t) > _EMPTY_MAX_CHARS or t[0] not in "[{n":
        return False
    try:
        value = json.loads(t)
    except (ValueError, RecursionError):
        return False
    return _empty_value(value)


_IDENTIFIER = re.compile(r"[\w.:/@+#-]{1,40}", re.ASCII)


def _free_text(value: Any) -> bool:
    """A value a model rephrases (words, CJK text), not an identifier it enumerates (a code,
    a date, an id, a number)."""
    return isinstance(value, str) and _IDENTIFIER.fullmatch(value.strip()) is None


def free_text_differs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two argument objects of one tool differ in free text -- a rephrased query --
    rather than only in identifiers (another date, airport, order id: a sweep)."""
    if a is None or b is None:
        return False
    keys = a.keys() | b.keys()
    return any(
        a.get(k) != b.get(k) and (_free_text(a.get(k)) or _free_text(b.get(k))) for k in keys
    )
