"""What "the same" means: canonical tool-call fingerprints and masked tool answers, computed
once per call and per result and shared by every plugin.

Two calls are "the same call" when their tool name and canonical arguments match: keys sorted,
whitespace collapsed, strings case-folded, volatile keys (request ids, timestamps, nonces)
dropped at any depth.  The fingerprint is a short hash of the canonical JSON.  A side
effect's idempotency key (:func:`idempotency_key`) is canonicalised the same way, so the
ledger never runs twice what the repeat detector calls one call.  A tool declared with
``normalize_arguments=False`` compares its string values exactly, in both.

**Answers** (:class:`AnswerMasks`): what a tool answer says, the normalisation every detector
compares answers through.

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

**Numbers that are the answer.**  A number is noise or the answer depending on where it
stands and on what the answer is, by this rule (the same for every detector):

1. Plain numbers are **never** masked: a status that moves (``42% done``, ``3 of 10
   shards``), a queue length, a balance, a count of results, a price, a date (``2026-06-22``)
   or an hour (``14:05``, a flight's departure) is what an answer says.  A date alone is data;
   a date with a time of day is a timestamp.
2. A **time** (timestamp, clock time, epoch) is the answer when the answer is short (at most
   ``time_value_chars`` characters, ``[run] time_value_chars``, default 120) and the time is not
   a log stamp: a clock's ``2026-12-02 20:51:54``, ``{"now": "20:51:54"}``, ``Current time:
   20:51:54`` are kept, so a clock read three times gives three answers.  A time that opens a
   line followed by more text (``[2026-12-02T10:00:01Z] upstream down``) is a log stamp, and a
   time inside a longer answer (a log, a traceback, a record) is noise: both are masked.
3. Ids, line numbers, durations, addresses, temp paths and process counters are noise
   wherever they stand.
4. **Failures** are compared by their *shape* (:meth:`AnswerMasks.shape`: every digit run
   masked): an error with a new line number, port or counter is the same error.  A successful
   answer of the same shape as the last one -- only its numbers changed -- is news when its
   numbers are new (a percentage that moves is progress) and stale when they come back (a
   status jittering between 3 and 4 of 10): :mod:`loopwarden.plugins.repeat_call` counts
   only the stale ones, and needs a streak of them (``shape_streak``).

Configurable per deployment in ``[run]``: ``mask_volatile = false`` compares answers byte for
byte; ``volatile_patterns = [...]`` adds regular expressions whose matches are masked too
(``<v>``) wherever they stand; ``time_value_chars = 0`` masks every time as noise (rule 2
off).  Work per answer is bounded: only the first ``max_chars`` characters are masked,
the rest is hashed as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from hashlib import blake2b
from typing import Any

__all__ = [
    "DEFAULT_ANSWER_MASKS",
    "DEFAULT_VOLATILE_KEYS",
    "AnswerMasks",
    "Fingerprinter",
    "canonical_arguments",
    "default_masks",
    "idempotency_key",
    "shape_of",
]

DEFAULT_VOLATILE_KEYS: tuple[str, ...] = (
    "request_id",
    "trace_id",
    "span_id",
    "timestamp",
    "nonce",
    "idempotency_key",
)

# One encoder, built once: ``json.dumps`` with non-default options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _c_encoder() -> Callable[[Any], str] | None:
    """The C iterencoder that ``_ENCODER.encode`` would build on every call, built once.

    Without a circular-reference check (canonical trees are fresh and acyclic).  ``None`` when
    this Python has no C encoder or its output differs from ``_ENCODER`` on a sample.
    """
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

        make = c_make_encoder(
            None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, True
        )

        def encode(obj: Any) -> str:
            return "".join(make(obj, 0))

        sample = {"b": [1, 2.5, None, True, float("nan")], "a": {"q": 'x"\n\u00e9\u4e2d'}}
        if encode(sample) != _ENCODER.encode(sample):
            return None
    except Exception:  # no C accelerator (another Python), or a changed signature
        return None
    return encode


_encode: Callable[[Any], str] = _c_encoder() or _ENCODER.encode


def _canon(value: Any, volatile: frozenset[str], fold: bool = True) -> Any:
    # the exact types first (no isinstance() call for a JSON string or object), subclasses
    # after them, in the same order
    t = type(value)
    if t is not str and t is not dict:
        if isinstance(value, str):
            t = str
        elif isinstance(value, dict):
            t = dict
    if t is str:
        # whitespace runs collapsed to one space, ends stripped (str.split's whitespace is
        # exactly the regex \s), then case-folded -- unless the tool asks for exact values
        return " ".join(value.split()).casefold() if fold else value
    if t is dict:
        # Key order is left to the encoder's sort_keys.  (Keys that are equal as strings,
        # 1 and "1", keep their dict order: the later one wins, as it would after a stable
        # sort by str(k).)
        out = {}
        for k, v in value.items():
            sk = k if type(k) is str else str(k)
            if sk.casefold() not in volatile:
                out[sk] = _canon(v, volatile, fold)
        return out
    if isinstance(value, (list, tuple)):
        return [_canon(v, volatile, fold) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical_arguments(
    arguments: Any, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS
) -> str:
    """Canonical JSON of a call's arguments (see the module docstring)."""
    vol = frozenset(k.casefold() for k in volatile_keys)
    return _encode(_canon(arguments, vol))


