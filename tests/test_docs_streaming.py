"""The streaming docs are code: README's "Streaming" block and docs/streaming.md's blocks run
as written (in a fresh directory, the shipped config), and the shell lines work."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from loopwarden import Deployment
from loopwarden.commands.cli import main
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.streaming import ResponseCut, RunEnd

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
GUIDE = (ROOT / "docs" / "streaming.md").read_text(encoding="utf-8")


def section(title: str, text: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str, lang: str = "python") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def run_block(code: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(code, name, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no ./config.toml: the shipped default
    return tmp_path


def test_readme_streaming_block_runs(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = blocks(section("Streaming", README))
    run_block(code, "readme_streaming")
    out = capsys.readouterr().out
    assert out.startswith("我先查一下订单和退货政策。")
    assert out.rstrip().endswith("final_answer")


def test_guide_blocks_run(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sync, asynchronous, plugin = blocks(GUIDE)
    run_block(sync, "guide_sync")
    out = capsys.readouterr().out
    assert "-> query_order {'order_id': '88231'}" in out
    assert out.rstrip().endswith("final_answer")
    run_block(asynchronous, "guide_async")
    assert capsys.readouterr().out.rstrip().endswith("final_answer")
    # the per-delta plugin example cuts an answer that starts shouting
    module = run_block(plugin, "guide_plugin")
    path = in_tmp / "shouting.toml"
    path.write_text(
        'name = "shouting"\nuser = "hi"\n[model]\nturns = [{ content = "WHERE IS MY ORDER '
        'WHERE IS MY ORDER" }]\nthen = "final"\nfinal_text = "Sorry, let me help."\n',
        encoding="utf-8",
    )
    cfg = parse_config({"plugins": {"enabled": ["max_steps"]}})
    with Deployment(
        cfg, tools=shop_tools(in_tmp), plugins={"no_shouting": module.NoShouting()}
    ) as dep:
        events = list(dep.stream(scenario=path))
    assert [e.by for e in events if isinstance(e, ResponseCut)] == ["no_shouting"]
    end = events[-1]
    assert isinstance(end, RunEnd)
    assert end.record["termination"] == "shouting" and end.record["soft"] is True
    assert end.record["final_answer"] == "Sorry, let me help."


def test_guide_shell_lines_are_real_commands(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [ln.strip() for ln in GUIDE.split("## Events")[0].splitlines()]
    cmd = next(ln for ln in lines if ln.startswith("loopwarden run --scenario"))
    assert cmd == "loopwarden run --scenario refund --stream"
    assert main(cmd.split()[1:]) == 0
    out = capsys.readouterr().out
    assert "-> query_order" in out and "termination: final_answer" in out
    readme_line = next(
        ln for ln in README.splitlines() if "loopwarden run --scenario refund --stream" in ln
    )
    assert readme_line.split("#")[0].split() == cmd.split()
