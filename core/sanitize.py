"""Untrusted text and JSON made safe to store, send and read back.

Model output, tool results and record files come from outside; none of them may crash a run
or a report.  Three dangers are handled here, once for every caller:

* **lone UTF-16 surrogates** (a truncated emoji, which JSON's ``\\ud83d`` escapes allow): such
  a string cannot be encoded as UTF-8, so it would break the next request, the record file
  and ``--json`` output.  :func:`clean_text` replaces them with U+FFFD (a split but complete
  pair is joined back into its character);
* **deep nesting**: parsing or walking 100,000 nested ``[`` recurses past Python's limit.
  :func:`loads_arguments` bounds the depth of a tool call's arguments (:data:`MAX_DEPTH`);
* **numbers and constants that are not JSON**: ``NaN``, ``Infinity``, ``1e999``, integers too
  long to convert.  :func:`loads_strict` rejects them when a record file is read back, and
  :func:`jsonable` turns them into strings before a record is written;
* **characters that steer a reader instead of being read**: C0 and C1 controls (ESC, CSI
  ``\x9b``, BEL), line breaks that ``str.splitlines`` and other splitters honour (``\x85``,
  U+2028, U+2029, ``\x1c``-``\x1e``) and bidi overrides.  In a log line they forge lines, on
  a terminal they run escape sequences (OSC, CSI), in a guard note they start a line of their
  own.  :func:`escape_controls` writes each as a visible escape (``\n``, ``\u001b``) -- valid
  inside a JSON string, so :func:`json_line` applies it to JSON text as well.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import IO, Any

from pydantic import BaseModel

__all__ = [
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "TerminalStream",
    "clean_text",
    "depth_exceeds",
    "escape_controls",
    "escape_tree",
    "first_line",
    "json_line",
    "json_loads",
    "jsonable",
    "loads_arguments",
    "loads_strict",
    "raw_stream",
]

#: the deepest nesting accepted in a tool call's arguments and in a record line
MAX_DEPTH = 100
#: integers with more digits are not counts a record or a trajectory holds (usage, ids)
MAX_INT_DIGITS = 30

_MAX_INT_BITS = (10**MAX_INT_DIGITS).bit_length() - 1
_SURROGATE = re.compile("[\ud800-\udfff]")

#: C0 controls, DEL and C1 controls (line breaks \n \r \v \f \x1c-\x1e \x85 among them),
#: U+2028 / U+2029 (line and paragraph separators), bidi marks, embeddings, overrides and
#: isolates (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069)
_CONTROLS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def escape_controls(text: str, keep: str = "") -> str:
    """``text`` with every control character (see :data:`_CONTROLS`) but those in ``keep``
    written as a visible escape: ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f`` or ``\\uXXXX`` --
    the escapes JSON reads back, so JSON text stays valid JSON with the same value.

    For every place untrusted text is shown or written line by line: the terminal (CLI
    output), log lines, guard notes.  Backslashes are left alone: the result is for reading,
    not for decoding."""
    if _CONTROLS.search(text) is None:
        return text

    def escape(m: re.Match[str]) -> str:
        c = m.group()
        if c in keep:
            return c
        return _SHORT_ESCAPES.get(c) or f"\\u{ord(c):04x}"

    return _CONTROLS.sub(escape, text)


def escape_tree(value: Any, keep: str = "") -> Any:
    """A copy of ``value`` with :func:`escape_controls` applied to every string in it, keys
    included (mappings become dicts, tuples lists; other values are kept)."""
    if isinstance(value, str):
        return escape_controls(value, keep)
    if isinstance(value, Mapping):
        return {escape_tree(k, keep): escape_tree(v, keep) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_tree(v, keep) for v in value]
    return value


class TerminalStream:
    """A text stream that writes through :func:`escape_controls` (newlines and tabs kept):
    what the ``loopwarden`` commands print can hold a tool name or a record field the model
    made up, and none of it may run an escape sequence on the operator's terminal.

    Every other attribute (``isatty``, ``fileno``, ``encoding``, ``reconfigure``, ...) is the
    wrapped stream's; :func:`raw_stream` gives the stream itself to a renderer that emits
    escape sequences of its own (rich) and escapes its data itself."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(escape_controls(text, keep="\n\t"))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def raw_stream(stream: Any) -> Any:
    """The stream a :class:`TerminalStream` wraps (``stream`` itself when it is not one)."""
    return stream.stream if isinstance(stream, TerminalStream) else stream


