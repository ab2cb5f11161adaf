"""Conversations: one run per user message; messages and conversation state carry on."""

from __future__ import annotations

from typing import Any

from builders import call, script

from loopwarden import Conversation, Deployment, Plugin, hookimpl
from loopwarden.config import default_config_path, load_config, parse_config


class Counter(Plugin):
    name = "counter"

    @hookimpl
    def after_tool(self, run: Any) -> None:
        self.state(run)["n"] = self.state(run).get("n", 0) + 1
        conv = self.conversation_state(run)
        conv["n"] = conv.get("n", 0) + 1


def test_messages_and_conversation_state_carry_on_per_run_state_does_not() -> None:
    dep = Deployment(parse_config({}), plugins={"counter": Counter()})
    conv = Conversation("c1")
    lookup = {"tool_calls": [call("query_order", order_id="88231")]}
    first = dep.run("where is 88231?", model=script(lookup, {"content": "signed"}),
                    conversation=conv)
    second = dep.run("and the logistics?", model=script(lookup, lookup, {"content": "ok"}),
                     conversation=conv)
    assert conv.runs == 2 and conv.messages is second.messages
    users = [m["content"] for m in second.messages if m["role"] == "user"]
    assert users == ["where is 88231?", "and the logistics?"]
    assert second.messages[: len(first.messages)] == first.messages
    assert first.state["counter"] == {"n": 1} and second.state["counter"] == {"n": 2}
    assert conv.state["counter"] == {"n": 3}
    assert second.step == 3  # per-run limits start afresh: steps count from zero again


def test_a_run_without_a_conversation_gets_its_own() -> None:
    dep = Deployment(parse_config({}), plugins={"counter": Counter()})
    lookup = {"tool_calls": [call("query_order", order_id="88231")]}
    a = dep.run("q", model=script(lookup, {"content": "x"}))
    b = dep.run("q", model=script(lookup, {"content": "x"}))
    assert a.conversation is not b.conversation
    assert b.conversation.state["counter"] == {"n": 1}


def not_found_turn() -> dict[str, Any]:
    return {"content": "let me check", "tool_calls": [call("query_order", order_id="99999")]}


def test_a_call_that_failed_for_good_stays_failed_in_the_next_user_turn() -> None:
    dep = Deployment(load_config(default_config_path()))
    conv = Conversation()
    turns = [not_found_turn(), {"content": "not found"}]
    r1 = dep.run("order 99999?", model=script(*turns), conversation=conv)
    assert r1.record()["termination"] == "final_answer"
    r2 = dep.run("please check 99999 again", model=script(*turns), conversation=conv)
    rec2 = r2.record()
    assert rec2["tools_executed"] == 0  # skipped: it already failed with NOT_FOUND
    assert rec2["warnings"][0]["plugin"] == "repeat_call"
    r3 = dep.run("once more?", model=script(*turns), conversation=conv)
    rec3 = r3.record()
    assert (rec3["termination"], rec3["stopped_by"]) == ("repeat_call", "repeat_call")


def test_the_memory_of_failures_can_be_per_run_only() -> None:
    cfg = parse_config({"plugins": {"enabled": ["repeat_call"],
                                    "repeat_call": {"failures_across_turns": False}}})
    dep = Deployment(cfg)
    conv = Conversation()
    for _ in range(3):
        rec = dep.run("order 99999?", model=script(not_found_turn(), {"content": "no"}),
                      conversation=conv).record()
        assert rec["tools_executed"] == 1 and rec["termination"] == "final_answer"


def test_a_successful_change_forgets_earlier_failures() -> None:
    dep = Deployment(parse_config({"plugins": {"enabled": ["repeat_call"]}}))
    conv = Conversation()
    dep.run("refund 99999", model=script(
        {"tool_calls": [call("apply_refund", order_id="99999", reason="x")]},
        {"content": "no such order"}), conversation=conv)
    assert conv.state["repeat_call"]  # remembered
    dep.run("hand me over", model=script(
        {"tool_calls": [call("transfer_to_human", reason="refund question")]},
        {"content": "done"}), conversation=conv)
    assert not conv.state["repeat_call"]  # a side effect succeeded: the world changed
