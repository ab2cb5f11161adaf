"""Your own tools in one import, one lookup rule, a testing kit that catches mistakes early
(issue 46, items 4 and 9).

* ``from loopwarden import tool, ToolRegistry`` works without slowing ``import loopwarden``;
* ``--tools MODULE:ATTR`` finds a module beside config.toml, as ``[plugins] enabled`` does;
* ``Deployment(model=script(...))`` fails at construction, naming the call to use;
* the tool error kinds are all documented in docs/tools.md;
* ``loopwarden new-plugin --minimal`` writes two files whose tests pass as generated.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from loopwarden import Deployment, tool
from loopwarden.commands import cli
from loopwarden.commands.new_plugin import render_minimal
from loopwarden.events import ErrorKind
from loopwarden.testing import ScriptedModel, make_deployment, script, tool_call, turn

ROOT = Path(__file__).resolve().parent.parent

# -- item 4: one import, one lookup rule -------------------------------------------------------


def test_tools_are_one_import_from_loopwarden() -> None:
    import loopwarden.tools
    from loopwarden import Tool, ToolContext, ToolRegistry

    assert tool is loopwarden.tools.tool and ToolRegistry is loopwarden.tools.ToolRegistry
    assert Tool is loopwarden.tools.Tool and ToolContext is loopwarden.tools.ToolContext
    assert {"tool", "Tool", "ToolRegistry", "ToolContext"} <= set(loopwarden.__all__)

    @tool(read_only=True)
    def track(parcel_id: str) -> str:
        """Where a parcel is."""
        return f"parcel {parcel_id}: in transit"

    assert ToolRegistry([track]).names == ["track"]


def test_import_loopwarden_does_not_import_the_tools_or_pydantic() -> None:
    code = (
        "import sys, loopwarden\n"
        "print(sorted(m for m in sys.modules if m.startswith(('loopwarden.', 'pydantic'))))\n"
        "loopwarden.tool\n"
        "print('loopwarden.tools' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["['loopwarden._version']", "True"]


def test_api_md_documents_tool_and_the_registry() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for heading in ("### tool\n", "### Tool\n", "### ToolRegistry\n", "### ToolContext\n"):
        assert heading in text
    assert "## Tools (docs/tools.md)" in text


TOOLS = '''
from loopwarden import ToolError, ToolRegistry, tool

@tool(read_only=True, deterministic=True)
def track_parcel(parcel_id: str) -> str:
    """Where a parcel is."""
    if parcel_id != "7":
        raise ToolError(f"NOT_FOUND: parcel {parcel_id}")
    return "parcel 7: in transit"

registry = ToolRegistry([track_parcel])
'''

SCENARIO = """
name = "parcel"
user = "Where is parcel 7?"
[model]
turns = [{ content = "Let me check.", tool_calls = [
    { name = "track_parcel", arguments = { parcel_id = "7" } },
] }]
then = "final"
final_text = "Parcel 7 is in transit."
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a tools module (uniquely named) beside config.toml, and a cwd
    elsewhere: neither the cwd nor ``sys.path`` holds the module."""
    d = tmp_path / "project"
    d.mkdir()
    (d / f"{_module(tmp_path)}.py").write_text(TOOLS, encoding="utf-8")
    (d / "config.toml").write_text('[plugins]\nenabled = ["max_steps"]\n', encoding="utf-8")
    (d / "parcel.toml").write_text(SCENARIO, encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the lookup appends the config's dir
    return d


def _module(tmp_path: Path) -> str:
    return "parcel_tools_" + re.sub(r"\W", "_", tmp_path.name)


def test_tools_beside_config_toml_are_found_as_plugins_are(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _module(tmp_path)
    argv = ["run", "--scenario", str(project / "parcel.toml"), "--json"]
    argv += ["--config", str(project / "config.toml"), "--tools", f"{module}:registry"]
    try:
        code = cli.main(argv)
    finally:
        sys.modules.pop(module, None)
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    assert record["termination"] == "final_answer" and record["tool_calls"] == 1
    assert record["final_answer"] == "Parcel 7 is in transit."


def test_tools_found_nowhere_say_where_they_were_looked_for(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "Where is parcel 7?", "--config", str(project / "config.toml")]
    assert cli.main([*argv, "--tools", "no_such_tools_module:registry"]) == 2
    err = capsys.readouterr().err
    assert "--tools no_such_tools_module:registry" in err
    assert str(project) in err  # the config file's directory was searched too


def test_the_lookup_rule_is_documented_for_both() -> None:
    tools_md = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    assert "--tools" in tools_md and "[plugins] enabled" in tools_md
    assert "beside" in (ROOT / "README.md").read_text(encoding="utf-8")


# -- item 9: the testing kit catches mistakes early -------------------------------------------


def test_a_script_given_as_the_model_fails_at_construction() -> None:
    with pytest.raises(TypeError) as err:
        Deployment(model=script([turn("Hello.")]))  # type: ignore[arg-type]
    message = str(err.value)
    assert "Deployment(model=...)" in message and "ScriptConfig" in message
    assert "model=ScriptedModel(script(...))" in message


def test_the_call_the_message_names_works() -> None:
    with make_deployment(model=ScriptedModel(script(final_text="Hello."))) as dep:
        run = dep.run("Hi")
    assert run.outcome is not None and run.outcome.final_answer == "Hello."


def test_turns_or_a_name_given_as_the_model_fail_too() -> None:
    with pytest.raises(TypeError, match="ScriptedModel"):
        Deployment(model=[turn("Hello.")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\[model\] name"):
        Deployment(model="gpt-4o-mini")  # type: ignore[arg-type]
    with make_deployment() as dep, pytest.raises(TypeError, match="model=: got a ScriptConfig"):
        dep.run("Hi", model=script([turn("Hello.")]))


def test_an_async_only_model_is_accepted() -> None:
    class OnlyAsync:
        async def acomplete(self, request: object) -> object:
            raise NotImplementedError

    make_deployment(model=OnlyAsync()).close()  # type: ignore[arg-type]


def test_every_tool_error_kind_is_documented() -> None:
    text = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    section = text.split("## Errors", 1)[1]
    kinds = typing.get_args(ErrorKind)
    missing = [k for k in kinds if f"| `{k}` |" not in section]
    assert kinds and missing == []


@pytest.fixture
def minimal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert cli.main(["new-plugin", "--minimal", "no_deletes", str(tmp_path)]) == 0
    assert "no_deletes:NoDeletes" in capsys.readouterr().out
    return tmp_path


def test_minimal_writes_two_files(minimal: Path) -> None:
    assert sorted(p.name for p in minimal.iterdir()) == ["no_deletes.py", "test_no_deletes.py"]


def test_minimal_scaffold_tests_pass_as_generated(minimal: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_no_deletes.py"],
        cwd=minimal,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_minimal_scaffold_is_ruff_clean(minimal: Path) -> None:
    ruff = shutil.which("ruff")
    assert ruff is not None
    for args in (["check", "--select", "E,F,I,UP,B", "."], ["format", "--check", "."]):
        proc = subprocess.run([ruff, *args], cwd=minimal, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_minimal_plugin_loads_beside_config_toml_and_stops_the_call(
    minimal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (minimal / "config.toml").write_text(
        '[plugins]\nenabled = ["max_steps", "no_deletes:NoDeletes"]\n', encoding="utf-8"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))  # the lookup appends the config's dir
    monkeypatch.delitem(sys.modules, "no_deletes", raising=False)
    deleted: list[str] = []

    @tool(side_effect=True)
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        deleted.append(user)
        return "deleted"

    model = ScriptedModel(script([turn("Deleting it now.", tool_call("delete_account", user="a"))]))
    try:
        with make_deployment(minimal / "config.toml", tools=[delete_account]) as dep:
            assert dep.plugins.names == ["max_steps", "no_deletes"]
            run = dep.run("Delete my account", model=model)
    finally:
        sys.modules.pop("no_deletes", None)
    assert deleted == []
    assert run.outcome is not None and run.outcome.termination == "no_deletes"
    assert run.outcome.final_answer is not None
    assert run.outcome.final_answer.startswith("I did not run delete_account")


def test_minimal_never_overwrites(minimal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (minimal / "no_deletes.py").read_text(encoding="utf-8")
    assert cli.main(["new-plugin", "--minimal", "no_deletes", str(minimal)]) == 2
    assert "already there" in capsys.readouterr().err
    assert (minimal / "no_deletes.py").read_text(encoding="utf-8") == before


def test_minimal_refuses_a_standard_library_name() -> None:
    from loopwarden.exceptions import LoopwardenError

    with pytest.raises(LoopwardenError, match="standard-library"):
        render_minimal("json")
