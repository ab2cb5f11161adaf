"""Token estimation: CJK-aware by default, tiktoken when installed and usable offline.

The default estimator counts one token per CJK character (Han, kana, hangul, full-width
punctuation) and about four characters per token for everything else (Latin text, digits,
JSON punctuation), plus a small fixed overhead per chat message.  It over-estimates English
slightly and matches Chinese closely, which is the safe side for a budget guard.

If ``tiktoken`` is installed *and* its encoding is already cached locally (it never downloads
here), :func:`get_estimator` ("auto") uses it instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["MESSAGE_OVERHEAD", "estimate_message", "estimate_text", "get_estimator"]

MESSAGE_OVERHEAD = 4

_CJK = re.compile(
    "[\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31bf"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)

TextEstimator = Callable[[str], int]


def estimate_text(text: str) -> int:
    """Estimated tokens of ``text``: CJK characters count 1 each, the rest ~4 chars a token."""
    if not text:
        return 0
    if text.isascii():  # O(1) in CPython: no CJK character, skip the scan
        return (len(text) + 3) // 4
    cjk = len(_CJK.findall(text))
    rest = len(text) - cjk
    return cjk + (rest + 3) // 4


_tiktoken_cache: list[TextEstimator | None] = []


def _tiktoken_estimator() -> TextEstimator | None:
    if _tiktoken_cache:
        return _tiktoken_cache[0]
    est: TextEstimator | None = None
    try:
        import tiktoken

        enc = tiktoken.get_encoding("o200k_base")

        def est(text: str) -> int:
            return len(enc.encode(text, disallowed_special=())) if text else 0
    except Exception:  # not installed, or the encoding is not cached offline
        est = None
    _tiktoken_cache.append(est)
    return est


def get_estimator(name: str = "cjk") -> TextEstimator:
    """Return a text estimator: ``"cjk"`` (default), ``"tiktoken"`` or ``"auto"``."""
    if name == "cjk":
        return estimate_text
    tk = _tiktoken_estimator()
    if tk is not None:
        return tk
    if name == "tiktoken":
        raise ValueError("tiktoken is not installed or its encoding is not available offline")
    return estimate_text


def estimate_message(message: Mapping[str, Any], text: TextEstimator = estimate_text) -> int:
    """Estimated tokens of one chat message (content, tool calls and a fixed overhead)."""
    n = MESSAGE_OVERHEAD
    content = message.get("content")
    if isinstance(content, str):
        n += text(content)
    elif content is not None:
        n += text(json.dumps(content, ensure_ascii=False))
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function", {})
        n += text(str(fn.get("name", ""))) + text(str(fn.get("arguments", ""))) + 3
    return n


def estimate_messages(
    messages: Iterable[Mapping[str, Any]], text: TextEstimator = estimate_text
) -> int:
    return sum(estimate_message(m, text) for m in messages)


def estimate_tools(tools: Iterable[Mapping[str, Any]], text: TextEstimator = estimate_text) -> int:
    """Estimated tokens that tool schemas add to a request."""
    return sum(text(json.dumps(t, ensure_ascii=False, separators=(",", ":"))) for t in tools)
