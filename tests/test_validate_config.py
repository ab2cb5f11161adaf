"""The ``validate_config`` lifecycle hook: ``loopwarden config check`` asks every plugin what
only it can find out about its surroundings -- through the hook, not by looking methods up."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from loopwarden import PluginLoadError
from loopwarden.commands.cli import main
from loopwarden.testing import make_deployment

GUARDS = '''
from loopwarden import ConfigError, Plugin, hookimpl


class Refuses:
    """A plain object implementing the hook itself."""

    name = "refuses"
    seen = []

    @hookimpl
    def validate_config(self, config):
        Refuses.seen.append(config.path)
        raise ConfigError("the audit bucket is not reachable", path=config.path,
                          key="plugins.refuses.bucket")

    @hookimpl
    def before_model(self, run, request):
        return None


class Legacy(Plugin):
    """A Plugin subclass with the 0.1 spelling: check_config(path=...)."""

    name = "legacy"
    calls = []

    def check_config(self, *, path=None):
        Legacy.calls.append(path)

    @hookimpl
    def before_model(self, run, request):
        return None


class Broken:
    """A check that crashes instead of refusing."""

    name = "broken"

    @hookimpl
    def validate_config(self, config):
        raise ValueError("bucket gone")

    @hookimpl
    def before_model(self, run, request):
        return None


class PlainLegacy:
    """A plain object with the 0.1 method and no hook: it would silently never be called."""

    name = "plain_legacy"

    def check_config(self, *, path=None):
        raise AssertionError("never called")

    @hookimpl
    def before_model(self, run, request):
        return None
'''


@pytest.fixture
def guards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"lw_validate_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(GUARDS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _config(tmp_path: Path, *enabled: str) -> Path:
    cfg = tmp_path / "config.toml"
    names = ", ".join(f'"{e}"' for e in ("max_steps", *enabled))
    cfg.write_text(
        textwrap.dedent(f"""
        [model]
        provider = "scripted"
        [plugins]
        enabled = [{names}]
        """),
        encoding="utf-8",
    )
    return cfg


def test_hook_validate_config_refuses_through_config_check(
    guards: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, f"{guards}:Refuses")
    assert main(["config", "check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "the audit bucket is not reachable" in err
    assert "plugins.refuses.bucket" in err


def test_a_plugin_subclass_keeps_its_check_config_method(
    guards: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    module = importlib.import_module(guards)
    cfg = _config(tmp_path, f"{guards}:Legacy")
    assert main(["config", "check", str(cfg)]) == 0
    assert module.Legacy.calls == [str(cfg)]
    assert "OK" in capsys.readouterr().out


def test_the_hook_is_not_called_for_a_run(guards: str) -> None:
    import importlib

    module = importlib.import_module(guards)
    with make_deployment({"plugins": {"enabled": ["max_steps", f"{guards}:Legacy"]}}) as dep:
        (row,) = [r for r in dep.plugins.describe() if r["spec"].endswith(":Legacy")]
        assert "validate_config" in row["hooks"]  # registered: it overrides check_config
        assert module.Legacy.calls == []  # building a deployment does not check the config


def test_a_plain_object_with_the_old_method_fails_at_load_naming_the_hook(guards: str) -> None:
    with pytest.raises(PluginLoadError, match="validate_config") as exc:
        make_deployment({"plugins": {"enabled": ["max_steps", f"{guards}:PlainLegacy"]}})
    assert "check_config" in str(exc.value)


def test_a_check_that_crashes_is_bad_input_naming_the_plugin(
    guards: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, f"{guards}:Broken")
    assert main(["config", "check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "validate_config failed: ValueError: bucket gone" in err
    assert "plugins.broken" in err and "Traceback" not in err  # its table: its one name
