"""An entry point's name is its plugin's name, as in pytest (issue 34, item 1).

``probe = "acme_probe"`` -- a short name for a longer module, the form every pytest plugin
uses -- is the plugin ``probe``: its ``[plugins.probe]`` table, its verdicts, its record.  The
package here is a real wheel installed by pip into a directory of its own, so that
``importlib.metadata`` finds its entry point the way it finds any installed distribution's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# A module plugin that declares no name: it stops any refund, citing a setting of its table.
PROBE = '''
"""acme's probe: stops refunds."""
from loopwarden import PluginSettings, hookimpl, stop


class Settings(PluginSettings):
    tag: str = "unset"


settings = Settings()


def configure(s: Settings) -> None:
    global settings
    settings = s


@hookimpl
def before_tool(run, call):
    if call.name == "apply_refund":
        return stop("no_refunds", plugin="probe", tag=settings.tag)
    return None
'''


def _wheel(tmp: Path, dist: str, module: str, source: str, entry_points: str) -> Path:
    """A pure-Python wheel holding one module, its entry points in ``loopwarden.plugins``."""
    info = f"{dist}-1.0.dist-info"
    files = {
        f"{module}.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[loopwarden.plugins]\n{entry_points}\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    path = tmp / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _install(tmp: Path, wheel: Path) -> Path:
    """pip-install ``wheel`` into a site directory of its own (the venv stays untouched)."""
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    assert list(site.glob("*.dist-info/entry_points.txt"))
    return site


def _run(site: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "loopwarden",
            "run",
            "--scenario",
            "refund",
            "--json",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=120,
    )


@pytest.fixture
def acme_site(tmp_path: Path) -> Path:
    wheel = _wheel(tmp_path, "acme_probe", "acme_probe", PROBE, "probe = acme_probe")
    return _install(tmp_path, wheel)


def test_a_short_entry_point_name_is_the_plugins_name(acme_site: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[plugins]\nenabled = ["max_steps", "probe"]\n[plugins.probe]\ntag = "from-table"\n',
        encoding="utf-8",
    )
    proc = _run(acme_site, config)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["termination"] == "no_refunds" and record["stopped_by"] == "probe"
    assert record["evidence"]["tag"] == "from-table"  # [plugins.probe] configured it


def test_the_testing_kit_and_the_loader_agree_on_the_entry_points_name(
    acme_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from loopwarden.config import parse_config
    from loopwarden.engine.pluginmanager import load_plugins

    monkeypatch.syspath_prepend(str(acme_site))
    importlib.invalidate_caches()
    try:
        plugins = load_plugins(
            parse_config(
                {"plugins": {"enabled": ["max_steps", "probe"], "probe": {"tag": "t"}}},
                path="<test>",
            )
        )
        assert plugins.names == ["max_steps", "probe"]
    finally:
        sys.modules.pop("acme_probe", None)


def test_a_plugin_declaring_another_name_than_its_entry_point_fails(tmp_path: Path) -> None:
    source = PROBE + '\nname = "acme_probe_guard"\n'
    site = _install(
        tmp_path, _wheel(tmp_path, "acme_probe", "acme_probe", source, "probe = acme_probe")
    )
    config = tmp_path / "config.toml"
    config.write_text('[plugins]\nenabled = ["max_steps", "probe"]\n', encoding="utf-8")
    proc = _run(site, config)
    assert proc.returncode == 2
    assert "declares the name 'acme_probe_guard'" in proc.stderr
