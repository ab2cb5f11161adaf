"""Failures read from the text of tools that give no error flag (failure shapes), as
failure_streak and stall see them: text-action agents (``Invalid action!``), encyclopedia QA
agents (``Could not find X. Similar: [...]``) and bare shells (``command not found``).

Tests marked *loop* fail on a build without failure shapes; tests marked *healthy twin* hold
there too and keep the new reading from warning or stopping what it must not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.detectors import Feed, kinds

from loopwarden.config import Config
from loopwarden.plugins._failures import DEFAULT_FAILURE_SHAPES, FailureShapes, declares_status
from loopwarden.plugins.failure_streak import FailureStreak, FailureStreakSettings
from loopwarden.plugins.stall import Stall, StallSettings
from loopwarden.testing import make_tool_result
from loopwarden.tools import ToolRegistry
from loopwarden.tools.recorded import recorded_tool
from loopwarden.verdicts import Stop

SCENARIOS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"

#: tools nobody declared, as a text-action agent (one ``act`` tool), an encyclopedia QA agent
#: (``search`` / ``lookup``) and a shell agent use them
TEXT_TOOLS = ToolRegistry([recorded_tool(n) for n in ("act", "search", "lookup", "shell")])

SHAPES = FailureShapes(DEFAULT_FAILURE_SHAPES)


def feed(plugin: Any) -> Feed:
    return Feed(plugin, tools=TEXT_TOOLS)


def play(f: Feed, tool: str, key: str, *pairs: tuple[str, str]) -> list[str | None]:
    """One call per turn: (argument, answer) pairs; the verdict kinds of each turn."""
    out: list[str | None] = []
    for arg, answer in pairs:
        c = f.call(tool, {key: arg})
        f.respond("next", [c])
        out.append(kinds([f.after(c, make_tool_result(answer))])[0])
    return out


# -- the shapes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("Invalid action!", "invalid_action"),
        ("Unknown command: fly north", "invalid_action"),
        ("Nothing happens.", "nothing_happens"),
        (
            "Could not find Apple Inc (band). Similar: ['Apple Inc.', 'Apple (band)'].",
            "not_found_similar",
        ),
        ("No more results.", "no_more_results"),
        ("bash: line 1: psql: command not found", "command_not_found"),
        ("zsh: command not found: rg", None),  # zsh's word order is not a default shape
        ("ls: cannot access 'src/app': No such file or directory", "no_such_file"),
        ("cat: /etc/shadow: Permission denied", "permission_denied"),
        ("\n\n  Invalid action!\n", "invalid_action"),  # the first non-empty line
    ],
)
def test_default_shapes_name_the_failure(text: str, shape: str | None) -> None:
    assert SHAPES.match(text) == shape


@pytest.mark.parametrize(
    "text",
    [
        # a failure message quoted further down is not the answer's own failure
        "Results for 'invalid action':\nInvalid action! is an error message of WebShop.",
        "Found 3 pages.\nCould not find X. Similar: [...] is what the search says on a miss.",
        # the answer states its own status: the status wins over the text
        "<returncode>0</returncode>\n<output>\ncat: x: No such file or directory\n</output>",
        "<returncode>2</returncode>\nls: cannot access 'x': No such file or directory",
        "exit code: 0\nbash: foo: command not found",
        '{"error": null, "message": "Invalid action!"}',
        '{"ok": true, "note": "Invalid action!"}',
        # ordinary answers
        "[Back to Search] Page 1 (Total results: 50) [Next >] [B07ABC1234] Nike ...",
        "Radiohead are an English rock band formed in Abingdon in 1985.",
        "",
    ],
)
def test_answers_that_are_not_text_failures(text: str) -> None:
    assert SHAPES.match(text) is None


def test_status_detection() -> None:
    assert declares_status("<returncode>1</returncode>\n<output>\n</output>")
    assert declares_status("Exit status 127\n")
    assert declares_status('{"success": false, "reason": "x"}')
    assert declares_status('{"isError": true}')
    assert not declares_status('{"order_id": "88231", "status": "shipped"}')
    assert not declares_status("[1, 2, 3]")
    assert not declares_status('{"error": ')  # not JSON: no status
    assert not declares_status("Invalid action!")


def test_shapes_are_configurable_and_validated() -> None:
    custom = FailureShapes({"refused": r"^I can't do that", "invalid_action": ""})
    assert custom.match("I can't do that, Dave.") == "refused"
    assert custom.match("Invalid action!") is None  # an empty pattern switches a shape off
    assert FailureShapes({}).match("Invalid action!") is None
    for settings in (FailureStreakSettings, StallSettings):
        with pytest.raises(ValidationError, match="failure_shapes"):
            settings(failure_shapes={"broken": "(unclosed"})


def test_shipped_config_spells_out_the_default_shapes(shipped_config: Config) -> None:
    tables = shipped_config.plugins.tables()
    for name in ("failure_streak", "stall"):
        assert tables[name]["failure_shapes"] == DEFAULT_FAILURE_SHAPES


# -- failure_streak ----------------------------------------------------------------------------


def test_loop_qa_searches_that_keep_answering_could_not_find_stop() -> None:
    """loop: every search different, every answer a different 'Could not find ...' -- the
    same shape, so the streak grows although the text changes."""
    f = feed(FailureStreak())
    got = play(
        f,
        "search",
        "entity",
        ("The Lighthouse Keeper (1998 film)", "Could not find it. Similar: ['The Lighthouse']."),
        ("Lighthouse Keeper film", "Could not find that. Similar: ['Lighthouse keeper']."),
        ("Le Gardien du phare", "Could not find Le Gardien du phare. Similar: ['Le Phare']."),
    )
    assert got == [None, "warn", "stop:failure_streak"]
    stop = f.verdicts[-1]
    assert isinstance(stop, Stop)
    assert [x["kind"] for x in stop.evidence["failures"]] == ["not_found_similar"] * 3


def test_loop_invalid_actions_of_a_tool_that_may_change_state_stop() -> None:
    """loop: ``act`` is undeclared (it may change state), and each action differs -- a
    failure of the same shape is still the same failure, not an agent trying new things."""
    f = feed(FailureStreak())
    got = play(
        f,
        "act",
        "action",
        ("click[size 9]", "Invalid action!"),
        ("click[Size: 9]", "Invalid action!"),
        ("select[size=9]", "Invalid action!"),
    )
    assert got == [None, "warn", "stop:failure_streak"]


def test_healthy_twin_an_invalid_action_followed_by_a_valid_one() -> None:
    f = feed(FailureStreak())
    got = play(
        f,
        "act",
        "action",
        ("click[size 9]", "Invalid action!"),
        ("click[9]", "[Back to Search] [< Prev] size [8] [9] [10] [selected: 9] [Buy Now]"),
        ("click[red]", "Invalid action!"),
        ("click[Red]", "[Back to Search] [< Prev] color [Red] [selected: 9, Red] [Buy Now]"),
    )
    assert got == [None, None, None, None]


def test_healthy_twin_a_failing_then_recovering_command() -> None:
    """healthy twin: a bare shell fails in two different shapes, then the right command runs
    (each different failure of a state-changing tool starts a new streak)."""
    f = feed(FailureStreak())
    got = play(
        f,
        "shell",
        "command",
        ("pytest -q", "bash: line 1: pytest: command not found"),
        (
            "python -m pytest -q tests/test_cart.py",
            "python: can't open file: No such file or directory",
        ),
        ("ls tests", "conftest.py\nunit"),
        ("python -m pytest -q tests/unit", "12 passed in 0.41s"),
    )
    assert got == [None, None, None, None]


def test_healthy_twin_qa_takes_a_suggestion() -> None:
    f = feed(FailureStreak())
    got = play(
        f,
        "search",
        "entity",
        (
            "The Lighthouse 2019",
            "Could not find The Lighthouse 2019. Similar: ['The Lighthouse (2019 film)'].",
        ),
        ("The Lighthouse (2019 film)", "The Lighthouse is a 2019 film directed by Robert Eggers."),
        ("Robert Eggers", "Robert Eggers (born 1983) is an American filmmaker."),
    )
    assert got == [None, None, None]


def test_exit_code_answers_are_judged_by_their_status_not_their_text() -> None:
    """A coding agent's wrapped shell: its failures are not read from the text, so three
    greps whose output mentions 'No such file' are not a streak."""
    f = feed(FailureStreak())
    got = play(
        f,
        "shell",
        "command",
        *[
            (
                f"grep -rn 'No such file' src/{i}",
                f"<returncode>0</returncode>\n<output>\n"
                f"src/{i}.py:3: No such file or directory\n</output>",
            )
            for i in range(4)
        ],
    )
    assert got == [None] * 4


def test_shapes_switched_off_restore_the_flag_only_reading() -> None:
    f = feed(FailureStreak(FailureStreakSettings(failure_shapes={})))
    got = play(f, "act", "action", *[(f"click[{i}]", "Invalid action!") for i in range(4)])
    assert "stop:failure_streak" not in got


# -- stall -------------------------------------------------------------------------------------


def test_loop_stall_sees_invalid_actions_as_results_that_say_nothing() -> None:
    """loop: different actions, the same 'Invalid action!' -- with failure_streak out of the
    way, stall alone stops it (a failure read from the text says nothing)."""
    f = feed(Stall())
    got = play(
        f,
        "act",
        "action",
        ("click[Buy]", "Invalid action!"),
        ("click[buy now]", "Invalid action!"),
        ("click[purchase]", "Invalid action!"),
        ("click[checkout]", "Invalid action!"),
    )
    # the first answer has nothing to repeat; each later one repeats it
    assert got == [None, None, "warn", "stop:stall"]


def test_healthy_twin_stall_same_answer_to_different_actions_that_is_not_a_failure() -> None:
    """The same answer to different actions is news unless it says nothing: a page that
    merely repeats is not stalled on text shapes."""
    f = feed(Stall())
    page = "[Back to Search] [< Prev] Nike Revolution 6 size [8] [9] [10] [Buy Now]"
    got = play(f, "act", "action", *[(f"click[option {i}]", page) for i in range(4)])
    assert "stop:stall" not in got


# -- the scenarios, played through the shipped config ------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [("qa-not-found-loop-en", "failure_streak"), ("text-invalid-streak-en", "failure_streak")],
)
def test_loop_scenarios_are_stopped_by_the_failure_streak(
    name: str, reason: str, shipped_config: Config, deployment_factory: Any
) -> None:
    """loop (fails without failure shapes: both run to the step cap)."""
    rec = deployment_factory(shipped_config).run(scenario=SCENARIOS / f"{name}.toml").record()
    assert rec["termination"] == reason
    assert rec["steps"] <= 7  # stopped within a few turns of the onset, far from the cap


@pytest.mark.parametrize(
    "name",
    [
        "text-invalid-then-valid-en",
        "qa-three-searches-en",
        "qa-similar-then-found-en",
        "text-shell-recovers-en",
    ],
)
def test_healthy_twin_scenarios_finish_unwarned(
    name: str, shipped_config: Config, deployment_factory: Any
) -> None:
    rec = deployment_factory(shipped_config).run(scenario=SCENARIOS / f"{name}.toml").record()
    assert rec["termination"] == "final_answer"
    assert rec["warnings"] == []
