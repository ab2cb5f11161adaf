"""pydantic-ai agents guarded by the ``Loopwarden`` capability.

The shared scenarios play :class:`support.adapters.Script` through pydantic-ai's own
``FunctionModel`` (``AgentInfo.function_tools`` says whether tools are offered); the tests of
issue 20 talk real HTTP: pydantic-ai's ``OpenAIChatModel`` against the local stub server
(:mod:`support.openai_stub`, streamed answers from :mod:`support.openai_stream`).  The tools are
real pydantic-ai tools.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage
from support.adapters import (
    FINAL,
    SCENARIOS,
    WORLD_SCENARIOS,
    Effects,
    Outcome,
    Script,
    World,
    cancel_when,
    deployment,
    only_record,
    records,
)
from support.adapters import (
    REFUND_A as REFUND,
)
from support.openai_stream import push_stream
from support.openai_stub import Stub, completion, serve
from support.stores import store_table

from loopwarden import Deployment, signals
from loopwarden.adapters.pydantic_ai import METADATA_KEY, Loopwarden
from loopwarden.config import default_config_path, load_toml, parse_config


def make_model(script: Script) -> FunctionModel:
    def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        text, calls = script.next(bool(info.function_tools))
        parts: list[Any] = [pm.ToolCallPart(n, a, tool_call_id=i) for n, a, i in calls]
        if text:
            parts.append(pm.TextPart(text))
        p, c = script.usage
        return pm.ModelResponse(parts=parts, usage=RequestUsage(input_tokens=p, output_tokens=c))

    return FunctionModel(respond, model_name="gpt-4o-mini")


def tool_returns(messages: list[pm.ModelMessage]) -> list[str]:
    """The observations the model was given, in order."""
    return [
        p.model_response_str()
        for m in messages
        if isinstance(m, pm.ModelRequest)
        for p in m.parts
        if isinstance(p, pm.ToolReturnPart)
    ]


def make_agent(script: Script, effects: Effects, dep: Any) -> Agent[None, str]:
    agent = Agent(make_model(script), capabilities=[Loopwarden(dep)])

    @agent.tool_plain
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    @agent.tool_plain
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    @agent.tool_plain
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        effects.hit("delete_account")
        return f"account {user} deleted"

    return agent


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any) -> Outcome:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    agent = make_agent(script, effects, dep)
    prompt = "Where is my order 99999?"
    try:
        result = agent.run_sync(prompt) if mode == "sync" else asyncio.run(agent.run(prompt))
    finally:
        dep.close()
    observations = tool_returns(result.all_messages())
    return Outcome(output=result.output, observations=observations, effects=effects)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario(tmp_path: Path, scenario: str, mode: str) -> None:
    check: Callable[..., None] = SCENARIOS[scenario]
    check(tmp_path, run_agent, mode)


def run_world(tmp_path: Path, script: Script, mode: str, world: World, user: str) -> Outcome:
    """One run of an agent whose tools nobody declared, ``user`` as the run's deps."""
    dep = deployment(tmp_path)
    agent: Agent[str, str] = Agent(
        make_model(script), deps_type=str, capabilities=[Loopwarden(dep)]
    )

    agent.tool_plain(world.bash)
    agent.tool_plain(world.edit_file)

    @agent.tool
    def account_balance(ctx: RunContext[str]) -> str:
        """The signed-in user's account balance."""
        return world.account_balance(ctx.deps)

    try:
        result = (
            agent.run_sync("Please help.", deps=user)
            if mode == "sync"
            else asyncio.run(agent.run("Please help.", deps=user))
        )
    finally:
        dep.close()
    observations = tool_returns(result.all_messages())
    return Outcome(output=result.output, observations=observations, effects=world.effects)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(WORLD_SCENARIOS))
def test_undeclared_tools(tmp_path: Path, scenario: str, mode: str) -> None:
    """Tools nobody declared run every time, for every user (support.adapters.World)."""
    WORLD_SCENARIOS[scenario](tmp_path, run_world, mode)


