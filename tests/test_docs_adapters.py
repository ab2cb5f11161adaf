"""docs/adapters.md and the README's "Adapters" section: the examples run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loopwarden.config import parse_config
from loopwarden.replay import load_tool_flags

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


def run_example(code: str, cwd: Path) -> list[str]:
    """Run a block as a script of its own, from a directory without a config.toml (so the
    shipped default config applies, as for a new user)."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


EXPECTED = {
    "LangChain": [
        "repeat_call True",
        "Here is the last information I found: NOT_FOUND: order 99 does not exist",
    ],
    "OpenAI Agents SDK": ["repeat_call True 1", "Your refund is on its way."],
    "pydantic-ai": ["repeat_call repeat_call True True", "I could not find order 99."],
}


@pytest.mark.parametrize("framework", sorted(EXPECTED))
def test_each_framework_example_runs_and_prints_what_the_doc_says(
    framework: str, tmp_path: Path
) -> None:
    (code,) = blocks(section(DOC, framework), "python")
    assert len(code.strip().splitlines()) <= 25
    assert run_example(code, tmp_path) == EXPECTED[framework]


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


def test_the_readme_adapters_example_runs(tmp_path: Path) -> None:
    readme = section(README, "Adapters")
    (code,) = blocks(readme, "python")
    run_example(code, tmp_path)
    assert "docs/adapters.md" in readme
