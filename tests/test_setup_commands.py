"""The README's two commands are what CI runs, with the pip that Python ships.

`.ci/run` once upgraded pip before installing, which hid that the pip of Python 3.10-3.12
cannot resolve the example plugin's dependency on loopwarden in the same command as
loopwarden itself.  CI must run the README's steps as written and nothing before them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
#: the README's test command: the whole suite, on every core (pytest-xdist)
TEST_COMMAND = "python -m pytest -n auto"


def _readme_test_command() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (line,) = [ln.strip() for ln in text.splitlines() if ln.strip().endswith(TEST_COMMAND)]
    return [step.strip() for step in line.split("&&")]


def test_ci_installs_exactly_as_the_readme_says_without_upgrading_pip() -> None:
    steps = _readme_test_command()
    installs = [s for s in steps if s.startswith("pip install")]
    assert installs, steps
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [ln.strip() for ln in ci.splitlines() if not ln.strip().startswith("#")]
    ci_installs = [
        c.removeprefix("python -m ")
        for c in commands
        if "pip install" in c and not c.startswith("echo")
    ]
    # the README's installs, in order, then only the type checker's copy of the package
    assert [re.sub(r"\s-q\b", "", c) for c in ci_installs[: len(installs)]] == installs
    assert not any("--upgrade pip" in c or "-U pip" in c for c in commands)
    assert steps[-1] == TEST_COMMAND and TEST_COMMAND in commands


def test_no_build_warns_about_a_deprecated_license_table() -> None:
    for path in (ROOT / "pyproject.toml", ROOT / "examples/loopwarden-allowlist/pyproject.toml"):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data["project"]["license"], str), path  # an SPDX expression
        (setuptools,) = [r for r in data["build-system"]["requires"] if "setuptools" in r]
        assert setuptools == "setuptools>=77", path  # the first to read SPDX expressions
