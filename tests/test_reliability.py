"""Reliability under a hostile world: event loops, secrets, odd values, exit codes, signals.

The model is the real ``openai`` client against the local stub server (tests/openai_stub.py);
the CLI runs as a real subprocess where signals are involved.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from openai_stub import Stub, completion

from loopwarden import Deployment
from loopwarden.config import parse_config

USAGE = {"prompt_tokens": 3, "completion_tokens": 2}
KEY = "sk-planted-secret-0123456789abcdef"


def live(url: str, monkeypatch: pytest.MonkeyPatch, plugins: dict[str, Any] | None = None,
         **model: Any) -> Deployment:
    monkeypatch.setenv("STUB_KEY", KEY)
    cfg = parse_config({
        "model": {"provider": "openai", "name": "stub-model", "base_url": url,
                  "api_key_env": "STUB_KEY", "max_retries": 0, **model},
        "plugins": plugins or {"enabled": []},
    }, path="<test>")
    return Deployment(cfg)


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
