"""Loops judged by what the world answered (issue 31): answers compared with their volatile
parts masked, cycles of state-changing calls, caps that fit agents that fan out, failures the
agent escapes -- each behaviour played end to end from its scenario in ``bench/scenarios`` with
the shipped config, and the pieces unit by unit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.detectors import Feed, kinds

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_config
from loopwarden.demo import shop_tools
from loopwarden.exceptions import ConfigError
from loopwarden.fingerprint import AnswerMasks
from loopwarden.plugins.repeat_call import RepeatCall, RepeatCallSettings
from loopwarden.plugins.tool_calls import ToolCalls, ToolCallsSettings
from loopwarden.testing import make_tool_result
from loopwarden.tools import ToolRegistry
from loopwarden.tools.recorded import recorded_tool
from loopwarden.traffic.trajectory import identical_repeat_streak

CORPUS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"

#: loops whose answers differ only in volatile parts or numbers, and cycles of edits: stopped
#: by a loop guard within three model turns of their onset (an identical call stops at its
#: fifth since issue 45, the third when the model's text stands still too)
LOOPS = {
    "rep-moving-line-number-en": "repeat_call",
    "rep-timestamped-error-zh": "repeat_call",
    "rep-digits-only-en": None,
    "osc-edit-revert-en": "oscillation",
    "osc-edit-cycle-three-en": None,
}
#: healthy behaviours of agents nobody tuned for: they finish by themselves
HEALTHY = [
    "ok-fan-out-document-en",
    "ok-fan-out-courses-zh",
    "ok-poll-moving-status-en",
    "ok-cursor-paging-en",
    "ok-date-sweep-en",
    "ok-date-sweep-zh",
    "ok-ddl-statements-en",
    "ok-sql-recovers-en",
    "ok-repeated-handoff-en",
    "ok-coding-long-en",
]
LOOP_GUARDS = {"repeat_call", "oscillation", "no_progress", "stall", "failure_streak"}


@pytest.fixture(scope="module")
def shipped() -> Deployment:
    return Deployment(load_config(default_config_path()), tools=shop_tools())


def _play(dep: Deployment, name: str) -> dict[str, Any]:
    return dep.run(scenario=str(CORPUS / f"{name}.toml")).record()


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_loops_are_stopped_within_three_turns_of_their_onset(
    shipped: Deployment, name: str
) -> None:
    from loopwarden.models.scenario import load_scenario

    onset = load_scenario(CORPUS / f"{name}.toml").expect.onset
    assert onset is not None
    rec = _play(shipped, name)
    assert rec["stopped_by"] in LOOP_GUARDS, rec["termination"]
    if LOOPS[name] is not None:
        assert rec["stopped_by"] == LOOPS[name]
    assert rec["steps"] <= onset + 4, rec["steps"]  # the soft stop's wrap-up turn included


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_behaviours_finish_by_themselves(shipped: Deployment, name: str) -> None:
    rec = _play(shipped, name)
    assert rec["termination"] == "final_answer", (rec["stopped_by"], rec["evidence"])
    assert rec["stopped_by"] is None


def test_a_fan_out_wider_than_the_turn_cap_is_refused_in_part_and_goes_on(
    shipped: Deployment,
) -> None:
    """The document builder's 17 calls a turn fit the per-turn cap; 30 do not: the rest are
    refused with an observation that asks for them in the next turn, and the run goes on."""
    settings = ToolCallsSettings()
    assert settings.max_tool_calls is None and settings.max_per_turn == 22
    f = Feed(ToolCalls(settings))
    calls = [f.call("add_paragraph", {"text": str(i)}, index=i) for i in range(30)]
    f.respond("writing", calls)
    got = [f.before(c) for c in calls]
    assert got[:22] == [None] * 22
    refused = got[22:]
    assert all(v is not None and v.kind == "skip" for v in refused)
    assert "next turn" in refused[0].observation  # type: ignore[union-attr]
    # the next turn starts afresh
    again = f.call("add_paragraph", {"text": "more"})
    f.respond("more", [again])
    assert f.before(again) is None


# -- answers compared for what they say ------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "/bin/bash: line 11301: cd: fastjson/: No such file or directory",
            "/bin/bash: line 11316: cd: fastjson/: No such file or directory",
        ),
        ('File "/tmp/tmpa8f3k2_q/x.py", line 12', 'File "/tmp/tmpz0p1r9_w/x.py", line 40'),
        ("src/a.py:12:5: E501", "src/a.py:13:9: E501"),
        ("Ran 5 tests in 0.012s\nFAILED", "Ran 5 tests in 0.301s\nFAILED"),
        ("[2026-12-02T10:00:01Z] upstream down", "[2026-12-02T10:07:44.120Z] upstream down"),
        (
            "request 3f2b9c1e-8d4a-4b6f-9e2a-1c5d7e9f0a1b failed",
            "request 9e0a1b3f-2b9c-4b6f-8d4a-1c5d7e9f0a1b failed",
        ),
        ("object at 0x7f3a2c10", "object at 0x7f3a2d88"),
        ("HEAD is 9fceb02d0ae5", "HEAD is 1a2b3c4d5e6f"),
        ("pid 4211 exited", "pid 4388 exited"),
    ],
)
def test_volatile_parts_are_masked(a: str, b: str) -> None:
    masks = AnswerMasks()
    assert a != b
    assert masks.digest(a) == masks.digest(b), (masks.mask(a), masks.mask(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("running, 42% done", "running, 67% done"),  # a status that moves
        ("3 results", "4 results"),
        ("flight CA123 departs 14:05", "flight CA123 departs 16:40"),  # an hour is data
        ("order 88231 signed 2026-06-22", "order 88231 signed 2026-06-23"),  # so is a date
        ("订单 88231 已签收", "订单 88232 已签收"),
    ],
)
def test_what_an_answer_says_is_not_masked(a: str, b: str) -> None:
    masks = AnswerMasks()
    assert masks.digest(a) != masks.digest(b)
    assert masks.shape(a) == masks.shape(b)  # the same apart from their numbers


def test_masks_are_configurable_and_checked(tmp_path: Path) -> None:
    assert AnswerMasks(enabled=False).digest("line 1") != AnswerMasks(enabled=False).digest(
        "line 2"
    )
    extra = AnswerMasks([r"job-\d+"])
    assert extra.digest("job-17 failed") == extra.digest("job-18 failed")
    base = load_config(default_config_path())
    assert base.run.mask_volatile is True and base.run.volatile_patterns == []
    for bad in ('"(unclosed"', '"(job)-x"'):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f"[run]\nvolatile_patterns = [{bad}]\n", encoding="utf-8")
        with pytest.raises((ConfigError, ValueError)):
            load_config(cfg)


def test_the_deployments_masks_reach_every_detector(tmp_path: Path) -> None:
    """With ``mask_volatile = false`` the moving line number is a changed answer again: the
    deployment's setting, not a module default, decides what detectors compare."""
    text = default_config_path().read_text(encoding="utf-8")
    cfg = tmp_path / "c.toml"
    cfg.write_text(text.replace('mode = "enforce"', 'mode = "enforce"\nmask_volatile = false'))
    dep = Deployment(load_config(cfg), tools=shop_tools())
    rec = _play(dep, "rep-moving-line-number-en")
    assert not (rec["stopped_by"] == "repeat_call" and rec["steps"] <= 4)


