"""OpenAI Agents SDK runs guarded by ``LoopwardenRunner``.

The scenarios' model is the SDK's own ``agents.testing.ScriptedModel`` whose steps respond
from the recorded call (``ModelCall.tools`` says whether tools are offered), playing
:class:`support.adapters.Script`; the tools are real SDK function tools.  The paths beyond
the basics -- MCP servers, handoffs, streaming, guardrails, sessions, concurrent runs -- run
as a user runs them: ``OpenAIChatCompletionsModel(AsyncOpenAI(base_url=...))`` over real HTTP
against the local stub server (:mod:`support.openai_stub`), and a real MCP server over stdio
(``tests/support/mcp_shop.py``, started by the SDK's ``MCPServerStdio``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    OpenAIChatCompletionsModel,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    RunContextWrapper,
    RunResult,
    SQLiteSession,
    function_tool,
    output_guardrail,
)
from agents.items import ItemHelpers, ToolCallOutputItem
from agents.mcp import MCPServerStdio
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from openai import AsyncOpenAI
from support.adapters import (
    FINAL,
    LOOKUP,
    REFUND_A,
    REFUND_B,
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
from support.openai_gated import gated
from support.openai_stream import push_stream
from support.openai_stub import completion, serve
from support.stores import store_table

from loopwarden.adapters import openai_agents
from loopwarden.adapters.openai_agents import LoopwardenRunner


def make_model(script: Script) -> ScriptedModel:
    def respond(call: ModelCall) -> ModelStep:
        text, calls = script.next(bool(call.tools))
        output: list[Any] = [function_call(n, a, call_id=i) for n, a, i in calls]
        if text:
            output.append(assistant_message(text))
        p, c = script.usage
        return ModelStep(
            output=output,
            usage=Usage(requests=1, input_tokens=p, output_tokens=c, total_tokens=p + c),
        )

    return ScriptedModel([ModelStep.respond(respond) for _ in range(40)])


def make_agent(script: Script, effects: Effects) -> Agent[Any]:
    @function_tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    @function_tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    @function_tool
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        effects.hit("delete_account")
        return f"account {user} deleted"

    return Agent(
        name="shop",
        instructions="Help the customer.",
        model=make_model(script),
        tools=[query_order, apply_refund, delete_account],
    )


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any) -> Outcome:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    agent = make_agent(script, effects)
    prompt = "Where is my order 99999?"
    config = RunConfig(tracing_disabled=True)
    try:
        result = (
            runner.run_sync(agent, prompt, run_config=config)
            if mode == "sync"
            else asyncio.run(runner.run(agent, prompt, run_config=config))
        )
    finally:
        dep.close()
    observations = [
        str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
    ]
    assert ItemHelpers.text_message_outputs(result.new_items)
    return Outcome(output=str(result.final_output), observations=observations, effects=effects)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario(tmp_path: Path, scenario: str, mode: str) -> None:
    check: Callable[..., None] = SCENARIOS[scenario]
    check(tmp_path, run_agent, mode)


@dataclass
class UserContext:
    user: str


def run_world(tmp_path: Path, script: Script, mode: str, world: World, user: str) -> Outcome:
    """One run of an agent whose tools nobody declared, ``user`` in the SDK's run context."""

    @function_tool
    def account_balance(ctx: RunContextWrapper[UserContext]) -> str:
        """The signed-in user's account balance."""
        return world.account_balance(ctx.context.user)

    agent: Agent[UserContext] = Agent(
        name="helper",
        instructions="Help the user.",
        model=make_model(script),
        tools=[function_tool(world.bash), function_tool(world.edit_file), account_balance],
    )
    dep = deployment(tmp_path)
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    kwargs: dict[str, Any] = dict(
        context=UserContext(user), run_config=RunConfig(tracing_disabled=True)
    )
    try:
        result = (
            runner.run_sync(agent, "Please help.", **kwargs)
            if mode == "sync"
            else asyncio.run(runner.run(agent, "Please help.", **kwargs))
        )
    finally:
        dep.close()
    observations = [
        str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
    ]
    return Outcome(
        output=str(result.final_output), observations=observations, effects=world.effects
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(WORLD_SCENARIOS))
def test_undeclared_tools(tmp_path: Path, scenario: str, mode: str) -> None:
    """Tools nobody declared run every time, for every user (support.adapters.World)."""
    WORLD_SCENARIOS[scenario](tmp_path, run_world, mode)


