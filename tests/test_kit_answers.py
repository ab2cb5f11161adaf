"""A hard stop before a blocked side effect tells the user the truth (issue 46, item 5).

The README's ten-line plugin is taken from README.md as written, saved beside a config.toml
and run by ``loopwarden run --scenario refund`` (in-process, the real shop database): the
model has already written "I am submitting your refund" when the guard stops the call, so
that text must not be the user's answer.  Without ``answer=`` the default
``[run.texts] side_effect_blocked`` answers; a stop before a read-only call keeps the
best-effort answer.
"""

from __future__ import annotations

import ast
import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Plugin, hookimpl
from loopwarden.commands import cli
from loopwarden.config import Texts
from loopwarden.testing import make_tool, run_plugin, tool_call, turn

ROOT = Path(__file__).resolve().parent.parent
#: what the refund scenario's model says in the turn that calls apply_refund
ANNOUNCED = "我为您提交退款"


def readme_plugin() -> str:
    """The Python block under README's "A plugin in ten lines", as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## A plugin in ten lines\n+```python\n(.*?)^```", text, re.M | re.S)
    assert m is not None, "README.md lost its 'A plugin in ten lines' block"
    return m.group(1)


def _answer_literal(code: str) -> str | None:
    """The ``answer=`` string the plugin's stop passes, if any."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.keyword) and node.arg == "answer":
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            return node.value.value
    return None


def _run_refund(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: str,
    extra: str = "",
) -> tuple[dict[str, Any], int]:
    """``loopwarden run --scenario refund --json`` with ``code`` as ``<module>.py`` beside
    the config; the record and the refund rows the shop database holds afterwards."""
    module = f"readme_guards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(code, encoding="utf-8")
    db = tmp_path / "shop.sqlite3"
    (tmp_path / "config.toml").write_text(
        f'[plugins]\nenabled = ["max_steps", "{module}:NoRefunds"]\n'
        f"[shop]\ndb_path = {json.dumps(str(db))}\n{extra}",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys, "path", list(sys.path))  # the config's directory is appended
    monkeypatch.delitem(sys.modules, module, raising=False)
    capsys.readouterr()
    code_ = cli.main(
        ["run", "--scenario", "refund", "--json", "--config", str(tmp_path / "config.toml")]
    )
    record = json.loads(capsys.readouterr().out)
    sys.modules.pop(module, None)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM refunds").fetchone()[0]
    assert code_ in (0, 1, 3)
    return record, rows


def test_the_readme_plugin_as_written_gives_a_truthful_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = readme_plugin()
    record, refunds = _run_refund(tmp_path, monkeypatch, capsys, code)
    assert record["termination"] == "forbidden_tool" and record["stopped_by"] == "no_refunds"
    assert refunds == 0  # the refund was really blocked ...
    answer = record["final_answer"]
    assert ANNOUNCED not in answer  # ... and the user is not told it was submitted
    written = _answer_literal(code)
    assert written is not None, "the README's plugin should say what the user reads"
    assert answer == written
    assert record["final_answer_present"] is False  # a guard's answer, not the model's


def test_without_answer_the_default_says_the_action_was_not_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = readme_plugin()
    literal = _answer_literal(code)
    assert literal is not None
    bare = re.sub(r",\s*answer=(\"[^\"]*\"|'[^']*')", "", code)
    assert _answer_literal(bare) is None and bare != code
    record, refunds = _run_refund(tmp_path, monkeypatch, capsys, bare)
    assert record["termination"] == "forbidden_tool" and refunds == 0
    expected = Texts().side_effect_blocked.format(name="apply_refund", reason="forbidden_tool")
    assert record["final_answer"] == expected
    assert ANNOUNCED not in record["final_answer"]
    assert "did not carry out apply_refund" in record["final_answer"]
    assert record["final_answer_present"] is False


def test_the_default_answer_is_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = re.sub(r",\s*answer=(\"[^\"]*\"|'[^']*')", "", readme_plugin())
    extra = '[run.texts]\nside_effect_blocked = "未执行 {name}（{reason}），没有任何改动。"\n'
    record, refunds = _run_refund(tmp_path, monkeypatch, capsys, bare, extra)
    assert refunds == 0
    assert record["final_answer"] == "未执行 apply_refund（forbidden_tool），没有任何改动。"


class _StopOn(Plugin):
    """Hard-stops before any call of ``tool`` (no ``answer=``)."""

    name = "stop_on"
    tool = "apply_refund"

    @hookimpl
    def before_tool(self, run: Any, call: Any) -> Any:
        if call.name == self.tool:
            return self.stop("forbidden_tool")
        return None


def test_a_stop_before_a_read_only_call_keeps_the_best_effort_answer() -> None:
    class StopLookups(_StopOn):
        tool = "query_order"

    lookup = make_tool("query_order", "shipped", read_only=True, parameters={"order_id": str})
    result = run_plugin(
        StopLookups,
        tools=[lookup],
        turns=[turn("Let me look that up.", tool_call("query_order", order_id="1"))],
    )
    assert result.record["termination"] == "forbidden_tool"
    assert result.record["final_answer"] == "Let me look that up."


def test_a_stop_before_an_undeclared_tool_keeps_the_best_effort_answer() -> None:
    # a tool whose nature nobody declared may or may not change anything: only a declared
    # side effect changes the answer (as only a declared nature changes execution)
    refund = make_tool("apply_refund", "done", parameters={"order_id": str})
    result = run_plugin(
        _StopOn,
        tools=[refund],
        turns=[turn("Refunding.", tool_call("apply_refund", order_id="1"))],
    )
    assert result.record["final_answer"] == "Refunding."


def test_an_explicit_answer_wins_over_the_default() -> None:
    class Answering(_StopOn):
        @hookimpl
        def before_tool(self, run: Any, call: Any) -> Any:
            return self.stop("forbidden_tool", answer="Refunds go through a person.")

    done: list[Any] = []
    refund = make_tool(
        "apply_refund", lambda **kw: done.append(kw), side_effect=True, parameters={"order_id": str}
    )
    result = run_plugin(
        Answering,
        tools=[refund],
        turns=[turn("Refunding now.", tool_call("apply_refund", order_id="1"))],
    )
    assert result.record["final_answer"] == "Refunds go through a person."
    assert done == []


def test_a_side_effect_call_among_others_in_one_turn_is_the_one_named() -> None:
    lookup = make_tool("query_order", "shipped", read_only=True, parameters={"order_id": str})
    done: list[Any] = []
    refund = make_tool(
        "apply_refund", lambda **kw: done.append(kw), side_effect=True, parameters={"order_id": str}
    )
    result = run_plugin(
        _StopOn,
        tools=[lookup, refund],
        turns=[
            turn(
                "Checking, then refunding.",
                tool_call("query_order", order_id="1"),
                tool_call("apply_refund", order_id="1"),
            )
        ],
    )
    assert done == []
    assert result.record["final_answer"].startswith("I did not carry out apply_refund")
