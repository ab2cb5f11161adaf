"""Framework adapters price and check their model as ``loopwarden run`` does.

LangChain's real ``ChatOpenAI`` talks HTTP to the local chat-completions stub
(:mod:`support.openai_stub`): the model name it sends is the one the adapter prices
(genai-prices for ``gpt-4.1-mini``), an unknown model runs unpriced with the start-up note,
and ``unknown_model = "error"`` raises the ConfigError before any request leaves -- in
LangChain, the OpenAI Agents SDK and pydantic-ai alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from genai_prices import Usage as GUsage
from genai_prices import calc_price
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from support.adapters import only_record, records
from support.openai_stub import Stub, completion, serve

from loopwarden import ConfigError, Deployment
from loopwarden.adapters.langchain import LoopwardenMiddleware
from loopwarden.config import default_config_path, load_toml, parse_config

langchain_openai = pytest.importorskip("langchain_openai")

PACKAGE_MODEL = "gpt-4.1-mini"  # priced by genai-prices, not by the shipped table
UNKNOWN = "my-local-vllm-model"
USAGES = [(120, 30), (180, 20)]  # the stub's reported usage per call


def _deployment(tmp_path: Path, **cost_budget: Any) -> Deployment:
    """The shipped config with run records in ``tmp_path`` and ``cost_budget`` overrides."""
    data = load_toml(default_config_path())
    plugins = data["plugins"]
    plugins["enabled"] = [*plugins["enabled"], "run_record"]
    plugins["run_record"] = {"path": str(tmp_path / "runs.jsonl")}
    plugins["cost_budget"] = {**plugins["cost_budget"], **cost_budget}
    return Deployment(parse_config(data, path="<adapter-pricing>"), tools=[])


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    with serve() as served:
        yield served


def _queue_lookup_then_answer(stub: Stub) -> None:
    (p1, c1), (p2, c2) = USAGES
    stub.push(
        completion(
            None,
            [{"name": "query_order", "arguments": '{"order_id": "88231"}'}],
            usage={"prompt_tokens": p1, "completion_tokens": c1, "total_tokens": p1 + c1},
        )
    )
    stub.push(
        completion(
            "Order 88231 was delivered.",
            usage={"prompt_tokens": p2, "completion_tokens": c2, "total_tokens": p2 + c2},
        )
    )


@tool
def query_order(order_id: str) -> str:
    """Look up an order by its id."""
    return f"order {order_id}: delivered"


def _langchain(dep: Deployment, model: str, base_url: str, mode: str = "sync") -> str:
    chat = langchain_openai.ChatOpenAI(
        model=model, base_url=base_url, api_key="sk-test", max_retries=0, timeout=10
    )
    agent = create_agent(chat, [query_order], middleware=[LoopwardenMiddleware(dep)])
    state = {"messages": [HumanMessage("Where is order 88231?")]}
    out = agent.invoke(state) if mode == "sync" else asyncio.run(agent.ainvoke(state))
    last = out["messages"][-1]
    assert isinstance(last, AIMessage)
    return str(last.content)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_langchain_chatopenai_run_is_priced_by_genai_prices(
    tmp_path: Path, stub: tuple[Stub, str], mode: str
) -> None:
    server, url = stub
    _queue_lookup_then_answer(server)
    dep = _deployment(tmp_path)
    try:
        answer = _langchain(dep, PACKAGE_MODEL, url, mode)
    finally:
        dep.close()
    assert answer == "Order 88231 was delivered."
    assert [r["model"] for r in server.requests] == [PACKAGE_MODEL] * 2  # real HTTP
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["model"] == PACKAGE_MODEL
    expected = sum(
        (calc_price(GUsage(input_tokens=p, output_tokens=c), PACKAGE_MODEL).total_price)
        for p, c in USAGES
    )
    assert expected > 0
    # the stub calls itself "stub-model": the configured model's price applies
    assert Decimal(str(rec["cost"])) == expected
    assert rec["cost_known"] is True and rec["cost_source"] == "genai-prices"


def test_langchain_unknown_model_runs_unpriced_with_one_note(
    tmp_path: Path, stub: tuple[Stub, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, url = stub
    dep = _deployment(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="loopwarden"):
            for _ in range(2):  # checked once per deployment and model, not per run
                _queue_lookup_then_answer(server)
                assert _langchain(dep, UNKNOWN, url) == "Order 88231 was delivered."
    finally:
        dep.close()
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer"] * 2
    assert all(r["cost_known"] is False and r["cost"] == 0.0 for r in recs)
    assert all(r["model"] == UNKNOWN for r in recs)
    notes = [r.getMessage() for r in caplog.records if r.name == "loopwarden.plugins.cost_budget"]
    assert len(notes) == 1
    assert UNKNOWN in notes[0] and "[plugins.cost_budget.prices]" in notes[0]
    assert "[model]" in notes[0]


def test_langchain_unknown_model_error_raises_before_any_request(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    server, url = stub
    _queue_lookup_then_answer(server)
    dep = _deployment(tmp_path, unknown_model="error")
    middleware = LoopwardenMiddleware(dep)
    chat = langchain_openai.ChatOpenAI(
        model=UNKNOWN, base_url=url, api_key="sk-test", max_retries=0, timeout=10
    )
    agent = create_agent(chat, [query_order], middleware=[middleware])
    try:
        with pytest.raises(ConfigError, match=UNKNOWN) as err:
            agent.invoke({"messages": [HumanMessage("Where is order 88231?")]})
        assert err.value.key == "plugins.cost_budget.prices"
        assert server.requests == []  # refused before the model was called
        assert middleware.runs() == []  # nothing left behind
        # a priced model through the same deployment still runs
        assert _langchain(dep, PACKAGE_MODEL, url) == "Order 88231 was delivered."
    finally:
        dep.close()
    rec = only_record(tmp_path)  # the refused run never started: no record of it
    assert rec["model"] == PACKAGE_MODEL


def test_pydantic_ai_unknown_model_error_raises(tmp_path: Path) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from loopwarden.adapters.pydantic_ai import Loopwarden

    calls: list[int] = []

    def respond(messages: list[Any], info: AgentInfo) -> Any:
        from pydantic_ai import messages as pm

        calls.append(1)
        return pm.ModelResponse(parts=[pm.TextPart("hi")])

    dep = _deployment(tmp_path, unknown_model="error")
    agent = Agent(FunctionModel(respond, model_name=UNKNOWN), capabilities=[Loopwarden(dep)])
    try:
        with pytest.raises(ConfigError, match=UNKNOWN):
            agent.run_sync("hello")
    finally:
        dep.close()
    assert calls == []
    assert not (tmp_path / "runs.jsonl").exists() or records(tmp_path) == []


def test_openai_agents_unknown_model_error_raises(tmp_path: Path, stub: tuple[Stub, str]) -> None:
    from agents import Agent, OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    from loopwarden.adapters.openai_agents import LoopwardenRunner

    server, url = stub
    server.push(completion("hi", usage={"prompt_tokens": 5, "completion_tokens": 1}))
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    model = OpenAIChatCompletionsModel(model=UNKNOWN, openai_client=client)
    dep = _deployment(tmp_path, unknown_model="error")
    try:
        with pytest.raises(ConfigError, match=UNKNOWN):
            LoopwardenRunner(dep).run_sync(Agent(name="shop", model=model), "hello")
    finally:
        dep.close()
    assert server.requests == []
