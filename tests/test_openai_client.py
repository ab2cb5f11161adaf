"""The OpenAI-compatible client over real HTTP, against a local chat-completions stub.

No mocks of the ``openai`` package: a stdlib HTTP server on 127.0.0.1 speaks the
chat-completions wire format, and the real client talks to it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support.openai_stub import Stub, completion

from loopwarden import Deployment, ModelError, ModelRequest
from loopwarden.config import ModelConfig, parse_config
from loopwarden.demo import shop_tools
from loopwarden.exceptions import ConfigError
from loopwarden.models.openai_chat import OpenAIChatModel


def make_model(base_url: str, **kw: Any) -> OpenAIChatModel:
    return OpenAIChatModel(
        model="stub-model",
        api_key="sk-test",
        base_url=base_url,
        timeout_s=5,
        max_retries=kw.pop("max_retries", 0),
        **kw,
    )


def request(**kw: Any) -> ModelRequest:
    return ModelRequest(
        messages=[{"role": "user", "content": "hi"}],
        tools=[
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        **kw,
    )


def test_tool_calls_and_usage_are_read_and_tools_are_sent(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push(
        completion(
            "checking",
            [{"name": "f", "arguments": '{"a": 1}'}],
            usage={
                "prompt_tokens": 120,
                "completion_tokens": 7,
                "total_tokens": 127,
                "prompt_tokens_details": {"cached_tokens": 100},
            },
        )
    )
    resp = make_model(url).complete(request(tool_choice="auto"))
    assert resp.content == "checking"
    assert [(c.name, c.arguments, c.id) for c in resp.tool_calls] == [("f", '{"a": 1}', "call_0")]
    assert (resp.usage.prompt, resp.usage.completion, resp.usage.cached) == (120, 7, 100)
    sent = state.requests[0]
    assert sent["model"] == "stub-model" and sent["tool_choice"] == "auto"
    assert sent["tools"][0]["function"]["name"] == "f"
    assert state.headers[0]["authorization"] == "Bearer sk-test"


def _transform_calls(model: OpenAIChatModel, req: ModelRequest) -> int:
    """Python calls into the SDK's param transform (``openai/_utils/_transform.py``) while
    ``model`` makes one call (the async client: it runs in this thread)."""
    import sys
    import threading

    calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.endswith("_transform.py"):
            calls[0] += 1

    threading.setprofile(count)
    sys.setprofile(count)
    try:
        asyncio.run(model.acomplete(req))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls[0]


def test_the_history_is_sent_as_it_is_not_walked_by_the_sdk(stub: tuple[Stub, str]) -> None:
    """``create()`` walks its typed params recursively (an identity for chat params) at a CPU
    cost that grows with the history -- as much as the rest of the call.  The history and the
    tools go in ``extra_body``, sent as they are; a configured ``extra_body`` still wins."""
    state, url = stub
    model = make_model(url, extra_body={"seed": 7})
    short = request()
    long = request()
    long.messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(40)
    ]
    for _ in range(3):
        state.push(completion("ok", usage={"prompt_tokens": 1, "completion_tokens": 1}))
    _transform_calls(model, short)  # warm: the SDK caches type lookups on first use
    assert _transform_calls(model, long) == _transform_calls(model, short)
    sent = state.requests[1]
    assert sent["messages"] == long.messages and sent["tools"] == long.tools
    assert sent["seed"] == 7 and sent["model"] == "stub-model"


def test_tool_choice_none_is_passed_through(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push(completion("final", usage={"prompt_tokens": 1, "completion_tokens": 1}))
    make_model(url).complete(request(tool_choice="none"))
    assert state.requests[0]["tool_choice"] == "none"


def test_a_response_without_usage_is_estimated_not_zero(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push(completion("an answer of some length"))
    resp = make_model(url).complete(request(estimated_tokens=42))
    assert resp.usage.prompt == 42 and resp.usage.completion > 0


@pytest.mark.parametrize(
    ("status", "kind"), [(429, "rate_limited"), (500, "server_error"), (400, "client_error")]
)
def test_http_errors_become_model_errors(stub: tuple[Stub, str], status: int, kind: str) -> None:
    state, url = stub
    state.push({"error": {"message": "nope", "type": "x"}}, status=status)
    with pytest.raises(ModelError) as info:
        make_model(url).complete(request())
    assert info.value.status == status and info.value.kind == kind


def test_a_429_is_retried_by_the_client_before_giving_up(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push({"error": {"message": "slow down"}}, status=429, headers={"retry-after-ms": "10"})
    state.push(completion("ok", usage={"prompt_tokens": 3, "completion_tokens": 1}))
    resp = make_model(url, max_retries=1).complete(request())
    assert resp.content == "ok" and len(state.requests) == 2


def test_unreachable_server_is_a_connection_error() -> None:
    model = OpenAIChatModel(
        model="m", api_key="k", base_url="http://127.0.0.1:9/v1", timeout_s=2, max_retries=0
    )
    with pytest.raises(ModelError) as info:
        model.complete(request())
    assert info.value.kind in ("connection", "timeout")


def test_async_client(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push(completion("async ok", usage={"prompt_tokens": 5, "completion_tokens": 2}))
    resp = asyncio.run(make_model(url).acomplete(request()))
    assert resp.content == "async ok" and resp.usage.total == 7


def test_key_comes_from_the_configured_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MY_LLM_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        OpenAIChatModel.from_config(ModelConfig(api_key_env="MY_LLM_KEY"))
    assert "MY_LLM_KEY" in str(info.value) and "--scenario" in str(info.value)
    monkeypatch.setenv("MY_LLM_KEY", "sk-abc")
    assert OpenAIChatModel.from_config(ModelConfig(api_key_env="MY_LLM_KEY")).name == "gpt-4o-mini"


def deployment_for(url: str, monkeypatch: pytest.MonkeyPatch, **model: Any) -> Deployment:
    monkeypatch.setenv("STUB_KEY", "sk-stub")
    cfg = parse_config(
        {
            "model": {
                "provider": "openai",
                "name": "stub-model",
                "base_url": url,
                "api_key_env": "STUB_KEY",
                "max_retries": 0,
                **model,
            }
        },
        path="<test>",
    )
    return Deployment(cfg, tools=shop_tools())


def test_a_whole_run_against_the_stub_uses_real_usage(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    state.push(
        completion(
            None,
            [{"name": "query_order", "arguments": '{"order_id": "88231"}'}],
            usage={"prompt_tokens": 300, "completion_tokens": 20},
        )
    )
    state.push(
        completion("订单 88231 已签收。", usage={"prompt_tokens": 420, "completion_tokens": 15})
    )
    run = deployment_for(url, monkeypatch).run("订单 88231 到哪了？")
    rec = run.record()
    assert rec["termination"] == "final_answer" and rec["steps"] == 2
    assert rec["tokens"] == {"prompt": 720, "completion": 35, "total": 755}
    # the tool result went back to the server, in the OpenAI wire format
    second = state.requests[1]["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_0"
    assert "比特 S10 Pro 扫地机" in second[-1]["content"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "query_order"


def test_malformed_arguments_from_the_server_become_an_error_observation(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    state.push(
        completion(
            None,
            [{"name": "query_order", "arguments": '{"order_id": 88'}],
            usage={"prompt_tokens": 10, "completion_tokens": 5},
        )
    )
    state.push(completion("sorry", usage={"prompt_tokens": 10, "completion_tokens": 5}))
    run = deployment_for(url, monkeypatch).run("q")
    assert run.record()["termination"] == "final_answer"
    tool_msg = state.requests[1]["messages"][-1]
    assert tool_msg["content"].startswith("ERROR: the arguments for query_order are not a valid")


def test_a_429_after_retries_ends_the_run_with_model_error(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    state.push({"error": {"message": "rate limited"}}, status=429)
    run = deployment_for(url, monkeypatch).run("q")
    rec = run.record()
    assert rec["termination"] == "model_error"
    assert rec["evidence"]["status"] == 429 and rec["final_answer"]


def test_tool_calls_without_ids_get_unique_ids_from_the_loop(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = stub
    no_id = completion(
        None,
        [{"name": "get_current_time", "arguments": "{}"}],
        usage={"prompt_tokens": 1, "completion_tokens": 1},
    )
    for body in (no_id, json.loads(json.dumps(no_id))):
        del body["choices"][0]["message"]["tool_calls"][0]["id"]
        state.push(body)
    state.push(completion("done", usage={"prompt_tokens": 1, "completion_tokens": 1}))
    run = deployment_for(url, monkeypatch).run("q")
    ids = [
        tc["id"] for m in run.messages if m["role"] == "assistant" for tc in m.get("tool_calls", [])
    ]
    assert len(ids) == 2 and len(set(ids)) == 2


@pytest.mark.parametrize("where", ["content", "arguments", "name"])
def test_the_stub_sends_a_lone_surrogate_as_json_allows(stub: tuple[Stub, str], where: str) -> None:
    from support.openai_stub import lone_surrogate_completion

    state, url = stub
    state.push(lone_surrogate_completion(where))
    resp = make_model(url).complete(request())
    if where == "arguments":  # JSON text whose string holds the escaped half emoji
        assert json.loads(resp.tool_calls[0].arguments) == {"order_id": "\ud83d"}
    else:
        text = resp.content if where == "content" else resp.tool_calls[0].name
        assert text is not None and "\ud83d" in text


def test_the_stub_sends_arguments_nested_deep(stub: tuple[Stub, str]) -> None:
    from support.openai_stub import nested_arguments

    state, url = stub
    state.push(nested_arguments(5000))
    resp = make_model(url).complete(request())
    assert resp.tool_calls[0].arguments.count("[") == 5000