def test_each_run_is_its_own_loopwarden_run(tmp_path: Path) -> None:
    """One agent (one capability object), two runs: two records, per-run state apart."""
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": "1"})]])
    agent = make_agent(script, effects, dep)
    first = agent.run_sync("Order 1?")
    script._turn = 0  # the same lookup again, in a new run
    second = agent.run_sync("Order 1 again?")
    dep.close()
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer", "final_answer"]
    assert recs[0]["run_id"] != recs[1]["run_id"]
    assert effects.counts == {"query_order": 2}  # not a repeat: a new run
    assert first.output == second.output


def test_refused_arguments_do_not_hold_up_the_next_call(tmp_path: Path) -> None:
    """pydantic-ai refuses the first call's arguments (a retry prompt) and never runs it; the
    second call of the same answer runs at once, and the record says what happened."""
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order": "99999"}), REFUND]], final="Refunded.")
    agent = make_agent(script, effects, dep)
    result = agent.run_sync("Refund 88231, and where is 99999?")
    dep.close()
    assert effects.counts == {"apply_refund": 1} and result.output == "Refunded."
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer"
    (note,) = rec["evidence"]["adapter"]
    assert "not run by the framework: arguments refused" in note


def test_a_side_effect_runs_once_across_runs(tmp_path: Path) -> None:
    """The deployment's shared ledger holds for framework runs too: the same refund asked for
    in a second run (a second conversation) is answered from the first."""
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[REFUND]], final="Refunded.")
    agent = make_agent(script, effects, dep)
    agent.run_sync("Refund 88231")
    script._turn = 0
    second = agent.run_sync("Refund 88231, please")
    dep.close()
    assert effects.counts == {"apply_refund": 1}
    replayed = [
        p.model_response_str()
        for m in second.all_messages()
        if isinstance(m, pm.ModelRequest)
        for p in m.parts
        if isinstance(p, pm.ToolReturnPart)
    ]
    assert "refund #1 created" in replayed[0] and len(records(tmp_path)) == 2


# -- over real HTTP: pydantic-ai's own OpenAIChatModel against the local stub server ----------

LOOKUP_CALL = {"name": "query_order", "arguments": '{"order_id": "99999"}'}
USAGE = {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}


def http_model(url: str) -> OpenAIChatModel:
    """A real ``OpenAIChatModel`` talking HTTP to the stub (no retries: one request each)."""
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0, timeout=10)
    return OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))


def http_agent(url: str, dep: Any, effects: Effects, **kwargs: Any) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(http_model(url), capabilities=[Loopwarden(dep)], **kwargs)

    @agent.tool_plain
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    return agent


def push_lookups(server: Stub, n: int, final: str = FINAL) -> None:
    for _ in range(n):
        server.push(completion(None, [LOOKUP_CALL], usage=USAGE))
    server.push(completion(final, usage=USAGE))


def offered(request: dict[str, Any]) -> list[str]:
    """The tool names a request offered the model."""
    return [t["function"]["name"] for t in request.get("tools") or []]


def loopwarden_meta(result: Any) -> dict[str, Any]:
    meta = result.metadata
    assert meta is not None and METADATA_KEY in meta, meta
    info: dict[str, Any] = meta[METADATA_KEY]
    return info


