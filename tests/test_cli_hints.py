"""Commands that explain themselves (issue 21 item 9): a mistyped scenario or config key gets
a suggestion and the choices, every config problem is listed, and an empty report or an
unmetered budgets table says what to enable."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwarden.commands.cli import main as cli_main
from loopwarden.config import ConfigError, parse_config


def _cli(argv: list[str]) -> int:
    try:
        return cli_main(argv)
    except SystemExit as exc:  # argparse-level and command errors exit
        return int(exc.code or 0)


def test_a_mistyped_scenario_gets_a_suggestion_and_the_list_not_a_package_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _cli(["run", "--scenario", "refundd"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'refund'?" in err
    assert "retry-storm" in err and "never-finish" in err  # the built-in scenarios
    assert "demo/scenarios" not in err and "site-packages" not in err


def test_every_config_problem_is_listed_with_suggestions() -> None:
    data = {
        "run": {"system_promt": "x", "mode": "shadw"},
        "store": {"ledger_ttl": 3},
    }
    with pytest.raises(ConfigError) as exc:
        parse_config(data, path="deploy.toml")
    text = str(exc.value)
    assert "system_promt: unknown key (did you mean 'system_prompt'?)" in text
    assert "store.ledger_ttl: unknown key (did you mean 'ledger_ttl_s'?)" in text
    assert "run.mode" in text and "3 problems" in text
    assert exc.value.key is not None  # the first problem still names its key


def test_a_mistyped_plugin_setting_gets_a_suggestion(tmp_path: Path) -> None:
    from loopwarden import Deployment

    cfg = parse_config(
        {"plugins": {"enabled": ["max_steps"], "max_steps": {"max_stepz": 3}}}, path="d.toml"
    )
    with pytest.raises(ConfigError) as exc:
        Deployment(cfg)
    assert "plugins.max_steps.max_stepz: unknown key (did you mean 'max_steps'?)" in str(exc.value)


def test_report_without_records_says_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path))
    assert _cli(["report"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "run_record" in err


def test_budgets_says_when_spend_limits_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path))
    config = tmp_path / "config.toml"
    config.write_text('[plugins]\nenabled = ["max_steps"]\n', encoding="utf-8")
    assert _cli(["budgets", "--config", str(config)]) == 0
    assert "spend_limits is not enabled" in capsys.readouterr().out


def test_run_says_which_calls_the_ledger_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second `run --scenario refund` differs from the first (the refund is not executed
    again): its text output says so, and why."""
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert _cli(["run", "--scenario", "refund"]) == 0
    assert "side-effect ledger" not in capsys.readouterr().out
    assert _cli(["run", "--scenario", "refund"]) == 0
    out = capsys.readouterr().out
    assert "not executed at step" in out and "apply_refund" in out
    assert "answered from the side-effect ledger (another run, state done)" in out
