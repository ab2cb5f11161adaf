"""What a tool answer says: the normalisation every detector compares answers through.

A detector that asks "did the same call get the same answer?" must not be fooled by the parts
of an answer that change on every call without saying anything new: a shell's line counter
(``/bin/bash: line 11301: cd: x: No such file or directory``, then ``line 11316``), a clock, a
duration, a request id, a temp path.  :class:`AnswerMasks` replaces those parts with a
placeholder before hashing, so the same error with a new line number is the same error.

What is masked (the default patterns, in this order; each match becomes the placeholder shown):

========================  =========================================================  ==========
part                      example                                                    becomes
========================  =========================================================  ==========
uuid                      ``3f2b9c1e-8d4a-4b6f-9e2a-1c5d7e9f0a1b``                   ``<uuid>``
timestamp                 ``2026-12-02T20:51:54.123Z``, ``2026-12-02 20:51``         ``<time>``
clock time with seconds   ``20:51:54``, ``20:51:54.120``                             ``<time>``
epoch seconds / millis    ``1764708714``, ``1764708714123``                          ``<epoch>``
line number               ``line 11301``, ``File "a.py", line 12``, ``a.py:12:5``    ``line <n>``
duration                  ``0.53s``, ``12ms``, ``real 0m1.204s``, ``took 3 seconds`` ``<dur>``
address, hex id           ``0x7f3a2c``, ``9fceb02d0ae598e95dc970b74767f19372d61af8`` ``<hex>``
temp path                 ``/tmp/pytest-of-root/x1/f.py``, ``tmpa8f3k2_q``           ``<tmp>``
process / cell counter    ``pid 4211``, ``In [12]:``, ``Out[12]:``                   ``pid <n>``
========================  =========================================================  ==========

Plain numbers are **not** masked: a status that moves (``42% done``, ``3 of 10 shards``), a
count of results, a price, a date (``2026-06-22``) or an hour (``14:05``, a flight's departure)
is what an answer says.  A date alone is data; a date with a time of day is a timestamp.

:meth:`AnswerMasks.shape` goes further and masks every digit run: two answers of the same
shape differ only in their numbers.  That is weaker evidence (a poll whose percentage moves
has one shape), which :mod:`loopwarden.plugins.repeat_call` counts only in a long streak of
the same call.

Configurable per deployment in ``[run]``: ``mask_volatile = false`` compares answers byte for
byte; ``volatile_patterns = [...]`` adds regular expressions whose matches are masked too
(``<v>``).  Work per answer is bounded: only the first ``max_chars`` characters are masked,
the rest is hashed as it is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

__all__ = ["DEFAULT_ANSWER_MASKS", "AnswerMasks", "default_masks"]

#: the default volatile parts: (name, pattern, replacement), applied in one pass, in this
#: order; every pattern starts at a word boundary (one ``\b`` for all of them: a fast scan)
DEFAULT_ANSWER_MASKS: tuple[tuple[str, str, str], ...] = (
    (
        "uuid",
        r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        "<uuid>",
    ),
    (
        "timestamp",
        r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
        r"(?:\s?(?:Z|UTC|[+-]\d{2}:?\d{2}))?(?![\d:])",
        "<time>",
    ),
    ("clock", r"\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?![\d:])", "<time>"),
    ("epoch", r"1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?(?![\d.])", "<epoch>"),
    (
        "line",
        r"(?:[Ll]ine|LINE|lineno|ln)\s*[:=#]?\s*\d+(?:\s*[:,]\s*(?:col(?:umn)?\s*)?\d+)?",
        "line <n>",
    ),
    # after a file name's extension only (checked on the match): a.py:12:5
    ("file_line", r":\d+(?::\d+)?\b", ":line <n>"),
    (
        "duration",
        r"\d+m\d+(?:\.\d+)?s\b|\d+(?:\.\d+)?\s?(?:ms|µs|us|ns)\b"
        r"|\d+\.\d+\s?(?:s|sec|secs|seconds)\b"
        r"|(?:took|after|elapsed|in) \d+\s?(?:s|sec|secs|seconds)\b",
        "<dur>",
    ),
    ("address", r"0x[0-9a-fA-F]+\b", "<hex>"),
    # with a digit and a letter in it (checked on the match): a sha, an object id
    ("hex_id", r"[0-9a-f]{8,}\b", "<hex>"),
    ("temp_path", r"tmp\w{6,}", "<tmp>"),
    ("counter", r"(?:pid|PID|process)\s*[:=#]?\s*\d+|(?:In|Out)\s?\[\d+\]", "pid <n>"),
)

#: temp directories, matched anywhere (a path starts after a quote or a space)
_TEMP_DIR = r"/(?:private/)?(?:var/)?(?:tmp|folders)/[^\s'\"`,;:)\]}]*"

_DIGITS = re.compile(r"\d+")
_EXTENSION = re.compile(r"\.[A-Za-z]{1,4}$")
_HEX_LETTER = re.compile(r"[a-f]")
_HEX_DIGIT = re.compile(r"\d")


def _file_line(m: re.Match[str]) -> bool:
    start = m.start()
    return _EXTENSION.search(m.string, max(0, start - 5), start) is not None


def _hex_id(m: re.Match[str]) -> bool:
    text = m.group()
    return _HEX_LETTER.search(text) is not None and _HEX_DIGIT.search(text) is not None


#: checks a default pattern's match must pass to be masked (by name)
_CHECKS = {"file_line": _file_line, "hex_id": _hex_id}


class AnswerMasks:
    """Masks the volatile parts of tool answers (see the module docstring); one per
    deployment, shared by every detector.  Immutable and thread-safe."""

    __slots__ = ("_checks", "_pattern", "_replacements", "enabled", "max_chars", "patterns")

    def __init__(
        self,
        extra_patterns: Iterable[str] = (),
        *,
        enabled: bool = True,
        defaults: Sequence[tuple[str, str, str]] = DEFAULT_ANSWER_MASKS,
        max_chars: int = 20000,
    ) -> None:
        self.enabled = enabled
        self.max_chars = max_chars
        extra = list(extra_patterns)
        self.patterns = (
            tuple(p for _, p, _ in defaults) + (_TEMP_DIR,) * bool(defaults) + tuple(extra)
        )
        alternatives = []
        if defaults:
            alternatives.append(r"\b(?:" + "|".join(f"({p})" for _, p, _ in defaults) + ")")
            alternatives.append(f"({_TEMP_DIR})")
        alternatives += [f"({p})" for p in extra]
        # one alternation, one pass over the text: group i is pattern i
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None
        own = [(r, _CHECKS.get(name)) for name, _, r in defaults]
        if defaults:
            own.append(("<tmp>", None))
        self._replacements = [r for r, _ in own] + ["<v>"] * len(extra)
        self._checks = [c for _, c in own] + [None] * len(extra)
        # inner groups of a pattern would shift the numbering: patterns use (?:...) only
        if self._pattern is not None and self._pattern.groups != len(self._replacements):
            raise ValueError(
                "volatile patterns must not contain capturing groups: write (?:...) instead"
            )

    def _sub(self, m: re.Match[str]) -> str:
        i = (m.lastindex or 1) - 1
        check = self._checks[i]
        if check is not None and not check(m):
            return m.group()
        return self._replacements[i]

    def mask(self, text: str) -> str:
        """``text`` with its volatile parts replaced by placeholders (its first ``max_chars``
        characters; the rest as it is)."""
        if not self.enabled or self._pattern is None or not text:
            return text
        head, tail = text[: self.max_chars], text[self.max_chars :]
        return self._pattern.sub(self._sub, head) + tail

    def digest(self, text: str) -> str:
        """A short hash of what ``text`` says: equal for two answers that differ only in
        their volatile parts."""
        return hashlib.blake2b(
            self.mask(text).encode("utf-8", "replace"), digest_size=8
        ).hexdigest()

    def shape(self, text: str) -> str:
        """A short hash of ``text`` with every digit run masked as well: equal for two
        answers that differ only in their numbers."""
        masked = _DIGITS.sub("#", self.mask(text[: self.max_chars])) + text[self.max_chars :]
        return hashlib.blake2b(masked.encode("utf-8", "replace"), digest_size=8).hexdigest()


_DEFAULT: AnswerMasks | None = None


def default_masks() -> AnswerMasks:
    """The default masks (built once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AnswerMasks()
    return _DEFAULT