def json_line(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **kwargs)`` that no line splitter, log viewer
    or terminal can break or steer: json leaves C1 controls, U+2028 / U+2029 and bidi marks
    raw inside strings; they are escaped too (the value read back is the same)."""
    return escape_controls(json.dumps(value, ensure_ascii=False, **kwargs))


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (unchanged when it has none)."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    # a UTF-16 round trip joins a high+low pair that arrived as two code points
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and dicts in ``value`` nest deeper than ``limit`` (checked iteratively)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list, tuple)))
    return False


def _too_deep(text: str, value: Any, limit: int) -> bool:
    # the bracket count (C speed) rules out deep nesting for almost every text
    return text.count("[") + text.count("{") > limit and depth_exceeds(value, limit)


#: the scanner json.loads uses (C when available), and the whitespace it skips around a value
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
#: json.decoder.WHITESPACE's match (a pattern that always matches)
_SPACE: Callable[[str, int], re.Match[str]] = re.compile(r"[ \t\n\r]*").match  # type: ignore[assignment]


def json_loads(text: str) -> Any:
    """``json.loads(text)`` for a ``str``: the same scanner, value and errors, without its three
    Python frames (``loads``, ``decode``, ``raw_decode``) -- every tool call's arguments pass
    through here."""
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        value, end = _SCAN(text, _SPACE(text, 0).end())
    except StopIteration as err:
        raise json.JSONDecodeError("Expecting value", text, err.value) from None
    end = _SPACE(text, end).end()
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def loads_arguments(text: str, limit: int = MAX_DEPTH) -> Any:
    """Parse a tool call's JSON arguments; ``ValueError`` for anything that is not usable JSON
    (including nesting deeper than ``limit`` and numbers Python refuses to convert).  Lone
    surrogates from ``\\ud800`` escapes are replaced (:func:`clean_text`)."""
    try:
        value = json_loads(text)
    except RecursionError:  # json's own limit (~1000 levels, less when the stack is deep)
        raise ValueError(f"the arguments nest deeper than {limit} levels") from None
    if _too_deep(text, value, limit):
        raise ValueError(f"the arguments nest deeper than {limit} levels")
    if "\\u" in text:  # an escaped lone surrogate parses into one: replace it
        value = _clean_tree(value)
    return value


def _clean_tree(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k): _clean_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_tree(v) for v in value]
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _strict_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} does not fit a float")
    return value


def _strict_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def loads_strict(text: str, limit: int = MAX_DEPTH, *, clean: bool = False) -> Any:
    """Parse one line of a JSONL file as strict JSON; ``ValueError`` when it is not.

    Not accepted: ``NaN`` / ``Infinity``, numbers beyond a float (``1e999``) or with more than
    :data:`MAX_INT_DIGITS` digits, nesting deeper than ``limit``, and lone surrogates --
    escaped (``\\ud800``) or from undecodable bytes read with ``surrogateescape`` -- unless
    ``clean``: then each of those is replaced by U+FFFD (:func:`clean_text`) and the line kept
    (a recorded run whose text holds half an emoji is still a run).
    """
    if _SURROGATE.search(text) is not None and clean_text(text) != text:
        if not clean:
            raise ValueError("the line holds undecodable bytes or a lone surrogate")
        text = clean_text(text)
    try:
        value = json.loads(
            text, parse_constant=_reject_constant, parse_float=_strict_float, parse_int=_strict_int
        )
    except RecursionError:
        raise ValueError(f"the line nests deeper than {limit} levels") from None
    if _too_deep(text, value, limit):
        raise ValueError(f"the line nests deeper than {limit} levels")
    if "\\u" in text and _has_lone_surrogate(value):
        if not clean:
            raise ValueError("the line holds a lone surrogate")
        value = _clean_tree(value)
    return value


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if clean_text(item) != item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def jsonable(value: Any, limit: int = MAX_DEPTH, *, exact: bool = False) -> Any:
    """A copy of ``value`` that encodes as strict, UTF-8-encodable JSON -- the one conversion
    used for run records, alert payloads and the generated docs.

    Strings are cleaned (:func:`clean_text`), non-finite floats and integers longer than
    :data:`MAX_INT_DIGITS` digits become strings, mappings dicts, tuples and sets lists,
    Decimals floats (the record's ``cost`` is a number) or, when ``exact``, their exact text
    (money in a config file), pydantic models their fields, enums their values, other objects
    their ``str()``, and anything nested deeper than ``limit`` a placeholder string.
    """
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        # at most about MAX_INT_DIGITS digits, checked without printing a huge int
        return value if value.bit_length() <= _MAX_INT_BITS else "(an integer too long)"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if limit <= 0:
        return "(nested too deep)"
    if isinstance(value, Mapping):
        return {
            clean_text(k if isinstance(k, str) else str(k)): jsonable(v, limit - 1, exact=exact)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, limit - 1, exact=exact) for v in value]
    if isinstance(value, Decimal):
        return str(value) if exact else jsonable(float(value), limit)
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(), limit - 1, exact=exact)
    if isinstance(value, enum.Enum):
        return jsonable(value.value, limit - 1, exact=exact)
    try:
        return clean_text(str(value))
    except Exception:  # an object whose __str__ fails
        return f"(unprintable {type(value).__name__})"


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of ``text``, clipped to ``limit`` characters."""
    line = text.strip().split("\n", 1)[0].strip()
    return line[:limit] + "..." if len(line) > limit else line
