"""What loopwarden creates on disk is owner-only: run records hold whole conversations and tool
results, so ``runs.jsonl`` is 0600 and a data directory loopwarden makes is 0700 -- whatever
the (usual, 022) umask.  What exists already keeps its mode: the user made it, or chose it.

POSIX modes only: skipped on Windows.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwarden.commands.cli import main
from loopwarden.paths import records_path
from loopwarden.plugins.run_record import JsonlAppender

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def _usual_umask() -> Iterator[None]:
    """The umask most systems run with (022): group and others could read what is created
    with a wide mode -- the case the owner-only modes are for."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def fresh_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory that does not exist yet, under a parent that does not either."""
    d = tmp_path / "home" / "share" / "loopwarden"
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(d))
    return d


def config_with_run_record(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('[plugins]\nenabled = ["max_steps", "run_record"]\n', encoding="utf-8")
    return path


def test_loopwarden_run_creates_runs_jsonl_0600_in_a_0700_data_directory(
    fresh_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--scenario", "refund", "--config", str(config_with_run_record(tmp_path))])
    capsys.readouterr()
    assert code == 0
    records = records_path()
    assert records.parent == fresh_data_dir and records.is_file()
    assert oct(mode(records)) == oct(0o600)
    # every directory loopwarden made on the way, the demo shop's included
    for d in (fresh_data_dir, fresh_data_dir.parent, fresh_data_dir.parent.parent):
        assert oct(mode(d)) == oct(0o700), d


def test_an_appender_creates_its_file_and_missing_directories_owner_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a" / "b" / "runs.jsonl"
    assert JsonlAppender(path).append({"run_id": "r1"})
    assert oct(mode(path)) == oct(0o600)
    assert oct(mode(path.parent)) == oct(0o700)
    assert oct(mode(path.parent.parent)) == oct(0o700)


def test_a_directory_the_user_made_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    assert JsonlAppender(shared / "runs.jsonl").append({"run_id": "r1"})
    assert oct(mode(shared)) == oct(0o755)
    assert oct(mode(shared / "runs.jsonl")) == oct(0o600)


def test_an_existing_file_keeps_the_mode_its_owner_chose(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("")
    os.chmod(path, 0o640)  # e.g. group-readable for a log shipper
    assert JsonlAppender(path).append({"run_id": "r1"})
    assert oct(mode(path)) == oct(0o640)
    assert path.read_text().count("\n") == 1


def test_the_helpers_are_owner_only_and_refuse_a_file_in_the_way(tmp_path: Path) -> None:
    from loopwarden.paths import ensure_private_dir, open_private

    d = ensure_private_dir(tmp_path / "x" / "y")
    assert oct(mode(d)) == oct(0o700)
    fd = open_private(d / "f", os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    assert oct(mode(d / "f")) == oct(0o600)
    (tmp_path / "blocker").write_text("x")
    with pytest.raises(OSError):
        ensure_private_dir(tmp_path / "blocker" / "sub")
