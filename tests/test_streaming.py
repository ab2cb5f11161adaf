"""Streamed runs (issue 22 item 2): ``Deployment.stream()`` / ``astream()`` events, guards
that act mid-stream, and the record a streamed run ends with.  Offline (the scripted model
streams); the OpenAI-compatible client's streams over real HTTP are in
tests/test_openai_stream.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.stores import store_table
from support.streams import (
    LOOP_SENTENCE,
    ClockedModel,
    events_of,
    healthy_scenario,
    runaway_scenario,
)

from loopwarden import Deployment, FakeClock, Plugin, hookimpl, signals, stop
from loopwarden.config import Config, parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.drivers import blocking_io
from loopwarden.engine.streaming import (
    ModelDelta,
    ResponseCut,
    RunEnd,
    StreamEvent,
    TextDelta,
    ToolCallExecuted,
    ToolCallProposed,
    ToolCallSkipped,
    VerdictIssued,
)
from loopwarden.models.scenario import load_scenario, scenario_path

#: record fields that differ between two runs of the same scenario: timing and identities
TIMING = ("run_id", "elapsed_s", "conversation_id")


def without_timing(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in TIMING}


def text_of(events: list[StreamEvent], step: int | None = None) -> str:
    return "".join(
        e.text for e in events if isinstance(e, TextDelta) and (step is None or e.step == step)
    )


MODES = ["sync", "async"]


# -- a healthy run: the same record streamed and unstreamed --------------------------------------


def fresh(
    factory: Callable[..., Deployment],
    config: Config,
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Deployment:
    """A deployment with a data directory of its own (its own shop and side-effect ledger):
    two runs of one scenario must not answer each other's refund from a shared ledger."""
    directory.mkdir()
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(directory))
    return factory(config, tools=shop_tools(directory))


@pytest.mark.parametrize("mode", MODES)
def test_healthy_streamed_run_ends_with_the_unstreamed_record(
    shipped_config: Config,
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    dep = fresh(deployment_factory, shipped_config, tmp_path / "plain", monkeypatch)
    plain = dep.run(scenario=healthy_scenario()).record()
    dep = fresh(deployment_factory, shipped_config, tmp_path / "streamed", monkeypatch)
    events = events_of(dep, mode, scenario=healthy_scenario())
    end = events[-1]
    assert isinstance(end, RunEnd) and sum(isinstance(e, RunEnd) for e in events) == 1
    assert end.record["termination"] == "final_answer"
    assert without_timing(end.record) == without_timing(plain)
    assert end.record == end.run.record() | {"elapsed_s": end.record["elapsed_s"]}
    # the text arrived in pieces, and says what the record's answer says
    assert sum(isinstance(e, TextDelta) for e in events) > 4
    assert end.record["final_answer"] in text_of(events)


def test_stream_events_follow_the_run(deployment_factory: Callable[..., Deployment]) -> None:
    """Deltas before the turn's proposals, each proposal executed after it was proposed."""
    events = list(deployment_factory().stream(scenario=healthy_scenario()))
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "TextDelta" and kinds[-1] == "RunEnd"
    proposed = [e.call for e in events if isinstance(e, ToolCallProposed)]
    executed = [e.call for e in events if isinstance(e, ToolCallExecuted)]
    assert [c.name for c in proposed] == [
        "query_order",
        "search_knowledge",
        "get_current_time",
        "apply_refund",
    ]
    assert executed == proposed
    at = {(type(e).__name__, id(getattr(e, "call", None))): i for i, e in enumerate(events)}
    for call in executed:
        assert at[("ToolCallProposed", id(call))] < at[("ToolCallExecuted", id(call))]
    first_proposal = kinds.index("ToolCallProposed")
    assert text_of(events[:first_proposal]) == "我先查一下订单和退货政策。"


# -- a runaway answer: stopped mid-stream ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_streamed_runaway_answer_is_stopped_mid_stream(
    shipped_config: Config,
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
    mode: str,
) -> None:
    scenario = runaway_scenario(tmp_path, repeats=60)
    # unstreamed, the whole degenerate answer is paid for and its lookup runs
    plain = deployment_factory(shipped_config).run(scenario=scenario)
    assert plain.record()["termination"] == "final_answer" and plain.tools_executed == 1

    events = events_of(deployment_factory(shipped_config), mode, scenario=scenario)
    cut = [e for e in events if isinstance(e, ResponseCut)]
    assert len(cut) == 1 and cut[0].reason == "verdict" and cut[0].by == "no_progress"
    streamed = text_of(events, step=1)
    # cut at the fourth saying of the sentence, not after sixty
    assert streamed.count(LOOP_SENTENCE) == 4 and len(streamed) < 5 * len(LOOP_SENTENCE)
    verdicts = [e for e in events if isinstance(e, VerdictIssued)]
    first = verdicts[0]
    assert (first.hook, first.verdict.plugin) == ("on_model_delta", "no_progress")
    # the proposed lookup never ran: the cut answer carries no tool calls
    assert not any(isinstance(e, (ToolCallProposed, ToolCallExecuted)) for e in events)
    end = events[-1]
    assert isinstance(end, RunEnd)
    rec = end.record
    assert rec["termination"] == "no_progress" and rec["stopped_by"] == "no_progress"
    assert rec["soft"] is True  # the wrap-up turn answered instead of the cut text
    assert rec["evidence"]["rule"] == "repeated_sentence"
    assert rec["evidence"]["count"] == 4 and rec["evidence"]["threshold"] == 4
    assert rec["final_answer"] == "订单 88231 已签收。"
    assert rec["tool_calls"] == 0
    # only what was streamed is accounted, not the whole answer
    assert rec["tokens"]["completion"] < plain.record()["tokens"]["completion"] / 5
    assert end.run.verdicts[0]["hook"] == "on_model_delta"


