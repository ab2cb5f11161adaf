"""The run_record plugin: whole-line JSONL appends of the run record (docs/contracts.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.contract import RECORD_FIELDS
from support.observability import ALWAYS_NOT_FOUND, SECRET_TOOL, repeat_guard

from loopwarden import Deployment, FakeClock
from loopwarden.config import Config
from loopwarden.plugins.run_record import JsonlAppender, RunRecord
from loopwarden.report import read_records


def _deployment(
    make_config: Callable[..., Config], factory: Callable[..., Deployment], **settings: Any
) -> Deployment:
    names, objects = repeat_guard()
    cfg = make_config(
        plugins={"enabled": ["max_steps", *names, "run_record"], "run_record": settings}
    )
    return factory(cfg, plugins=objects, clock=FakeClock())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


#: the wall-clock fields the plugin adds to what ``Run.record()`` says
WALL_TIMES = ("started_at", "ended_at")


def _untimed(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in WALL_TIMES}


def test_each_run_appends_its_record(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    path = tmp_path / "records" / "runs.jsonl"  # the directory is created
    dep = _deployment(make_config, deployment_factory, path=str(path))
    runs = [dep.run(scenario="refund"), dep.run(scenario=ALWAYS_NOT_FOUND)]
    lines = _lines(path)
    assert [_untimed(line) for line in lines] == [r.record() for r in runs]
    for line in lines:
        assert set(line) >= RECORD_FIELDS
        assert "trajectory" not in line and "steps_detail" not in line
    assert lines[1]["termination"] == "repeat_call"
    assert path.read_bytes().endswith(b"}\n")


def test_trajectory_and_steps_detail_only_add_fields(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    path = tmp_path / "runs.jsonl"
    dep = _deployment(
        make_config, deployment_factory, path=str(path), trajectory=True, steps_detail=True
    )
    run = dep.run(scenario=ALWAYS_NOT_FOUND)
    (line,) = _lines(path)
    record = run.record()
    assert {k: line[k] for k in record} == record  # the contract's fields intact
    assert set(line) - set(record) == {"trajectory", "steps_detail", *WALL_TIMES}
    assert line["trajectory"] == run.trajectory()
    detail = line["steps_detail"]
    assert [d["step"] for d in detail] == list(range(1, record["steps"] + 1))
    assert sum(d["total"] for d in detail) == record["tokens"]["total"]
    assert sum(d["prompt"] for d in detail) == record["tokens"]["prompt"]
    assert all(d["prompt"] + d["completion"] == d["total"] for d in detail)
    # prompts grow with the conversation
    assert [d["prompt"] for d in detail] == sorted(d["prompt"] for d in detail)
    assert line["verdicts"] == run.verdicts
    assert any(v["kind"] == "stop" and v["plugin"] == "repeat_call" for v in line["verdicts"])


def test_secrets_are_masked_in_trajectory_and_evidence(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    path = tmp_path / "runs.jsonl"
    dep = _deployment(make_config, deployment_factory, path=str(path), trajectory=True)
    dep.run(scenario=SECRET_TOOL)
    text = path.read_text(encoding="utf-8")
    for secret in ("sk-live-ABCDEF1234567890", "tok_abcdefgh12345", "hunter2-secret"):
        assert secret not in text
    (line,) = _lines(path)
    args = json.loads(line["trajectory"][0]["tool_calls"][0]["arguments"])
    assert args["customer"] == "C-42" and args["api_key"] == "[REDACTED]"
    assert args["items"] == [{"name": "primary", "password": "[REDACTED]"}]


def test_a_truncated_last_line_is_left_behind_on_its_own_line(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "runs.jsonl"
    good = {"run_id": "old", "termination": "final_answer", "steps": 1}
    # What a crash in the middle of a write leaves behind: a partial last line.
    path.write_text(
        json.dumps(good) + "\n" + '{"run_id": "cut", "termination": "max_st', encoding="utf-8"
    )
    dep = _deployment(make_config, deployment_factory, path=str(path))
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.run_record"):
        run = dep.run(scenario="refund")
    assert any("truncated" in r.getMessage() for r in caplog.records)
    raw = path.read_text(encoding="utf-8").splitlines()
    assert len(raw) == 3
    assert json.loads(raw[0]) == good
    assert raw[1] == '{"run_id": "cut", "termination": "max_st'
    assert _untimed(json.loads(raw[2])) == run.record()
    loaded = read_records(raw)
    assert [r["run_id"] for r in loaded.records] == ["old", run.run_id]
    assert loaded.skipped == 1 and loaded.skipped_lines == [2]


def test_concurrent_appends_are_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    appender = JsonlAppender(path)
    big = "数据" * 5000  # lines far larger than a pipe buffer
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(25):
            assert appender.append(
                {"run_id": f"{n}-{i}", "termination": "final_answer", "pad": big}
            )

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    appender.close()
    loaded = read_records(path.read_text(encoding="utf-8").splitlines())
    assert loaded.skipped == 0
    assert sorted(r["run_id"] for r in loaded.records) == sorted(
        f"{n}-{i}" for n in range(8) for i in range(25)
    )
    assert appender.written == 200


def test_concurrent_async_runs(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    path = tmp_path / "runs.jsonl"
    dep = _deployment(make_config, deployment_factory, path=str(path), steps_detail=True)

    async def main() -> list[Any]:
        return await asyncio.gather(*(dep.arun(scenario=ALWAYS_NOT_FOUND) for _ in range(6)))

    runs = asyncio.run(main())
    lines = {line["run_id"]: line for line in _lines(path)}
    assert set(lines) == {r.run_id for r in runs}
    for r in runs:  # each run's per-step state stayed its own
        assert len(lines[r.run_id]["steps_detail"]) == r.step


def test_an_unwritable_path_never_breaks_a_run(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "a-directory"
    path.mkdir()
    dep = _deployment(make_config, deployment_factory, path=str(path))
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.run_record"):
        a = dep.run(scenario="refund")
        b = dep.run(scenario="refund")
    assert a.record()["termination"] == b.record()["termination"] == "final_answer"
    # the failure is reported in the record the caller gets (issue 14, item 8)
    errors = a.record()["errors"]
    assert [(e["plugin"], e["hook"]) for e in errors] == [("run_record", "run_stopped")]
    assert str(path) in errors[0]["error"] and "directory" in errors[0]["error"]
    plugin: RunRecord = dep.plugins.get("run_record")
    assert plugin.appender.failed == 2
    assert len([r for r in caplog.records if "cannot append" in r.getMessage()]) == 1


def test_default_path_is_in_the_data_directory(
    _isolated_data_dir: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    dep = _deployment(make_config, deployment_factory)
    run = dep.run(scenario="refund")
    path = _isolated_data_dir / "runs.jsonl"
    assert [_untimed(line) for line in _lines(path)] == [run.record()]


def test_shipped_config_lists_but_does_not_enable_run_record(shipped_config: Config) -> None:
    assert "run_record" not in shipped_config.plugins.enabled
    assert "run_record" in shipped_config.plugins.tables()
    enabled = shipped_config.plugins.enabled
    observers = [n for n in enabled if n in ("logging", "metrics", "alerting")]
    assert observers == ["logging", "metrics", "alerting"]


def test_records_carry_wall_clock_times_even_on_a_fake_clock(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    path = tmp_path / "runs.jsonl"
    dep = _deployment(make_config, deployment_factory, path=str(path))  # a FakeClock at 0
    before = time.time()
    runs = [dep.run(scenario="refund"), dep.run(scenario=ALWAYS_NOT_FOUND)]
    after = time.time()
    lines = _lines(path)
    assert len(lines) == len(runs) == 2
    for line in lines:
        assert isinstance(line["started_at"], float) and isinstance(line["ended_at"], float)
        # rounded to microseconds when written
        assert before - 1e-6 <= line["started_at"] <= line["ended_at"] <= after + 1e-6
    assert lines[0]["ended_at"] <= lines[1]["started_at"] + 1e-6  # one after the other
    assert all(r.started_at == 0.0 for r in runs)  # the run's own clock stayed fake
