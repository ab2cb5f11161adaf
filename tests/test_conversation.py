"""Conversations: one run per user message; messages and conversation state carry on."""

from __future__ import annotations

from typing import Any

from loopwarden import Conversation, Deployment, Plugin, ToolError, hookimpl
from loopwarden.config import default_config_path, load_config, parse_config
from loopwarden.demo import shop_tools
from loopwarden.testing import ScriptedModel, script, tool_call


class Counter(Plugin):
    name = "counter"

    @hookimpl
    def after_tool(self, run: Any) -> None:
        self.state(run)["n"] = self.state(run).get("n", 0) + 1
        conv = self.conversation_state(run)
        conv["n"] = conv.get("n", 0) + 1


def test_messages_and_conversation_state_carry_on_per_run_state_does_not() -> None:
    dep = Deployment(parse_config({}), plugins={"counter": Counter()}, tools=shop_tools())
    conv = Conversation("c1")
    lookup = {"tool_calls": [tool_call("query_order", order_id="88231")]}
    first = dep.run(
        "where is 88231?",
        model=ScriptedModel(script([lookup, {"content": "signed"}])),
        conversation=conv,
    )
    second = dep.run(
        "and the logistics?",
        model=ScriptedModel(script([lookup, lookup, {"content": "ok"}])),
        conversation=conv,
    )
    assert conv.runs == 2 and conv.messages == second.messages
    users = [m["content"] for m in second.messages if m["role"] == "user"]
    assert users == ["where is 88231?", "and the logistics?"]
    assert second.messages[: len(first.messages)] == first.messages
    assert first.state["counter"] == {"n": 1} and second.state["counter"] == {"n": 2}
    assert conv.state["counter"] == {"n": 3}
    assert second.step == 3  # per-run limits start afresh: steps count from zero again


def test_a_run_without_a_conversation_gets_its_own() -> None:
    dep = Deployment(parse_config({}), plugins={"counter": Counter()}, tools=shop_tools())
    lookup = {"tool_calls": [tool_call("query_order", order_id="88231")]}
    a = dep.run("q", model=ScriptedModel(script([lookup, {"content": "x"}])))
    b = dep.run("q", model=ScriptedModel(script([lookup, {"content": "x"}])))
    assert a.conversation is not b.conversation
    assert b.conversation.state["counter"] == {"n": 1}


def not_found_turn() -> dict[str, Any]:
    return {"content": "let me check", "tool_calls": [tool_call("query_order", order_id="99999")]}


def test_a_call_that_failed_for_good_counts_on_in_the_next_user_turns() -> None:
    dep = Deployment(load_config(default_config_path()), tools=shop_tools())
    conv = Conversation()
    turns = [not_found_turn(), {"content": "not found"}]
    r1 = dep.run("order 99999?", model=ScriptedModel(script(turns)), conversation=conv)
    assert r1.record()["termination"] == "final_answer"
    # the next user message may have fixed something: the call runs once more ...
    rec2 = dep.run(
        "please check 99999 again", model=ScriptedModel(script(turns)), conversation=conv
    ).record()
    assert rec2["tools_executed"] == 1 and rec2["termination"] == "final_answer"
    assert rec2["warnings"][0]["plugin"] == "repeat_call"  # ... failing again is a repeat
    recs = [
        dep.run(f"once more? ({i})", model=ScriptedModel(script(turns)), conversation=conv).record()
        for i in range(3)
    ]
    # one call failing the same way in every turn is a repeat: warned on, and stopped at its
    # fifth identical call across the turns (repeat_call's, failure_streak's same-call rule:
    # the earlier plugin in config order names the stop)
    assert [r["termination"] for r in recs[:2]] == ["final_answer"] * 2
    assert any(w["plugin"] == "repeat_call" for w in recs[0]["warnings"])
    assert (recs[2]["termination"], recs[2]["stopped_by"]) == ("repeat_call", "repeat_call")


def test_repeat_call_alone_stops_the_fifth_failing_turn() -> None:
    """Without failure_streak, repeat_call counts the failing call across the user turns and
    stops it at its fifth identical call (stop_at_repeat = 4)."""
    cfg = parse_config({"plugins": {"enabled": ["repeat_call"]}})
    dep = Deployment(cfg, tools=shop_tools())
    conv = Conversation()
    turns = [not_found_turn(), {"content": "not found"}]
    recs = [
        dep.run(
            f"order 99999? ({i})", model=ScriptedModel(script(turns)), conversation=conv
        ).record()
        for i in range(5)
    ]
    assert [r["termination"] for r in recs[:4]] == ["final_answer"] * 4
    assert (recs[4]["termination"], recs[4]["stopped_by"]) == ("repeat_call", "repeat_call")
    assert recs[4]["evidence"]["across_turns"] is True and recs[4]["evidence"]["count"] == 5


def test_a_fix_between_turns_lets_the_call_succeed() -> None:
    dep = Deployment(load_config(default_config_path()), tools=shop_tools())
    conv = Conversation()
    turns = [not_found_turn(), {"content": "not found"}]
    dep.run("order 99999?", model=ScriptedModel(script(turns)), conversation=conv)
    from loopwarden.demo.shop import Shop

    with Shop().write() as c:  # the order is created outside the agent
        c.execute("INSERT INTO orders VALUES ('99999','x',1,'已签收','2026-06-01',NULL,NULL)")
    rec = dep.run("I placed it now", model=ScriptedModel(script(turns)), conversation=conv).record()
    assert rec["tools_executed"] == 1 and rec["warnings"] == []
    assert not conv.state["repeat_call"]