@pytest.mark.parametrize("mode", ["run", "streamed"])
def test_the_sdks_max_turns_raises_as_the_sdk_raises_it(tmp_path: Path, mode: str) -> None:
    """Issue 43 item 8: the bare ``Runner`` raises ``MaxTurnsExceeded`` at ``max_turns``, so
    the guarded runner does too (no canned answer in its place): the caller's ``except
    MaxTurnsExceeded`` runs, the run is recorded ``ended_by_framework`` with no answer, and
    the exception carries the run's guard."""
    from agents import MaxTurnsExceeded, Runner

    script = Script([[("query_order", {"order_id": str(n)})] for n in range(10)])
    with pytest.raises(MaxTurnsExceeded):  # the SDK's own behaviour, unguarded
        Runner.run_sync(make_agent(script, Effects()), "Orders?", max_turns=2, run_config=NO_TRACE)
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": str(n)})] for n in range(10)])
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    agent = make_agent(script, Effects())

    async def streamed() -> None:
        result = runner.run_streamed(agent, "Orders?", max_turns=2, run_config=NO_TRACE)
        async for _ in result.stream_events():
            pass

    try:
        with pytest.raises(MaxTurnsExceeded) as raised:
            if mode == "run":
                runner.run_sync(agent, "Orders?", max_turns=2, run_config=NO_TRACE)
            else:
                asyncio.run(streamed())
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and "max_turns" in rec["evidence"]["detail"]
    assert rec["evidence"]["raised"] == "MaxTurnsExceeded"
    assert rec["final_answer"] is None and rec["steps"] == 2
    guard = openai_agents.guard_of(raised.value)
    assert guard is not None and guard.run_id == rec["run_id"]
    assert guard.termination == "ended_by_framework"


def test_a_max_turns_handler_of_the_callers_still_answers(tmp_path: Path) -> None:
    """The SDK's way to answer at ``max_turns`` instead of raising -- an ``error_handlers``
    entry of the caller's -- still works; the record holds the answer the caller got."""
    from agents.run_error_handlers import RunErrorHandlerResult

    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": str(n)})] for n in range(10)])
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    try:
        result = runner.run_sync(
            make_agent(script, Effects()),
            "Orders?",
            max_turns=2,
            run_config=NO_TRACE,
            error_handlers={"max_turns": lambda _: RunErrorHandlerResult(final_output="Busy.")},
        )
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert result.final_output == "Busy." == rec["final_answer"]
    assert rec["termination"] == "ended_by_framework" and rec["final_answer_present"] is False


def test_a_model_error_is_recorded_and_raised(tmp_path: Path) -> None:
    dep = deployment(tmp_path)
    agent = Agent(name="shop", model=ScriptedModel([ModelStep.raise_error(RuntimeError("boom"))]))
    with pytest.raises(RuntimeError, match="boom"):
        LoopwardenRunner(dep, model_name="gpt-4o-mini").run_sync(
            agent, "Hi", run_config=RunConfig(tracing_disabled=True)
        )
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "model_error" and "boom" in rec["evidence"]["error"]


def test_notes_reach_the_model_input(tmp_path: Path) -> None:
    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": "99999"})]], repeat=True)
    agent = make_agent(script, effects)
    model = agent.model
    assert isinstance(model, ScriptedModel)
    LoopwardenRunner(dep, model_name="gpt-4o-mini").run_sync(
        agent, "Where?", run_config=RunConfig(tracing_disabled=True)
    )
    dep.close()
    last = model.calls[-1]
    notes = [
        i["content"]
        for i in last.input
        if isinstance(i, dict) and str(i.get("content", "")).startswith("[loopwarden] ")
    ]
    assert notes and "Stop calling tools" in notes[-1]
    assert last.tools == [] and last.handoffs == []


# -- over real HTTP: the SDK's OpenAIChatCompletionsModel against the local stub server ------

NO_TRACE = RunConfig(tracing_disabled=True)
MCP_SHOP = Path(__file__).parent / "support" / "mcp_shop.py"
USAGE = {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}


