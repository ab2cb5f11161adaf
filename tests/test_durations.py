"""Every duration bounded (issue 33): a huge timeout, ``Retry-After`` or wait never overflows a
timer, kills the process's watchdog or escapes ``run`` / ``arun`` -- the config refuses it
(``tests/test_config_types.py``), and whatever reaches the runtime otherwise is cut to
``MAX_DURATION_S``."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import textwrap

import pytest

from loopwarden import Deployment, ToolError
from loopwarden.config import parse_config
from loopwarden.exceptions import ToolDefinitionError
from loopwarden.models.scripted import ScriptedModel
from loopwarden.run import Run
from loopwarden.testing import script, tool_call, turn
from loopwarden.tools import tool


def test_a_huge_watch_does_not_kill_the_watchdog() -> None:
    """A watch of 1e10 s (past ``threading.TIMEOUT_MAX``) and then a short one: the short
    one still fires -- the process-wide watchdog thread lives on.  In a subprocess, so a
    watchdog that dies takes no other test with it (the timeout guards against a hang)."""
    code = textwrap.dedent(
        """
        import sys, threading, time
        from loopwarden.clock import WATCHDOG
        WATCHDOG.watch(1e10, lambda: None)
        time.sleep(0.5)  # the watchdog thread is now waiting for the far watch
        fired = threading.Event()
        WATCHDOG.watch(0.2, fired.set)
        sys.exit(0 if fired.wait(30) else 1)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OverflowError" not in proc.stderr


def test_a_tool_timeout_past_the_bound_is_refused_when_declared() -> None:
    for bad in (1e10, float("inf"), 0, -1.0, True):
        with pytest.raises(ToolDefinitionError, match="timeout_s"):

            @tool(timeout_s=bad)
            def slow() -> str:
                return "x"


def _dep(*tools: object, retries: bool = False) -> Deployment:
    # no timeout plugin: its tool_timeout_s would lower the tool's own timeout
    enabled = ["max_steps"] + (["retry_policy"] if retries else [])
    return Deployment(parse_config({"plugins": {"enabled": enabled}}), tools=list(tools))


def _play(dep: Deployment, name: str, mode: str) -> Run:
    model = ScriptedModel(script([turn("x", tool_call(name, {}))], final_text="done"))
    if mode == "sync":
        return dep.run("q", model=model)
    return asyncio.run(dep.arun("q", model=model))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tool_with_a_huge_timeout_runs(mode: str) -> None:
    """A tool whose ``timeout_s`` got past the declaration check (replaced on the Tool
    object): a blocking call waits a bounded time and returns its value, in sync and async
    runs alike."""

    @tool(timeout_s=5.0)
    def blocking() -> str:
        return "fine"

    huge = dataclasses.replace(blocking, timeout_s=1e10)
    dep = _dep(huge)
    run = _play(dep, "blocking", mode)
    rec = run.record()
    assert rec["termination"] == "final_answer" and rec["tool_calls"] == 1
    assert run.last_observation == "fine"
    dep.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("retries", [False, True])
def test_a_retry_after_of_400_digits_does_not_escape_the_run(mode: str, retries: bool) -> None:
    """``ToolError(retry_after=<400-digit int>)``: an error observation and a record, in
    ``run`` and ``arun``, with the runtime's retries on or off (a wait longer than the plan's
    ``max_backoff_s`` is not waited for)."""

    @tool(read_only=True, deterministic=True)
    def rate_limited() -> str:
        raise ToolError("429 slow down", retryable=True, retry_after=10**400)

    dep = _dep(rate_limited, retries=retries)
    run = _play(dep, "rate_limited", mode)
    rec = run.record()
    assert rec["termination"] == "final_answer" and rec["tool_calls"] == 1
    assert any("429 slow down" in str(m.get("content")) for m in run.messages)
    dep.close()
