"""The otel plugin under the framework adapters: loopwarden's run span nests under the span that
is current when the framework's loop starts -- the caller's (LangChain, which writes no OTel
spans of its own) or the framework's own agent span (pydantic-ai's instrumentation).  Each model
call and each tool call has one GenAI span: loopwarden's where the framework writes none,
the framework's where it does (loopwarden then adds none)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from support.adapters import LOOKUP, Effects, Script
from support.otel import Telemetry

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.plugins.otel import OTel


@pytest.fixture
def telemetry() -> Any:
    t = Telemetry()
    yield t
    t.shutdown()


def _deployment(t: Telemetry) -> Deployment:
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "otel"]
    data["tools"] = {"query_order": {"read_only": True, "deterministic": True}}
    otel = OTel(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    return Deployment(
        parse_config(data, path="<otel-adapter-test>"), tools=[], plugins={"otel": otel}
    )


def _check_tree(t: Telemetry, parent_id: int, children: bool = True) -> None:
    """loopwarden's run span under ``parent_id``, its verdicts and stop; with ``children``
    its chat and execute_tool spans under it (without: the framework writes those, and
    loopwarden none)."""
    (root,) = [s for s in t.spans("invoke_agent") if s.instrumentation_scope.name == "loopwarden"]
    assert root.parent is not None and root.parent.span_id == parent_id
    assert root.attributes["loopwarden.termination"] == "repeat_call"
    events = [e.attributes["loopwarden.verdict.action"] for e in root.events]
    assert events[-1] == "stop"
    chats, tools = t.spans("chat"), t.spans("execute_tool")
    ours = [s for s in chats + tools if s.instrumentation_scope.name == "loopwarden"]
    if not children:
        assert ours == []
        return
    assert len([s for s in ours if s.name.startswith("chat")]) >= 3
    assert {s.name for s in ours if s.name.startswith("execute_tool")} == {
        "execute_tool query_order"
    }
    assert all(s.parent.span_id == root.context.span_id for s in ours)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_langchain_run_span_nests_under_the_callers_span(telemetry: Telemetry, mode: str) -> None:
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from test_adapter_langchain import make_model, make_tools

    from loopwarden.adapters.langchain import LoopwardenMiddleware

    dep = _deployment(telemetry)
    agent = create_agent(
        make_model(Script([[LOOKUP]], repeat=True)),
        make_tools(Effects()),
        middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")],
    )
    state = {"messages": [HumanMessage("Where is my order 99999?")]}
    tracer = telemetry.tracer_provider.get_tracer("app")
    try:
        with tracer.start_as_current_span("POST /support") as caller:
            if mode == "sync":
                agent.invoke(state)
            else:
                asyncio.run(agent.ainvoke(state))
    finally:
        dep.close()
    _check_tree(telemetry, caller.get_span_context().span_id)


def test_pydantic_ai_run_span_nests_under_the_frameworks_agent_span(
    telemetry: Telemetry,
) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from test_adapter_pydantic_ai import make_agent

    dep = _deployment(telemetry)
    agent = make_agent(Script([[LOOKUP]], repeat=True), Effects(), dep)
    agent.instrument = InstrumentationSettings(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    try:
        agent.run_sync("Where is my order 99999?")
    finally:
        dep.close()
    theirs = [
        s
        for s in telemetry.spans()
        if s.instrumentation_scope.name != "loopwarden" and s.parent is None
    ]
    assert len(theirs) == 1, [s.name for s in telemetry.spans()]
    _check_tree(telemetry, theirs[0].context.span_id, children=False)


def test_openai_agents_run_span_nests_under_the_callers_span(telemetry: Telemetry) -> None:
    """The Agents SDK traces through its own processors, not OpenTelemetry: loopwarden's span
    joins the caller's OTel trace (bridging the SDK's own traces is the SDK's processors' job)."""
    pytest.importorskip("agents")
    from agents import RunConfig
    from test_adapter_openai_agents import make_agent

    from loopwarden.adapters.openai_agents import LoopwardenRunner

    dep = _deployment(telemetry)
    runner = LoopwardenRunner(dep, model_name="gpt-4o-mini")
    agent = make_agent(Script([[LOOKUP]], repeat=True), Effects())
    tracer = telemetry.tracer_provider.get_tracer("app")
    try:
        with tracer.start_as_current_span("job") as caller:
            runner.run_sync(
                agent, "Where is my order 99999?", run_config=RunConfig(tracing_disabled=True)
            )
    finally:
        dep.close()
    _check_tree(telemetry, caller.get_span_context().span_id)


# -- one set of spans per model and tool call, usage summing to the truth (issue 32) ---------

HTTP_USAGE = {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}


def _push_lookup_then_answer(server: Any) -> None:
    from support.openai_stub import completion

    call = {"name": "query_order", "arguments": '{"order_id": "99999"}'}
    server.push(completion(None, [call], usage=HTTP_USAGE))
    server.push(completion("Order 99999 does not exist.", usage=HTTP_USAGE))


def _genai_counts(spans: list[Any]) -> tuple[int, int, int, int]:
    """Chat spans, tool spans, and the input / output tokens the chat spans sum to."""
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    return (
        len(chats),
        len(tools),
        sum(int(s.attributes.get("gen_ai.usage.input_tokens", 0)) for s in chats),
        sum(int(s.attributes.get("gen_ai.usage.output_tokens", 0)) for s in chats),
    )


def test_pydantic_ai_instrumented_run_has_one_span_per_call(
    telemetry: Telemetry, stub: Any
) -> None:
    """pydantic-ai's own instrumentation on, over HTTP: one chat span per model call and one
    execute_tool span per tool call (the framework's -- loopwarden writes none), the chat
    spans' ``gen_ai.usage.*`` summing to the true totals; loopwarden's invoke_agent span, the
    child of pydantic-ai's agent span, keeps the stop and carries no ``gen_ai.usage.*``."""
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from test_adapter_pydantic_ai import http_agent

    server, url = stub
    _push_lookup_then_answer(server)
    dep = _deployment(telemetry)
    agent = http_agent(url, dep, Effects())
    agent.instrument = InstrumentationSettings(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    try:
        agent.run_sync("Where is order 99999?")
    finally:
        dep.close()
    spans = telemetry.spans()
    assert _genai_counts(spans) == (2, 1, 80, 20), [(s.name, dict(s.attributes)) for s in spans]
    assert not [
        s
        for s in spans
        if s.instrumentation_scope.name == "loopwarden"
        and s.name.startswith(("chat", "execute_tool"))
    ]
    ours = next(s for s in spans if s.instrumentation_scope.name == "loopwarden")
    assert ours.name == "invoke_agent agent" == f"invoke_agent {agent.name}"
    assert ours.attributes["gen_ai.agent.name"] == "agent"
    assert ours.attributes["loopwarden.termination"] == "final_answer"
    assert "gen_ai.usage.input_tokens" not in ours.attributes
    assert ours.attributes["loopwarden.usage.input_tokens"] == 80
    parent = next(s for s in spans if s.context.span_id == ours.parent.span_id)
    assert parent.instrumentation_scope.name != "loopwarden"
    tokens = telemetry.points("gen_ai.client.token.usage")
    assert sum(p.sum for p in tokens) == 100  # the framework's histogram alone: no double count


def test_langchain_run_has_one_span_per_call_with_the_response_attributes(
    telemetry: Telemetry, stub: Any
) -> None:
    """LangChain writes no OTel spans of its own: loopwarden's are the GenAI spans -- one chat
    span per model call with ``gen_ai.response.finish_reasons``, one execute_tool span per tool
    call with ``gen_ai.tool.description``, the usage summing to the true totals."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from test_adapter_langchain import chat, query_order

    from loopwarden.adapters.langchain import LoopwardenMiddleware

    server, url = stub
    _push_lookup_then_answer(server)
    dep = _deployment(telemetry)
    agent = create_agent(chat(url), [query_order], middleware=[LoopwardenMiddleware(dep)])
    try:
        agent.invoke({"messages": [HumanMessage("Where is order 99999?")]})
    finally:
        dep.close()
    spans = telemetry.spans()
    assert _genai_counts(spans) == (2, 1, 80, 20)
    chats = telemetry.spans("chat")
    assert [s.attributes["gen_ai.response.finish_reasons"] for s in chats] == [
        ("tool_calls",),
        ("stop",),
    ]
    (tool_span,) = telemetry.spans("execute_tool")
    assert tool_span.attributes["gen_ai.tool.description"] == "Look up an order by its id."


def test_openai_agents_run_has_one_span_per_call(telemetry: Telemetry, stub: Any) -> None:
    """The Agents SDK traces through its own processors, not OpenTelemetry: loopwarden's spans
    are the GenAI spans, one per model call and per tool call (with its description), the usage
    summing to the true totals."""
    from agents import Agent, RunConfig
    from test_adapter_openai_agents import http_model, lookups

    from loopwarden.adapters.openai_agents import LoopwardenRunner

    server, url = stub
    _push_lookup_then_answer(server)
    dep = _deployment(telemetry)
    agent = Agent(name="shop", model=http_model(url), tools=[lookups(Effects())])
    try:
        LoopwardenRunner(dep).run_sync(
            agent, "Where is order 99999?", run_config=RunConfig(tracing_disabled=True)
        )
    finally:
        dep.close()
    assert _genai_counts(telemetry.spans()) == (2, 1, 80, 20)
    run_span = telemetry.one("invoke_agent")
    assert (
        run_span.name == "invoke_agent shop" and run_span.attributes["gen_ai.agent.name"] == "shop"
    )
    (tool_span,) = telemetry.spans("execute_tool")
    assert tool_span.attributes["gen_ai.tool.description"] == "Look up an order by its id."