def http_model(url: str) -> OpenAIChatCompletionsModel:
    """The SDK's chat-completions model, talking HTTP to the stub at ``url``."""
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    return OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)


_call_ids = itertools.count()


def answer(text: str | None = None, *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A chat completion: ``text`` and/or tool ``calls`` (name, arguments), each call with an
    id of its own (the SDK refuses an id used before in the run)."""
    tool_calls = [{"name": n, "arguments": json.dumps(a)} for n, a in calls]
    body = completion(text, tool_calls or None, usage=USAGE)
    for call in body["choices"][0]["message"].get("tool_calls") or ():
        call["id"] = f"call_{next(_call_ids)}"
    return body


def streamed_call(call: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A tool call for :func:`support.openai_stream.push_stream`, with an id of its own."""
    name, arguments = call
    return {"name": name, "arguments": json.dumps(arguments), "id": f"call_{next(_call_ids)}"}


def lookups(effects: Effects) -> Any:
    @function_tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    return query_order


def test_mcp_server_tools_are_guarded_and_in_the_ledger(tmp_path: Path, store_url: str) -> None:
    """A real MCP server over stdio (the SDK's ``MCPServerStdio``): a refund declared a side
    effect, proposed twice in each of two runs, executes once; both runs record their calls,
    and the second run's are answered from the deployment's shared ledger."""
    log = tmp_path / "mcp.log"
    dep = deployment(tmp_path, store=store_table(store_url))
    with serve() as (stub, url):
        for _ in range(2):
            stub.push(answer(None, REFUND_A))
            stub.push(answer(None, REFUND_B))
            stub.push(answer("Refunded."))

        async def two_runs() -> list[RunResult]:
            params = {"command": sys.executable, "args": [str(MCP_SHOP), str(log)]}
            async with MCPServerStdio(params, client_session_timeout_seconds=60) as server:
                agent = Agent(name="shop", model=http_model(url), mcp_servers=[server])
                runner = LoopwardenRunner(dep)
                first = await runner.run(agent, "Refund 88231", run_config=NO_TRACE)
                second = await runner.run(agent, "Refund 88231 again", run_config=NO_TRACE)
                return [first, second]

        try:
            results = asyncio.run(two_runs())
        finally:
            dep.close()
    assert log.read_text().splitlines() == ["apply_refund 88231"]  # what the server really ran
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer", "final_answer"]
    assert [r["tool_calls"] for r in recs] == [2, 2] and [r["tools_executed"] for r in recs] == [
        1,
        0,
    ]
    assert len(recs[0]["ledger_answers"]) == 1 and len(recs[1]["ledger_answers"]) == 2
    outputs = [
        str(item.output) for item in results[1].new_items if isinstance(item, ToolCallOutputItem)
    ]
    assert len(outputs) == 2 and all("was not executed again" in o for o in outputs)


def test_every_agent_of_a_handoff_is_guarded(tmp_path: Path) -> None:
    """Triage hands off to support, whose lookups loop: the handoff is a recorded call, the
    repeats are answered from the first lookup, and the third stops the run (repeat_call,
    soft) -- support's wrap-up turn gets no tools."""
    effects = Effects()
    dep = deployment(tmp_path)
    support = Agent(name="support", tools=[lookups(effects)])
    with serve() as (stub, url):
        model = http_model(url)
        support.model = model
        triage = Agent(name="triage", model=model, handoffs=[support])
        stub.push(answer(None, ("transfer_to_support", {})))
        for _ in range(3):  # the third is the second repeat: the stop
            stub.push(answer(None, LOOKUP))
        stub.push(answer(FINAL))  # the wrap-up turn
        try:
            result = LoopwardenRunner(dep).run_sync(triage, "Where is 99999?", run_config=NO_TRACE)
        finally:
            dep.close()
        requests = stub.requests
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["stopped_by"] == "repeat_call"
    assert rec["soft"] is True and rec["steps"] == 5 and len(requests) == 5
    assert rec["tool_calls"] == 4 and rec["tools_executed"] == 2  # the handoff + one lookup
    assert effects.counts == {"query_order": 1}
    assert "tools" not in requests[-1] and "tools" in requests[1]
    assert result.last_agent.name == "support" and result.final_output == FINAL
    assert rec["final_answer"] == FINAL and rec["meta"]["agents"] == ["triage", "support"]


def test_the_sdks_tool_error_output_is_a_failure(tmp_path: Path) -> None:
    """A tool that raises: the SDK answers the model "An error occurred while running the
    tool..." (its default failure_error_function) -- loopwarden counts a failed call, so
    failure_streak stops the run after three failed rounds."""
    effects = Effects()

    @function_tool
    def legacy_lookup(order_id: str) -> str:
        """Look up an order in the old system."""
        effects.hit("legacy_lookup")
        raise ConnectionError("the old order system is down")

    dep = deployment(tmp_path)
    with serve() as (stub, url):
        for n in range(8):
            stub.push(answer(None, ("legacy_lookup", {"order_id": str(n)})))
        stub.push(answer("The order system is down."))
        agent = Agent(name="shop", model=http_model(url), tools=[legacy_lookup])
        try:
            result = LoopwardenRunner(dep).run_sync(agent, "Where is 7?", run_config=NO_TRACE)
        finally:
            dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "failure_streak" and rec["stopped_by"] == "failure_streak"
    assert effects.counts == {"legacy_lookup": 3}
    outputs = [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert outputs == ["An error occurred while running the tool. Please try again."] * 3


def test_each_result_says_how_its_own_run_ended(tmp_path: Path) -> None:
    """Two runs at once on one runner (the first is held at the server until the second has
    started): each result carries its own run -- id, stop, plugin, soft -- and so does
    ``runner.last_run`` in each task, whatever was started last."""
    effects = Effects()
    dep = deployment(tmp_path)
    started = threading.Event()
    with serve() as (stub_a, url_a), serve() as (stub_b, url_b):
        stub_a.responses.append(gated(answer(None, LOOKUP), wait=started))
        for _ in range(2):
            stub_a.push(answer(None, LOOKUP))
        stub_a.push(answer(FINAL))
        stub_b.responses.append(gated(answer("Hello!"), release=started))
        looping = Agent(name="a", model=http_model(url_a), tools=[lookups(effects)])
        polite = Agent(name="b", model=http_model(url_b))
        runner = LoopwardenRunner(dep)

        async def one(agent: Agent[Any]) -> tuple[Any, Any]:
            result = await runner.run(agent, "Hi", run_config=NO_TRACE)
            return result, runner.last_run

        async def both() -> list[tuple[Any, Any]]:
            first = asyncio.create_task(one(looping))
            await asyncio.sleep(0)  # let the first run start before the second
            return list(await asyncio.gather(first, one(polite)))

        try:
            (res_a, last_a), (res_b, last_b) = asyncio.run(both())
        finally:
            dep.close()
    recs = {r["run_id"]: r for r in records(tmp_path)}
    guard_a, guard_b = openai_agents.guard_of(res_a), openai_agents.guard_of(res_b)
    assert guard_a is not None and guard_b is not None
    assert recs[guard_a.run_id]["termination"] == "repeat_call" == guard_a.termination
    assert guard_a.stopped and guard_a.stopped_by == "repeat_call" and guard_a.soft is True
    assert recs[guard_b.run_id]["termination"] == "final_answer" == guard_b.termination
    assert not guard_b.stopped and guard_b.stopped_by is None
    assert guard_a.record()["run_id"] == guard_a.run_id != guard_b.run_id
    assert guard_a.info() == {
        "run_id": guard_a.run_id,
        "termination": "repeat_call",
        "stopped_by": "repeat_call",
        "soft": True,
        "final_answer_present": True,
    }
    assert last_a is guard_a.run and last_b is guard_b.run


def test_run_streamed_is_guarded(tmp_path: Path) -> None:
    """``run_streamed`` over a streaming HTTP endpoint: the looping lookups stop
    (repeat_call, soft), the events stream as usual, and the record is written by the time
    the events are consumed."""
    effects = Effects()
    dep = deployment(tmp_path)
    with serve() as (stub, url):
        for _ in range(3):
            push_stream(stub, None, [streamed_call(LOOKUP)], USAGE)
        push_stream(stub, FINAL, None, USAGE)
        agent = Agent(name="shop", model=http_model(url), tools=[lookups(effects)])

        async def consume() -> tuple[Any, int, dict[str, Any] | None]:
            result = LoopwardenRunner(dep).run_streamed(agent, "Where?", run_config=NO_TRACE)
            n = 0
            async for _event in result.stream_events():
                n += 1
            guard = openai_agents.guard_of(result)
            return result, n, guard.record() if guard and guard.outcome else None

        try:
            result, n_events, record = asyncio.run(consume())
        finally:
            dep.close()
        requests = stub.requests
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["soft"] is True and rec["steps"] == 4
    assert len(requests) == 4 and all(r.get("stream") is True for r in requests)
    assert effects.counts == {"query_order": 1} and n_events > 0
    assert result.final_output == FINAL == rec["final_answer"]
    assert record is not None and record["run_id"] == rec["run_id"]


def test_a_tripped_output_guardrail_is_recorded_without_the_blocked_text(tmp_path: Path) -> None:
    """The model's answer trips an output guardrail: the SDK raises, and the record says the
    SDK ended the run (which guardrail), with no final answer -- not the blocked text."""

    @output_guardrail
    def no_secrets(ctx: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> Any:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="secret" in output)

    dep = deployment(tmp_path)
    with serve() as (stub, url):
        stub.push(answer("The secret code is 4711."))
        agent = Agent(name="shop", model=http_model(url), output_guardrails=[no_secrets])
        with pytest.raises(OutputGuardrailTripwireTriggered) as caught:
            LoopwardenRunner(dep).run_sync(agent, "Code?", run_config=NO_TRACE)
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and rec["evidence"]["guardrail"] == (
        "no_secrets"
    )
    assert rec["final_answer"] is None and rec["final_answer_present"] is False
    assert "4711" not in json.dumps(rec)
    guard = openai_agents.guard_of(caught.value)
    assert guard is not None and guard.run_id == rec["run_id"] and not guard.stopped


def test_conversation_limits_count_across_an_sdk_session(tmp_path: Path) -> None:
    """Three runs in one SDK session with ``conversation_limits.max_turns = 2``: the session
    is one conversation, so the third run is refused before its model call."""
    dep = deployment(tmp_path, plugins_conversation_limits={"max_turns": 2})
    session = SQLiteSession("customer-7", str(tmp_path / "sessions.sqlite3"))
    with serve() as (stub, url):
        stub.push(answer("Hello."))
        stub.push(answer("Still here."))
        stub.push(answer("A third answer."))
        agent = Agent(name="shop", model=http_model(url))
        runner = LoopwardenRunner(dep)

        async def three_runs() -> list[Any]:
            return [
                (await runner.run(agent, q, session=session, run_config=NO_TRACE)).final_output
                for q in ("Hi", "Are you there?", "And now?")
            ]

        try:
            outputs = asyncio.run(three_runs())
        finally:
            dep.close()
            session.close()
        requests = stub.requests
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer", "final_answer", "max_turns"]
    assert recs[2]["stopped_by"] == "conversation_limits"
    assert recs[2]["evidence"]["key"] == "customer-7"
    assert len(requests) == 2 and outputs[:2] == ["Hello.", "Still here."]


def test_mcp_error_results_are_failures(tmp_path: Path) -> None:
    """An MCP tool that fails (the server answers ``isError``; the SDK passes its text on as
    the output): each call is a failed one, so failure_streak stops the run."""
    log = tmp_path / "mcp.log"
    dep = deployment(tmp_path)
    with serve() as (stub, url):
        for n in range(3):
            stub.push(answer(None, ("flaky_lookup", {"order_id": str(n)})))
        stub.push(answer("The old system is down."))  # the wrap-up turn

        async def one_run() -> RunResult:
            params = {"command": sys.executable, "args": [str(MCP_SHOP), str(log)]}
            async with MCPServerStdio(params, client_session_timeout_seconds=60) as server:
                agent = Agent(name="shop", model=http_model(url), mcp_servers=[server])
                return await LoopwardenRunner(dep).run(agent, "Order 7?", run_config=NO_TRACE)

        try:
            result = asyncio.run(one_run())
        finally:
            dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "failure_streak" and rec["tools_executed"] == 3
    assert log.read_text().splitlines() == [f"flaky_lookup {n}" for n in range(3)]
    assert result.final_output == "The old system is down."


def test_a_hard_stop_ends_a_streamed_run_without_a_model_call(tmp_path: Path) -> None:
    """Streamed calls reporting 3100 tokens each against a 7000-token budget: the third call
    is not made; the stream ends with loopwarden's best-effort answer as the final output."""
    effects = Effects()
    dep = deployment(tmp_path, max_total_tokens=7000)
    big = {"prompt_tokens": 3000, "completion_tokens": 100, "total_tokens": 3100}
    with serve() as (stub, url):
        for n in range(2):
            push_stream(stub, None, [streamed_call(("query_order", {"order_id": str(n)}))], big)
        agent = Agent(name="shop", model=http_model(url), tools=[lookups(effects)])

        async def consume() -> Any:
            result = LoopwardenRunner(dep).run_streamed(agent, "Where?", run_config=NO_TRACE)
            async for _event in result.stream_events():
                pass
            return result

        try:
            result = asyncio.run(consume())
        finally:
            dep.close()
        assert len(stub.requests) == 2
    rec = only_record(tmp_path)
    assert rec["termination"] == "max_tokens" and rec["soft"] is False
    assert result.final_output == rec["final_answer"]
    assert str(result.final_output).startswith("Here is the last information I found")
    guard = openai_agents.guard_of(result)
    assert guard is not None and guard.stopped_by == "token_budget"


def test_a_run_state_resumes_with_the_approved_call_run_once(
    tmp_path: Path, store_url: str
) -> None:
    """Issue 32: an interrupted run (a tool with ``needs_approval``) is recorded as paused,
    its call not run; resuming its ``RunState`` with the call approved (over real HTTP) runs
    the refund once, through the guards, in a new run that says which run it resumed.  The
    same state serialised and resumed again by a second runner on another deployment sharing
    the store (another worker) is answered from the ledger: the refund does not run twice.
    Restored against the unguarded agent instead, it is refused (a TypeError says how)."""
    from agents import RunState

    effects = Effects()

    @function_tool(needs_approval=True)
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund created for order {order_id}"

    deps = [deployment(tmp_path, store=store_table(store_url)) for _ in range(2)]
    with serve() as (stub, url):
        stub.push(answer(None, REFUND_A))
        stub.push(answer("Refunded."))
        stub.push(answer("Refunded."))
        agent = Agent(name="shop", model=http_model(url), tools=[apply_refund])
        runner, other = LoopwardenRunner(deps[0]), LoopwardenRunner(deps[1])

        async def three_runs() -> tuple[RunResult, RunResult, RunResult]:
            first = await runner.run(agent, "Refund 88231", run_config=NO_TRACE)
            assert first.interruptions and effects.counts == {}
            state = first.to_state()
            state.approve(first.interruptions[0])
            saved = state.to_string()
            resumed = await runner.run(agent, state, run_config=NO_TRACE)
            foreign = await RunState.from_string(agent, saved)  # bound to the unguarded agent
            with pytest.raises(TypeError, match=r"runner\.resumable"):
                await other.run(agent, foreign, run_config=NO_TRACE)
            restored = await RunState.from_string(other.resumable(agent), saved)
            return first, resumed, await other.run(agent, restored, run_config=NO_TRACE)

        try:
            first, resumed, again = asyncio.run(three_runs())
        finally:
            for d in deps:
                d.close()
    assert effects.counts == {"apply_refund": 1}
    assert resumed.final_output == "Refunded." == again.final_output
    paused, approved, replayed = records(tmp_path)
    assert paused["termination"] == "ended_by_framework" and paused["tools_executed"] == 0
    assert paused["evidence"]["interrupted"] == [first.interruptions[0].raw_item.call_id]
    assert approved["termination"] == "final_answer" and approved["tools_executed"] == 1
    assert approved["meta"]["resumed_from"] == paused["run_id"]
    assert approved["tokens"]["total"] == USAGE["total_tokens"]  # the paused answer: run 1's
    assert "adapter" not in approved["evidence"]
    guard = openai_agents.guard_of(resumed)
    assert guard is not None and guard.run_id == approved["run_id"]
    assert replayed["tools_executed"] == 0 and replayed["ledger_answers"][0]["source"] == "shared"


def test_last_run_is_each_threads_own(tmp_path: Path) -> None:
    """``run_sync`` in two threads at once (the first held at its server until the second
    has started): ``runner.last_run`` in each thread is that thread's run."""
    effects = Effects()
    dep = deployment(tmp_path)
    started, a_asked = threading.Event(), threading.Event()
    seen: dict[str, tuple[Any, Any]] = {}
    with serve() as (stub_a, url_a), serve() as (stub_b, url_b):
        stub_a.responses.append(gated(answer(None, LOOKUP), wait=started, release=a_asked))
        stub_a.push(answer("Not found."))
        stub_b.responses.append(gated(answer("Hello!"), release=started))
        agents = {
            "a": Agent(name="a", model=http_model(url_a), tools=[lookups(effects)]),
            "b": Agent(name="b", model=http_model(url_b)),
        }
        runner = LoopwardenRunner(dep)

        def work(name: str) -> None:
            result = runner.run_sync(agents[name], "Hi", run_config=NO_TRACE)
            seen[name] = (result, runner.last_run)

        first = threading.Thread(target=work, args=("a",))
        first.start()
        try:
            assert a_asked.wait(60)  # a's run has started and waits at its server
            work("b")
            first.join(60)
        finally:
            dep.close()
    for name in ("a", "b"):
        result, last = seen[name]
        guard = openai_agents.guard_of(result)
        assert guard is not None and last is guard.run
    assert seen["a"][1] is not seen["b"][1]


# -- every ending recorded (issue 32) ---------------------------------------------------------


def test_a_tool_exception_that_ends_the_run_is_recorded_as_error(tmp_path: Path) -> None:
    """``failure_error_function=None``: the tool's exception ends the SDK's run.  The run is
    recorded ``error`` (``run_stopped`` sent once), and the exception says so:
    ``guard_of(exc).termination == "error"``."""
    from loopwarden import signals

    @function_tool(failure_error_function=None)
    def legacy_lookup(order_id: str) -> str:
        """Look up an order in the old system."""
        raise ConnectionError("the old order system is down")

    dep = deployment(tmp_path)
    stopped: list[str] = []
    dep.connect(signals.run_stopped, lambda run, record, **_: stopped.append(record["run_id"]))
    with serve() as (stub, url):
        stub.push(answer(None, ("legacy_lookup", {"order_id": "7"})))
        agent = Agent(name="shop", model=http_model(url), tools=[legacy_lookup])
        try:
            with pytest.raises(Exception) as raised:
                LoopwardenRunner(dep).run_sync(agent, "Where is 7?", run_config=NO_TRACE)
        finally:
            dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "error"
    assert "the old order system is down" in rec["evidence"]["error"]
    assert stopped == [rec["run_id"]]
    guard = openai_agents.guard_of(raised.value)
    assert guard is not None and guard.termination == "error" and guard.run_id == rec["run_id"]


@pytest.mark.parametrize("where", ["model", "tool"])
def test_a_cancelled_run_is_recorded_cancelled(tmp_path: Path, where: str) -> None:
    """The caller cancels the run while the model call is under way (the server holds it) or
    while a tool runs: recorded ``cancelled``, as the core loop and LangChain record it."""
    started = threading.Event()

    @function_tool
    async def slow_lookup(order_id: str) -> str:
        """Look up an order (slowly)."""
        started.set()
        await asyncio.sleep(30)
        return "found"

    dep = deployment(tmp_path)
    with serve() as (stub, url):
        if where == "model":
            stub.push_hang(30.0)
        else:
            stub.push(answer(None, ("slow_lookup", {"order_id": "7"})))
        agent = Agent(name="shop", model=http_model(url), tools=[slow_lookup])
        runner = LoopwardenRunner(dep)

        def ready() -> bool:
            return started.is_set() if where == "tool" else bool(stub.requests)

        try:
            cancel_when(
                lambda: runner.run(agent, "Where is 7?", run_config=NO_TRACE),
                ready,
                asyncio.CancelledError,
            )
        finally:
            dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "cancelled"


class ConvertingModel(OpenAIChatCompletionsModel):
    """The SDK's chat-completions model behind a transport that turns the caller's
    cancellation into a connection error (raised from the ``CancelledError``) -- what the
    SDK's retry logic calls an abort-like error and never retries."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_response(*args, **kwargs)
        except asyncio.CancelledError as exc:
            raise ConnectionError("the connection was closed: the request was cancelled") from exc


def test_a_cancellation_the_transport_reports_as_an_error_is_recorded_cancelled(
    tmp_path: Path,
) -> None:
    """Issue 43 item 9: the caller cancels the run during the model call and the model's
    transport raises a connection error from the cancellation: the caller gets that error as
    the SDK raised it, and the run is recorded ``cancelled`` -- not ``model_error``."""
    dep = deployment(tmp_path)
    with serve() as (stub, url):
        stub.push_hang(30.0)
        client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        model = ConvertingModel(model="gpt-4o-mini", openai_client=client)
        agent = Agent(name="shop", model=model)
        runner = LoopwardenRunner(dep)

        try:
            raised = cancel_when(
                lambda: runner.run(agent, "Where is 7?", run_config=NO_TRACE),
                lambda: bool(stub.requests),
                ConnectionError,
            )
        finally:
            dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "cancelled"
    assert "ConnectionError" in rec["evidence"]["error"]
    guard = openai_agents.guard_of(raised)
    assert guard is not None and guard.termination == "cancelled"


def test_the_next_run_may_start_from_the_agent_a_handoff_left(tmp_path: Path) -> None:
    """Issue 32: after a handoff, the SDK's pattern for the next turn is
    ``runner.run(result.last_agent, result.to_input_list() + [...])``.  ``last_agent`` is the
    finished run's guarded copy: the next run guards the agent it copies, calls the model and
    its tools, and is recorded with what it ran -- not answered with the last run's answer."""
    effects = Effects()
    dep = deployment(tmp_path)
    support = Agent(name="support", tools=[lookups(effects)])
    with serve() as (stub, url):
        model = http_model(url)
        support.model = model
        triage = Agent(name="triage", model=model, handoffs=[support])
        stub.push(answer(None, ("transfer_to_support", {})))
        stub.push(answer("Support here."))
        stub.push(answer(None, LOOKUP))
        stub.push(answer(FINAL))
        runner = LoopwardenRunner(dep)

        async def two_turns() -> RunResult:
            first = await runner.run(triage, "Hi", run_config=NO_TRACE)
            follow_up = [*first.to_input_list(), {"role": "user", "content": "Where is 99999?"}]
            return await runner.run(first.last_agent, follow_up, run_config=NO_TRACE)

        try:
            second = asyncio.run(two_turns())
        finally:
            dep.close()
        requests = len(stub.requests)
    assert second.final_output == FINAL and requests == 4
    assert effects.counts == {"query_order": 1}
    first_rec, second_rec = records(tmp_path)
    assert first_rec["termination"] == second_rec["termination"] == "final_answer"
    assert second_rec["meta"]["agents"] == ["support"] and second_rec["tools_executed"] == 1
    assert second_rec["steps"] == 2


def _responses_body(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses API answer (what ``OpenAIResponsesModel`` reads) with ``output`` items."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-4o-mini",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "usage": {
            "input_tokens": 40,
            "output_tokens": 10,
            "total_tokens": 50,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def test_a_hosted_tool_call_is_recorded(tmp_path: Path) -> None:
    """Issue 32: a hosted tool (``WebSearchTool``) runs on the provider's side during the
    model call -- over real HTTP, the Responses API answer carries the finished
    ``web_search_call``: no hook could refuse it, and the record says it ran
    (``evidence.hosted_tools``)."""
    from agents import OpenAIResponsesModel, WebSearchTool

    dep = deployment(tmp_path)
    with serve() as (stub, url):
        stub.push(
            _responses_body(
                [
                    {
                        "type": "web_search_call",
                        "id": "ws_1",
                        "status": "completed",
                        "action": {"type": "search", "query": "order 7"},
                    },
                    {
                        "type": "message",
                        "id": "msg_1",
                        "role": "assistant",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": "Found it.", "annotations": []}
                        ],
                    },
                ]
            )
        )
        client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        model = OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)
        agent = Agent(name="shop", model=model, tools=[WebSearchTool()])
        try:
            result = LoopwardenRunner(dep).run_sync(agent, "Where is 7?", run_config=NO_TRACE)
        finally:
            dep.close()
    assert result.final_output == "Found it."
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer"
    assert rec["evidence"]["hosted_tools"] == [{"type": "web_search_call", "id": "ws_1"}]
