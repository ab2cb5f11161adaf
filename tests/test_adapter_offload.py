"""The adapters' async paths never wait on the shared store on the event loop (issue 32).

``Deployment.arun`` advances its machine off the loop when its hooks may block on the store
(docs/shared-budgets.md).  Inside a framework the machine is stepped from the framework's
async hooks, so each adapter hands those steps to a worker thread too.  Each test runs one
framework's own async entry point over real HTTP (the local stub server) with a refund (a
side effect the shared ledger claims) on a real store
(SQLite file, redis-server) wrapped to note the thread of every store call: none is the
event loop's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from support.adapters import Effects, deployment, records
from support.openai_stub import Stub, completion
from support.stores import store_table

from loopwarden import Deployment
from loopwarden.testing.faults import GatedStore, install_store

USAGE = {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}
REFUND = {"name": "apply_refund", "arguments": '{"order_id": "88231", "reason": "late"}'}


def store_deployment(tmp_path: Path, store_url: str) -> tuple[Deployment, GatedStore]:
    """The adapter tests' deployment on ``store_url`` (refunds claimed in its ledger), its
    store noting
    the thread of each call (the gate open: nothing waits)."""
    dep = deployment(tmp_path, store=store_table(store_url))
    gated: GatedStore = install_store(dep, lambda s: GatedStore(s))
    gated.gate.set()
    return dep, gated


def run_on_loop(main: Callable[[], Awaitable[Any]], gated: GatedStore) -> set[int]:
    """Run ``main`` on a new event loop; the store calls made on the loop's own thread."""
    loop_thread: list[int] = []

    async def wrapped() -> Any:
        loop_thread.append(threading.get_ident())
        return await main()

    asyncio.run(wrapped())
    return gated.threads & set(loop_thread)


def push_refund(server: Stub) -> None:
    server.push(completion(None, [REFUND], usage=USAGE))
    server.push(completion("Refunded.", usage=USAGE))


def check(tmp_path: Path, effects: Effects, gated: GatedStore, on_loop: set[int]) -> None:
    assert effects.counts == {"apply_refund": 1}
    [rec] = records(tmp_path)
    assert rec["termination"] == "final_answer" and rec["tools_executed"] == 1
    assert "claim" in gated.entered  # the ledger was used
    assert on_loop == set()  # no store call waited on the event loop's thread


def test_langchain_ainvoke_keeps_the_store_off_the_loop(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from loopwarden.adapters.langchain import LoopwardenMiddleware

    server, url = stub
    push_refund(server)
    effects = Effects()

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return "refunded"

    dep, gated = store_deployment(tmp_path, store_url)
    model = ChatOpenAI(model="gpt-4o-mini", base_url=url, api_key="sk-test", max_retries=0)
    agent = create_agent(model, [apply_refund], middleware=[LoopwardenMiddleware(dep)])
    state = {"messages": [HumanMessage("Refund 88231")]}
    try:
        on_loop = run_on_loop(lambda: agent.ainvoke(state, {"metadata": {"tenant": "acme"}}), gated)
    finally:
        dep.close()
    check(tmp_path, effects, gated, on_loop)


def test_pydantic_ai_run_keeps_the_store_off_the_loop(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from loopwarden.adapters.pydantic_ai import Loopwarden

    server, url = stub
    push_refund(server)
    effects = Effects()
    dep, gated = store_deployment(tmp_path, store_url)
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    agent: Agent[None, str] = Agent(model, capabilities=[Loopwarden(dep, meta={"tenant": "acme"})])

    @agent.tool_plain
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return "refunded"

    try:
        on_loop = run_on_loop(lambda: agent.run("Refund 88231"), gated)
    finally:
        dep.close()
    check(tmp_path, effects, gated, on_loop)


def test_agents_sdk_runner_keeps_the_store_off_the_loop(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, function_tool
    from openai import AsyncOpenAI

    from loopwarden.adapters.openai_agents import LoopwardenRunner

    server, url = stub
    push_refund(server)
    effects = Effects()

    @function_tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return "refunded"

    dep, gated = store_deployment(tmp_path, store_url)
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
    agent = Agent(name="shop", model=model, tools=[apply_refund])
    runner = LoopwardenRunner(dep, meta={"tenant": "acme"})
    try:
        on_loop = run_on_loop(
            lambda: runner.run(agent, "Refund 88231", run_config=RunConfig(tracing_disabled=True)),
            gated,
        )
    finally:
        dep.close()
    check(tmp_path, effects, gated, on_loop)
