"""Numbers that are the answer versus numbers that are noise (issue 45): the shared rule of
:mod:`loopwarden.fingerprint`, and what repeat_call makes of it.

Each test says whether it fails on the code before this round ("fails before") or is a
healthy or loop twin that held before too ("twin")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.detectors import Feed, kinds

from loopwarden.config import ConfigError, default_config_path, load_config
from loopwarden.fingerprint import AnswerMasks
from loopwarden.plugins.repeat_call import RepeatCall, RepeatCallSettings
from loopwarden.testing import make_tool_result
from loopwarden.tools import ToolRegistry
from loopwarden.tools.recorded import recorded_tool

# -- the masks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("2026-12-02 20:51:14", "2026-12-02 20:51:41"),  # a clock's answer
        ("Current time: 20:51:14 UTC", "Current time: 20:51:41 UTC"),
        ('{"now": "2026-12-02T20:51:14Z"}', '{"now": "2026-12-02T20:51:41Z"}'),
        ('{"ts": 1764708714}', '{"ts": 1764708741}'),
    ],
)
def test_a_time_that_is_the_answer_is_kept(a: str, b: str) -> None:
    """Fails before: every time was masked, so three clock reads were one answer."""
    masks = AnswerMasks()
    assert masks.digest(a) != masks.digest(b), masks.mask(a)
    assert masks.shape(a) == masks.shape(b)  # the same apart from their numbers


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("[2026-12-02T10:00:01Z] upstream down", "[2026-12-02T10:07:44Z] upstream down"),
        ("2026-12-02 10:00:01 ERROR upstream down", "2026-12-02 10:07:44 ERROR upstream down"),
        (
            "Traceback (most recent call last):\n  at 2026-12-02 10:00:01 in worker\n" + "x" * 120,
            "Traceback (most recent call last):\n  at 2026-12-02 10:07:44 in worker\n" + "x" * 120,
        ),
    ],
)
def test_a_log_stamp_or_a_time_in_a_long_answer_is_noise(a: str, b: str) -> None:
    """Twin: a log line's stamp and a time inside a long answer stay masked."""
    masks = AnswerMasks()
    assert masks.digest(a) == masks.digest(b), (masks.mask(a), masks.mask(b))


def test_the_time_rule_is_configurable(tmp_path: Path) -> None:
    """Fails before (no such key): ``[run] time_value_chars = 0`` masks every time again."""
    assert AnswerMasks(time_value_chars=0).digest("20:51:14") == AnswerMasks(
        time_value_chars=0
    ).digest("20:51:41")
    assert load_config(default_config_path()).run.time_value_chars == 120
    cfg = tmp_path / "c.toml"
    cfg.write_text("[run]\ntime_value_chars = -1\n", encoding="utf-8")
    with pytest.raises((ConfigError, ValueError)):
        load_config(cfg)


# -- repeat_call with the shipped defaults ---------------------------------------------------------


def _feed(*names: str, **settings: Any) -> Feed:
    """repeat_call (shipped defaults) fed with tools nobody declared, as an MCP server's."""
    reg = ToolRegistry()
    for name in names:
        reg.add(recorded_tool(name))
    return Feed(RepeatCall(RepeatCallSettings(**settings)), tools=reg)


def _poll(f: Feed, name: str, answers: list[str], content: str | None = None) -> list[Any]:
    out = []
    for a in answers:
        c = f.call(name, {"id": "x"})
        f.respond(content, [c])
        out.append(kinds(list(f.tool(c, make_tool_result(a))))[1])
    return out


def test_a_clock_read_three_times_is_neither_warned_nor_stopped() -> None:
    """Fails before: warned at the 2nd read, stopped at the 3rd."""
    f = _feed("get_time")
    got = _poll(
        f, "get_time", ["2026-12-02 20:51:14", "2026-12-02 20:51:41", "2026-12-02 20:52:07"]
    )
    assert got == [None, None, None]


def test_a_percentage_that_moves_is_progress() -> None:
    """Fails before: the same call in a row, answers of one shape, stopped at the 5th."""
    f = _feed("get_build_status")
    answers = [f"build rel-7: RUNNING, {p}% complete" for p in (10, 25, 40, 55, 70, 85, 95)]
    assert _poll(f, "get_build_status", answers) == [None] * 7


