"""Reliability under a hostile world: event loops, secrets, odd values, exit codes, signals.

The model is the real ``openai`` client against the local stub server
(tests/support/openai_stub.py); the CLI runs as a real subprocess where signals are involved.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.openai_stub import Stub, completion

from loopwarden import (
    Deployment,
    ModelError,
    ModelRequest,
    Plugin,
    Run,
    RunOutcome,
    hookimpl,
)
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.plugins.alerting import Alerting, AlertingSettings
from loopwarden.verdicts import stop, warn

USAGE = {"prompt_tokens": 3, "completion_tokens": 2}
KEY = "sk-planted-secret-0123456789abcdef"


def live(
    url: str, monkeypatch: pytest.MonkeyPatch, plugins: dict[str, Any] | None = None, **model: Any
) -> Deployment:
    monkeypatch.setenv("STUB_KEY", KEY)
    cfg = parse_config(
        {
            "model": {
                "provider": "openai",
                "name": "stub-model",
                "base_url": url,
                "api_key_env": "STUB_KEY",
                "max_retries": 0,
                **model,
            },
            "plugins": plugins or {"enabled": []},
        },
        path="<test>",
    )
    return Deployment(cfg, tools=shop_tools())


# -- one deployment, many event loops ----------------------------------------------------


def test_one_deployment_serves_asyncio_run_job_after_job(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    for i in range(4):
        state.push(completion(f"answer {i}", usage=USAGE))
    dep = live(url, monkeypatch)
    records = [asyncio.run(dep.arun(f"job {i}")).record() for i in range(4)]
    assert [r["termination"] for r in records] == ["final_answer"] * 4
    assert [r["final_answer"] for r in records] == [f"answer {i}" for i in range(4)]


def test_one_deployment_serves_event_loops_in_several_threads_at_once(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    for _ in range(6):
        state.push(completion("ok", usage=USAGE))
    dep = live(url, monkeypatch)
    results: list[str] = []

    def worker() -> None:
        for _ in range(2):
            results.append(asyncio.run(dep.arun("q")).record()["termination"])

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == ["final_answer"] * 6


# -- no secret in any output --------------------------------------------------------------


def test_a_key_echoed_in_an_error_body_reaches_no_record_log_alert_or_exception(
    stub: tuple[Stub, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    state, url = stub
    state.push_echo_auth(401)
    records = tmp_path / "runs.jsonl"
    dep = live(
        url,
        monkeypatch,
        plugins={
            "enabled": ["logging", "alerting", "run_record"],
            "logging": {"level": "DEBUG"},
            "alerting": {"sinks": [{"type": "log"}], "dedup_window_s": 0},
            "run_record": {"path": str(records)},
        },
    )
    with caplog.at_level(logging.DEBUG):
        run = dep.run("q")
        dep.close()
    rec = run.record()
    assert rec["termination"] == "model_error" and rec["evidence"]["status"] == 401
    assert "[REDACTED]" in rec["evidence"]["error"]  # the echo arrived, and was masked
    outputs = {
        "record": json.dumps(rec, ensure_ascii=False),
        "run_record file": records.read_text(encoding="utf-8"),
        "logs": "\n".join(
            r.getMessage() + str(r.__dict__.get("alert", "")) for r in caplog.records
        ),
    }
    assert outputs["logs"]  # logging and alerting did log the run
    for where, text in outputs.items():
        assert KEY not in text, where
    # the exception the model client raises carries no key either
    state.push_echo_auth(401)
    with pytest.raises(ModelError) as info:
        dep.model.complete(ModelRequest(messages=[{"role": "user", "content": "q"}], tools=[]))
    assert KEY not in str(info.value) and "[REDACTED]" in str(info.value)


class _Leaky(Plugin):
    name = "leaky"

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> None:
        raise RuntimeError(f"cannot reach the billing API with key {KEY}")

    @hookimpl
    def on_stop(self, run: Run, outcome: RunOutcome) -> None:
        raise RuntimeError(f"Authorization: Bearer {KEY}")


def test_a_plugin_error_quoting_the_key_is_redacted_in_record_and_logs(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("STUB_KEY", KEY)
    cfg = parse_config(
        {"model": {"api_key_env": "STUB_KEY"}, "plugins": {"enabled": ["max_steps"]}}, path="<test>"
    )
    with (
        Deployment(cfg, plugins={"leaky": _Leaky()}, tools=shop_tools()) as dep,
        caplog.at_level(logging.ERROR),
    ):
        rec = dep.run(scenario="refund").record()
    assert rec["termination"] == "plugin_error" and rec["stopped_by"] == "leaky"
    assert rec["errors"] and rec["errors"][0]["plugin"] == "leaky"
    text = json.dumps(rec) + "\n".join(r.getMessage() for r in caplog.records)
    assert "billing API" in text and "Traceback" in text  # the failure is still explained
    assert KEY not in text


def test_a_failing_webhook_logs_no_credentials_from_its_url(
    stub: tuple[Stub, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, url = stub
    state.push({"error": {"message": "unauthorized"}}, status=401)
    hook = url.replace("http://", "http://alice:PASSWORD123@") + "/hook?token=QUERYTOKEN99&x=1"
    plugin = Alerting(
        AlertingSettings.model_validate(
            {
                "sinks": [{"type": "webhook", "url": hook, "min_severity": "warn", "timeout_s": 5}],
                "dedup_window_s": 0,
            }
        )
    )
    plugin.name = "alerting"
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.alerting"):
        plugin.on_guard_triggered(
            Run("u", run_id="r1"),
            verdict=stop("repeat_call", plugin="a"),
            hook="before_tool",
            step=1,
        )
        assert plugin.flush(10)
        plugin.close()
    lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(lines) == 1 and "401" in lines[0] and "/v1/hook" in lines[0]
    for secret in ("PASSWORD123", "QUERYTOKEN99", "alice"):
        assert secret not in lines[0]


# -- exit codes and signals ---------------------------------------------------------------


def cli_config(tmp_path: Path, url: str, enabled: str = '"run_record"') -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[model]\nprovider = "openai"\nname = "stub-model"\nbase_url = "{url}"\n'
        'api_key_env = "STUB_KEY"\nmax_retries = 0\ntimeout_s = 60\n'
        f"[plugins]\nenabled = [{enabled}]\n"
        f'[plugins.run_record]\npath = "{tmp_path / "runs.jsonl"}"\n',
        encoding="utf-8",
    )
    return cfg


def cli(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path), "STUB_KEY": KEY}
    return subprocess.Popen(
        [sys.executable, "-m", "loopwarden", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_model_call_exits_with_its_code_and_a_cancelled_record(
    stub: tuple[Stub, str], tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    state, url = stub
    state.push_hang(60)
    proc = cli(tmp_path, "--json", "--config", str(cli_config(tmp_path, url)), "q")
    deadline = time.monotonic() + 30
    while not state.requests and time.monotonic() < deadline:  # the call is in flight
        time.sleep(0.05)
    assert state.requests, "the run never called the model"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    rec = json.loads(out)
    assert rec["termination"] == "cancelled"
    assert rec["evidence"]["reason"] == sig.name
    written = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["termination"] for r in written] == ["cancelled"]


def test_a_model_error_exits_3_and_prints_no_key(stub: tuple[Stub, str], tmp_path: Path) -> None:
    state, url = stub
    state.push_echo_auth(401)
    proc = cli(tmp_path, "--json", "--config", str(cli_config(tmp_path, url)), "q")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert json.loads(out)["termination"] == "model_error"
    assert KEY not in out and KEY not in err


@pytest.mark.parametrize(
    ("enabled", "code", "termination"),
    [
        ('"max_steps"', 0, "final_answer"),
        ('"max_steps", "test_reliability:_Leaky"', 3, "plugin_error"),
    ],
)
def test_run_exit_codes_per_outcome(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    enabled: str,
    code: int,
    termination: str,
) -> None:
    from loopwarden.commands.cli import main

    cfg = cli_config(tmp_path, "http://127.0.0.1:9/v1", enabled)
    assert main(["run", "--scenario", "refund", "--json", "--config", str(cfg)]) == code
    assert json.loads(capsys.readouterr().out)["termination"] == termination


def test_a_guard_s_stop_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    from loopwarden.commands.cli import main

    assert main(["run", "--scenario", "always-not-found", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["termination"] == "repeat_call"


# -- odd values from the model, plugins and tools -----------------------------------------


def test_an_odd_model_field_is_not_priced_and_crashes_nothing(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    first = completion(
        None,
        [{"name": "query_order", "arguments": '{"order_id": "88231"}'}],
        usage={"prompt_tokens": 1_000_000, "completion_tokens": 0},
    )
    first["model"] = 7
    second = completion("done", usage={"prompt_tokens": 1_000_000, "completion_tokens": 0})
    second["model"] = "free-model"  # the server claims a model that costs nothing
    state.push(first)
    state.push(second)
    dep = live(
        url,
        monkeypatch,
        plugins={
            "enabled": ["cost_budget"],
            "cost_budget": {
                "max_cost": 100,
                "prices": {
                    "stub-model": {"input": 1, "output": 1},
                    "free-model": {"input": 0, "output": 0},
                },
            },
        },
    )
    rec = dep.run("q").record()
    assert rec["termination"] == "final_answer" and rec["errors"] == []
    assert rec["cost"] == 2.0  # both calls at the configured model's price


def scripted_run(
    tool_obj: Any, *, sync: bool = True, plugins: dict[str, Any] | None = None, **settings: Any
) -> dict[str, Any]:
    from loopwarden.models.scripted import ScriptedModel
    from loopwarden.testing import script, tool_call, turn
    from loopwarden.tools import ToolRegistry

    cfg = parse_config({"plugins": plugins or {"enabled": ["max_steps"]}, **settings})
    model = ScriptedModel(
        script([turn("calling", tool_call(tool_obj.name, {}))], then="final", final_text="finished")
    )
    with Deployment(cfg, tools=ToolRegistry([tool_obj])) as dep:
        if sync:
            return dep.run("q", model=model).record()
        return asyncio.run(dep.arun("q", model=model)).record()


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


@pytest.mark.parametrize("sync", [True, False])
@pytest.mark.parametrize(
    "value",
    [10**5000, _Unprintable(), [_Unprintable()], {"n": 10**5000}],
    ids=["huge-int", "bad-str", "list-of-bad-str", "dict-huge-int"],
)
def test_a_tool_returning_an_unprintable_value_does_not_escape_the_run(
    value: Any, sync: bool
) -> None:
    from loopwarden.testing import make_tool

    rec = scripted_run(make_tool("odd", value), sync=sync)
    assert rec["termination"] == "final_answer" and rec["final_answer"] == "finished"
    json.dumps(rec)  # the record stays writable


@pytest.mark.parametrize("sync", [True, False])
def test_a_tool_raising_an_unprintable_error_does_not_escape_the_run(sync: bool) -> None:
    from loopwarden.testing import make_tool

    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    rec = scripted_run(make_tool("odd", Weird()), sync=sync)
    assert rec["termination"] == "final_answer"


class _BadVerdicts(Plugin):
    name = "bad_verdicts"

    def __init__(self, verdict: Any) -> None:
        super().__init__()
        self.verdict = verdict

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Any:
        return self.verdict


@pytest.mark.parametrize(
    "verdict",
    [
        stop("custom", message=7),  # type: ignore[arg-type]
        stop("custom", answer=["not", "text"]),  # type: ignore[arg-type]
        warn(12345),  # type: ignore[arg-type]
        stop(None),  # type: ignore[arg-type]
    ],
)
def test_a_verdict_with_non_text_fields_ends_the_run_plugin_error(verdict: Any) -> None:
    from loopwarden.models.scripted import ScriptedModel
    from loopwarden.testing import script

    cfg = parse_config({"plugins": {"enabled": ["max_steps"]}})
    with Deployment(
        cfg, plugins={"bad_verdicts": _BadVerdicts(verdict)}, tools=shop_tools()
    ) as dep:
        rec = dep.run("q", model=ScriptedModel(script([], final_text="x"))).record()
    assert rec["termination"] == "plugin_error" and rec["stopped_by"] == "bad_verdicts"
    assert "not str" in rec["evidence"]["returned"] or "verdict" in json.dumps(rec)
    assert isinstance(rec["final_answer"], str)
    json.dumps(rec)


@pytest.mark.parametrize("sync", [True, False])
def test_an_async_tool_that_swallows_cancellation_is_abandoned_at_its_deadline(
    sync: bool,
) -> None:
    from loopwarden.tools import tool

    @tool(name="stubborn", read_only=True, timeout_s=0.5)
    async def stubborn() -> str:
        """Never gives up."""
        end = time.monotonic() + 4
        while time.monotonic() < end:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # swallowed
        return "late"

    rec = scripted_run(
        stubborn,
        sync=sync,
        plugins={"enabled": ["max_steps", "timeout"], "timeout": {"stop_on_tool_timeout": True}},
    )
    assert rec["termination"] == "timeout" and rec["evidence"]["tool_error"] == "timeout"
    # the run itself ended soon after the tool's deadline (the tool would run 4 s); under
    # asyncio.run() the abandoned task still delays the loop's closing -- a documented limit
    assert rec["elapsed_s"] < 0.5 + 2.0


class _Blocking(Plugin):
    name = "blocking"

    def __init__(self) -> None:
        super().__init__()
        #: set once the record is seen: until then the hook blocks (at most 5 s)
        self.release = threading.Event()

    @hookimpl
    def before_tool(self, run: Run, call: Any) -> None:
        self.release.wait(5.0)  # a hook that blocks: no deadline can interrupt it


@pytest.mark.parametrize("sync", [True, False])
def test_a_blocking_hook_cannot_keep_the_run_from_its_record(tmp_path: Path, sync: bool) -> None:
    from loopwarden.models.scripted import ScriptedModel
    from loopwarden.testing import script, tool_call, turn

    records = tmp_path / "runs.jsonl"
    cfg = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "timeout", "run_record"],
                # a second: enough that a loaded machine reaches the blocking hook before the limit
                "timeout": {"max_seconds": 1.0, "grace_s": 0},
                "run_record": {"path": str(records)},
            }
        }
    )
    written: list[float] = []
    model = ScriptedModel(script([turn("x", tool_call("get_current_time", {}))]))
    blocking = _Blocking()
    with Deployment(cfg, plugins={"blocking": blocking}, tools=shop_tools()) as dep:

        def watch() -> None:  # when does the record appear? (then the hook may return)
            end = time.monotonic() + 10
            while time.monotonic() < end and not written:
                if records.exists() and records.read_text():
                    written.append(time.monotonic())
                    blocking.release.set()
                time.sleep(0.05)
            blocking.release.set()

        t0 = time.monotonic()
        watcher = threading.Thread(target=watch)
        watcher.start()
        run = dep.run("q", model=model) if sync else asyncio.run(dep.arun("q", model=model))
        watcher.join()
    rec = run.record()
    assert rec["termination"] == "timeout" and rec["evidence"]["watchdog"] is True
    assert written and written[0] - t0 < 1.0 + 1.0 + 2.0  # deadline + slack + a loaded machine
    assert written[0] - t0 < 5.0  # before the hook returned (it blocks until then, or 5 s)
    assert json.loads(records.read_text())["termination"] == "timeout"
    assert len(records.read_text().splitlines()) == 1  # once, though the run ended twice
