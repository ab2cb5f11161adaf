"""``loopwarden run --stream`` (issue 22 item 2): the text is shown as it arrives, the record
is the unstreamed run's, and a runaway answer is cut on screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.openai_stub import serve
from support.streams import LOOP_SENTENCE, push_held, runaway_scenario

from loopwarden.commands.cli import main

IGNORE = ("run_id", "elapsed_s", "conversation_id")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_stream_json_prints_the_unstreamed_record(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path / "plain"))
    code, out, _ = run_cli(capsys, "run", "--scenario", "refund", "--json")
    plain = json.loads(out)
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path / "streamed"))
    code, out, err = run_cli(capsys, "run", "--scenario", "refund", "--json", "--stream")
    assert code == 0
    streamed = json.loads(out)  # stdout holds the record only: the stream went to stderr
    assert {k: v for k, v in streamed.items() if k not in IGNORE} == {
        k: v for k, v in plain.items() if k not in IGNORE
    }
    assert "我先查一下订单和退货政策。\n-> query_order" in err
    assert streamed["final_answer"] in err


def test_run_stream_cuts_a_runaway_answer_on_screen(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scenario = runaway_scenario(tmp_path)
    code, out, _ = run_cli(capsys, "run", "--scenario", str(scenario.path), "--stream")
    assert code == 0
    shown, summary = out.split("termination:", 1)
    assert shown.count(LOOP_SENTENCE) == 4
    assert "[answer cut after ~" in shown and ": verdict]" in shown
    assert "[no_progress: no_progress in on_model_delta]" in shown
    assert summary.startswith(" no_progress (soft)")


@pytest.mark.slow
def test_run_stream_shows_text_while_the_stream_is_still_open(tmp_path: Path) -> None:
    """A real ``loopwarden run --stream`` process against a streaming HTTP endpoint that holds
    the rest of its answer back until the test has seen the first part on the process's
    stdout: the text is printed as it arrives, not when the answer is complete."""
    release = threading.Event()
    first, rest = "The order 88231 ", "was signed for on 2026-06-22."
    usage = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    with serve() as (stub, url):
        push_held(stub, first, rest, release, usage)
        config = tmp_path / "config.toml"
        config.write_text(
            f'[model]\nname = "stub-model"\nbase_url = "{url}"\n'
            'api_key_env = "STUB_API_KEY"\ncontext_window = 32000\n'
            '[plugins]\nenabled = ["max_steps", "no_progress"]\n',
            encoding="utf-8",
        )
        env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path), "STUB_API_KEY": "sk-stub"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loopwarden",
                "run",
                "Where is 88231?",
                "--stream",
                "--config",
                str(config),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
        )
        assert proc.stdout is not None
        seen = bytearray()
        shown = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            while byte := proc.stdout.read(1):
                seen.extend(byte)
                if first.encode() in seen:
                    shown.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert shown.wait(60), bytes(seen).decode(errors="replace")
            assert rest.encode() not in seen  # the server has not sent it yet
            release.set()
            assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
        reader.join(10)
    out = bytes(seen).decode()
    assert out.startswith(first + rest)
    assert "termination: final_answer" in out
    assert stub.requests[0]["stream"] is True