def test_the_replay_figure_masks_digits_in_identical_repeats() -> None:
    steps = [
        {
            "tool_calls": [{"name": "bash", "arguments": {"command": "cd x/"}}],
            "observations": [f"/bin/bash: line {100 + i}: cd: x/: No such file or directory"],
        }
        for i in range(6)
    ]
    assert identical_repeat_streak(steps) == 6


# -- failures the agent escapes, hand-offs -----------------------------------------------------


def _undeclared_feed(*names: str) -> Feed:
    """repeat_call fed with tools nobody declared (as an MCP server's or a framework's)."""
    reg = ToolRegistry()
    for name in names:
        reg.add(recorded_tool(name))
    return Feed(RepeatCall(RepeatCallSettings()), tools=reg)


def test_an_identical_failure_among_successes_warns_once_then_stops_when_ignored() -> None:
    f = _undeclared_feed("execute_sql", "list_columns")
    out = []
    for i in range(8):
        c = f.call("execute_sql", {"sql": "SELECT * FROM customer"})
        out.append(kinds([f.tool(c, make_tool_result("relation missing", ok=False))[1]])[0])
        d = f.call("list_columns", {"table": f"t{i}"})
        f.tool(d, make_tool_result(f"columns of t{i}"))
    # the 2nd failure warns; the next eight are the warning ignored; the 10th stops
    assert out[:8] == [None, "warn", None, None, None, None, None, None]
    for i in range(8, 10):
        c = f.call("execute_sql", {"sql": "SELECT * FROM customer"})
        out.append(kinds([f.tool(c, make_tool_result("relation missing", ok=False))[1]])[0])
        d = f.call("list_columns", {"table": f"t{i}"})
        f.tool(d, make_tool_result(f"columns of t{i}"))
    assert out[8:] == [None, "stop:repeat_call"]


def test_the_identical_failure_in_a_row_still_stops_at_stop_at_repeat() -> None:
    f = _undeclared_feed("execute_sql")
    out = []
    for _ in range(5):
        c = f.call("execute_sql", {"sql": "SELECT * FROM customer"})
        out.append(kinds([f.tool(c, make_tool_result("relation missing", ok=False))[1]])[0])
    assert out == [None, "warn", "warn", "warn", "stop:repeat_call"]


def test_a_repeated_undeclared_hand_off_is_not_a_loop() -> None:
    t = recorded_tool("transfer_to_human_agents")
    assert t.likely_repeatable and not t.declared
    f = _undeclared_feed("transfer_to_human_agents")
    for _ in range(4):
        c = f.call("transfer_to_human_agents", {"summary": "wants a person"})
        assert f.tool(c, make_tool_result("Transfer successful")) == (None, None)
    # ... but a hand-off called again and again (real runs have done it a hundred times) is
    # a loop: the 5th in a row with the same answer stops, as any call's would
    c = f.call("transfer_to_human_agents", {"summary": "wants a person"})
    assert kinds([f.tool(c, make_tool_result("Transfer successful"))[1]]) == ["stop:repeat_call"]