def test_a_hard_repeat_stop_withholds_the_cut_text(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
) -> None:
    cfg = make_config(plugins={"enabled": ["no_progress"], "no_progress": {"soft": False}})
    events = list(deployment_factory(cfg).stream(scenario=runaway_scenario(tmp_path)))
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "no_progress" and rec["soft"] is False
    assert LOOP_SENTENCE not in (rec["final_answer"] or "")
    assert rec["steps"] == 1


def test_a_wrap_up_turn_that_repeats_too_is_withheld(
    shipped_config: Config, deployment_factory: Callable[..., Deployment], tmp_path: Path
) -> None:
    """The soft stop's tool-less wrap-up turn loops as well: it is cut and withheld (a cut
    answer is never a final answer), and the run ends there -- no third model call."""
    scenario = runaway_scenario(tmp_path)
    looping = scenario.model.model_copy(update={"final_text": LOOP_SENTENCE * 20})
    scenario = scenario.model_copy(update={"model": looping})
    events = list(deployment_factory(shipped_config).stream(scenario=scenario))
    assert [(e.step, e.reason) for e in events if isinstance(e, ResponseCut)] == [
        (1, "verdict"),
        (2, "verdict"),
    ]
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "no_progress" and rec["soft"] is False
    assert rec["steps"] == 2 and rec["final_answer_present"] is False
    assert LOOP_SENTENCE not in (rec["final_answer"] or "")


def test_repeat_check_can_be_turned_off(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
) -> None:
    cfg = make_config(plugins={"enabled": ["no_progress"], "no_progress": {"stream_repeats": None}})
    events = list(deployment_factory(cfg).stream(scenario=runaway_scenario(tmp_path, 10)))
    assert not any(isinstance(e, ResponseCut) for e in events)
    assert events[-1].record["termination"] == "final_answer"  # type: ignore[union-attr]


def test_shadowed_repeat_check_records_but_does_not_cut(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
) -> None:
    cfg = make_config(plugins={"enabled": ["no_progress"], "no_progress": {"shadow": True}})
    events = list(deployment_factory(cfg).stream(scenario=runaway_scenario(tmp_path, 10)))
    assert not any(isinstance(e, ResponseCut) for e in events)
    shadowed = [e for e in events if isinstance(e, VerdictIssued)]
    assert shadowed and all(e.shadow for e in shadowed)
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "final_answer"
    assert rec["shadow_stop"]["hook"] == "on_model_delta"


# -- the output cap and the run's time, mid-stream ----------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_answer_past_max_output_tokens_is_cut_there(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
    mode: str,
) -> None:
    clock = FakeClock()
    scenario = runaway_scenario(tmp_path, repeats=60)
    model = ClockedModel(scenario, clock, max_output_tokens=40)
    cfg = make_config(plugins={"enabled": ["max_steps"]})
    events = events_of(deployment_factory(cfg), mode, scenario=scenario, model=model)
    cut = [e for e in events if isinstance(e, ResponseCut)]
    assert [c.reason for c in cut] == ["max_output_tokens"]
    assert cut[0].tokens > 40
    rec = events[-1].record  # type: ignore[union-attr]
    # cut like a server that honours the cap: the text so far is the answer, no tool ran
    assert rec["termination"] == "final_answer" and rec["tool_calls"] == 0
    assert rec["final_answer"] == text_of(events, step=1)
    assert rec["tokens"]["completion"] == cut[0].tokens
    assert model.pieces < 60 * len(LOOP_SENTENCE) / 8 / 4


@pytest.mark.parametrize("mode", MODES)
def test_answer_past_the_runs_time_is_cut_there(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    tmp_path: Path,
    mode: str,
) -> None:
    clock = FakeClock()
    scenario = runaway_scenario(tmp_path, repeats=60)
    model = ClockedModel(scenario, clock, seconds_per_piece=1.0)
    cfg = make_config(
        plugins={"enabled": ["max_steps", "timeout"], "timeout": {"max_seconds": 10.0}}
    )
    events = events_of(deployment_factory(cfg), mode, scenario=scenario, model=model, clock=clock)
    assert [e.reason for e in events if isinstance(e, ResponseCut)] == ["timeout"]
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "timeout"
    assert model.pieces == 10  # the eleventh piece was never asked for


# -- ledger answers, the hook contract, a consumer that leaves ------------------------------------


