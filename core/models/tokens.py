"""Token estimation: CJK-aware by default, tiktoken when installed and usable offline.

The default estimator counts one token per CJK character (Han, kana, hangul, full-width
punctuation) and about four characters per token for everything else (Latin text, digits,
JSON punctuation), plus a small fixed overhead per chat message.  It over-estimates English
slightly and matches Chinese closely, which is the safe side for a budget guard.

If ``tiktoken`` is installed *and* its encoding file is already in tiktoken's local cache,
:func:`get_estimator` ("auto" or "tiktoken") uses it instead.  It never downloads: tiktoken
fetches a missing (or corrupt) encoding file from the network inside ``get_encoding``, so the
cache file is looked up and its hash checked *before* tiktoken is asked for the encoding.  The
cache is where tiktoken keeps it: ``$TIKTOKEN_CACHE_DIR``, else ``$DATA_GYM_CACHE_DIR``, else
``<tmp>/data-gym-cache``, one file per encoding named by the SHA-1 of its URL.  To prepare a
machine, run ``tiktoken.get_encoding("o200k_base")`` once where the network is reachable (or
copy the cache directory) -- and keep ``TIKTOKEN_CACHE_DIR`` pointing at it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from loopwarden.exceptions import ConfigError

__all__ = [
    "MESSAGE_OVERHEAD",
    "TIKTOKEN_ENCODING",
    "estimate_message",
    "estimate_text",
    "get_estimator",
    "reset_tiktoken",
    "tiktoken_cache_file",
    "tiktoken_estimator",
]

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


#: the encoding used by "tiktoken"/"auto" (GPT-4o's), its file URL and SHA-256 (as tiktoken's
#: own registry, tiktoken_ext.openai_public, declares them)
TIKTOKEN_ENCODING = "o200k_base"
_TIKTOKEN_FILES: dict[str, tuple[str, str]] = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}


def tiktoken_cache_file(encoding: str = TIKTOKEN_ENCODING) -> Path | None:
    """Where tiktoken caches ``encoding``'s file (None: caching is switched off)."""
    url, _ = _TIKTOKEN_FILES[encoding]
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache_dir == "":
        return None
    return Path(cache_dir) / hashlib.sha1(url.encode()).hexdigest()


def _cached_offline(encoding: str) -> bool:
    """True when ``encoding``'s file is in the cache with the right hash (no download needed)."""
    path = tiktoken_cache_file(encoding)
    if path is None or not path.is_file():
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == _TIKTOKEN_FILES[encoding][1]


def _load_tiktoken(encoding: str) -> TextEstimator | None:
    try:
        import tiktoken

        enc = tiktoken.get_encoding(encoding)
    except Exception:  # not installed, or unusable: fall back to the default
        return None

    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=())) if text else 0

    return count


_tiktoken_lock = threading.Lock()
_tiktoken_loaded: dict[str, TextEstimator | None] = {}


def tiktoken_estimator(encoding: str = TIKTOKEN_ENCODING) -> TextEstimator | None:
    """A tiktoken counter for ``encoding``, or None when tiktoken is not installed or the
    encoding is not cached locally.  Never touches the network; the answer is remembered per
    process (:func:`reset_tiktoken` forgets it)."""
    with _tiktoken_lock:
        if encoding in _tiktoken_loaded:
            return _tiktoken_loaded[encoding]
        est: TextEstimator | None = None
        if encoding in _TIKTOKEN_FILES and _cached_offline(encoding):
            est = _load_tiktoken(encoding)
        _tiktoken_loaded[encoding] = est
        return est


def reset_tiktoken() -> None:
    """Forget which tiktoken encodings were found (after the cache changed; for tests)."""
    with _tiktoken_lock:
        _tiktoken_loaded.clear()


def get_estimator(name: str = "cjk") -> TextEstimator:
    """Return a text estimator: ``"cjk"`` (default), ``"tiktoken"`` (required: a ConfigError
    when unavailable offline) or ``"auto"`` (tiktoken when available offline, else "cjk")."""
    if name == "cjk":
        return estimate_text
    tk = tiktoken_estimator()
    if tk is not None:
        return tk
    if name == "tiktoken":
        where = tiktoken_cache_file()
        raise ConfigError(
            "tiktoken is not installed, or its encoding "
            f"{TIKTOKEN_ENCODING!r} is not cached at {where or '(caching disabled)'}",
            key="run.token_estimator",
            expected='"cjk" or "auto", or tiktoken installed with its encoding cached',
        )
    return estimate_text


def estimate_message(message: Mapping[str, Any], text: TextEstimator = estimate_text) -> int:
    """Estimated tokens of one chat message (content, tool calls and a fixed overhead)."""
    n = MESSAGE_OVERHEAD
    content = message.get("content")
    if type(content) is str or isinstance(content, str):  # the exact type: no call
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
