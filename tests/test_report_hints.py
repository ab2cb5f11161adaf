"""``loopwarden report`` without a file: its hint works as given (issue 34, item 5).

The hint's commands are run exactly as printed, in a shell, with the real console script;
afterwards ``loopwarden report`` must print a report instead of the same error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _shell(line: str, cwd: Path, data: Path) -> subprocess.CompletedProcess[str]:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    env["LOOPWARDEN_DATA_DIR"] = str(data)
    return subprocess.run(
        line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _hinted(stderr: str) -> list[str]:
    """The indented command lines of the hint (4 spaces, starting a command)."""
    return [ln.strip() for ln in stderr.splitlines() if ln.startswith("    ") and ln.strip()]


@pytest.mark.parametrize(
    "config",
    [
        None,  # the shipped config: run_record is off
        '[plugins]\nenabled = ["max_steps", "run_record"]\n',  # on: naming it again fails
        '[plugins]\nenabled = ["max_steps"]\n[plugins.run_record]\npath = "records/r.jsonl"\n',
    ],
    ids=["shipped", "run_record-enabled", "own-path"],
)
@pytest.mark.slow
def test_the_hint_after_no_records_file_works_as_given(config: str | None, tmp_path: Path) -> None:
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir()
    if config is not None:
        (work / "config.toml").write_text(config, encoding="utf-8")
    first = _shell("loopwarden report", work, data)
    assert first.returncode == 2 and "no such file" in first.stderr
    commands = _hinted(first.stderr)
    assert commands and commands[-1].startswith("loopwarden report"), first.stderr
    for line in commands:
        done = _shell(line, work, data)
        assert done.returncode in (0, 1), f"{line}: {done.stderr}"
    assert "1 run" in done.stdout  # the last hinted command: a report of the recorded run


def test_report_takes_the_records_path_from_config(tmp_path: Path) -> None:
    records = tmp_path / "elsewhere.jsonl"
    config = tmp_path / "c.toml"
    config.write_text(f'[plugins.run_record]\npath = "{records.as_posix()}"\n', encoding="utf-8")
    proc = _shell(f"loopwarden report --config {config}", tmp_path, tmp_path / "data")
    assert proc.returncode == 2 and f"no such file: {records}" in proc.stderr
    assert f"--config {config}" in proc.stderr  # the hint keeps the config
