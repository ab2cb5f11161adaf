"""The demo lives apart from the core: a deployment has only the tools it is given, the core
never imports the shop, and the demo's ``[shop]`` table is still validated."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from loopwarden import Deployment
from loopwarden.commands.cli import main
from loopwarden.config import parse_config
from loopwarden.exceptions import ConfigError
from loopwarden.models.scenario import Scenario, ToolScript, builtin_scenarios
from loopwarden.testing import make_run, make_tool, script, tool_call, turn
from loopwarden.tools import ToolRegistry

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_a_deployment_without_tools_plays_a_scenario_that_scripts_them() -> None:
    sc = Scenario(
        name="scripted",
        user="Where is parcel 7?",
        model=script(
            [turn("Looking.", tool_call("track", parcel="7"))], final_text="It is in Lyon."
        ),
        tools={"track": ToolScript(results=["in Lyon"], read_only=True)},
    )
    with Deployment(parse_config({}, path="<test>")) as dep:
        assert dep.tools.names == []
        run = dep.run(scenario=sc)
    record = run.record()
    assert (record["termination"], record["final_answer"]) == ("final_answer", "It is in Lyon.")
    assert [m["content"] for m in run.messages if m["role"] == "tool"] == ["in Lyon"]


def test_a_call_of_a_tool_the_deployment_lacks_is_an_unknown_tool_not_a_shop_call() -> None:
    sc = Scenario(
        name="unknown",
        user="Refund order 88231.",
        model=script([turn("x", tool_call("apply_refund", order_id="88231"))], final_text="no"),
    )
    track = make_tool("track", "in Lyon", read_only=True)
    with Deployment(parse_config({}, path="<test>"), tools=ToolRegistry([track])) as dep:
        run = dep.run(scenario=sc)
    (observation,) = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert "unknown tool" in observation
    assert run.record()["tools_executed"] == 0


def test_a_scenario_tool_without_results_needs_the_deployment_to_have_it() -> None:
    sc = Scenario(name="s", user="u", tools={"track": ToolScript(read_only=True)})
    with (
        Deployment(parse_config({}, path="<test>")) as dep,
        pytest.raises(ConfigError, match="no tool of this name") as exc,
    ):
        dep.run(scenario=sc)
    assert exc.value.key == "tools.track"


def test_the_test_kit_defaults_to_no_tools() -> None:
    assert make_run().tools is not None
    assert make_run().tools.names == []


def test_no_core_module_imports_the_shop() -> None:
    shop = {"loopwarden.demo.shop", "loopwarden.tools.shop"}
    for path in [*ROOT.glob("core/*.py"), *ROOT.glob("core/commands/*.py")]:
        imported = _imports(path)
        assert not imported & shop, f"{path.relative_to(ROOT)} imports the shop"
    # the core proper (not the command line, which wires the demo in) never imports the demo
    for path in ROOT.glob("core/*.py"):
        assert not any(m.startswith("loopwarden.demo") for m in _imports(path)), path.name


def test_building_and_running_a_deployment_never_imports_the_demo() -> None:
    code = (
        "import sys, loopwarden, loopwarden.testing, loopwarden.traffic.replay\n"
        "from loopwarden.config import parse_config\n"
        "with loopwarden.Deployment(parse_config({})) as dep:\n"
        "    dep.run('hi', model=loopwarden.testing.ScriptedModel("
        "loopwarden.testing.script([], final_text='ok')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('loopwarden.demo')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_built_in_scenarios_are_the_demos_package_data() -> None:
    paths = builtin_scenarios()
    assert len(paths) >= 11
    assert all(p.parent.parent.name == "demo" for p in paths)


@pytest.mark.parametrize(
    ("table", "key"),
    [("db_path = 3", "shop.db_path"), ('db_pth = "x.sqlite3"', "shop.db_pth")],
)
def test_config_check_still_validates_the_demos_shop_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, key: str
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[shop]\n{table}\n", encoding="utf-8")
    assert main(["config", "check", str(cfg)]) == 2
    assert key in capsys.readouterr().err


def test_the_old_import_path_of_the_shop_still_works(tmp_path: Path) -> None:
    from loopwarden.demo import Shop
    from loopwarden.tools.shop import Shop as Old

    assert Old is Shop


def test_a_scenario_calling_tools_the_run_lacks_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with Deployment(parse_config({}, path="<test>")) as dep, caplog.at_level("WARNING"):
        run = dep.run(scenario="always-not-found")
    (message,) = [r.getMessage() for r in caplog.records if r.name == "loopwarden.deployment"]
    assert "'always-not-found'" in message and "query_order" in message
    assert "loopwarden.demo.shop_tools()" in message
    assert run.record()["tools_executed"] == 0


def test_no_warning_when_the_scenario_scripts_or_the_deployment_has_its_tools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from loopwarden.demo import shop_tools

    with (
        Deployment(parse_config({}, path="<test>"), tools=shop_tools()) as dep,
        caplog.at_level("WARNING"),
    ):
        dep.run(scenario="always-not-found")
    assert not [r for r in caplog.records if r.name == "loopwarden.deployment"]


def test_config_schema_describes_the_shop_table_as_the_demo_checks_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    shop = schema["$defs"][schema["properties"]["shop"]["$ref"].rsplit("/", 1)[1]]
    assert shop["additionalProperties"] is False
    assert set(shop["properties"]) == {"db_path"}
