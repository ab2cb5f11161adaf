"""The wheel: one import package ``loopwarden``, package data inside, nothing top-level else."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    (whl,) = out.glob("loopwarden-*.whl")
    return zipfile.ZipFile(whl)


def test_wheel_has_only_the_loopwarden_package(wheel: zipfile.ZipFile) -> None:
    tops = {n.split("/", 1)[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"loopwarden"}
    assert not tops & {"core", "plugins", "tools", "tests"}


def test_every_source_package_and_data_file_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    mapping = {"core": "loopwarden", "plugins": "loopwarden/plugins", "tools": "loopwarden/tools"}
    for src, dest in mapping.items():
        for py in (ROOT / src).rglob("*.py"):
            rel = py.relative_to(ROOT / src).as_posix()
            if "__pycache__" in rel:
                continue
            assert f"{dest}/{rel}" in names, f"{src}/{rel} is missing from the wheel"
    for data in (
        "py.typed",
        "default_config.toml",
        "grafana/loopwarden.json",  # the Grafana dashboard docs/observability.md imports
        "console/static/console.css",  # the console's assets ship in the package (no CDN)
        "console/static/console.js",
    ):
        assert f"loopwarden/{data}" in names, f"{data} is missing from the wheel"
    shipped = {p.name for p in (ROOT / "core" / "demo" / "scenarios").glob("*.toml")}
    in_wheel = {n.rsplit("/", 1)[1] for n in names if n.startswith("loopwarden/demo/scenarios/")}
    assert shipped and shipped <= in_wheel


def test_console_script_is_declared(wheel: zipfile.ZipFile) -> None:
    ep = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    text = wheel.read(ep).decode()
    assert "loopwarden = loopwarden.commands.cli:main" in text
