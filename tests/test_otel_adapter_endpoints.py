"""``gen_ai.response.id`` and ``server.address`` / ``server.port`` on the ``chat`` spans of
framework runs (issue 43, item 11): the id is the provider's (LangChain's message carries
it, the Agents SDK's ``ModelResponse.response_id``), the endpoint the framework's model
calls.  Real parts: a real LangChain ``ChatOpenAI`` and a real Agents SDK
``OpenAIChatCompletionsModel`` over real HTTP to the local OpenAI-compatible stub server,
and the real OpenTelemetry SDK with in-memory exporters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("opentelemetry.sdk")

from support.openai_stub import Stub, completion
from support.otel import Telemetry

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.plugins.otel import CAPTURE_ENV, OTel

LOOKUP = [{"name": "query_order", "arguments": '{"order_id": "88231"}'}]
ANSWER = "Order 88231 was signed for on 2026-06-22."


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    t = Telemetry()
    yield t
    t.shutdown()


def _deployment(t: Telemetry) -> Deployment:
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "otel"]
    data["tools"] = {"query_order": {"read_only": True, "deterministic": True}}
    otel = OTel(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    return Deployment(
        parse_config(data, path="<otel-endpoint-test>"), tools=[], plugins={"otel": otel}
    )


def _answers(state: Stub, prefix: str) -> None:
    first = completion(None, LOOKUP, {"prompt_tokens": 30, "completion_tokens": 5})
    first["id"] = f"chatcmpl-{prefix}-1"
    second = completion(ANSWER, None, {"prompt_tokens": 40, "completion_tokens": 9})
    second["id"] = f"chatcmpl-{prefix}-2"
    state.push(first)
    state.push(second)


def _check(t: Telemetry, url: str, prefix: str) -> None:
    chats = [s for s in t.spans("chat") if s.instrumentation_scope.name == "loopwarden"]
    assert [s.attributes.get("gen_ai.response.id") for s in chats] == [  # type: ignore[union-attr]
        f"chatcmpl-{prefix}-1",
        f"chatcmpl-{prefix}-2",
    ]
    port = urlsplit(url).port
    for span in chats:
        attrs = dict(span.attributes or {})
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["server.port"] == port


def test_langchain_chat_spans_carry_the_answers_id_and_the_endpoint(
    stub: tuple[Stub, str], telemetry: Telemetry
) -> None:
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from loopwarden.adapters.langchain import LoopwardenMiddleware

    state, url = stub
    _answers(state, "lc")

    @tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        return f"order {order_id}: signed for"

    dep = _deployment(telemetry)
    model = ChatOpenAI(model="stub-model", base_url=url, api_key="sk-stub", max_retries=0)
    agent = create_agent(model, [query_order], middleware=[LoopwardenMiddleware(dep)])
    try:
        agent.invoke({"messages": [HumanMessage("Where is my order 88231?")]})
    finally:
        dep.close()
    _check(telemetry, url, "lc")


def test_agents_sdk_chat_spans_carry_the_response_id_and_the_endpoint(
    telemetry: Telemetry,
) -> None:
    """The SDK's default model speaks the Responses API, whose every answer has an id (a
    chat-completions model's ``ModelResponse.response_id`` is None): served here by the
    gateway's scripted upstream, over real HTTP."""
    pytest.importorskip("agents")
    from agents import Agent, OpenAIResponsesModel, RunConfig, function_tool
    from openai import AsyncOpenAI
    from support.gateway import scenarios, serve

    from loopwarden.adapters.openai_agents import LoopwardenRunner
    from loopwarden.gateway.scripted import ScriptedUpstream

    @function_tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        return f"order {order_id}: signed for"

    @function_tool
    def search_knowledge(query: str) -> str:
        """Search the policies."""
        return "7-day no-reason returns"

    @function_tool
    def get_current_time() -> str:
        """The time now."""
        return "2026-06-25 10:30"

    @function_tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        return f"refund for {order_id} created"

    dep = _deployment(telemetry)
    with serve(ScriptedUpstream(scenarios(("refund",)))) as url:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-stub", max_retries=0)
        agent: Any = Agent(
            name="shop",
            instructions="Help the customer.",
            model=OpenAIResponsesModel(model="scenario:refund", openai_client=client),
            tools=[query_order, search_knowledge, get_current_time, apply_refund],
        )
        try:
            asyncio.run(
                LoopwardenRunner(dep).run(
                    agent, "Where is my order 88231?", run_config=RunConfig(tracing_disabled=True)
                )
            )
        finally:
            dep.close()
    chats = [s for s in telemetry.spans("chat") if s.instrumentation_scope.name == "loopwarden"]
    ids = [s.attributes.get("gen_ai.response.id") for s in chats]  # type: ignore[union-attr]
    assert chats and all(isinstance(i, str) and i.startswith("resp_") for i in ids)
    assert len(set(ids)) == len(ids)
    port = urlsplit(url).port
    for span in chats:
        attrs = dict(span.attributes or {})
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["server.port"] == port
