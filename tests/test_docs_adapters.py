"""docs/adapters.md and the README's "Adapters" section (the examples run, and print what the
doc says, in tests/test_doc_blocks.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from loopwarden.config import parse_config
from loopwarden.traffic.replay import load_tool_flags

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(text: str, title: str, level: str = "##") -> str:
    start = text.index(f"\n{level} {title}")
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_each_framework_example_is_short() -> None:
    # they run, and print what the doc says, in tests/test_doc_blocks.py
    for framework in ("LangChain", "OpenAI Agents SDK", "pydantic-ai"):
        (code,) = blocks(section(DOC, framework), "python")
        assert len(code.strip().splitlines()) <= 25


def test_the_tool_natures_example_is_a_valid_config_and_replay_tools_file(tmp_path: Path) -> None:
    (toml,) = blocks(section(DOC, "Tool natures"), "toml")
    cfg = parse_config(tomllib.loads(toml), path="docs/adapters.md")
    assert cfg.tools["refund_order"].idempotency_keys == ["order_id"]
    assert cfg.tools["escalate"].terminal is True
    path = tmp_path / "tools.toml"
    path.write_text(toml, encoding="utf-8")
    assert load_tool_flags(path)["flaky_search"] == {"read_only": True, "retryable": True}


def test_the_verdict_table_covers_every_verdict_and_framework() -> None:
    table = section(DOC, "Verdicts in each framework")
    header = next(line for line in table.splitlines() if line.startswith("| verdict"))
    for name in ("LangChain", "OpenAI Agents SDK", "pydantic-ai"):
        assert name in header
    for verdict in ("**warn**", "**skip**", "**soft stop**", "**hard stop**"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {verdict}"))
        assert row.count("|") == 6


def test_the_readme_adapters_section_links_the_doc() -> None:
    assert "docs/adapters.md" in section(README, "Adapters")
