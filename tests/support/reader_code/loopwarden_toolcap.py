"""docs/plugin-guide.md's ``ToolCap``, as the package its "Publishing" section describes.

The class is the guide's own block (run from the Markdown), so the stand-in cannot drift from
the page; ``loopwarden_toolcap-0.1.0.dist-info`` beside this file declares its entry point.
"""

from __future__ import annotations

from pathlib import Path

_GUIDE = Path(__file__).resolve().parents[3] / "docs" / "plugin-guide.md"
_text = _GUIDE.read_text(encoding="utf-8")
_code = next(b for b in _text.split("```python\n")[1:] if "class ToolCap(" in b)
exec(compile(_code.split("```")[0], str(_GUIDE), "exec"), globals())