def test_numbers_that_come_back_are_a_status_that_never_settles() -> None:
    """Loop twin (stopped before too, at the 3rd call): a count jittering between 3 and 4 of
    10 is stopped at the 5th call, warned before."""
    f = _feed("get_rollout_status")
    answers = [f"rollout: IN_PROGRESS, {n} of 10 healthy" for n in (3, 4, 3, 3, 4)]
    got = _poll(f, "get_rollout_status", answers)
    assert got[:2] == [None, None] and "warn" in got[2:4]
    assert got[4] == "stop:repeat_call"


def test_a_failure_with_a_new_number_is_the_same_failure() -> None:
    """Fails before (the answers' digests differed: no warning at the 2nd): failures are
    compared by shape; the 5th identical failure in a row stops."""
    f = _feed("connect")
    answers = [f"connection refused by 10.0.0.7 port {p}" for p in (8123, 8124, 8125, 8126, 8127)]
    out = []
    for a in answers:
        c = f.call("connect", {"host": "db"})
        out.append(kinds([f.tool(c, make_tool_result(a, ok=False))[1]])[0])
    assert out == [None, "warn", "warn", "warn", "stop:repeat_call"]


def test_four_identical_calls_then_the_agent_moves_on() -> None:
    """Fails before (stopped at the 3rd): a missing compiler called four times, the model's
    text moving, is warned -- saying what repeated -- and not stopped."""
    f = _feed("bash")
    out = []
    for i in range(4):
        c = f.call("bash", {"command": "gcc -o app main.c"})
        f.respond(f"Attempt {i}: maybe the toolchain needs {['a', 'b', 'c', 'd'][i]}.", [c])
        res = make_tool_result(f"/bin/bash: line {12 + 3 * i}: gcc: command not found")
        out.append(f.tool(c, res)[1])
    assert kinds(out) == [None, "warn", "warn", "warn"]
    assert "gcc -o app main.c" in (out[1].message or "")  # type: ignore[union-attr]


def test_loops_that_repeat_five_times_are_stopped_at_the_fifth() -> None:
    """Loop twin (stopped before at the 3rd): the 5th identical call stops."""
    f = _feed("list_directory")
    got = _poll(f, "list_directory", ["README.md\nsrc/"] * 5)
    assert got == [None, "warn", "warn", "warn", "stop:repeat_call"]


def test_the_third_call_stops_when_the_model_text_stands_still_too() -> None:
    """Loop twin (as before): the same call, the same answer, the same words each turn."""
    f = _feed("list_directory")
    got = _poll(f, "list_directory", ["README.md\nsrc/"] * 3, content="Listing the project.")
    assert got == [None, "warn", "stop:repeat_call"]


def test_a_listing_repeated_beside_new_reads_is_not_a_loop() -> None:
    """Fails before (the window rule stopped it at the 3rd listing): a directory listed nine
    turns in a row, each turn also reading a new file, is never stopped."""
    f = _feed("list_directory", "read_file")
    out: list[Any] = []
    for i in range(9):
        ls = f.call("list_directory", {"path": "."})
        rd = f.call("read_file", {"path": f"f{i}.py"}, index=1)
        out += f.turn(
            None,
            (ls, make_tool_result("README.md\nsrc/\ntests/")),
            (rd, make_tool_result(f"contents of f{i}.py: " + "code " * 20 + str(i))),
        )
    assert not any(k and k.startswith("stop") for k in kinds(out))


def test_an_identical_failure_among_new_answers_is_stopped_late() -> None:
    """Fails before (stopped at the 7th): a migration failing the same validation eight times
    while new tables are read in between, then fixed, is warned once and not stopped."""
    f = _feed("run_migration", "get_table_schema")
    out: list[Any] = []
    for i in range(8):
        c = f.call("run_migration", {"name": "0042"})
        err = f"ValidationError: customers.email violates NOT NULL (row {100 + i})"
        out.append(f.tool(c, make_tool_result(err, ok=False))[1])
        d = f.call("get_table_schema", {"table": f"t{i}"})
        f.tool(d, make_tool_result(f"t{i}: id INTEGER, name TEXT, v{i} TEXT"))
    assert kinds(out) == [None, "warn"] + [None] * 6


def test_the_time_value_setting_reaches_the_engine() -> None:
    """``[run] time_value_chars`` is what every detector's digest uses (fails before: the
    engine built its masks without it, so the setting had no effect)."""
    from loopwarden import Deployment
    from loopwarden.config import parse_config

    answer = "It is 10:42:07 now."
    kept = Deployment(parse_config({}))
    masked = Deployment(parse_config({"run": {"time_value_chars": 0}}))
    try:
        assert kept.engine.answers.mask(answer) == answer
        assert masked.engine.answers.mask(answer) != answer
    finally:
        kept.close()
        masked.close()