def test_result_metadata_says_which_guard_stopped_the_run(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Issue 20 item 12: the result says that repeat_call stopped the run (soft), links to
    the record by run id, and keeps the caller's own metadata."""
    server, url = stub
    push_lookups(server, 3)  # the third identical lookup stops the run; then the wrap-up
    dep = deployment(tmp_path)
    mine = {"tenant": "acme"}
    try:
        result = http_agent(url, dep, Effects()).run_sync("Where is 99999?", metadata=mine)
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call"
    info = loopwarden_meta(result)
    assert info == {
        "run_id": rec["run_id"],
        "termination": "repeat_call",
        "stopped_by": "repeat_call",
        "soft": True,
        "final_answer_present": True,
    }
    assert result.run_id == rec["run_id"] and result.output == FINAL
    assert result.metadata is not None and result.metadata["tenant"] == "acme"
    assert mine == {"tenant": "acme"}  # the caller's mapping is not written into
    assert offered(server.requests[-1]) == []  # the wrap-up was made without tools


def test_result_metadata_is_each_runs_own_under_concurrency(tmp_path: Path) -> None:
    """Two runs of one agent at once (one loops, one answers): each result carries its own
    run's stop and run id, whichever finished last."""
    dep = deployment(tmp_path)
    with serve() as (looping, loop_url), serve() as (healthy, ok_url):
        push_lookups(looping, 3)
        healthy.push(completion(None, [LOOKUP_CALL], usage=USAGE))
        healthy.push(completion("Order 99999 does not exist.", usage=USAGE))
        agent = http_agent(loop_url, dep, Effects())

        async def both() -> list[Any]:
            return list(
                await asyncio.gather(
                    agent.run("Where is 99999?"),
                    agent.run("Where is 99999?", model=http_model(ok_url)),
                )
            )

        try:
            stopped, answered = asyncio.run(both())
        finally:
            dep.close()
    by_id = {r["run_id"]: r for r in records(tmp_path)}
    assert len(by_id) == 2
    s, a = loopwarden_meta(stopped), loopwarden_meta(answered)
    assert by_id[s["run_id"]]["termination"] == s["termination"] == "repeat_call"
    assert s["stopped_by"] == "repeat_call" and s["run_id"] == stopped.run_id
    assert by_id[a["run_id"]]["termination"] == a["termination"] == "final_answer"
    assert a["stopped_by"] is None and a["run_id"] == answered.run_id


def test_run_stream_sync_is_recorded_when_the_stream_is_consumed(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Issue 20 item 9: a streamed run (SSE over HTTP), its result not closed and still
    referenced: the record is written and ``run_stopped`` sent once the caller has read the
    stream to its end -- not when the result is garbage-collected."""
    server, url = stub
    push_stream(server, None, [LOOKUP_CALL], usage=USAGE)
    push_stream(server, "Order 99999 does not exist.", usage=USAGE)
    dep = deployment(tmp_path)
    stopped: list[str] = []
    dep.connect(signals.run_stopped, lambda run, record, **_: stopped.append(record["run_id"]))
    effects = Effects()
    result = http_agent(url, dep, effects).run_stream_sync("Where is 99999?")
    try:
        text = "".join(result.stream_text(delta=True))
        rec = only_record(tmp_path)  # before any close or collection of `result`
        assert stopped == [rec["run_id"]] == [result.run_id]
        assert text == "Order 99999 does not exist." == rec["final_answer"]
        assert rec["termination"] == "final_answer" and rec["steps"] == 2
        assert rec["tokens"]["total"] == 2 * USAGE["total_tokens"]  # the streamed answer's too
        assert rec["tools_executed"] == 1 and effects.counts == {"query_order": 1}
        assert all(r.get("stream") is True for r in server.requests)  # really streamed
    finally:
        result.__exit__(None, None, None)
        dep.close()
    assert len(records(tmp_path)) == 1 and len(stopped) == 1  # closing adds nothing
    assert loopwarden_meta(result)["termination"] == "final_answer"


class Order(BaseModel):
    order_id: str
    status: str


ORDER_ARGS = '{"order_id": "99999", "status": "not found"}'


def ask_for_order(tmp_path: Path, url: str, output: Any = Order) -> tuple[Any, Effects]:
    """One run of the ``Order``-typed agent (``output``: its ``output_type``) against the stub:
    its result and tool effects."""
    dep = deployment(tmp_path)
    effects = Effects()
    try:
        result = http_agent(url, dep, effects, output_type=output).run_sync("Where is 99999?")
    finally:
        dep.close()
    return result, effects


def test_output_type_healthy_run_is_a_final_answer(tmp_path: Path, stub: tuple[Stub, str]) -> None:
    """Issue 20 item 10: the model's ``final_result`` call is the answer, not a tool call the
    framework never ran: the run is recorded ``final_answer`` with the structured output."""
    server, url = stub
    server.push(completion(None, [LOOKUP_CALL], usage=USAGE))
    server.push(completion(None, [{"name": "final_result", "arguments": ORDER_ARGS}], usage=USAGE))
    result, _ = ask_for_order(tmp_path, url)
    assert result.output == Order(order_id="99999", status="not found")
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["final_answer_present"] is True
    assert json.loads(rec["final_answer"]) == json.loads(ORDER_ARGS)
    assert rec["tools_executed"] == 1 and "adapter" not in rec["evidence"]


def test_output_type_soft_stop_keeps_the_structured_output(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Issue 20 item 10: a soft stop's wrap-up offers no function tool but still the output
    tool; the model's valid ``final_result`` call is the run's output."""
    server, url = stub
    for _ in range(3):
        server.push(completion(None, [LOOKUP_CALL], usage=USAGE))
    server.push(completion(None, [{"name": "final_result", "arguments": ORDER_ARGS}], usage=USAGE))
    result, effects = ask_for_order(tmp_path, url)
    assert result.output == Order(order_id="99999", status="not found")
    assert offered(server.requests[-1]) == ["final_result"] and len(server.requests) == 4
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["soft"] is True
    assert rec["final_answer_present"] is True
    assert json.loads(rec["final_answer"]) == json.loads(ORDER_ARGS)
    assert effects.counts == {"query_order": 1}
    assert loopwarden_meta(result)["stopped_by"] == "repeat_call"


def limited_deployment(tmp_path: Path, **conversation_limits: Any) -> Deployment:
    """The adapter tests' deployment with ``[plugins.conversation_limits]`` overrides."""
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "run_record"]
    data["plugins"]["run_record"] = {"path": str(tmp_path / "runs.jsonl")}
    limits = data["plugins"]["conversation_limits"]
    data["plugins"]["conversation_limits"] = {**limits, **conversation_limits}
    return Deployment(parse_config(data, path="<adapter-test>"), tools=[])


def test_conversation_limits_hold_across_a_message_history(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Issue 20 item 13: runs continuing one conversation (``message_history=``) are one
    loopwarden conversation: with ``max_turns = 2`` the third turn is refused before any
    request; a run without history starts a conversation of its own."""
    server, url = stub
    dep = limited_deployment(tmp_path, max_turns=2)
    agent = http_agent(url, dep, Effects())
    try:
        history: list[pm.ModelMessage] = []
        results = []
        for turn in range(3):
            if turn < 2:
                server.push(completion(f"Answer {turn + 1}.", usage=USAGE))
            result = agent.run_sync(f"Question {turn + 1}?", message_history=history)
            history = result.all_messages()
            results.append(result)
        assert len(server.requests) == 2  # the third turn never reached the model
        server.push(completion("A new conversation.", usage=USAGE))
        fresh = agent.run_sync("Question 1?")
    finally:
        dep.close()
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == [
        "final_answer",
        "final_answer",
        "max_turns",
        "final_answer",
    ]
    refused = recs[2]
    assert refused["stopped_by"] == "conversation_limits" and refused["steps"] == 0
    assert refused["evidence"]["key"] == results[0].conversation_id == results[2].conversation_id
    assert loopwarden_meta(results[2])["termination"] == "max_turns"
    assert (
        fresh.output == "A new conversation."
        and fresh.conversation_id != refused["evidence"]["key"]
    )


# -- human approval: requires_approval=True, then deferred_tool_results (issue 32) ------------

REFUND_CALLS = [
    {"name": "apply_refund", "arguments": '{"order_id": "1", "reason": "late"}'},
    {"name": "apply_refund", "arguments": '{"order_id": "2", "reason": "late"}'},
]


def approval_agent(url: str, dep: Any, effects: Effects) -> Agent[None, Any]:
    """An agent whose refund tool needs a human's approval (``DeferredToolRequests`` out)."""
    agent: Agent[None, Any] = Agent(
        http_model(url), capabilities=[Loopwarden(dep)], output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit(f"apply_refund {order_id}")
        return f"refund created for order {order_id}"

    return agent


def test_approved_calls_run_once_in_the_resumed_run(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    """Issue 32: two refunds wait for approval; the next run, given ``deferred_tool_results``
    approving both, runs each once (through the guards and the shared ledger) and is
    recorded with them; the paused run is recorded as paused, its calls not run.  A third run
    re-approving the same history is answered from the ledger: the refunds do not run again."""
    server, url = stub
    server.push(completion(None, REFUND_CALLS, usage=USAGE))
    server.push(completion("Both refunded.", usage=USAGE))
    server.push(completion("Both refunded.", usage=USAGE))
    dep = deployment(tmp_path, store=store_table(store_url))
    effects = Effects()
    agent = approval_agent(url, dep, effects)
    try:
        first = agent.run_sync("Refund orders 1 and 2")
        assert isinstance(first.output, DeferredToolRequests) and effects.counts == {}
        approvals = DeferredToolResults(
            approvals={c.tool_call_id: True for c in first.output.approvals}
        )
        history = first.all_messages()
        second = agent.run_sync(message_history=history, deferred_tool_results=approvals)
        again = agent.run_sync(message_history=history, deferred_tool_results=approvals)
    finally:
        dep.close()
    assert effects.counts == {"apply_refund 1": 1, "apply_refund 2": 1}
    assert second.output == "Both refunded." and tool_returns(second.new_messages()) == [
        "refund created for order 1",
        "refund created for order 2",
    ]
    paused, approved, replayed = records(tmp_path)
    assert paused["termination"] == "ended_by_framework" and paused["tools_executed"] == 0
    assert paused["evidence"]["deferred"] == ["call_0", "call_1"]
    assert paused["final_answer"] is None
    assert approved["termination"] == "final_answer" and approved["tools_executed"] == 2
    assert approved["final_answer"] == "Both refunded."
    # its first step is the paused answer, paid for by the run that received it
    assert approved["steps"] == 2 and approved["tokens"]["total"] == USAGE["total_tokens"]
    assert approved["meta"]["resumed_from"] == paused["run_id"] == first.run_id
    assert "adapter" not in approved["evidence"]
    assert replayed["tools_executed"] == 0 and len(replayed["ledger_answers"]) == 2
    assert loopwarden_meta(second)["termination"] == "final_answer"
    assert again.output == "Both refunded."


def test_output_type_stop_without_structured_output_raises_a_typed_stop(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Issue 32: with an ``output_type`` that is not text, a soft stop's wrap-up answered
    with text (no ``final_result`` call) cannot be the output: the run raises
    ``GuardStopped`` at once -- the stop, its run id and the best-effort text on it --
    instead of pydantic-ai retrying loopwarden's text until ``UnexpectedModelBehavior``."""
    from loopwarden.exceptions import GuardStopped, LoopwardenError

    server, url = stub
    push_lookups(server, 3, final="I could not find order 99999.")  # text, not final_result
    dep = deployment(tmp_path)
    try:
        with pytest.raises(GuardStopped) as raised:
            http_agent(url, dep, Effects(), output_type=Order).run_sync("Where is 99999?")
    finally:
        dep.close()
    rec = only_record(tmp_path)
    stop = raised.value
    assert isinstance(stop, LoopwardenError)
    assert stop.run_id == rec["run_id"] and stop.termination == "repeat_call" == rec["termination"]
    assert stop.stopped_by == "repeat_call" and stop.soft is True
    assert stop.final_answer == "I could not find order 99999." == rec["final_answer"]
    assert len(server.requests) == 4  # no request after the wrap-up


def test_a_native_tool_call_is_recorded(tmp_path: Path, stub: tuple[Stub, str]) -> None:
    """Issue 32: a native (built-in) tool -- web search through ``OpenAIResponsesModel`` --
    runs on the provider's side during the model call, over real HTTP: no hook could refuse
    it, and the record says it ran (``evidence.hosted_tools``)."""
    from pydantic_ai.capabilities.native_tool import NativeTool
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.native_tools import WebSearchTool
    from test_adapter_openai_agents import _responses_body

    server, url = stub
    search = {"type": "search", "query": "order 7"}
    server.push(
        _responses_body(
            [
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": search},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Found it.", "annotations": []}],
                },
            ]
        )
    )
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    model = OpenAIResponsesModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    dep = deployment(tmp_path)
    agent: Agent[None, str] = Agent(
        model, capabilities=[Loopwarden(dep), NativeTool(WebSearchTool())]
    )
    try:
        result = agent.run_sync("Where is order 7?")
    finally:
        dep.close()
    assert result.output == "Found it."
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer"
    assert rec["evidence"]["hosted_tools"] == [{"type": "web_search", "id": "ws_1"}]


# -- round 5 (issue 43) --------------------------------------------------------------------------


def test_output_tool_beside_a_function_tool_is_a_final_answer(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Issue 43 item 7: one answer that calls a function tool and ``final_result`` together
    (pydantic-ai's default ``end_strategy`` runs the tool, then ends on the output) is the
    model's own answer: recorded ``final_answer`` with the output's JSON, in the record and in
    ``result.metadata["loopwarden"]`` -- not ``ended_by_framework``."""
    server, url = stub
    both = [LOOKUP_CALL, {"name": "final_result", "arguments": ORDER_ARGS}]
    server.push(completion(None, both, usage=USAGE))
    result, effects = ask_for_order(tmp_path, url)
    assert result.output == Order(order_id="99999", status="not found")
    assert effects.counts == {"query_order": 1} and len(server.requests) == 1
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["final_answer_present"] is True
    assert json.loads(rec["final_answer"]) == json.loads(ORDER_ARGS)
    assert rec["tools_executed"] == 1 and rec["stopped_by"] is None
    assert loopwarden_meta(result) == {
        "run_id": rec["run_id"],
        "termination": "final_answer",
        "stopped_by": None,
        "soft": False,
        "final_answer_present": True,
    }


def refund_call(order_id: str) -> dict[str, Any]:
    """The model's answer asking for one refund of ``order_id``."""
    call = {"name": "apply_refund", "arguments": json.dumps({"order_id": order_id, "reason": "x"})}
    return completion(None, [call], usage=USAGE)


def test_an_approval_that_edits_the_arguments_guards_what_executes(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    """Issue 43 item 1: a reviewer approves the proposed refund of order 1001 but corrects it
    to 2002 (``ToolApproved(override_args=...)``): the refund runs for 2002, and 2002 is what
    the guards and the side-effect ledger saw -- a later refund of 1001 runs (it never ran),
    a later refund of 2002 is answered from the ledger (it must not run twice)."""
    from pydantic_ai import ToolApproved

    server, url = stub
    for body in (
        refund_call("1001"),
        completion("Refunded 2002.", usage=USAGE),
        refund_call("1001"),
        completion("Refunded 1001.", usage=USAGE),
        refund_call("2002"),
        completion("Refunded 2002 already.", usage=USAGE),
    ):
        server.push(body)
    dep = deployment(tmp_path, store=store_table(store_url))
    effects = Effects()
    reviewed = approval_agent(url, dep, effects)
    plain: Agent[None, str] = Agent(http_model(url), capabilities=[Loopwarden(dep)])

    @plain.tool_plain
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit(f"apply_refund {order_id}")
        return f"refund created for order {order_id}"

    try:
        paused = reviewed.run_sync("Refund order 1001")
        assert isinstance(paused.output, DeferredToolRequests)
        [asked] = paused.output.approvals
        edit = ToolApproved(override_args={"order_id": "2002", "reason": "x"})
        approved = reviewed.run_sync(
            message_history=paused.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={asked.tool_call_id: edit}),
        )
        assert tool_returns(approved.new_messages()) == ["refund created for order 2002"]
        later_1001 = plain.run_sync("Refund order 1001")
        later_2002 = plain.run_sync("Refund order 2002")
    finally:
        dep.close()
    assert effects.counts == {"apply_refund 2002": 1, "apply_refund 1001": 1}
    assert tool_returns(later_1001.all_messages()) == ["refund created for order 1001"]
    assert "2002" in tool_returns(later_2002.all_messages())[0]
    recs = records(tmp_path)
    assert [r["tools_executed"] for r in recs] == [0, 1, 1, 0]
    assert recs[3]["ledger_answers"][0]["source"] == "shared"


@pytest.mark.parametrize("kind", ["native", "prompted", "tool"])
def test_output_type_soft_stop_answers_in_the_output_type(
    tmp_path: Path, stub: tuple[Stub, str], kind: str
) -> None:
    """Issue 43 item 10: a soft stop's wrap-up turn answers the way the output type asks --
    the JSON of ``NativeOutput`` (the provider's response format) or ``PromptedOutput``, or
    the ``final_result`` call of a tool output -- and offers no other tool (for a tool output,
    the output tool is required); that answer is the run's output, not a ``GuardStopped``."""
    from pydantic_ai import NativeOutput, PromptedOutput

    server, url = stub
    for _ in range(3):
        server.push(completion(None, [LOOKUP_CALL], usage=USAGE))
    if kind == "tool":
        wrap_up = completion(None, [{"name": "final_result", "arguments": ORDER_ARGS}], usage=USAGE)
    else:
        wrap_up = completion(ORDER_ARGS, usage=USAGE)
    server.push(wrap_up)
    output: Any = {"native": NativeOutput(Order), "prompted": PromptedOutput(Order)}.get(
        kind, Order
    )
    result, _ = ask_for_order(tmp_path, url, output)
    assert result.output == Order(order_id="99999", status="not found")
    last = server.requests[-1]
    assert offered(last) == (["final_result"] if kind == "tool" else [])
    # the wrap-up instruction's "stop calling tools" comes with the way to answer that is left
    [note] = [str(m["content"]) for m in last["messages"] if "required structured form" in str(m)]
    assert ("calling final_result" if kind == "tool" else "as JSON") in note
    if kind == "tool":
        assert last.get("tool_choice") == "required"
    if kind == "native":
        assert last["response_format"]["type"] == "json_schema"
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["soft"] is True
    assert rec["final_answer_present"] is True
    assert json.loads(rec["final_answer"]) == json.loads(ORDER_ARGS)
    assert loopwarden_meta(result)["stopped_by"] == "repeat_call"


def test_a_cancelled_run_is_recorded_cancelled(tmp_path: Path) -> None:
    """Issue 43 item 9, in every adapter: the caller cancels the run during the model call:
    recorded ``cancelled``, not ``model_error``.  (A transport that reports the cancelled
    request as an error raised from the cancellation does not change that here: pydantic-ai's
    task group re-raises the cancellation itself.)"""
    asked = threading.Event()

    async def slow(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        asked.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError as exc:
            raise ConnectionError("the connection was closed: request cancelled") from exc
        return pm.ModelResponse(parts=[pm.TextPart("late")])

    dep = deployment(tmp_path)
    agent = Agent(FunctionModel(slow, model_name="gpt-4o-mini"), capabilities=[Loopwarden(dep)])

    try:
        cancel_when(lambda: agent.run("Where is 7?"), asked.is_set, asyncio.CancelledError)
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "cancelled"
