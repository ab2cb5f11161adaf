"""Text helpers shared by the detectors: token sets and Jaccard similarity.

Tokens are CJK characters one by one (Chinese and Japanese have no spaces between words, so a
character set is what compares), and case-folded runs of letters and digits for everything
else; punctuation is ignored.  Pure CJK text thus becomes a character set, pure English text a
word set, and mixed text ("查询订单 88231") both.  Texts are clipped to ``max_chars`` first, so
the work per text is bounded however long an observation is.
"""

from __future__ import annotations

import re

__all__ = ["jaccard", "token_set"]

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")


def token_set(text: str, max_chars: int = 4000) -> frozenset[str]:
    """The set of tokens of ``text`` (its first ``max_chars`` characters)."""
    return frozenset(t.casefold() for t in _TOKEN.findall(text[:max_chars]))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a & b| / |a | b|; two empty sets are identical (1.0)."""
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)
