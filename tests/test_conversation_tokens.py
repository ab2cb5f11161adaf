"""A long conversation: each turn opens with the whole history, but its token estimate is
carried on, not recounted -- so a turn's own work does not grow with the number of turns -- and
it is always the estimate a recount would give (edits, withheld answers, another estimator)."""

from __future__ import annotations

from typing import Any

import pytest

from loopwarden import Conversation, Deployment, Plugin, Stop, hookimpl
from loopwarden.config import default_config_path, load_config, parse_config
from loopwarden.models.tokens import estimate_messages, estimate_text
from loopwarden.testing import ScriptedModel, script, tool_call
from loopwarden.tools import ToolRegistry, tool


@tool(read_only=True, deterministic=True)
def lookup(key: str) -> str:
    """Look a record up."""
    return f"record {key}: found"


def lookup_tools() -> ToolRegistry:
    return ToolRegistry([lookup])


class CountingEstimator:
    """A text estimator (the default one) that counts the texts it was asked to estimate."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return estimate_text(text)


class ContextCheck(Plugin):
    """Records, at every model request, the run's kept estimate and a recount of its messages."""

    name = "context_check"

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    @hookimpl
    def before_model(self, run: Any) -> None:
        self.seen.append((run.context_tokens, estimate_messages(run.messages, run.estimator)))


class WithholdAnswer(Plugin):
    """Hard-stops a run on its answer when the user said "withhold": the answer is replaced in
    the history (the message object the run counted is swapped for another)."""

    name = "withhold"

    @hookimpl
    def after_response(self, run: Any, response: Any) -> Stop | None:
        if "withhold" in run.user and not response.tool_calls:
            return Stop("withheld", answer="I cannot say that.")
        return None


def turn(t: int) -> ScriptedModel:
    """One user turn: a distinct lookup, then an answer."""
    lookup = {"content": f"checking {t}", "tool_calls": [tool_call("lookup", key=f"k{t}")]}
    return ScriptedModel(script([lookup, {"content": f"order {t}: signed " + "x" * t}]))


def test_a_turn_counts_only_its_own_messages_however_long_the_conversation() -> None:
    """The history is not estimated again every turn: turn 30 counts as many texts as turn 2
    (on the whole-history recount each turn counted every earlier message again)."""
    dep = Deployment(load_config(default_config_path()), tools=lookup_tools())
    counter = CountingEstimator()
    dep.estimator = counter
    conv = Conversation()
    per_turn = []
    for t in range(30):  # within the shipped max_turns (40) and its warning (at 32)
        before = counter.calls
        run = dep.run(f"where is order {t}?", model=turn(t), conversation=conv)
        assert run.outcome is not None and run.outcome.termination == "final_answer"
        per_turn.append(counter.calls - before)
    assert per_turn[-1] == per_turn[1]
    assert len(set(per_turn[1:])) == 1, per_turn


def test_the_kept_estimate_is_the_recount_through_edits_and_withheld_answers() -> None:
    check = ContextCheck()
    plugins = {"context_check": check, "withhold": WithholdAnswer()}
    dep = Deployment(parse_config({}), plugins=plugins, tools=lookup_tools())
    conv = Conversation()
    # each edit follows a turn that ended normally (the estimate was kept); the turn after a
    # withheld answer opens with no edit (the kept estimate would be the stale one)
    edits = {
        4: lambda: conv.messages.append({"role": "user", "content": "an aside " * 40}),
        6: lambda: conv.messages.__setitem__(1, {"role": "user", "content": "short"}),
        8: lambda: conv.messages.pop(),
        10: lambda: setattr(conv, "messages", conv.messages[:3]),
        12: lambda: conv.messages.extend([]),
    }
    withheld = (2, 13)
    for t in range(15):
        if t in edits:
            edits[t]()
        user = f"withhold {t}" if t in withheld else f"where is {t}?"
        run = dep.run(user, model=turn(t), conversation=conv)
        assert run.outcome is not None
        assert (run.outcome.termination == "withheld") == (t in withheld)
    assert len(check.seen) == 30
    assert all(kept == recount for kept, recount in check.seen), check.seen


def test_another_estimator_recounts_the_history() -> None:
    conv = Conversation()
    first = Deployment(parse_config({}), tools=lookup_tools())
    first.run("where is 1?", model=turn(1), conversation=conv)
    check = ContextCheck()
    second = Deployment(parse_config({}), plugins={"context_check": check}, tools=lookup_tools())
    second.estimator = lambda text: len(text)  # one token a character
    second.run("and 2?", model=turn(2), conversation=conv)
    assert check.seen and all(kept == recount for kept, recount in check.seen)


@pytest.mark.parametrize("edit", ["assign", "append", "replace"])
def test_a_conversation_forgets_its_estimate_when_its_history_changes(edit: str) -> None:
    dep = Deployment(parse_config({}), tools=lookup_tools())
    conv = Conversation()
    dep.run("where is 1?", model=turn(1), conversation=conv)
    assert conv._known_tokens(dep.estimator) == estimate_messages(conv.messages, dep.estimator)
    assert conv._known_tokens(len) is None  # counted by another estimator
    if edit == "assign":
        conv.messages = list(conv.messages)
    elif edit == "append":
        conv.messages.append({"role": "user", "content": "more"})
    else:
        conv.messages[0] = dict(conv.messages[0])
    assert conv._known_tokens(dep.estimator) is None
