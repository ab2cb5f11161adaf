"""Run records under a hostile world: crashed writers, exhausted descriptors, odd paths.

* every append starts on a fresh line, checked under the lock every time: a fragment that a
  killed writer left is counted as corrupt and costs no other record (item 5);
* no descriptor is held between appends, and a record that cannot be written is reported --
  log, metric, ``errors`` in the record (item 8).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment, FakeClock
from loopwarden.config import Config
from loopwarden.models.scripted import ScriptedModel
from loopwarden.report import load_records
from loopwarden.testing import script, turn
from loopwarden.tools import ToolRegistry

FRAGMENT = '{"run_id": "killed", "termination": "max_st'


def _dep(
    make_config: Callable[..., Config], factory: Callable[..., Deployment], path: Path, *extra: str
) -> Deployment:
    cfg = make_config(
        plugins={"enabled": ["max_steps", *extra, "run_record"], "run_record": {"path": str(path)}}
    )
    return factory(cfg, clock=FakeClock())


def _quick_run(dep: Deployment) -> dict[str, Any]:
    run = dep.run(
        "hi", model=ScriptedModel(script([turn("hello")], then="final")), tools=ToolRegistry()
    )
    record = run.record()
    assert record["termination"] == "final_answer", record["evidence"]
    return record


def test_a_fragment_left_after_the_file_was_opened_is_fenced_off(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    """The old appender checked the last line only when it opened the file: a process that
    already had it open wrote its record right after another writer's fragment."""
    path = tmp_path / "runs.jsonl"
    dep = _dep(make_config, deployment_factory, path)
    first = _quick_run(dep)
    with path.open("a", encoding="utf-8") as fh:  # a writer killed mid-line
        fh.write(FRAGMENT)
    second = _quick_run(dep)
    third = _quick_run(dep)
    loaded = load_records(path)
    assert [r["run_id"] for r in loaded.records] == [
        first["run_id"],
        second["run_id"],
        third["run_id"],
    ]
    assert (loaded.skipped, loaded.skipped_lines) == (1, [2])


_KILLED_WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from loopwarden.plugins import run_record

    def half_then_hang(fd, data):  # write half of the line, then hang (holding the flock)
        os.write(fd, data[: len(data) // 2])
        print("ready", flush=True)
        time.sleep(60)

    run_record._write_all = half_then_hang
    run_record.JsonlAppender(Path(sys.argv[1])).append(
        {"run_id": "killed", "termination": "final_answer", "pad": "x" * 100000})
""")


def test_a_writer_killed_mid_append_costs_no_other_record(
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    path = tmp_path / "runs.jsonl"
    dep = _dep(make_config, deployment_factory, path)
    first = _quick_run(dep)  # this process has written (and, before the fix, kept it open)
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    second = _quick_run(dep)
    loaded = load_records(path)
    assert [r["run_id"] for r in loaded.records] == [first["run_id"], second["run_id"]]
    assert (loaded.skipped, loaded.skipped_lines) == (1, [2])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_descriptor_is_held_between_appends(
    tmp_path: Path,
    make_config: Callable[..., Config],
) -> None:
    path = tmp_path / "runs.jsonl"
    cfg = make_config(
        plugins={"enabled": ["max_steps", "run_record"], "run_record": {"path": str(path)}}
    )
    deps = [Deployment(cfg, clock=FakeClock()) for _ in range(3)]
    for dep in deps:  # warm up whatever the first runs load
        _quick_run(dep)
    before = _open_fds()
    deps += [Deployment(cfg, clock=FakeClock()) for _ in range(40)]  # never closed
    for dep in deps:
        _quick_run(dep)
    assert _open_fds() - before <= 2  # 2,000 unclosed deployments once held 2,006
    assert len(load_records(path).records) == 3 + 43


_LOW_ULIMIT = textwrap.dedent("""
    import json, logging, os, resource, sys
    from loopwarden import Deployment
    from loopwarden.config import parse_config
    from loopwarden.models.scripted import ScriptedModel
    from loopwarden.testing import script, turn
    from loopwarden.tools import ToolRegistry

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    cfg = parse_config({"plugins": {"enabled": ["max_steps", "metrics", "run_record"],
                                    "run_record": {"path": sys.argv[1]}}})
    dep = Deployment(cfg)

    def run():
        return dep.run("hi", model=ScriptedModel(script([turn("hello")], then="final")),
                       tools=ToolRegistry()).record()

    ok = run()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    hog = []
    try:
        while True:
            hog.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    starved = run()
    for fd in hog:
        os.close(fd)
    again = run()
    metrics = dep.plugins.get("metrics")
    print(json.dumps({"ok": ok["errors"], "starved": starved["errors"],
                      "again": again["errors"],
                      "failures": metrics.value("record_write_failures_total"),
                      "ids": [ok["run_id"], starved["run_id"], again["run_id"]]}))
""")


def test_out_of_descriptors_the_lost_record_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _LOW_ULIMIT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["ok"] == [] and out["again"] == []
    (error,) = out["starved"]
    assert error["plugin"] == "run_record" and "Too many open files" in error["error"]
    assert out["failures"] == 1
    assert "cannot append" in proc.stderr  # the log line
    ok_id, _starved, again_id = out["ids"]
    assert [r["run_id"] for r in load_records(path).records] == [ok_id, again_id]


@pytest.mark.parametrize("kind", ["/dev/full", "fifo", "under a file"])
def test_unwritable_paths_are_reported_and_never_hang(
    kind: str,
    tmp_path: Path,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    caplog: pytest.LogCaptureFixture,
) -> None:
    if kind == "/dev/full":
        path = Path("/dev/full")
    elif kind == "fifo":
        path = tmp_path / "runs.fifo"
        os.mkfifo(path)
    else:
        (tmp_path / "plain").write_text("x", encoding="utf-8")
        path = tmp_path / "plain" / "runs.jsonl"
    dep = _dep(make_config, deployment_factory, path, "metrics")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.run_record"):
        record = _quick_run(dep)
    assert time.monotonic() - started < 30  # a FIFO without a reader used to block forever
    assert record["termination"] == "final_answer"
    assert [e["plugin"] for e in record["errors"]] == ["run_record"]
    assert str(path) in record["errors"][0]["error"]
    assert dep.plugins.get("metrics").value("record_write_failures_total") == 1
    assert any("cannot append" in r.getMessage() for r in caplog.records)


def test_receivers_of_dead_deployments_are_disconnected(
    tmp_path: Path,
    make_config: Callable[..., Config],
) -> None:
    """A fan-out receiver used to disconnect itself only when its signal was next sent: a
    rarely sent signal kept one receiver per dead deployment connected for ever."""
    import gc

    from loopwarden import signals

    cfg = make_config(
        plugins={
            "enabled": ["max_steps", "metrics", "run_record"],
            "run_record": {"path": str(tmp_path / "runs.jsonl")},
        }
    )
    before = {s.name: len(s.receivers) for s in signals.ALL}
    for _ in range(20):
        _quick_run(Deployment(cfg, clock=FakeClock()))  # never closed
    gc.collect()
    assert {s.name: len(s.receivers) - before[s.name] for s in signals.ALL} == {
        s.name: 0 for s in signals.ALL
    }
