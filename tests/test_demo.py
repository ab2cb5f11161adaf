"""``loopwarden demo``: guarded vs unguarded, a fresh shop per run, the table, the exit code.

The scenarios are written here (a runaway and a healthy one), so the tests stay fast and do
not change when more built-in scenarios land.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loopwarden.commands.cli import main
from loopwarden.config import Config, parse_config
from loopwarden.demo import (
    UNGUARDED_CAP,
    Totals,
    find_scenarios,
    judge,
    play_all,
    unguarded_config,
    unguarded_deployment,
    without_observers,
)
from loopwarden.demo.shop import Shop
from loopwarden.models.scenario import builtin_scenarios, load_scenario

RUNAWAY = """
name = "loop-lookup"
user = "查询订单 99999 的状态"
[model]
turns = [
  { content = "我查一下", tool_calls = [
      { name = "query_order", arguments = { order_id = "99999" } },
  ] },
]
then = "repeat_last"
final_text = "没有查到订单 99999。"
[expect]
healthy = false
kind = "repeat"
onset = 2
"""

HEALTHY = """
name = "one-refund"
user = "订单 88231 不想要了，帮我退款"
[model]
turns = [
  { content = "查订单", tool_calls = [
      { name = "query_order", arguments = { order_id = "88231" } },
  ] },
  { content = "退款", tool_calls = [
      { name = "apply_refund", arguments = { order_id = "88231", reason = "不想要了" } },
  ] },
  { content = "已为您退款 1999 元。" },
]
final_text = "已退款。"
[expect]
healthy = true
"""

SIX_TURNS = """
name = "six-turns"
user = "look up six things"
[model]
turns = [
  { tool_calls = [{ name = "query_order", arguments = { order_id = "88231" } }] },
  { tool_calls = [{ name = "query_order", arguments = { order_id = "88232" } }] },
  { tool_calls = [{ name = "query_order", arguments = { order_id = "88233" } }] },
  { tool_calls = [{ name = "query_order", arguments = { order_id = "88234" } }] },
  { tool_calls = [{ name = "query_logistics", arguments = { tracking_no = "SF1234567890" } }] },
  { content = "All four orders checked." },
]
[expect]
healthy = true
"""


@pytest.fixture
def scenario_dir(tmp_path: Path) -> Path:
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "loop-lookup.toml").write_text(RUNAWAY, encoding="utf-8")
    (d / "one-refund.toml").write_text(HEALTHY, encoding="utf-8")
    return d


def run_demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["demo", "-q", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_unguarded_is_the_step_cap_alone_without_warnings_or_profile_limits(
    shipped_config: Config,
) -> None:
    u = unguarded_config(shipped_config)
    assert u.plugins.enabled == ["max_steps"]
    assert u.plugins.tables() == {"max_steps": {"max_steps": UNGUARDED_CAP, "warn_remaining": 0}}
    assert set(u.profiles) == set(shipped_config.profiles)
    assert all(
        p.max_steps is None and p.max_tokens is None and p.max_seconds is None
        for p in u.profiles.values()
    )


def test_the_unguarded_baseline_ignores_plugins_added_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    shipped_config: Config,
) -> None:
    monkeypatch.setenv("LOOPWARDEN_PLUGINS", "does.not.exist:Plugin")
    with unguarded_deployment(shipped_config) as dep:
        assert [lp.name for lp in dep.plugins] == ["max_steps"]
    import os

    assert os.environ["LOOPWARDEN_PLUGINS"] == "does.not.exist:Plugin"


def test_offline_runs_leave_pure_observers_out(shipped_config: Config) -> None:
    from loopwarden.engine.pluginmanager import load_plugins

    config, names = without_observers(shipped_config)
    assert names and {"logging", "alerting"} <= set(names)
    loaded = load_plugins(config)
    assert all(lp.hooks for lp in loaded)  # every plugin left decides something
    assert "repeat_call" in [lp.name for lp in loaded]
    assert without_observers(config) == (config, [])


def test_demo_json_plays_each_scenario_guarded_and_unguarded(
    capsys: pytest.CaptureFixture[str],
    scenario_dir: Path,
    _isolated_data_dir: Path,
) -> None:
    code, out, _ = run_demo(capsys, "--json", "--scenarios", str(scenario_dir))
    assert code == 0
    lines = [json.loads(x) for x in out.splitlines()]
    records, totals = lines[:-1], lines[-1]
    assert [(r["scenario"], r["guarded"]) for r in records] == [
        ("loop-lookup", True),
        ("loop-lookup", False),
        ("one-refund", True),
        ("one-refund", False),
    ]
    loop_g, loop_u, ok_g, ok_u = records
    # the runaway: stopped by a guard early with guards, run to the cap without
    assert loop_g["stopped_by"] is not None and loop_g["termination"] != "final_answer"
    assert loop_g["steps"] < 10 and loop_g["ok"] is True
    assert loop_u["termination"] == "max_steps" and loop_u["steps"] == UNGUARDED_CAP
    assert loop_u["stopped_by"] == "max_steps" and loop_u["warnings"] == []
    assert loop_u["tokens"]["total"] > 10 * loop_g["tokens"]["total"]
    # the healthy run: the same on both sides, with one real refund row each
    for rec in (ok_g, ok_u):
        assert rec["termination"] == "final_answer" and rec["steps"] == 3
        assert rec["refund_rows"] == 1
    assert totals["failed"] == []
    t = totals["totals"]
    assert t["guarded"]["tokens"] == loop_g["tokens"]["total"] + ok_g["tokens"]["total"]
    assert t["token_ratio"] > 1
    # the demo never touched the user's own shop database
    assert not (_isolated_data_dir / "shop.sqlite3").exists()


def test_demo_can_keep_the_shop_databases_with_their_refund_rows(
    capsys: pytest.CaptureFixture[str],
    scenario_dir: Path,
    tmp_path: Path,
) -> None:
    keep = tmp_path / "dbs"
    code, _, _ = run_demo(
        capsys, "--scenarios", str(scenario_dir), "--only", "one-*", "--db-dir", str(keep)
    )
    assert code == 0
    dbs = sorted(keep.glob("*.sqlite3"))
    assert [p.name for p in dbs] == [
        "000-one-refund-guarded.sqlite3",
        "000-one-refund-unguarded.sqlite3",
    ]
    for db in dbs:
        assert Shop(db).refunds() == [("RF88231001", "88231", "不想要了")]


def test_demo_table_in_plain_text(capsys: pytest.CaptureFixture[str], scenario_dir: Path) -> None:
    code, out, err = run_demo(capsys, "--scenarios", str(scenario_dir))
    assert code == 0 and err == ""
    lines = out.splitlines()
    head = next(line for line in lines if line.startswith("scenario"))
    for col in (
        "provokes",
        "run",
        "termination",
        "turns",
        "calls",
        "tokens",
        "cost",
        "answer",
        "result",
    ):
        assert col in head
    i = next(k for k, line in enumerate(lines) if line.startswith("loop-lookup"))
    guarded, unguarded = lines[i], lines[i + 1]  # two lines per scenario
    assert "runaway" in guarded and " guarded " in guarded and "ok: stopped" in guarded
    assert " unguarded " in unguarded and "max_steps" in unguarded
    assert f" {UNGUARDED_CAP} " in unguarded
    assert any(line.startswith("total") for line in lines)
    assert any(line.startswith("tokens:") and "saving" in line for line in lines)
    assert "runaway scenarios stopped by a guard: 1/1" in out
    assert "healthy scenarios finished as expected: 1/1" in out
    assert "observers left out: " in out and "logging" in out


def _legend(out: str) -> str:
    return out[out.index("What the columns show:") : out.index("\ntokens:")]


def test_a_legend_under_the_table_says_what_each_column_shows(
    capsys: pytest.CaptureFixture[str], scenario_dir: Path
) -> None:
    code, out, _ = run_demo(capsys, "--scenarios", str(scenario_dir))
    assert code == 0
    legend = _legend(out)
    assert all(len(line) <= 100 for line in legend.splitlines())
    keys = ("provokes", "run", "termination", "turns, calls", "tokens, cost", "answer", "result")
    for key in keys:  # one entry per column of the table
        assert f"\n  {key} " in legend
    flat = " ".join(legend.split())
    assert f"only a cap of {UNGUARDED_CAP} model calls" in flat
    assert "judged on the guarded run only" in flat
    assert "ok: stopped = a guard stopped the runaway" in flat
    # loop-lookup runs to the cap unguarded: the legend says why its row still has an answer
    assert "loop-lookup: runaways the cap cut" in flat


def test_the_legend_explains_runaways_that_finish_and_healthy_runs_that_run_away(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_demo(capsys, "--only", "all-tools-fail", "--only", "repeat-then-recover")
    assert code == 0
    legend = " ".join(_legend(out).split())
    assert "all-tools-fail: runaways that end with an answer unguarded" in legend
    assert "the model gave up by itself" in legend
    assert "repeat-then-recover: healthy, yet it runs away unguarded" in legend
    assert "runaways the cap cut" not in legend  # only the notes that apply


def test_the_rich_table_has_the_legend_too(scenario_dir: Path, shipped_config: Config) -> None:
    pytest.importorskip("rich")
    import io

    from loopwarden.commands.demo import render_rich

    pairs = play_all(shipped_config, find_scenarios([scenario_dir]))
    buf = io.StringIO()
    render_rich(pairs, Totals.of(pairs), None, UNGUARDED_CAP, buf)
    text = " ".join(buf.getvalue().split())
    assert "provokes" in text and "What the columns show:" in text
    assert "loop-lookup: runaways the cap cut" in text


def test_progress_goes_to_stderr_when_not_quiet(
    capsys: pytest.CaptureFixture[str], scenario_dir: Path
) -> None:
    code = main(["demo", "--json", "--scenarios", str(scenario_dir), "--only", "loop-*"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "[1/2] loop-lookup (guarded)" in err and "[2/2] loop-lookup (unguarded)" in err
    assert all(json.loads(x) for x in out.splitlines())


def test_a_healthy_scenario_stopped_by_a_guard_fails_the_demo(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    (tmp_path / "six-turns.toml").write_text(SIX_TURNS, encoding="utf-8")
    conf = tmp_path / "c.toml"
    conf.write_text("[plugins.max_steps]\nmax_steps = 3\n", encoding="utf-8")
    code, out, err = run_demo(
        capsys, "--scenarios", str(tmp_path / "six-turns.toml"), "--config", str(conf)
    )
    assert code == 1
    assert "FAILED" in out
    assert "six-turns: healthy run ended with max_steps (expected final_answer)" in err
    assert "1 of 1 scenario(s) did not end as expected" in err


def test_no_matching_scenario_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_demo(capsys, "--only", "no-such-scenario")
    assert code == 2 and "no scenario matched" in err


def test_judge_reads_the_expect_table(scenario_dir: Path) -> None:
    runaway = load_scenario(scenario_dir / "loop-lookup.toml")
    healthy = load_scenario(scenario_dir / "one-refund.toml")
    stopped = {"termination": "repeat_call", "stopped_by": "repeat_call"}
    finished = {"termination": "final_answer", "stopped_by": None}
    assert judge(runaway, stopped) == (True, "stopped")
    assert judge(runaway, finished)[0] is False
    assert judge(healthy, finished) == (True, "finished")
    assert judge(healthy, {"termination": "max_steps", "stopped_by": "max_steps"})[0] is False
    strict = runaway.model_copy(
        update={"expect": runaway.expect.model_copy(update={"termination": "stall"})}
    )
    assert judge(strict, stopped) == (False, "stopped by repeat_call (expected stall)")
    unlabelled = runaway.model_copy(
        update={"expect": runaway.expect.model_copy(update={"healthy": None})}
    )
    assert judge(unlabelled, stopped)[0] is None


def test_stop_step_and_totals(scenario_dir: Path) -> None:
    config = parse_config(
        {"plugins": {"max_steps": {"max_steps": 4, "warn_remaining": 0}}}, path="<test>"
    )
    pairs = play_all(config, find_scenarios([scenario_dir]))
    loop = pairs[0]
    # max_steps refuses call 4 as a tool call: it becomes the wrap-up turn
    assert loop.guarded["termination"] == "max_steps"
    assert (loop.guarded["stop_step"], loop.guarded["stop_hook"]) == (4, "before_model")
    assert loop.guarded["steps"] == 4
    t = Totals.of(pairs)
    assert t.steps == [4 + 3, UNGUARDED_CAP + 3]
    assert t.token_ratio is not None and t.token_ratio > 5
    assert t.refund_rows == [1, 1]


def test_find_scenarios_defaults_to_the_built_in_ones_and_filters_by_name() -> None:
    assert find_scenarios() == builtin_scenarios()
    assert [p.stem for p in find_scenarios(only=["refund"])] == ["refund"]
    from loopwarden.exceptions import ScenarioError

    with pytest.raises(ScenarioError):
        find_scenarios(["/no/such/dir"])


def test_every_built_in_scenario_is_labelled() -> None:
    """The demo judges built-in scenarios by their [expect] table: each must have one."""
    for path in builtin_scenarios():
        sc = load_scenario(path)
        assert sc.expect.healthy is not None, path.name


def test_the_docs_show_the_demos_table_and_legend_as_the_code_prints_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "real-traffic.md").read_text(
        encoding="utf-8"
    )
    (block,) = re.findall(r"```console\n\$ loopwarden (demo [^\n]*)\n(.*?)```", doc, re.S)
    command, shown = block[0].split(), block[1].splitlines()
    code = main([*command, "--quiet"])
    out = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    head = shown[: shown.index("...")]  # the doc elides the totals in words
    assert out[: len(head)] == head
    assert "What the columns show:" in head
