"""The command line: exit codes, JSON records, the refund scenario's done-when."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwarden.commands.cli import main
from loopwarden.demo.shop import Shop
from loopwarden.models.scenario import scenario_path

REFUND = scenario_path("refund")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures the "loopwarden" logger, as a CLI should; undo it for other tests."""
    logger = logging.getLogger("loopwarden")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_refund_scenario_json_ends_with_final_answer_after_four_turns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "run", "--scenario", str(REFUND), "--json")
    assert code == 0
    rec = json.loads(out)
    assert rec["termination"] == "final_answer" and rec["steps"] == 4
    assert rec["scenario"] == "refund" and rec["warnings"] == []


def test_running_the_refund_twice_leaves_exactly_one_refund_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for _ in range(2):
        assert run_cli(capsys, "run", "--scenario", str(REFUND), "--json")[0] == 0
    assert Shop().refunds() == [("RF88231001", "88231", "七天无理由退货")]


def test_a_built_in_scenario_can_be_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "--scenario", "refund")
    assert code == 0 and "termination: final_answer" in out


def test_plugins_lists_in_config_order(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[plugins]\nenabled = ["max_steps"]\n', encoding="utf-8")
    code, out, _ = run_cli(capsys, "plugins", "--config", str(cfg), "--json")
    assert code == 0
    rows = json.loads(out)["plugins"]
    assert [r["name"] for r in rows] == ["max_steps"]
    assert rows[0]["source"] == "builtin" and "before_model" in rows[0]["hooks"]


def test_bad_config_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[plugins.max_steps]\nmax_steps = "ten"\n', encoding="utf-8")
    code, _, err = run_cli(capsys, "run", "--scenario", "refund", "--config", str(cfg))
    assert code == 2
    assert "plugins.max_steps.max_steps" in err and str(cfg) in err
    assert "Traceback" not in err
    code, _, err = run_cli(capsys, "config", "check", str(cfg))
    assert code == 2 and "plugins.max_steps.max_steps" in err


def test_bad_scenario_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sc = tmp_path / "s.toml"
    sc.write_text('name = "x"\nuser = "q"\n[model]\nthen = "forever"\n', encoding="utf-8")
    code, _, err = run_cli(capsys, "run", "--scenario", str(sc))
    assert code == 2 and "model.then" in err
    code, _, err = run_cli(capsys, "run", "--scenario", str(tmp_path / "missing.toml"))
    assert code == 2 and "file not found" in err


def test_live_question_without_a_key_explains_and_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(Path(__file__).parent)  # no config.toml here: the shipped default
    code, out, err = run_cli(capsys, "run", "where is my order?")
    assert code == 2 and out == ""
    assert "OPENAI_API_KEY" in err and "--scenario" in err
    assert "Traceback" not in err


def test_config_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "config", "check")
    assert code == 0 and "OK" in out


def test_console_script_runs_in_a_subprocess(tmp_path: Path) -> None:
    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden", "run", "--scenario", "refund", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["termination"] == "final_answer"
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden", "frobnicate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown command" in proc.stderr


def test_guard_logs_reach_stderr_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "--scenario", "always-not-found")
    assert code == 0 and "guard_triggered" not in err
    code, _, err = run_cli(
        capsys, "run", "--scenario", "always-not-found", "--log-level", "warning"
    )
    assert code == 0
    assert "event=guard_triggered" in err and "plugin=repeat_call" in err
    assert err.count("event=run_stopped") == 1  # one handler, however often main() runs


def test_scenarios_lists_every_built_in_scenario_with_its_expectation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from loopwarden.models.scenario import builtin_scenarios

    code, out, _ = run_cli(capsys, "scenarios")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == len(builtin_scenarios()) >= 11
    refund = next(line for line in lines if line.startswith("refund "))
    assert "final_answer" in refund
    code, out, _ = run_cli(capsys, "scenarios", "--paths")
    assert all(line.endswith(".toml") for line in out.strip().splitlines())
