"""The OpenAI-compatible client streaming over real HTTP (issue 22 item 2): the real
``openai`` package against the local chat-completions stub sending server-sent events
(:mod:`support.openai_stream`, hostile streams from :mod:`support.streams`).  No mocks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.openai_stream import push_stream, stream_chunks
from support.openai_stub import Stub, completion
from support.streams import (
    events_of,
    push_endless_text,
    push_garbage,
    push_sse,
    push_stalled,
    push_truncated,
)

from loopwarden import Deployment, ModelError, ModelRequest, ModelResponse
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.streaming import ResponseCut, RunEnd, TextDelta
from loopwarden.models.openai_chat import OpenAIChatModel

USAGE = {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}
LOOKUP = {"name": "query_order", "arguments": '{"order_id": "88231"}'}
ANSWER = "Order 88231 was signed for on 2026-06-22."
MODES = ["sync", "async"]


def make_model(base_url: str, **kw: Any) -> OpenAIChatModel:
    return OpenAIChatModel(
        model="stub-model", api_key="sk-test", base_url=base_url, max_retries=0, **kw
    )


def request() -> ModelRequest:
    return ModelRequest(
        messages=[{"role": "user", "content": "where is 88231?"}],
        tools=[
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
    )


def stream_items(model: OpenAIChatModel, mode: str) -> list[str | ModelResponse]:
    if mode == "sync":
        return list(model.stream(request()))

    async def collect() -> list[str | ModelResponse]:
        return [item async for item in model.astream(request())]

    return asyncio.run(collect())


def deployment(model: OpenAIChatModel, **tables: Any) -> Deployment:
    cfg = parse_config({"plugins": {"enabled": ["max_steps", "no_progress"]}, **tables})
    return Deployment(cfg, model=model, tools=shop_tools())


# -- the assembled response equals the unstreamed one ------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_stream_assembles_the_unstreamed_response(stub: tuple[Stub, str], mode: str) -> None:
    state, url = stub
    calls = [LOOKUP, {"name": "search_knowledge", "arguments": '{"query": "七天无理由退货"}'}]
    state.push(completion("Let me check.", calls, USAGE))
    push_stream(state, "Let me check.", calls, USAGE)
    model = make_model(url)
    whole = model.complete(request())
    items = stream_items(model, mode)
    assert items[:-1] == ["Let ", "me c", "heck", "."]  # the text as it arrived
    streamed = items[-1]
    assert isinstance(streamed, ModelResponse)
    assert streamed == whole
    sent = state.requests[1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert "stream" not in state.requests[0]


@pytest.mark.parametrize("mode", MODES)
def test_server_that_does_not_stream_answers_as_one_delta(
    stub: tuple[Stub, str], mode: str
) -> None:
    """An "OpenAI-compatible" server that ignores ``stream`` and sends one JSON completion."""
    state, url = stub
    state.push(completion("Let me check.", [LOOKUP], USAGE))
    state.push(completion("Let me check.", [LOOKUP], USAGE))
    model = make_model(url)
    whole = model.complete(request())
    items = stream_items(model, mode)
    assert items == ["Let me check.", whole]
    assert state.requests[1]["stream"] is True


@pytest.mark.parametrize("mode", MODES)
def test_streamed_http_run_ends_with_the_unstreamed_record(
    stub: tuple[Stub, str], mode: str
) -> None:
    state, url = stub
    state.push(completion("Checking.", [LOOKUP], USAGE))
    state.push(completion(ANSWER, None, USAGE))
    push_stream(state, "Checking.", [LOOKUP], USAGE)
    push_stream(state, ANSWER, None, USAGE)
    with deployment(make_model(url)) as dep:
        plain = dep.run("where is 88231?").record()
        events = events_of(dep, mode, user="where is 88231?")
    end = events[-1]
    assert isinstance(end, RunEnd)
    ignore = ("run_id", "elapsed_s", "conversation_id")
    assert {k: v for k, v in end.record.items() if k not in ignore} == {
        k: v for k, v in plain.items() if k not in ignore
    }
    assert end.record["tokens"]["total"] == 2 * USAGE["total_tokens"]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Checking." + ANSWER


# -- hostile streams: the defined outcomes of malformed output ---------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_stream_that_breaks_off_is_a_model_error(stub: tuple[Stub, str], mode: str) -> None:
    state, url = stub
    push_truncated(state)
    with pytest.raises(ModelError) as err:
        stream_items(make_model(url), mode)
    assert err.value.kind == "connection"  # as a body that breaks off unstreamed
    push_truncated(state)
    with deployment(make_model(url)) as dep:
        events = events_of(dep, mode, user="where?")
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "model_error"
    assert rec["evidence"]["kind"] == "connection"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "The orde"


def test_stream_without_a_finish_is_malformed(stub: tuple[Stub, str]) -> None:
    """A stream that ends cleanly (``[DONE]``) but never said it was finished."""
    state, url = stub
    chunks = stream_chunks("half an answer", None, None)[:-1]  # no finish chunk
    push_sse(state, [*chunks, "[DONE]"])
    with pytest.raises(ModelError) as err:
        list(make_model(url).stream(request()))
    assert err.value.kind == "malformed" and "finish" in str(err.value)


@pytest.mark.parametrize("mode", MODES)
def test_garbage_chunk_is_malformed(stub: tuple[Stub, str], mode: str) -> None:
    state, url = stub
    push_garbage(state)
    with pytest.raises(ModelError) as err:
        stream_items(make_model(url), mode)
    assert err.value.kind == "malformed"
    assert "sk-test" not in str(err.value)


def test_wrong_shaped_chunk_is_malformed(stub: tuple[Stub, str]) -> None:
    state, url = stub
    bad = {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": {"not": "text"}}, "finish_reason": None}],
    }
    push_sse(state, [bad, "[DONE]"])
    with pytest.raises(ModelError) as err:
        list(make_model(url).stream(request()))
    assert err.value.kind == "malformed"


@pytest.mark.parametrize("mode", MODES)
def test_stream_without_usage_is_estimated(stub: tuple[Stub, str], mode: str) -> None:
    state, url = stub
    push_stream(state, ANSWER, None, None)
    items = stream_items(make_model(url), mode)
    response = items[-1]
    assert isinstance(response, ModelResponse) and response.content == ANSWER
    assert response.usage is not None and response.usage.completion > 0


@pytest.mark.parametrize("mode", MODES)
def test_stalled_stream_times_out(stub: tuple[Stub, str], mode: str) -> None:
    state, url = stub
    push_stalled(state)
    with pytest.raises(ModelError) as err:
        stream_items(make_model(url, timeout_s=1.0), mode)
    assert err.value.kind == "timeout"


# -- a runaway answer over HTTP: cut mid-stream, the connection closed ---------------------------


@pytest.mark.parametrize("mode", MODES)
def test_endless_repeating_answer_is_cut_and_the_connection_closed(
    stub: tuple[Stub, str], mode: str
) -> None:
    state, url = stub
    push_endless_text(state)
    push_stream(state, ANSWER, None, USAGE)  # the soft stop's wrap-up turn
    with deployment(make_model(url, timeout_s=30.0)) as dep:
        events = events_of(dep, mode, user="where is 88231?")
    cut = [e for e in events if isinstance(e, ResponseCut)]
    assert [(c.reason, c.by) for c in cut] == [("verdict", "no_progress")]
    rec = events[-1].record  # type: ignore[union-attr]
    assert rec["termination"] == "no_progress" and rec["evidence"]["count"] == 4
    assert rec["final_answer"] == ANSWER
    assert len(state.requests) == 2 and state.requests[1]["tool_choice"] == "none"
    # the endless stream ended because the client left, long before any deadline
    assert state.bytes_sent < 1_000_000
