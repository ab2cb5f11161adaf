"""The otel plugin under the framework adapters: loopwarden's run span nests under the span that
is current when the framework's loop starts -- the caller's (LangChain, which writes no OTel
spans of its own) or the framework's own agent span (pydantic-ai's instrumentation)."""

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


def _check_tree(t: Telemetry, parent_id: int) -> None:
    root = t.one("invoke_agent loopwarden")
    assert root.parent is not None and root.parent.span_id == parent_id
    assert root.attributes["loopwarden.termination"] == "repeat_call"
    chats, tools = t.spans("chat"), t.spans("execute_tool")
    ours = [s for s in chats + tools if s.instrumentation_scope.name == "loopwarden"]
    assert len([s for s in ours if s.name.startswith("chat")]) >= 3
    assert {s.name for s in ours if s.name.startswith("execute_tool")} == {
        "execute_tool query_order"
    }
    assert all(s.parent.span_id == root.context.span_id for s in ours)
    events = [e.attributes["loopwarden.verdict.action"] for e in root.events]
    assert events[-1] == "stop"


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
    _check_tree(telemetry, theirs[0].context.span_id)


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