def test_the_memory_of_failures_can_be_per_run_only() -> None:
    cfg = parse_config(
        {"plugins": {"enabled": ["repeat_call"], "repeat_call": {"failures_across_turns": False}}}
    )
    dep = Deployment(cfg, tools=shop_tools())
    conv = Conversation()
    for _ in range(3):
        rec = dep.run(
            "order 99999?",
            model=ScriptedModel(script([not_found_turn(), {"content": "no"}])),
            conversation=conv,
        ).record()
        assert rec["tools_executed"] == 1 and rec["termination"] == "final_answer"


def test_a_successful_change_forgets_earlier_failures() -> None:
    dep = Deployment(parse_config({"plugins": {"enabled": ["repeat_call"]}}), tools=shop_tools())
    conv = Conversation()
    dep.run(
        "refund 99999",
        model=ScriptedModel(
            script(
                [
                    {"tool_calls": [tool_call("apply_refund", order_id="99999", reason="x")]},
                    {"content": "no such order"},
                ]
            )
        ),
        conversation=conv,
    )
    assert conv.state["repeat_call"]  # remembered
    dep.run(
        "hand me over",
        model=ScriptedModel(
            script(
                [
                    {"tool_calls": [tool_call("transfer_to_human", reason="refund question")]},
                    {"content": "done"},
                ]
            )
        ),
        conversation=conv,
    )
    assert not conv.state["repeat_call"]  # a side effect succeeded: the world changed


def test_a_failed_side_effect_may_run_again_after_the_next_user_message() -> None:
    from loopwarden.tools import ToolRegistry, tool

    attempts: list[str] = []

    @tool(side_effect=True, idempotency_keys=("order_id",))
    def charge(order_id: str) -> str:
        """Charge an order; the card is declined the first time."""
        attempts.append(order_id)
        if len(attempts) == 1:
            raise ToolError("DECLINED: card expired")
        return "charged"

    dep = Deployment(parse_config({}), tools=ToolRegistry([charge]))
    conv = Conversation()
    turn = {"tool_calls": [tool_call("charge", order_id="1")]}
    dep.run(
        "charge 1",
        model=ScriptedModel(script([turn, turn, {"content": "declined"}])),
        conversation=conv,
    )
    assert attempts == ["1"]  # not retried within the run: it failed for good
    dep.run(
        "I renewed my card",
        model=ScriptedModel(script([turn, {"content": "ok"}])),
        conversation=conv,
    )
    dep.run("again?", model=ScriptedModel(script([turn, {"content": "ok"}])), conversation=conv)
    assert attempts == ["1", "1"]  # ran again once, then never: it took place


def test_a_side_effect_never_runs_twice_in_a_conversation() -> None:
    from loopwarden.tools import ToolRegistry, tool

    charges: list[str] = []

    @tool(side_effect=True, idempotency_keys=("order_id",))
    def charge(order_id: str) -> str:
        """Charge an order."""
        charges.append(order_id)
        return f"charged {order_id}"

    dep = Deployment(parse_config({}), tools=ToolRegistry([charge]))
    conv = Conversation()
    turn = {"tool_calls": [tool_call("charge", order_id="1")]}
    for _ in range(2):
        dep.run(
            "charge order 1",
            model=ScriptedModel(script([turn, {"content": "done"}])),
            conversation=conv,
        )
    assert charges == ["1"]
    outs = [m["content"] for m in conv.messages if m["role"] == "tool"]
    assert "was not executed again" in outs[1]


def test_the_next_turn_sees_a_well_formed_history_with_what_the_user_was_told() -> None:
    from loopwarden import FakeClock

    class Veto(Plugin):
        name = "veto"

        @hookimpl
        def after_response(self, response: Any) -> Any:
            if response.content and "SECRET" in response.content:
                return self.stop("forbidden_content")
            return None

    class Cut(Plugin):
        name = "cut"

        @hookimpl
        def after_response(self, response: Any) -> Any:
            if response.tool_calls and response.content == "cut here":
                return self.stop("budget")  # hard: the proposed calls never run
            return None

    cfg = parse_config({"run": {"fallback_answer": "Sorry."}})
    dep = Deployment(
        cfg, plugins={"veto": Veto(), "cut": Cut()}, clock=FakeClock(), tools=shop_tools()
    )
    conv = Conversation()
    r1 = dep.run(
        "q1",
        model=ScriptedModel(script([{"content": "the password is SECRET123"}])),
        conversation=conv,
    )
    assert r1.record()["final_answer"] == "Sorry."
    assert not any("SECRET" in str(m.get("content")) for m in conv.messages)
    assert conv.messages[-1] == {"role": "assistant", "content": "Sorry."}
    dep.run(
        "q2",
        model=ScriptedModel(
            script(
                [{"content": "cut here", "tool_calls": [tool_call("query_order", order_id="1")]}]
            )
        ),
        conversation=conv,
    )
    # the cut call is answered, and the best-effort answer the user got closes the turn
    assert conv.messages[-2]["role"] == "tool" and "NOT EXECUTED" in conv.messages[-2]["content"]
    assert conv.messages[-1]["role"] == "assistant"
    r3 = dep.run("q3", model=ScriptedModel(script([{"content": "fine"}])), conversation=conv)
    assert r3.record()["termination"] == "final_answer"
