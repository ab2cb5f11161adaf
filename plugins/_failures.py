"""Failures read from a tool result's text, for tools that give no error flag.

Agents that act in text -- ``act(action="click[red shoes]")``, ReAct's ``search[X]`` /
``lookup[Y]`` against an encyclopedia, a shell without an exit-code wrapper -- get their
failures back as ordinary text: ``Invalid action!``, ``Could not find X. Similar: [...]``,
``bash: foo: command not found``, ``ls: cannot access 'x': No such file or directory``.  A
*failure shape* is a named regular expression for one such answer.  The rule, shared by
``failure_streak`` and ``stall``:

1. A result the loop marked failed (``ok`` is False: an exception, an MCP ``isError``, a
   recorded ``observation_is_error``) is a failure; no shape is consulted.
2. A result that states its own status -- the tool's declared error schema -- is judged by
   that status alone, never by its text: a leading ``<returncode>N</returncode>`` /
   ``exit code: N`` line, or a JSON object carrying ``error`` / ``errors`` / ``is_error`` /
   ``isError`` / ``ok`` / ``success``.  A ``grep`` that exits 0 and prints a line containing
   "No such file" did not fail; a non-zero exit code is not on its own a failure either
   (``grep`` finding nothing exits 1), so such a result is simply not read for shapes.
3. Otherwise the result's *first non-empty line* is matched against the shapes: a failure
   message leads its answer, while text that merely quotes one further down (a file's
   content, a search snippet) is not a failure.

A match names its shape, so detectors can tell "the same kind of failure again" from a new
one although the text differs (``Could not find X`` then ``Could not find Y``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import Field

from loopwarden.plugin import check_patterns

__all__ = [
    "DEFAULT_FAILURE_SHAPES",
    "FailureShapes",
    "check_shapes",
    "declares_status",
    "shapes_field",
]

#: shape name -> regular expression, searched (case-insensitively) in a result's first
#: non-empty line.  Each is the answer of a real kind of text environment or shell.
DEFAULT_FAILURE_SHAPES: dict[str, str] = {
    # web-shop / household text environments: an action the page or room does not offer
    "invalid_action": r"^\s*(invalid|unknown|unrecognized|illegal) (action|command)\b",
    "nothing_happens": r"^\s*nothing happens\.?\s*$",
    # encyclopedia search: no page by that title, with suggestions
    "not_found_similar": r"^\s*could not find\b.*\bsimilar\b",
    # encyclopedia lookup: the keyword has no (more) occurrences on the page
    "no_more_results": r"^\s*no more results\.?\s*$",
    # shells without an exit-code wrapper
    "command_not_found": r"(^|:\s*)([\w./-]+: )?command not found\s*$",
    "no_such_file": r"no such file or directory\s*$",
    "permission_denied": r":\s*permission denied\s*$",
}

_FIRST_LINE_CHARS = 1000  # a first line longer than this is cut: bounded work per result
# a leading exit-status line: a <returncode> tag, "exit code: 1", "Exit status 0"
_STATUS_LINE = re.compile(
    r"^\s*(<returncode>\s*-?\d+\s*</returncode>"
    r"|(exit[ _-]?(code|status)|returncode)\s*[:=]?\s*-?\d+\b)",
    re.IGNORECASE,
)
_STATUS_KEYS = frozenset({"error", "errors", "is_error", "isError", "ok", "success"})
_JSON_MAX_CHARS = 20_000  # longer JSON is not parsed for a status (bounded work)


def declares_status(text: str) -> bool:
    """Whether ``text`` states its own success or failure (rule 2 of the module docstring)."""
    if _STATUS_LINE.match(text):
        return True
    t = text.lstrip()
    if not t.startswith("{") or len(t) > _JSON_MAX_CHARS:
        return False
    try:
        value = json.loads(t)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and not _STATUS_KEYS.isdisjoint(value)


def _first_line(text: str) -> str:
    for line in text[: _FIRST_LINE_CHARS * 4].splitlines():
        if line.strip():
            return line[:_FIRST_LINE_CHARS]
    return ""


class FailureShapes:
    """A compiled set of failure shapes (name -> pattern; an empty pattern switches a shape
    off)."""

    __slots__ = ("_shapes",)

    def __init__(self, shapes: dict[str, str]) -> None:
        self._shapes = [(name, re.compile(p, re.IGNORECASE)) for name, p in shapes.items() if p]

    def match(self, text: str) -> str | None:
        """The name of the shape ``text`` has, or None: no shape, or the text states its own
        status (see the module docstring)."""
        if not self._shapes:
            return None
        line = _first_line(text)
        for name, pattern in self._shapes:
            if pattern.search(line):
                return None if declares_status(text) else name
        return None


def shapes_field() -> Any:
    """The ``failure_shapes`` setting, the same in every detector that reads it."""
    return Field(
        default_factory=lambda: dict(DEFAULT_FAILURE_SHAPES),
        description="failures read from the text of a result that has no error flag: shape "
        "name -> regular expression searched case-insensitively in the result's first "
        "non-empty line; a result that states its own status (an exit-code line, JSON with "
        "error / ok / success keys) is never read so; an empty pattern switches a shape off",
    )


def check_shapes(shapes: dict[str, str]) -> dict[str, str]:
    """Validate ``failure_shapes`` (for a ``field_validator``): every pattern compiles."""
    check_patterns([p for p in shapes.values() if p])
    return shapes
