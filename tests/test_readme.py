"""The README's examples: what tests/test_doc_blocks.py cannot see from one block alone.

Every block of the README and the guides runs there (the plugin example and its tests, the
alerting table with the reader's own sink); here: the README shows the same ten lines as the
plugin guide, and they are ten.
"""

from __future__ import annotations

from pathlib import Path

from support.docblocks import blocks

ROOT = Path(__file__).resolve().parent.parent


def _first_python(path: Path, heading: str) -> str:
    return next(b.text for b in blocks(path) if b.lang == "python" and b.heading == heading)


def test_the_readme_shows_the_guides_plugin_in_ten_lines() -> None:
    readme = _first_python(ROOT / "README.md", "A plugin in ten lines")
    guide = _first_python(ROOT / "docs" / "plugin-guide.md", "A plugin in ten lines")
    assert readme == guide
    assert len(readme.strip().splitlines()) <= 10


def test_the_readmes_adapter_cost_figures_are_those_of_docs_adapters() -> None:
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (para,) = [p for p in readme.split("\n\n") if p.startswith("Cost per step")]
    adapters = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    section = adapters.split("## Cost per step", 1)[1].split("\n## ", 1)[0]
    figures = re.findall(r"\d+\.\d+–\d+\.\d+", para)
    assert len(figures) == 4, para
    flat = section.replace(", ", "–").replace(" and ", "–")  # "0.68, 0.70 and 0.71"
    for figure in figures:
        low, high = figure.split("–")
        assert figure in section or (low in flat and high in flat), (figure, "docs/adapters.md")
