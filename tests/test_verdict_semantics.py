"""What each verdict does, as docs/contracts.md and the verdict docstrings say (issue 21.5).

* ``skip(..., message=)``: the call does not run, the model gets the observation, and the
  message is a warning in the *next* model request;
* a hard stop's ``message`` goes to the run record, logs and alerts -- never to the user (the
  final answer) nor to the model;
* the best-effort answer: the latest non-empty model content, else the last observation
  (wrapped in ``[run.texts] best_effort``), else ``[run] fallback_answer``;
* ``answer=`` on a hard stop is the user's answer from *every* decision hook;
* ``final_answer_present`` is false for a guard's substitute ``answer=`` and true for a
  plugin whose stops are normal endings (``terminal_tool``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from loopwarden import Plugin, hookimpl
from loopwarden.testing import make_tool, run_plugin, tool_call, turn

LOOKUP = make_tool("lookup", "order 1001: shipped", read_only=True)
TURNS = [
    turn("Looking it up.", tool_call("lookup", order_id="1001")),
    turn("One more time.", tool_call("lookup", order_id="1002")),
    turn("Order 1001 has shipped."),
]


class StopAt(Plugin):
    """Hard-stops in the hook named by ``hook`` at the second call (or second step)."""

    name = "stop_at"
    hook: ClassVar[str] = "before_tool"
    answer: ClassVar[str | None] = None

    def _stop(self) -> Any:
        return self.stop("pii", message="LOG ONLY: saw a card number", answer=self.answer)

    @hookimpl
    def before_model(self, run: Any, request: Any) -> Any:
        return self._stop() if self.hook == "before_model" and run.step == 0 else None

    @hookimpl
    def after_response(self, run: Any, response: Any) -> Any:
        return self._stop() if self.hook == "after_response" and run.step == 2 else None

    @hookimpl
    def before_tool(self, run: Any, call: Any) -> Any:
        return self._stop() if self.hook == "before_tool" and call.step == 2 else None

    @hookimpl
    def after_tool(self, run: Any, call: Any, result: Any) -> Any:
        return self._stop() if self.hook == "after_tool" and call.step == 2 else None

    @hookimpl
    def on_start(self, run: Any) -> Any:
        return self._stop() if self.hook == "on_start" else None


def _stopper(hook: str, answer: str | None = None) -> type[StopAt]:
    return type("StopAt_" + hook, (StopAt,), {"hook": hook, "answer": answer})


def test_skip_message_is_a_warning_in_the_next_request() -> None:
    class SkipIt(Plugin):
        name = "skip_it"

        @hookimpl
        def before_tool(self, run: Any, call: Any) -> Any:
            return self.skip("NOT RUN: blocked", message="do not look that up again")

    res = run_plugin(SkipIt, tools=[LOOKUP], turns=TURNS[:1] + TURNS[2:])
    assert res.executed == []
    second = res.model.requests[1]
    assert "do not look that up again" in " ".join(second.notes)
    assert any(m.get("content") == "NOT RUN: blocked" for m in second.messages)
    # the first request came before the skip: the warning is for the *next* request only
    assert not res.model.requests[0].notes
    assert res.warnings == ["do not look that up again"]


@pytest.mark.parametrize("hook", ["on_start", "before_model", "after_response", "before_tool"])
def test_hard_stop_message_reaches_the_record_not_the_user_nor_the_model(hook: str) -> None:
    res = run_plugin(_stopper(hook), tools=[LOOKUP], turns=TURNS)
    assert res.termination == "pii"
    assert res.outcome.message == "LOG ONLY: saw a card number"
    assert "LOG ONLY" not in (res.outcome.final_answer or "")
    for request in res.model.requests:
        assert "LOG ONLY" not in str(request.messages)


def test_best_effort_is_the_latest_model_content() -> None:
    # the example: a hard stop in before_tool at step 2 ends on the model's latest
    # text ("One more time."), not on an answer the model never gave
    res = run_plugin(_stopper("before_tool"), tools=[LOOKUP], turns=TURNS)
    assert res.outcome.final_answer == "One more time."
    assert res.outcome.final_answer_present is False


def test_best_effort_without_model_text_is_the_last_observation() -> None:
    turns = [turn(None, tool_call("lookup", order_id="1")), turn(None, tool_call("lookup"))]
    res = run_plugin(_stopper("before_tool"), tools=[LOOKUP], turns=turns)
    assert "order 1001: shipped" in (res.outcome.final_answer or "")
    assert res.outcome.final_answer_present is False


def test_best_effort_with_nothing_known_is_the_fallback() -> None:
    res = run_plugin(
        _stopper("before_model"),
        turns=TURNS,
        config={"run": {"fallback_answer": "Sorry, no answer."}},
    )
    assert res.outcome.final_answer == "Sorry, no answer."


@pytest.mark.parametrize(
    "hook", ["on_start", "before_model", "after_response", "before_tool", "after_tool"]
)
def test_hard_stop_answer_is_the_users_answer_from_every_hook(hook: str) -> None:
    res = run_plugin(_stopper(hook, answer="I cannot help with that."), tools=[LOOKUP], turns=TURNS)
    assert res.termination == "pii"
    assert res.outcome.final_answer == "I cannot help with that."
    # a guard's substitute is not the model's answer (docs/contracts.md)
    assert res.outcome.final_answer_present is False
    assert res.record["final_answer_present"] is False


def test_terminal_tool_answer_counts_as_present() -> None:
    handoff = make_tool("transfer_to_human", "ticket T-1", terminal=True, side_effect=True)
    res = run_plugin(
        "terminal_tool",
        tools=[handoff],
        turns=[turn("Handing over.", tool_call("transfer_to_human", why="refund"))],
    )
    assert res.termination == "terminal_tool"
    assert "ticket T-1" in (res.outcome.final_answer or "")
    assert res.outcome.final_answer_present is True


def test_hard_stop_message_goes_to_the_guard_triggered_signal() -> None:
    res = run_plugin(_stopper("before_tool"), tools=[LOOKUP], turns=TURNS)
    assert [v.message for v in res.verdicts] == ["LOG ONLY: saw a card number"]


def test_soft_stop_message_comes_before_the_wrap_up_instruction() -> None:
    class Wrap(Plugin):
        name = "wrap"

        @hookimpl
        def after_tool(self, run: Any, call: Any, result: Any) -> Any:
            return self.stop("enough", soft=True, message="Stop looking.", answer="unused")

    res = run_plugin(Wrap, tools=[LOOKUP], turns=TURNS)
    final = res.model.requests[-1]
    assert final.final and final.tool_choice == "none"
    assert any("Stop looking." in str(m.get("content")) for m in final.messages)
    # the wrap-up turn answers; the soft stop's answer= is not used
    assert res.outcome.final_answer != "unused" and res.outcome.final_answer_present is True


def test_hard_stop_on_an_answer_is_a_veto() -> None:
    class Veto(Plugin):
        name = "veto"

        @hookimpl
        def after_response(self, run: Any, response: Any) -> Any:
            return None if response.calls else self.stop("pii", answer="[withheld]")

    res = run_plugin(Veto, turns=[turn("card 4111 1111 1111 1111")])
    assert res.outcome.final_answer == "[withheld]"
    assert "4111" not in str(res.run.conversation.messages)
    assert res.outcome.final_answer_present is False


def test_the_plugin_guide_states_these_semantics() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "plugin-guide.md").read_text(
        encoding="utf-8"
    )
    section = guide.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    for phrase in ("best-effort answer", "from every decision hook", "final_answer_present"):
        assert phrase in section, phrase
    assert "(api.md#verdicts)" in section
