"""``loopwarden run --tools MODULE:ATTR``: the command line runs against your tools, not only
the demo shop's; a spec that does not name tools is bad input (exit 2), never a traceback."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from loopwarden.commands.cli import main

TOOLS = """
from loopwarden.tools import ToolRegistry, tool

calls = []


@tool(read_only=True, deterministic=True)
def track(parcel: str) -> str:
    \"\"\"Where a parcel is.\"\"\"
    calls.append(parcel)
    return f"parcel {parcel} is in Lyon"


registry = ToolRegistry([track])
as_list = [track]


def make():
    return ToolRegistry([track])


def broken():
    raise RuntimeError("no database")


not_tools = 42
"""

SCENARIO = """
name = "track"
user = "Where is parcel 7?"
[model]
turns = [{ content = "Looking.", tool_calls = [{ name = "track", arguments = { parcel = "7" } }] }]
final_text = "In Lyon."
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"lw_cli_tools_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TOOLS, encoding="utf-8")
    (tmp_path / "track.toml").write_text(textwrap.dedent(SCENARIO), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize("attr", ["registry", "as_list", "make", "track"])
def test_the_run_uses_the_named_tools(
    module: str, attr: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    mod = importlib.import_module(module)
    mod.calls.clear()
    scenario = str(tmp_path / "track.toml")
    assert main(["run", "--scenario", scenario, "--tools", f"{module}:{attr}", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["termination"], record["tools_executed"]) == ("final_answer", 1)
    assert mod.calls == ["7"]  # the real function ran


def test_without_tools_the_scenario_must_script_them(
    module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the demo shop has no 'track': the call is an unknown tool, nothing of the module runs
    assert main(["run", "--scenario", str(tmp_path / "track.toml"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["tools_executed"] == 0


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("no_colon", "expected MODULE:ATTR"),
        ("lw_no_such_module_x:tools", "cannot import 'lw_no_such_module_x'"),
        ("{m}:missing", "has no attribute 'missing'"),
        ("{m}:broken", "calling broken() failed: RuntimeError: no database"),
        ("{m}:not_tools", "got int"),
    ],
)
def test_a_bad_spec_is_bad_input(
    module: str, spec: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--scenario", "refund", "--tools", spec.format(m=module)])
    err = capsys.readouterr().err
    assert code == 2
    assert why in err and "Traceback" not in err
