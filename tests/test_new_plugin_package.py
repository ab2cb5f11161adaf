"""``loopwarden new-plugin`` end to end, installed for real (issue 21: "CI creates one").

A slow integration test (about two minutes; ``-m "not slow"`` leaves it out locally, CI runs it):
in a throwaway venv (``python -m venv --system-site-packages``, which also sees this
environment's packages -- loopwarden, pytest, mypy -- through a ``site.addsitedir`` line), it

* runs the docs' line ``loopwarden new-plugin pii_guard pii-guard && pip install -e pii-guard
  && pytest pii-guard`` as written (bash; ``loopwarden`` and ``pytest`` are that venv's),
* enables the plugin by its entry-point name in a config.toml and checks that ``loopwarden
  plugins`` lists it as an entry point of its distribution,
* runs docs/plugin-guide.md's type-check recipe as written (a wheel-layout copy of
  loopwarden, then strict mypy over the package).

``pip install -e`` builds without isolation (``--no-build-isolation``, no network) when the
throwaway venv can build a wheel (setuptools >= 70.1 or ``wheel``); otherwise pip fetches the
build backend from the package index as usual (a venv of Python 3.11 brings setuptools 65,
one of 3.12+ none at all).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.docblocks import blocks

ROOT = Path(__file__).resolve().parent.parent
LINE = "loopwarden new-plugin pii_guard pii-guard && pip install -e pii-guard && pytest pii-guard"

pytestmark = pytest.mark.slow


_CAN_BUILD = """
import sys
try:
    import setuptools
except ImportError:
    sys.exit(1)
try:
    import wheel  # noqa: F401
except ImportError:
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    sys.exit(0 if (major, minor) >= (70, 1) else 1)
"""


def _can_build_without_isolation(venv: Path) -> bool:
    """Whether ``venv``'s own Python can build an editable wheel (its setuptools, which shadows
    this environment's: a venv made by Python 3.11 brings setuptools 65)."""
    python = venv / "bin" / "python"
    return subprocess.run([str(python), "-c", _CAN_BUILD], check=False).returncode == 0


def make_venv(where: Path) -> Path:
    """A throwaway venv that sees this environment's packages, with ``loopwarden`` and
    ``pytest`` commands of its own (so they import what is installed into it)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "_outer_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    for name, module in (("loopwarden", "loopwarden"), ("pytest", "pytest"), ("mypy", "mypy")):
        script = where / "bin" / name
        script.write_text(f'#!/bin/sh\nexec "{python}" -m {module} "$@"\n')
        script.chmod(0o755)
    return where


def bash(script: str, cwd: Path, venv: Path, **env: str) -> str:
    environ = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", **env)
    environ.pop("PYTHONPATH", None)
    environ["VIRTUAL_ENV"] = str(venv)  # for a venv: its bin/ comes first on PATH
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_line_in_the_docs_is_the_one_tested() -> None:
    issue_line = "`" + LINE + "`"
    docs = (ROOT / "docs" / "plugin-guide.md").read_text(encoding="utf-8")
    assert issue_line in docs


def test_a_new_plugin_installs_passes_its_tests_and_loads_by_name(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    pip_env = {"PIP_NO_BUILD_ISOLATION": "0"} if _can_build_without_isolation(venv) else {}
    # pip's inverted flag: PIP_NO_BUILD_ISOLATION=0 means --no-build-isolation
    out = bash(LINE, tmp_path, venv, **pip_env)
    assert " passed" in out.splitlines()[-1], out[-2000:]

    (tmp_path / "config.toml").write_text(
        '[plugins]\nenabled = ["max_steps", "pii_guard"]\n\n[plugins.pii_guard]\nstop = false\n',
        encoding="utf-8",
    )
    listing = bash("loopwarden plugins && loopwarden config check", tmp_path, venv)
    (row,) = [ln for ln in listing.splitlines() if "pii_guard" in ln and "entry point" in ln]
    assert "entry point (loopwarden-pii-guard 0.1.0)" in row
    assert "OK (2 plugins: max_steps, pii_guard)" in listing

    # docs/plugin-guide.md's type-check recipe, as written, where loopwarden is installed
    # with -e (this environment: the throwaway venv's view of it would shadow the setuptools
    # pip isolates for building the copy)
    (recipe,) = [
        b.text
        for b in blocks(ROOT / "docs" / "plugin-guide.md")
        if b.lang == "bash" and "mypy" in b.text
    ]
    out = bash(recipe, tmp_path, Path(sys.executable).parent.parent)
    assert "Success: no issues found" in out
