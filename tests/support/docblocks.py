"""Every code block of a Markdown file: fenced (```` ```lang ````) and indented (4 spaces).

The docs' examples are code, so tests/test_doc_blocks.py runs each block by its kind.  This
module only finds them: a :class:`Block` knows its file, its first line (1-based, so a
traceback can point at the Markdown), its language (``""`` for a fence without one,
``"indented"`` for an indented block), the heading it sits under and its
``<!-- not run: REASON -->`` marker, if any (written directly above the fence).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER", "Block", "blocks", "doc_files"]

_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
_LIST_ITEM = re.compile(r"^\s*(?:[*+-]|\d+[.)])\s")
#: the marker of a block that cannot run here; the reason is required
MARKER = re.compile(r"^<!--\s*not run(?::\s*(?P<reason>.*?))?\s*-->$")


@dataclass(frozen=True)
class Block:
    """One code block of a Markdown file."""

    path: Path
    #: the block's first line of code, 1-based
    line: int
    #: the fence's language, ``""`` when it names none, ``"indented"`` for an indented block
    lang: str
    text: str
    #: the nearest heading above the block (without its ``#``), ``""`` before the first
    heading: str
    #: ``None`` without a ``<!-- not run -->`` marker, else its reason (``""`` when missing)
    not_run: str | None

    @property
    def id(self) -> str:
        """``README.md:42``: the block's file (relative to the repository) and line."""
        folder = "docs/" if self.path.parent.name == "docs" else ""
        return f"{folder}{self.path.name}:{self.line}"


def _marker(lines: list[str], index: int) -> str | None:
    """The reason of a ``<!-- not run -->`` marker on the last non-blank line before
    ``index`` (None: no marker)."""
    for prev in reversed(lines[:index]):
        if prev.strip():
            match = MARKER.match(prev.strip())
            return None if match is None else (match.group("reason") or "")
    return None


def blocks(path: Path) -> list[Block]:
    """The code blocks of ``path``, in order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    heading = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            mark = fence.group("fence")
            end = i + 1
            while end < len(lines) and not (
                lines[end].strip().startswith(mark[0] * len(mark))
                and not lines[end].strip().strip(mark[0])
            ):
                end += 1
            text = "\n".join(lines[i + 1 : end]) + "\n"
            lang = fence.group("info").lower()
            found.append(Block(path, i + 2, lang, text, heading, _marker(lines, i)))
            i = end + 1
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        previous = next((p for p in reversed(lines[:i]) if p.strip()), "")
        if (
            line.startswith("    ")
            and line.strip()
            and (i == 0 or not lines[i - 1].strip())
            and not _LIST_ITEM.match(previous)
            and not previous.startswith("  ")  # a list item's continued paragraph
        ):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            text = "\n".join(ln[4:] for ln in lines[i:end]) + "\n"
            found.append(Block(path, i + 1, "indented", text, heading, _marker(lines, i)))
            i = end
            continue
        i += 1
    return found


def doc_files(root: Path) -> list[Path]:
    """README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]
