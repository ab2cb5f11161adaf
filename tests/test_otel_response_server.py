"""The OpenTelemetry attributes backends join on (issue 43, item 11): ``gen_ai.response.id``
on ``chat`` spans -- the provider's id of the answer, which its own logs and billing carry --
and ``server.address`` / ``server.port`` of the endpoint the model calls (``[model]
base_url``), on the spans and on the GenAI metrics' points.

Real parts: the built-in OpenAI client over real HTTP to a local OpenAI-compatible server,
answering whole and streamed, and the real OpenTelemetry SDK with in-memory exporters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.openai_stream import push_stream
from support.openai_stub import Stub, completion, stub_model
from support.otel import Telemetry

from loopwarden import Deployment, FakeClock
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.streaming import RunEnd
from loopwarden.events import ModelRequest, ModelResponse
from loopwarden.models.openai_chat import OpenAIChatModel
from loopwarden.plugins.otel import CAPTURE_ENV, OTel, OTelSettings

LOOKUP = [{"name": "query_order", "arguments": '{"order_id": "88231"}'}]
USAGE = {"prompt_tokens": 300, "completion_tokens": 20}
ANSWER = "Order 88231 was signed for on 2026-06-22."


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    t = Telemetry()
    yield t
    t.shutdown()


def _deployment(url: str, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    cfg = parse_config(
        {"model": stub_model(url, monkeypatch), "plugins": {"enabled": ["max_steps", "otel"]}},
        path="<test>",
    )
    otel = OTel(
        OTelSettings(),
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    return Deployment(cfg, tools=shop_tools(), plugins={"otel": otel}, clock=FakeClock())


def _answered(body: dict[str, Any], response_id: str) -> dict[str, Any]:
    body["id"] = response_id
    return body


@pytest.mark.parametrize("mode", ["whole", "streamed"])
def test_chat_spans_carry_the_response_id_and_the_endpoint(
    stub: tuple[Stub, str],
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    state, url = stub
    dep = _deployment(url, telemetry, monkeypatch)
    try:
        if mode == "whole":
            state.push(_answered(completion(None, LOOKUP, USAGE), "chatcmpl-first-7"))
            state.push(_answered(completion(ANSWER, None, USAGE), "chatcmpl-second-8"))
            run = dep.run("where is my order 88231?")
            outcome = run.outcome
        else:
            push_stream(state, None, LOOKUP, USAGE, response_id="chatcmpl-first-7")
            push_stream(state, ANSWER, None, USAGE, response_id="chatcmpl-second-8")
            events = list(dep.stream("where is my order 88231?"))
            end = events[-1]
            assert isinstance(end, RunEnd)
            outcome = end.outcome
    finally:
        dep.close()
    assert outcome is not None and outcome.termination == "final_answer"
    assert state.requests[0].get("stream", False) is (mode == "streamed")

    chats = telemetry.spans("chat")
    assert [s.attributes.get("gen_ai.response.id") for s in chats] == [  # type: ignore[union-attr]
        "chatcmpl-first-7",
        "chatcmpl-second-8",
    ]
    port = urlsplit(url).port
    for span in chats:
        attrs = dict(span.attributes or {})
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["server.port"] == port
    # the GenAI metrics' points carry the endpoint too (not the per-answer id: cardinality)
    for name in ("gen_ai.client.operation.duration", "gen_ai.client.token.usage"):
        points = telemetry.points(name)
        assert points
        for point in points:
            assert point.attributes["server.address"] == "127.0.0.1"
            assert point.attributes["server.port"] == port
            assert "gen_ai.response.id" not in point.attributes


def test_the_client_reports_the_answers_id(stub: tuple[Stub, str]) -> None:
    """:class:`ModelResponse` carries the provider's id (``id``); a server that sends none
    leaves it None."""
    state, url = stub
    model = OpenAIChatModel(model="stub-model", api_key="sk-stub", base_url=url, max_retries=0)
    state.push(_answered(completion(ANSWER), "chatcmpl-xyz"))
    no_id = completion(ANSWER)
    del no_id["id"]
    state.push(no_id)
    request = ModelRequest(messages=[{"role": "user", "content": "hi"}], tools=[])
    assert model.complete(request).id == "chatcmpl-xyz"
    assert model.complete(request).id is None
    assert model.base_url.rstrip("/") == url


def test_a_model_without_an_endpoint_writes_no_server_attributes(
    telemetry: Telemetry,
) -> None:
    """The scripted model calls no server, and its answers have no provider id."""
    otel = OTel(
        OTelSettings(),
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    cfg = parse_config({"plugins": {"enabled": ["max_steps", "otel"]}}, path="<test>")
    dep = Deployment(cfg, tools=shop_tools(), plugins={"otel": otel}, clock=FakeClock())
    try:
        run = dep.run(scenario="refund")
    finally:
        dep.close()
    assert run.model_url is None
    chats = telemetry.spans("chat")
    assert chats
    for span in chats:
        attrs = dict(span.attributes or {})
        assert not {"server.address", "server.port", "gen_ai.response.id"} & set(attrs)


def test_server_attributes_from_a_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopwarden.plugins._otel import server_attributes

    assert server_attributes("https://dashscope.aliyuncs.com/compatible-mode/v1") == {
        "server.address": "dashscope.aliyuncs.com",
        "server.port": 443,
    }
    assert server_attributes("http://user:pw@[::1]:8000/v1?key=s") == {
        "server.address": "::1",
        "server.port": 8000,
    }
    assert server_attributes("http://vllm.internal/v1") == {
        "server.address": "vllm.internal",
        "server.port": 80,
    }
    assert server_attributes(None) == {} and server_attributes("http://[::1/v1") == {}
    # no base_url: the openai package's endpoint
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    default = OpenAIChatModel(model="gpt-4o-mini", api_key="sk-x").base_url
    assert server_attributes(default) == {"server.address": "api.openai.com", "server.port": 443}


def test_model_response_id_is_optional_and_last() -> None:
    """A compatible field: responses built positionally or without it are as before."""
    response = ModelResponse("hi", [], None, "stop", "m")
    assert response.id is None
    assert ModelResponse(content="x", id="r-1").id == "r-1"
