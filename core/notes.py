"""Guard notes: text a plugin injects into the model's request with the runtime's authority.

A warning, a skip's hint and a stop's message reach the model as a ``[run] warning_role``
message -- ``system`` by default -- prefixed ``[loopwarden]``: they outrank everything the model
and the tools said.  So a note carries only text the runtime authored, and this module is
the one place that rule is kept:

* **runtime text** -- the template itself (the plugin's default or the operator's config),
  numbers, and strings marked with :func:`runtime`: a config value, a stop reason, the name
  of a tool the deployment *registered* (:func:`tool_name`) -- is shown as it is;
* **everything else is data** -- a tool's result or error line (attacker-controlled for any
  fetch or search tool), a tool name the model made up, arguments, a call's signature: it is
  shown JSON-quoted, every control, line break and bidi mark escaped, cut to
  :data:`NOTE_DATA_CHARS` (:func:`quote_data`).  A quoted value cannot end its quotes, start
  a line of its own, or pass for a ``[loopwarden]`` note.

Strings are data unless marked, so a field a plugin forgets to classify is quoted, never
trusted.  Every built-in plugin formats its notes with :func:`render_note`; third-party plugins
should too::

    from loopwarden.notes import render_note, tool_name

    return self.warn(render_note(s.message, tool=tool_name(call), error=first_line))

Observations (``skip``'s observation, a tool's error text) are not notes: they go to the model
as ``tool`` messages, data by their role, and are not quoted.
"""

from __future__ import annotations

import json
import numbers
from typing import TYPE_CHECKING, Any

from loopwarden.sanitize import escape_controls

if TYPE_CHECKING:
    from loopwarden.events import ToolCall

__all__ = ["NOTE_DATA_CHARS", "RuntimeText", "quote_data", "render_note", "runtime", "tool_name"]

#: the most characters of one model- or tool-derived value a note shows (then "…")
NOTE_DATA_CHARS = 200


class RuntimeText(str):
    """A string the runtime authored (config, a registered tool's name, a reason): a note
    shows it as it is.  Made with :func:`runtime`."""

    __slots__ = ()


def runtime(text: str) -> RuntimeText:
    """Mark ``text`` as runtime-authored for :func:`render_note` (never model or tool text)."""
    return text if isinstance(text, RuntimeText) else RuntimeText(text)


def tool_name(call: ToolCall) -> str:
    """The call's tool for a note: the name the deployment registered (runtime text), or --
    for a tool the model made up -- its name as data."""
    tool = call.tool
    return runtime(tool.name) if tool is not None else call.name


def quote_data(value: object, limit: int = NOTE_DATA_CHARS) -> str:
    """``value`` as data inside a note: its text cut to ``limit`` characters, JSON-quoted
    (quotes and backslashes escaped), every control, line break and bidi mark escaped."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    return escape_controls(json.dumps(text, ensure_ascii=False))


def _field(value: Any) -> Any:
    if isinstance(value, (RuntimeText, numbers.Number)):  # format specs ({percent:.0f}) work
        return value
    if value is None:
        return "-"
    return quote_data(value)


def render_note(template: str, /, **fields: Any) -> str:
    """``template.format(**fields)`` with every field that is not runtime text (a number, a
    :func:`runtime` string) rendered as quoted data (:func:`quote_data`)."""
    return template.format(**{k: _field(v) for k, v in fields.items()})