def test_ledger_answer_is_a_skipped_event(
    deployment_factory: Callable[..., Deployment], tmp_path: Path
) -> None:
    path = tmp_path / "refund-twice.toml"
    call = (
        '{ name = "apply_refund", arguments = { order_id = "88231", reason = "七天无理由退货" } }'
    )
    path.write_text(
        f"""name = "refund-twice"
user = "退款"
[model]
turns = [
  {{ content = "提交退款。", tool_calls = [{call}] }},
  {{ content = "再提交一次。", tool_calls = [{call}] }},
]
then = "final"
final_text = "已退款。"
""",
        encoding="utf-8",
    )
    events = list(deployment_factory().stream(scenario=load_scenario(path)))
    done = [e for e in events if isinstance(e, (ToolCallExecuted, ToolCallSkipped))]
    assert [type(e).__name__ for e in done] == ["ToolCallExecuted", "ToolCallSkipped"]
    skipped = done[1]
    assert isinstance(skipped, ToolCallSkipped)
    assert skipped.why == "ledger" and skipped.call.name == "apply_refund"
    assert events[-1].run.ledger_answers  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", MODES)
def test_shared_ledger_answer_streams_as_skipped(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    store_url: str,
    tmp_path: Path,
    mode: str,
) -> None:
    """Two streamed runs of the refund through one shared store (a SQLite file, a Redis
    server): the second run's refund is answered by the store's ledger, and says so.  An
    async run with a ledger advances its machine in worker threads (store I/O never blocks
    the event loop): its events still arrive in order."""
    cfg = make_config(plugins={"enabled": ["max_steps"]}, store=store_table(store_url))
    dep = deployment_factory(cfg, tools=shop_tools(tmp_path))
    first = events_of(dep, mode, scenario=healthy_scenario())
    second = events_of(dep, mode, scenario=healthy_scenario())
    end = second[-1]
    assert isinstance(end, RunEnd) and blocking_io(end.run)
    assert [e.call.name for e in first if isinstance(e, ToolCallExecuted)][-1] == "apply_refund"
    skipped = [e for e in second if isinstance(e, ToolCallSkipped)]
    assert [(e.call.name, e.why) for e in skipped] == [("apply_refund", "ledger")]
    assert end.record["ledger_answers"][0]["source"] == "shared"
    assert end.record["termination"] == "final_answer"


class CutAtThird(Plugin):
    """Stops (hard) at the third delta of any answer; keeps what it saw."""

    name = "cut_at_third"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, str]] = []

    @hookimpl
    def on_model_delta(self, run: Any, request: Any, delta: ModelDelta) -> Any:
        self.seen.append((delta.index, delta.tokens, delta.content()))
        if delta.index == 2:
            return stop("guard_cut", soft=False, message="enough")
        return None


def test_hook_on_model_delta_sees_each_piece_and_a_stop_cuts(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    plugin = CutAtThird()
    cfg = make_config(plugins={"enabled": ["max_steps"]})
    with Deployment(cfg, tools=shop_tools(tmp_path), plugins={"cut_at_third": plugin}) as dep:
        unstreamed = dep.run(scenario=healthy_scenario())
        assert plugin.seen == []  # an unstreamed run never calls it
        events = list(dep.stream(scenario=healthy_scenario()))
    # the first answer has two pieces; the second is cut at its third
    assert [i for i, _, _ in plugin.seen] == [0, 1, 0, 1, 2]
    second = "订单已签收，我确认一下今天的日期。"
    assert plugin.seen[-1][2] == text_of(events, step=2) == second[:24]
    assert plugin.seen[2][1] < plugin.seen[4][1]  # tokens grow
    assert [e.call.name for e in events if isinstance(e, ToolCallExecuted)] == [
        "query_order",
        "search_knowledge",
    ]
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "guard_cut" and rec["stopped_by"] == "cut_at_third"
    assert rec["final_answer_present"] is False  # the cut text is withheld (a veto)
    assert unstreamed.record()["termination"] == "final_answer"


@pytest.mark.parametrize("mode", MODES)
def test_consumer_that_leaves_cancels_the_run_with_a_record(
    deployment_factory: Callable[..., Deployment], mode: str
) -> None:
    dep = deployment_factory()
    records: list[dict[str, Any]] = []

    def keep(sender: Any, record: dict[str, Any], **_: Any) -> None:
        records.append(record)

    with signals.run_stopped.connected_to(keep):
        if mode == "sync":
            stream = dep.stream(scenario=healthy_scenario())
            assert isinstance(next(stream), TextDelta)
            stream.close()
        else:

            async def leave() -> None:
                stream = dep.astream(scenario=healthy_scenario())
                assert isinstance(await stream.__anext__(), TextDelta)
                await stream.aclose()  # type: ignore[attr-defined]

            asyncio.run(leave())
    assert len(records) == 1
    assert records[0]["termination"] == "cancelled"
    assert records[0]["tool_calls"] == 0


def test_stream_builds_the_run_at_once() -> None:
    """Bad arguments raise when stream() is called, not at the first event."""
    with Deployment(parse_config({})) as dep, pytest.raises(ValueError):
        dep.stream()
    assert scenario_path("refund").exists()
