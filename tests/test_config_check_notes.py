"""``loopwarden config check`` says what it drops and why (issue 34, item 6).

A plugin both enabled and blocked is dropped (blocking wins): a warning.  With plugin autoload
off, an installed plugin's table is not "configures nothing ... did you mean" something
unrelated: it is the table of a plugin the switch keeps from loading.  The installed plugin is
the example package, ``loopwarden-allowlist`` (entry point ``allowlist``).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from loopwarden.commands.cli import main

pytestmark = pytest.mark.skipif(
    not any(ep.name == "allowlist" for ep in metadata.entry_points(group="loopwarden.plugins")),
    reason="install the example first: pip install -e ./examples/loopwarden-allowlist",
)


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    code = main(["config", "check", str(path)])
    return code, capsys.readouterr().err


def test_a_plugin_enabled_and_blocked_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _check(
        tmp_path,
        '[plugins]\nenabled = ["max_steps", "repeat_call", "stall"]\nblocked = ["stall"]\n',
        capsys,
    )
    assert code == 0
    assert "warning: plugin 'stall' is enabled and blocked (by [plugins] blocked)" in err


def test_a_plugin_enabled_and_blocked_by_the_environment_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPWARDEN_BLOCK_PLUGINS", "repeat_call")
    code, err = _check(tmp_path, '[plugins]\nenabled = ["max_steps", "repeat_call"]\n', capsys)
    assert code == 0
    assert "'repeat_call' is enabled and blocked (by LOOPWARDEN_BLOCK_PLUGINS)" in err


def test_with_autoload_off_an_installed_plugins_table_gets_a_relevant_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD", "1")
    code, err = _check(
        tmp_path,
        '[plugins]\nenabled = ["max_steps"]\n[plugins.allowlist]\nallowed = ["get_*"]\n',
        capsys,
    )
    assert code == 0, err
    assert "did you mean" not in err
    assert "[plugins.allowlist] configures the installed plugin 'allowlist'" in err
    assert "LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD is set" in err


def test_with_autoload_off_enabling_an_installed_plugin_names_the_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD", "1")
    code, err = _check(tmp_path, '[plugins]\nenabled = ["max_steps", "allowlist"]\n', capsys)
    assert code == 2
    assert "did you mean" not in err
    assert "'allowlist' is the entry point of loopwarden-allowlist" in err
    assert "'loopwarden_allowlist:Allowlist'" in err  # how to enable it without autoload
