"""A measurement no plugin made is "n/a" with the reason, never a 0 (issue 34, item 4).

Real runs through the command line: ``repeat_call`` and ``cost_budget`` switched off, then
``loopwarden report`` on their records; and ``loopwarden run`` in shadow mode, whose text
output must show the stop that enforcing the guards would have made.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopwarden.commands.cli import main


def _config(tmp_path: Path, enabled: list[str], extra: str = "") -> Path:
    path = tmp_path / "config.toml"
    records = tmp_path / "runs.jsonl"
    path.write_text(
        f"{extra}[plugins]\nenabled = {json.dumps(enabled)}\n"
        f'[plugins.run_record]\npath = "{records.as_posix()}"\n',
        encoding="utf-8",
    )
    return path


def _runs(config: Path, capsys: pytest.CaptureFixture[str], *scenarios: str) -> None:
    for scenario in scenarios:
        assert main(["run", "--scenario", scenario, "--json", "--config", str(config)]) in (0, 1)
    capsys.readouterr()


def test_report_says_n_a_when_repeat_call_and_cost_budget_were_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, ["max_steps", "run_record"])
    _runs(config, capsys, "always-not-found", "refund")
    records = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert records[0]["tool_calls"] > 2  # the lookup repeated, and nobody counted
    assert {"duplicate_calls", "cost"} <= set(records[0]["unmeasured"])

    assert main(["report", str(tmp_path / "runs.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "duplicate calls: n/a (repeat_call was off in all 2 runs)" in text
    assert "cost    n/a: cost_budget was off in 2 runs" in text
    assert "duplicate calls: 0" not in text

    assert main(["report", str(tmp_path / "runs.jsonl"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["duplicate_calls"] is None and data["duplicate_call_rate"] is None
    assert data["unmeasured"]["duplicate_calls"] == {"runs": 2, "plugin": "repeat_call"}
    assert data["cost"]["p50"] is None


def test_report_counts_duplicates_where_they_were_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, ["max_steps", "repeat_call", "cost_budget", "run_record"])
    _runs(config, capsys, "always-not-found")
    off = _config(tmp_path, ["max_steps", "run_record"])
    _runs(off, capsys, "always-not-found")
    assert main(["report", str(tmp_path / "runs.jsonl"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["duplicate_calls"] >= 1 and data["runs_with_duplicates"] == 1
    assert data["runs_with_duplicates_share"] == 1.0  # of the one run that measured
    assert data["unmeasured"]["duplicate_calls"]["runs"] == 1
    assert main(["report", str(tmp_path / "runs.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "(repeat_call was off in 1 of 2 runs: not counted)" in text
    assert "cost measured in 1 of 2 runs (cost_budget was off in 1" in text


def test_run_text_says_cost_n_a_when_cost_budget_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, ["max_steps"])
    assert main(["run", "--scenario", "refund", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "cost: n/a (cost_budget is off)" in out and "cost: 0.0" not in out


def test_run_text_shows_the_stop_shadow_mode_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, ["max_steps", "repeat_call"], extra='[run]\nmode = "shadow"\n')
    main(["run", "--scenario", "always-not-found", "--config", str(config)])
    out = capsys.readouterr().out
    assert "termination: max_steps" in out or "termination: final_answer" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("shadow: repeat_call")]
    assert "would have stopped the run at step" in line and "(repeat_call," in line
