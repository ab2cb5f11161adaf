"""``module:attr`` plugins next to the config file load without packaging (issue 34, item 2).

The docs say a ``my_guards.py`` beside ``config.toml`` works; the console script does not put
the current directory on ``sys.path``, so the config file's directory is searched for
``module:attr`` entries, as pytest searches its rootdir for ``conftest.py``.  These run the
real ``loopwarden`` console script in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GUARDS = """
from loopwarden import Plugin, hookimpl


class NoRefunds(Plugin):
    name = "no_refunds"

    @hookimpl
    def before_tool(self, run, call):
        if call.name == "apply_refund":
            return self.stop("forbidden_tool", tool=call.name)
        return None
"""

CONFIG = '[plugins]\nenabled = ["max_steps", "my_guards:NoRefunds"]\n'


def _script() -> str:
    found = shutil.which("loopwarden", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("the loopwarden console script is not installed next to this Python")
    return found


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [_script(), "run", "--scenario", "refund", "--json", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    d = tmp_path / "project"
    d.mkdir()
    (d / "my_guards.py").write_text(GUARDS, encoding="utf-8")
    (d / "config.toml").write_text(CONFIG, encoding="utf-8")
    return d


def test_a_plugin_next_to_config_toml_loads_from_that_directory(project: Path) -> None:
    proc = _run(cwd=project)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["stopped_by"] == "no_refunds" and record["termination"] == "forbidden_tool"


def test_a_plugin_next_to_a_config_given_by_path_loads_from_elsewhere(
    project: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _run("--config", str(project / "config.toml"), cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stopped_by"] == "no_refunds"


def test_a_module_found_nowhere_says_where_it_was_looked_for(project: Path) -> None:
    (project / "my_guards.py").unlink()
    proc = _run(cwd=project)
    assert proc.returncode == 2
    assert "cannot import 'my_guards'" in proc.stderr
    assert str(project) in proc.stderr  # the config's directory was searched too
