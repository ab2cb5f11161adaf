"""The worked third-party plugin (examples/loopwarden-allowlist), installed for real by CI.

Checks issue 5's done-when end to end: the installed package runs in its configured position
and `loopwarden plugins` names its source; the same plugin loads by module:attr without being
installed; blocking it keeps its module from being imported; its own tests pass using only
loopwarden.testing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "loopwarden-allowlist"


def _installed() -> bool:
    try:
        metadata.distribution("loopwarden-allowlist")
    except metadata.PackageNotFoundError:
        return False
    return True


needs_install = pytest.mark.skipif(
    not _installed(),
    reason="install the example first: pip install ./examples/loopwarden-allowlist "
    "(the README's test command and CI do)",
)


def lw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def write_config(tmp_path: Path, name: str) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        "[plugins]\n"
        f'enabled = ["max_steps", "{name}", "repeat_call"]\n'
        # one table whichever way the plugin is enabled: it is named by the name it declares
        '[plugins.allowlist]\nallowed = ["query_*"]\nallow_read_only = false\nmax_refusals = 0\n',
        encoding="utf-8",
    )
    return cfg


@needs_install
def test_installed_plugin_runs_in_its_configured_position(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "allowlist")
    proc = lw("plugins", "--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["plugins"]
    assert [r["name"] for r in rows] == ["max_steps", "allowlist", "repeat_call"]
    assert rows[1]["source"].startswith("entry point (loopwarden-allowlist ")
    proc = lw(
        "run",
        "--scenario",
        "refund",
        "--config",
        str(cfg),
        "--json",
        env={"LOOPWARDEN_DATA_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["stopped_by"] == "allowlist"  # search_knowledge is not on the list


def test_the_same_plugin_loads_by_module_attr_without_installing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "loopwarden_allowlist:Allowlist")
    env = {
        "PYTHONPATH": str(EXAMPLE / "src"),
        "LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD": "1",
        "LOOPWARDEN_DATA_DIR": str(tmp_path),
    }
    proc = lw("plugins", "--config", str(cfg), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["plugins"][1]
    assert row["name"] == "allowlist" and row["source"] == "module:attr"
    assert row["spec"] == "loopwarden_allowlist:Allowlist"
    proc = lw("run", "--scenario", "refund", "--config", str(cfg), "--json", env=env)
    assert json.loads(proc.stdout)["stopped_by"] == "allowlist"  # as when installed


@needs_install
def test_blocking_it_by_name_keeps_its_module_from_being_imported(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "allowlist")
    code = (
        "import sys, json\n"
        "from loopwarden import Deployment\n"
        f"dep = Deployment.from_config({str(cfg)!r})\n"
        "print(json.dumps([dep.plugins.names, 'loopwarden_allowlist' in sys.modules]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LOOPWARDEN_BLOCK_PLUGINS": "allowlist"},
    )
    assert proc.returncode == 0, proc.stderr
    names, imported = json.loads(proc.stdout)
    assert names == ["max_steps", "repeat_call"] and imported is False


@needs_install
@pytest.mark.slow
def test_the_examples_own_tests_pass_using_only_the_testing_kit() -> None:
    tests = EXAMPLE / "tests"
    imports = {
        line.split()[1]
        for f in tests.glob("*.py")
        for line in f.read_text().splitlines()
        if line.startswith(("import ", "from "))
    }
    ours = {i for i in imports if i.split(".")[0] == "loopwarden"}
    assert ours == {"loopwarden.testing"}, ours
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=EXAMPLE,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
