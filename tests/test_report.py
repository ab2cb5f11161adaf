"""`loopwarden report`: numbers checked against small known record files, and advice."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.observability import ALWAYS_NOT_FOUND, WANDERING, repeat_guard

from loopwarden import Deployment, FakeClock
from loopwarden.commands.cli import main as cli
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.models.scenario import builtin_scenarios
from loopwarden.report import analyse, format_text, load_records, percentile, read_records


def rec(
    termination: str,
    steps: int,
    tokens: int,
    cost: float,
    tool_calls: int,
    duplicates: int = 0,
    stall_rounds: int = 0,
    stopped_by: str | None = None,
    evidence: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "run_id": f"r{steps}-{tokens}",
        "scenario": None,
        "termination": termination,
        "soft": False,
        "steps": steps,
        "tool_calls": tool_calls,
        "tokens": {"prompt": tokens - 100, "completion": 100, "total": tokens},
        "cost": cost,
        "duplicate_calls": duplicates,
        "oscillation_hits": 0,
        "stall_rounds": stall_rounds,
        "warnings": [],
        "stopped_by": stopped_by,
        "evidence": evidence or {},
        "final_answer": "x",
        "final_answer_present": True,
        "elapsed_s": 0.1,
        **extra,
    }


def _search(q: str) -> dict[str, Any]:
    return {"name": "search_knowledge", "arguments": json.dumps({"query": q})}


LOOPY = [
    rec("final_answer", 4, 3000, 0.010, 4),
    rec("final_answer", 2, 1000, 0.004, 2),
    rec(
        "repeat_call",
        3,
        2500,
        0.008,
        3,
        2,
        stopped_by="repeat_call",
        evidence={
            "fingerprint": "query_order:aaa",
            "tool": "query_order",
            "count": 3,
            "repeats": 2,
            "signature": 'query_order({"order_id": "1"})',
        },
    ),
    rec(
        "repeat_call",
        5,
        6000,
        0.020,
        5,
        3,
        stopped_by="repeat_call",
        evidence={"fingerprint": "query_order:aaa", "tool": "query_order", "count": 4},
    ),
    rec(
        "repeat_call",
        4,
        4000,
        0.012,
        4,
        2,
        stopped_by="repeat_call",
        evidence={"fingerprint": "query_logistics:bbb", "tool": "query_logistics", "count": 3},
    ),
    rec("max_steps", 10, 20000, 0.050, 9, stopped_by="max_steps", evidence={"limit": 10}),
    rec("stall", 6, 8000, 0.030, 6, 0, 3, stopped_by="stall", evidence={"rounds": 3}),
    # no signature in the evidence: read from the trajectory (search repeated 3 times)
    rec(
        "max_steps",
        10,
        18000,
        0.045,
        10,
        4,
        stopped_by="max_steps",
        evidence={"limit": 10},
        trajectory=[
            {"content": None, "tool_calls": [_search("退货")], "observations": []},
            {"content": None, "tool_calls": [_search("退货"), _search("换货")], "observations": []},
            {"content": None, "tool_calls": [_search("退货")], "observations": []},
        ],
    ),
    rec("final_answer", 3, 2000, 0.006, 2),
    rec(
        "oscillation",
        8,
        12000,
        0.040,
        8,
        stopped_by="oscillation",
        evidence={
            "period": 2,
            "count": 2,
            "signatures": ["query_order:aaa", "query_logistics:bbb"],
            "calls": "query_order(...) -> query_logistics(...)",
        },
    ),
]


def _write(path: Path, records: list[dict[str, Any]], *, corrupt: bool = True) -> Path:
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    if corrupt:
        lines.insert(3, "this is not json")
        lines.insert(5, "")
        lines.append('{"run_id": "cut", "termination": "fin')  # a truncated last line
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None


def test_numbers_of_a_small_known_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "runs.jsonl", LOOPY)
    loaded = read_records(path.read_text(encoding="utf-8").splitlines())
    assert loaded.skipped == 2 and loaded.skipped_lines == [4, 13]
    r = analyse(loaded.records, skipped=loaded.skipped)
    assert r["runs"] == 10 and r["skipped_lines"] == 2
    assert r["termination"] == [
        {"termination": "final_answer", "runs": 3, "share": 0.3},
        {"termination": "repeat_call", "runs": 3, "share": 0.3},
        {"termination": "max_steps", "runs": 2, "share": 0.2},
        {"termination": "oscillation", "runs": 1, "share": 0.1},
        {"termination": "stall", "runs": 1, "share": 0.1},
    ]
    assert r["stopped_by"] == {"repeat_call": 3, "max_steps": 2, "oscillation": 1, "stall": 1}
    assert r["steps"] == {
        "p50": 4.5,
        "p90": 10.0,
        "p95": 10.0,
        "p99": 10.0,
        "max": 10.0,
        "mean": 5.5,
    }
    assert r["tokens"] == pytest.approx(
        {
            "p50": 5000.0,
            "p90": 18200.0,
            "p95": 19100.0,
            "p99": 19820.0,
            "max": 20000.0,
            "mean": 7650.0,
        }
    )
    assert r["cost"]["mean"] == pytest.approx(0.0225)
    assert r["cost"]["max"] == pytest.approx(0.05)
    assert r["tool_calls"] == 53 and r["duplicate_calls"] == 11
    assert r["duplicate_call_rate"] == pytest.approx(11 / 53)
    assert r["runs_with_duplicates"] == 4 and r["runs_with_duplicates_share"] == 0.4
    assert r["stall_runs"] == 1 and r["stall_rate"] == 0.1
    assert r["loop_stops"] == 5
    # signatures keyed by fingerprint, shown by their readable signature when evidence has one;
    # an oscillation's cycle counts each of its calls `cycles` times
    assert r["top_signatures"] == [
        {
            "signature": 'query_order({"order_id": "1"})',
            "fingerprint": "query_order:aaa",
            "tool": "query_order",
            "count": 9,
            "runs": 3,
            "terminations": {"repeat_call": 2, "oscillation": 1},
        },
        {
            "signature": "query_logistics:bbb",
            "fingerprint": "query_logistics:bbb",
            "tool": "query_logistics",
            "count": 5,
            "runs": 2,
            "terminations": {"repeat_call": 1, "oscillation": 1},
        },
        {
            "signature": 'search_knowledge({"query":"退货"})',
            "fingerprint": 'search_knowledge({"query":"退货"})',
            "tool": "search_knowledge",
            "count": 3,
            "runs": 1,
            "terminations": {"max_steps": 1},
        },
    ]
    assert r["tools"] == [
        {"tool": "query_order", "calls": 9, "runs": 3},
        {"tool": "query_logistics", "calls": 5, "runs": 2},
        {"tool": "search_knowledge", "calls": 3, "runs": 1},
    ]
    (advice,) = r["advice"]
    assert advice["kind"] == "fix_prompt"
    assert advice["tools"] == ["query_order", "query_logistics", "search_knowledge"]
    assert advice["message"] == (
        "6 of 10 runs (60%) looped (4 with duplicate calls, 1 stalled, 5 stopped by a loop "
        "guard): fix the prompt or the tool descriptions -- a bigger budget would only buy "
        "more repeats. Tools most involved: query_order (9 calls in 3 runs), "
        "query_logistics (5 calls in 2 runs), search_knowledge (3 calls in 1 run)."
    )


BUDGETY = [
    *[rec("max_steps", 10, 15000 + i, 0.04, 9, stopped_by="max_steps") for i in range(6)],
    rec("max_tokens", 7, 60000, 0.1, 7, stopped_by="token_budget"),
    *[rec("final_answer", 3 + i, 2000, 0.01, 3) for i in range(3)],
]


def test_mostly_budget_stops_with_few_duplicates_advise_a_bigger_budget() -> None:
    r = analyse(BUDGETY)
    assert [a["kind"] for a in r["advice"]] == ["raise_budget"]
    assert r["advice"][0]["message"] == (
        "7 of 10 runs (70%) ended on a budget (max_steps 6, max_tokens 1) and only 0 of them "
        "repeated calls or stalled: the tasks need a bigger budget. Raise max_steps / "
        "max_tokens, or give these tasks a larger profile."
    )


def test_budget_stops_that_loop_are_not_a_budget_problem() -> None:
    looping = [
        dict(r, duplicate_calls=3) if r["termination"] == "max_steps" else r for r in BUDGETY
    ]
    kinds = [a["kind"] for a in analyse(looping)["advice"]]
    assert kinds == ["fix_prompt"]


def test_healthy_errors_and_failure_streaks() -> None:
    healthy = [rec("final_answer", 3, 2000, 0.01, 2) for _ in range(9)]
    healthy.append(rec("max_steps", 10, 9000, 0.03, 9))
    (advice,) = analyse(healthy)["advice"]
    assert advice["kind"] == "healthy"
    assert advice["message"].startswith("9 of 10 runs (90%) finished by themselves")
    failures = {
        "streak": 3,
        "failures": [
            {"tool": "query_order", "error": "503"},
            {"tool": "query_logistics", "error": "timeout"},
            {"tool": "query_order", "error": "503"},
        ],
    }
    broken = [
        *healthy[:6],
        rec("failure_streak", 4, 3000, 0.01, 4, evidence=failures),
        rec(
            "failure_streak",
            4,
            3000,
            0.01,
            4,
            evidence={"failures": [{"tool": "query_order", "error": "503"}]},
        ),
        rec("plugin_error", 1, 500, 0, 0),
        rec("model_error", 1, 0, 0, 0),
    ]
    advice = analyse(broken)["advice"]
    assert [a["kind"] for a in advice] == ["check_tools", "errors"]
    assert advice[0]["tools"] == ["query_order", "query_logistics"]
    assert advice[0]["message"].endswith(
        "Tools failing: query_order (2 runs), query_logistics (1 run)."
    )
    assert advice[1]["message"].startswith(
        "2 of 10 runs ended on errors (plugin_error 1, model_error 1)"
    )
    assert analyse([])["advice"] == []


def test_text_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "runs.jsonl", LOOPY)
    assert cli(["report", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"{path}: 10 runs (skipped 2 corrupt lines)" in out
    assert "skipped 2 corrupt lines" in err and "(line 4, 13)" in err
    table = out.split("\n\n")[1].splitlines()
    assert table == [
        "termination            runs   share",
        "final_answer              3   30.0%",
        "repeat_call               3   30.0%",
        "max_steps                 2   20.0%",
        "oscillation               1   10.0%",
        "stall                     1   10.0%",
    ]
    assert "steps          4.5      10.0      10.0      10.0      10.0       5.5" in out
    assert "tokens       5,000    18,200    19,100    19,820    20,000     7,650" in out
    assert "duplicate calls: 11 of 53 tool calls (20.8%); runs with duplicates: 4 (40.0%)" in out
    assert '      9    3  query_order        query_order({"order_id": "1"})' in out
    assert out.rstrip().splitlines()[-1].startswith("  - 6 of 10 runs (60%) looped")


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "runs.jsonl", BUDGETY, corrupt=False)
    assert cli(["report", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 10 and data["skipped_lines"] == 0 and data["file"] == str(path)
    assert data["termination"][0] == {"termination": "max_steps", "runs": 6, "share": 0.6}
    assert [a["kind"] for a in data["advice"]] == ["raise_budget"]


def test_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b'\xff\xfe garbage\n[1, 2]\n{"no": "termination"}\n')
    assert cli(["report", str(junk)]) == 1
    out, err = capsys.readouterr()
    assert "0 runs (skipped 3 corrupt lines)" in out
    assert "no valid run record" in err


def test_default_file_is_the_run_record_default(
    _isolated_data_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _write(_isolated_data_dir / "runs.jsonl", BUDGETY, corrupt=False)
    assert cli(["report"]) == 0
    assert "10 runs" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Done when: the records of all built-in scenarios
# ---------------------------------------------------------------------------------------------


def _record_all_scenarios(path: Path, factory: Callable[..., Deployment]) -> None:
    data = load_toml(default_config_path())
    enabled = data["plugins"]["enabled"]
    names, objects = repeat_guard()
    enabled.extend(n for n in [*names, "run_record"] if n not in enabled)
    data["plugins"]["run_record"] = {"path": str(path), "steps_detail": True}
    dep = factory(parse_config(data, path="<test>"), plugins=objects, clock=FakeClock())
    for scenario in builtin_scenarios():
        dep.run(scenario=str(scenario))
    for scenario in (ALWAYS_NOT_FOUND, ALWAYS_NOT_FOUND, ALWAYS_NOT_FOUND, WANDERING):
        dep.run(scenario=scenario)


def test_report_on_the_records_of_all_builtin_scenarios(
    tmp_path: Path,
    deployment_factory: Callable[..., Deployment],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "runs.jsonl"
    _record_all_scenarios(path, deployment_factory)
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(builtin_scenarios()) + 4
    assert cli(["report", str(path)]) == 0
    out = capsys.readouterr().out
    # the termination table is the file's distribution
    counts = Counter(r["termination"] for r in records)
    table = out.split("\n\n")[1].splitlines()[1:]
    assert {line.split()[0]: int(line.split()[1]) for line in table} == dict(counts)
    # ... and the advice matches the data
    advice = out.split("\nadvice\n", 1)[1]
    assert advice.strip()
    looped = [
        r
        for r in records
        if r["duplicate_calls"] > 0
        or r["stall_rounds"] > 0
        or r["termination"] in ("repeat_call", "oscillation", "no_progress", "stall")
    ]
    if len(looped) / len(records) >= 0.2:
        assert "fix the prompt or the tool descriptions" in advice
        assert "query_order" in advice  # the tool the always-not-found runs repeat
    else:
        assert "fix the prompt" not in advice


def test_plot_tokens_per_step(
    tmp_path: Path,
    deployment_factory: Callable[..., Deployment],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "runs.jsonl"
    _record_all_scenarios(path, deployment_factory)
    png = tmp_path / "tokens.png"
    assert cli(["report", str(path), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plotted tokens per step of" in capsys.readouterr().err
    # Records without per-step tokens: one point per run instead, and a note saying so.
    plain = _write(tmp_path / "plain.jsonl", LOOPY, corrupt=False)
    png2 = tmp_path / "plain.png"
    assert cli(["report", str(plain), "--plot", str(png2)]) == 0
    assert png2.read_bytes()[:4] == b"\x89PNG"
    assert "steps_detail = true" in capsys.readouterr().err


def test_plot_without_matplotlib_exits_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _write(tmp_path / "runs.jsonl", LOOPY, corrupt=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli(["report", str(path), "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install 'loopwarden[plot]'" in err
    assert not (tmp_path / "x.png").exists()


def test_format_text_of_an_empty_report() -> None:
    text = format_text(analyse([]))
    assert text.startswith("0 runs")


def test_the_report_counts_calls_answered_from_the_ledger(
    tmp_path: Path,
    deployment_factory: Callable[..., Deployment],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The refund scenario twice, in two conversations: the second refund of order 88231 is
    answered by the shared ledger (apply_refund is declared a side effect keyed on the order),
    its record says so and why, and the report counts it."""
    path = tmp_path / "runs.jsonl"
    data = load_toml(default_config_path())
    data["plugins"]["enabled"].append("run_record")
    data["plugins"]["run_record"] = {"path": str(path)}
    dep = deployment_factory(parse_config(data, path="<test>"), clock=FakeClock())
    first, second = (dep.run(scenario="refund").record() for _ in range(2))
    assert first["ledger_answers"] == [] and first["tools_executed"] == 4
    [answer] = second["ledger_answers"]
    assert (answer["tool"], answer["source"], answer["state"]) == ("apply_refund", "shared", "done")
    assert answer["idempotency_keys"] == ["order_id"] and "another run" in answer["why"]
    assert second["tools_executed"] == 3
    data = analyse(load_records(path).records)
    assert data["ledger_answers"] == [
        {"tool": "apply_refund", "source": "shared", "state": "done", "calls": 1}
    ]
    assert cli(["report", str(path)]) == 0
    assert "apply_refund 1x (shared, done)" in capsys.readouterr().out
