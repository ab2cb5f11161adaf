"""``loopwarden new-plugin`` (issue 21, item 6): the package it writes is complete and green.

The generated package is not pip-installed here (so its entry point cannot be registered):
its files must exist and compile, be ruff-clean under its own pyproject, its own tests must
pass with ``src`` on ``PYTHONPATH`` (the entry-point test then skips), and its plugin class
must run in a Deployment enabled as ``module:attr``.  The installed path (``pip install -e``,
entry point, ``loopwarden plugins``) is checked by hand and in CI.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loopwarden.commands.cli import main
from loopwarden.commands.new_plugin import render
from loopwarden.testing import ScriptedModel, make_deployment, make_tool, script, tool_call, turn

FILES = [
    "pyproject.toml",
    "README.md",
    "src/loopwarden_pii_guard/__init__.py",
    "src/loopwarden_pii_guard/py.typed",
    "tests/test_pii_guard.py",
]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``loopwarden new-plugin pii_guard DIR``, once for the module."""
    target = tmp_path_factory.mktemp("scaffold") / "pii-guard"
    assert main(["new-plugin", "pii_guard", str(target)]) == 0
    return target


def test_it_writes_the_package_files(package: Path) -> None:
    written = sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file())
    assert written == sorted(FILES)
    pyproject = (package / "pyproject.toml").read_text(encoding="utf-8")
    assert '[project.entry-points."loopwarden.plugins"]' in pyproject
    assert 'pii_guard = "loopwarden_pii_guard:PiiGuard"' in pyproject
    assert 'addopts = ["-p", "loopwarden.testing"]' in pyproject


def test_the_python_files_compile(package: Path) -> None:
    for path in package.rglob("*.py"):
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_the_package_is_ruff_clean_under_its_own_config(package: Path) -> None:
    ruff = shutil.which("ruff")
    assert ruff is not None
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run(
            [ruff, *args], cwd=package, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_generated_tests_pass(package: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package / "src"), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package)],
        cwd=package,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # six tests run; only the installed-entry-point test skips without an install
    assert "6 passed, 1 skipped" in proc.stdout, proc.stdout


def test_the_plugin_runs_in_a_deployment_as_module_attr(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(package / "src"))
    sent: list[dict[str, object]] = []
    tools = [make_tool("post_message", lambda **kw: sent.append(kw) or "sent", side_effect=True)]
    config = {"plugins": {"enabled": ["max_steps", "loopwarden_pii_guard:PiiGuard"]}}
    with make_deployment(config, tools=tools) as dep:
        model = ScriptedModel(
            script([turn("Sending.", tool_call("post_message", text="to jane@example.com"))])
        )
        run = dep.run("Tell Jane.", model=model)
    assert run.record()["termination"] == "pii_guard"
    assert run.record()["pii_guard_matches"] == 1
    assert sent == []


@pytest.mark.parametrize("name", ["1bad", "Pii", "pii-guard", "class", "", "max_steps"])
def test_a_bad_name_is_refused(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new-plugin", name, str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "loopwarden new-plugin: error:" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_existing_non_empty_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    assert main(["new-plugin", "pii_guard", str(tmp_path)]) == 2
    assert "not an empty directory: nothing written" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_an_empty_directory_is_used(tmp_path: Path) -> None:
    assert main(["new-plugin", "pii_guard", str(tmp_path)]) == 0
    assert (tmp_path / "tests" / "test_pii_guard.py").is_file()


def test_every_name_fills_every_placeholder() -> None:
    for text in render("a2_b").values():
        assert "__NAME__" not in text and "__CLASS__" not in text and "__PACKAGE__" not in text
    assert "class A2B(Plugin[A2BSettings])" in render("a2_b")["src/loopwarden_a2_b/__init__.py"]


@pytest.mark.parametrize(
    ("plugin_code", "clean"),
    [("x: int = f()\n", True), ("x: str = f()\n", False)],
    ids=["error-inside-loopwarden", "error-in-the-plugin"],
)
def test_its_mypy_config_reports_the_plugins_errors_not_loopwardens(
    package: Path, tmp_path: Path, plugin_code: str, clean: bool
) -> None:
    """The generated [tool.mypy]: strict on the plugin, silent inside loopwarden (here a
    stand-in whose own code has a type error, as an optional adapter without its framework)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    fake = tmp_path / "stubs" / "loopwarden"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def f() -> int:\n    return 'x'  # wrong\n", "utf-8")
    (fake / "py.typed").write_text("", "utf-8")
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    shutil.copy(package / "pyproject.toml", project / "pyproject.toml")
    (project / "src" / "guard.py").write_text("from loopwarden import f\n\n" + plugin_code)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "src/guard.py"],
        cwd=project,
        env={**os.environ, "MYPYPATH": str(tmp_path / "stubs")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (proc.returncode == 0) is clean, proc.stdout + proc.stderr
    assert "loopwarden/__init__.py" not in proc.stdout