def idempotency_key(
    name: str,
    arguments: Mapping[str, Any],
    keys: Iterable[str] | None = None,
    *,
    normalize: bool = True,
    volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS,
) -> str:
    """The key under which a side effect of tool ``name`` happens at most once.

    The tool's idempotency arguments ``keys`` (all arguments when None, volatile keys dropped
    as in fingerprints), canonicalised exactly as fingerprints are -- so the side-effect
    ledger and the repeat detector agree on what "the same call" is: ``"Bob@Example.com"``
    and ``" bob@example.com "`` are one e-mail address.  ``normalize=False`` (a tool whose
    values are case-sensitive, such as tokens or file names) compares values exactly, in
    both places.  The one function every ledger computes its keys with.
    """
    volatile = frozenset(k.casefold() for k in volatile_keys)
    if keys is None:
        canon: Any = _canon(arguments, volatile, normalize)
    else:  # named keys are kept even when they look volatile: the tool chose them
        canon = {k: _canon(arguments.get(k), volatile, normalize) for k in keys}
    return name + ":" + _encode(canon)


class Fingerprinter:
    """Computes ``name:hash`` fingerprints with one deployment's volatile-key list."""

    __slots__ = ("_volatile", "volatile_keys")

    def __init__(self, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> None:
        self.volatile_keys = tuple(volatile_keys)
        self._volatile = frozenset(k.casefold() for k in self.volatile_keys)

    def canonical(self, arguments: Any, normalize: bool = True) -> str:
        return _encode(_canon(arguments, self._volatile, normalize))

    def __call__(self, name: str, arguments: Any, normalize: bool = True) -> str:
        """``name:hash`` of the canonical arguments (values compared exactly when
        ``normalize`` is False: the tool's choice, see :func:`idempotency_key`)."""
        data = _encode(_canon(arguments, self._volatile, normalize)).encode(
            "utf-8", "surrogatepass"
        )
        return name + ":" + blake2b(data, digest_size=8).hexdigest()


# -- answers ---------------------------------------------------------------------------------


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
        r"(?:[Ll]ine|LINE|lineno|ln)(?:\s*[:=#])?\s*\d+(?:\s*[:,]\s*(?:col(?:umn)?\s*)?\d+)?",
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
    ("counter", r"(?:pid|PID|process)(?:\s*[:=#])?\s*\d+|(?:In|Out)\s?\[\d+\]", "pid <n>"),
)

#: temp directories, matched anywhere (a path starts after a quote or a space)
_TEMP_DIR = r"/(?:private/)?(?:var/)?(?:tmp|folders)/[^\s'\"`,;:)\]}]*"

