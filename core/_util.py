"""Small helpers shared by the core and the built-in plugins (one definition of each; JSON
conversion is :func:`loopwarden.sanitize.jsonable`)."""

from __future__ import annotations

__all__ = ["first_line"]


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of ``text``, clipped to ``limit`` characters."""
    line = text.strip().split("\n", 1)[0].strip()
    return line[:limit] + "..." if len(line) > limit else line