_DIGITS = re.compile(r"\d+")
#: default patterns whose match is a time: the answer itself in a short answer (rule 2)
_TIMES = frozenset({"timestamp", "clock", "epoch"})
#: what may stand before a log stamp on its line: indentation and an opening bracket
_STAMP_BEFORE = re.compile(r"[ \t]*[\[(]?[ \t]*$")
#: what follows a log stamp: a closing bracket or separator, then more text on the line
_STAMP_AFTER = re.compile(r"[\])]?[ \t]*[-:|]?[ \t]*[^\s\])]")
_EXTENSION = re.compile(r"\.[A-Za-z]{1,4}$")
_HEX_LETTER = re.compile(r"[a-f]")
_HEX_DIGIT = re.compile(r"\d")


def _file_line(m: re.Match[str]) -> bool:
    start = m.start()
    return _EXTENSION.search(m.string, max(0, start - 5), start) is not None


def _log_stamp(m: re.Match[str]) -> bool:
    """Whether a time opens its line and more text follows it (a log line's stamp)."""
    text = m.string
    line_start = text.rfind("\n", 0, m.start()) + 1
    return (
        _STAMP_BEFORE.match(text, line_start, m.start()) is not None
        and _STAMP_AFTER.match(text, m.end()) is not None
    )


def _hex_id(m: re.Match[str]) -> bool:
    text = m.group()
    return _HEX_LETTER.search(text) is not None and _HEX_DIGIT.search(text) is not None


#: checks a default pattern's match must pass to be masked (by name)
_CHECKS = {"file_line": _file_line, "hex_id": _hex_id}


class AnswerMasks:
    """Masks the volatile parts of tool answers (see the module docstring); one per
    deployment, shared by every detector.  Immutable and thread-safe."""

    __slots__ = (
        "_checks",
        "_pattern",
        "_replacements",
        "_times",
        "enabled",
        "max_chars",
        "patterns",
        "time_value_chars",
    )

    def __init__(
        self,
        extra_patterns: Iterable[str] = (),
        *,
        enabled: bool = True,
        defaults: Sequence[tuple[str, str, str]] = DEFAULT_ANSWER_MASKS,
        max_chars: int = 20000,
        time_value_chars: int = 120,
    ) -> None:
        self.enabled = enabled
        self.max_chars = max_chars
        #: an answer at most this long keeps a time that is not a log stamp (rule 2)
        self.time_value_chars = time_value_chars
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
        #: the group numbers of the time patterns
        self._times = frozenset(i for i, (name, _, _) in enumerate(defaults) if name in _TIMES)
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

    def _sub_short(self, m: re.Match[str]) -> str:
        """:meth:`_sub` for a short answer: a time that is not a log stamp is its value."""
        if (m.lastindex or 1) - 1 in self._times and not _log_stamp(m):
            return m.group()
        return self._sub(m)

    def mask(self, text: str) -> str:
        """``text`` with its volatile parts replaced by placeholders (its first ``max_chars``
        characters; the rest as it is); a short answer keeps the time it gives (see the
        module docstring's rule)."""
        if not self.enabled or self._pattern is None or not text:
            return text
        if len(text) <= self.time_value_chars and self._times:
            return self._pattern.sub(self._sub_short, text)
        head, tail = text[: self.max_chars], text[self.max_chars :]
        return self._pattern.sub(self._sub, head) + tail

    def digest(self, text: str) -> str:
        """A short hash of what ``text`` says: equal for two answers that differ only in
        their volatile parts."""
        return blake2b(self.mask(text).encode("utf-8", "replace"), digest_size=8).hexdigest()

    def shape(self, text: str) -> str:
        """A short hash of ``text`` with every digit run masked as well: equal for two
        answers that differ only in their numbers -- how failures are compared (rule 4)."""
        return shape_of(self.mask(text))


def shape_of(said: str) -> str:
    """The shape of an answer already masked (``ToolResult.said``): a short hash of it with
    every digit run masked too."""
    return blake2b(_DIGITS.sub("#", said).encode("utf-8", "replace"), digest_size=8).hexdigest()


_DEFAULT: AnswerMasks | None = None


def default_masks() -> AnswerMasks:
    """The default masks (built once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AnswerMasks()
    return _DEFAULT
