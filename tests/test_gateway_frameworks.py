"""Agent frameworks pointed at ``loopwarden gateway``, with no loopwarden code in the agent.

A LangChain agent (``langchain.agents.create_agent`` on ``ChatOpenAI``, real ``@tool``s) and
an OpenAI Agents SDK agent (``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI`` whose
``base_url`` is the gateway, tracing off) run the demo's runaway scenarios through a real
gateway in front of the scripted upstream.  Each is stopped by the gateway and the framework
returns normally with the gateway's final answer.  The tools are the demo shop's, run for real
(:class:`support.gw_clients.ToolBox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.gateway import scenarios, serve
from support.gw_clients import ToolBox, serve_gateway, wait_for_record

from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.models.scenario import Scenario

pytest.importorskip("langchain.agents", reason="the adapters extra (langchain) is not installed")
pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
pytest.importorskip("agents", reason="the adapters extra (openai-agents) is not installed")

RUNAWAY = {"repeat_call", "oscillation", "no_progress", "stall", "max_steps", "failure_streak"}
KEY = "sk-test-gw-frameworks"


@dataclass
class World:
    tmp: Path
    scs: dict[str, Scenario]
    gw: str

    def record(self, user: str) -> dict[str, Any]:
        return wait_for_record(
            self.tmp / "runs.jsonl", lambda r: r.get("meta", {}).get("user") == user
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gw-frameworks")
    scs = scenarios()
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPWARDEN_DATA_DIR", str(tmp / "data"))
        up = stack.enter_context(serve(ScriptedUpstream(scs)))
        gw, _ = serve_gateway(stack, tmp, up)
        yield World(tmp, scs, gw)


def who(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


# -- LangChain ----------------------------------------------------------------------------


def langchain_tools(box: ToolBox) -> list[Any]:
    from langchain_core.tools import tool

    @tool
    def query_order(order_id: str) -> str:
        """查询订单详情：商品、金额、状态、签收时间、运单号。"""
        return box.run("query_order", {"order_id": order_id})

    @tool
    def query_logistics(tracking_no: str) -> str:
        """查询运单的物流轨迹。"""
        return box.run("query_logistics", {"tracking_no": tracking_no})

    @tool
    def search_knowledge(query: str) -> str:
        """检索售后知识库（退货、退款、保修、发货政策）。"""
        return box.run("search_knowledge", {"query": query})

    @tool
    def get_current_time() -> str:
        """当前时间。"""
        return box.run("get_current_time", {})

    return [query_order, query_logistics, search_knowledge, get_current_time]


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize("name", ["always-not-found", "never-finish"])
def test_langchain_agent_is_stopped_and_returns_normally(
    world: World, tmp_path: Path, name: str, streaming: bool
) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_openai import ChatOpenAI

    sc = world.scs[name]
    user = who("langchain")
    box = ToolBox(sc, tmp_path)
    model = ChatOpenAI(
        model="scenario:" + name,
        base_url=world.gw + "/v1",
        api_key=KEY,  # type: ignore[arg-type]
        max_retries=0,
        timeout=30,
        streaming=streaming,
        model_kwargs={"user": user},
    )
    agent = create_agent(model, tools=langchain_tools(box), system_prompt="你是售后客服。")
    result = agent.invoke(
        {"messages": [{"role": "user", "content": sc.user}]}, {"recursion_limit": 60}
    )
    last = result["messages"][-1]
    rec = world.record(user)
    assert rec["termination"] in RUNAWAY
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert rec["final_answer"] == sc.model.final_text
    if streaming:
        # the turn's text had already streamed through as it came when its calls were
        # judged: the gateway continued that same stream into the final answer
        assert isinstance(last.content, str) and last.content.endswith("\n\n" + sc.model.final_text)
    else:
        assert last.content == sc.model.final_text
    assert 0 < len(box.ran) < 15


# -- the OpenAI Agents SDK ----------------------------------------------------------------


def agents_tools(box: ToolBox) -> list[Any]:
    from agents import function_tool

    @function_tool
    def query_order(order_id: str) -> str:
        """查询订单详情：商品、金额、状态、签收时间、运单号。"""
        return box.run("query_order", {"order_id": order_id})

    @function_tool
    def query_logistics(tracking_no: str) -> str:
        """查询运单的物流轨迹。"""
        return box.run("query_logistics", {"tracking_no": tracking_no})

    @function_tool
    def search_knowledge(query: str) -> str:
        """检索售后知识库（退货、退款、保修、发货政策）。"""
        return box.run("search_knowledge", {"query": query})

    @function_tool
    def get_current_time() -> str:
        """当前时间。"""
        return box.run("get_current_time", {})

    return [query_order, query_logistics, search_knowledge, get_current_time]


@pytest.mark.parametrize("name", ["always-not-found", "never-finish"])
def test_agents_sdk_agent_is_stopped_and_runner_returns_a_final_output(
    world: World, tmp_path: Path, name: str
) -> None:
    import openai
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner

    sc = world.scs[name]
    user = who("agents")
    box = ToolBox(sc, tmp_path)

    async def main() -> Any:
        client = openai.AsyncOpenAI(
            base_url=world.gw + "/v1", api_key=KEY, max_retries=0, timeout=30
        )
        async with client:
            agent = Agent(
                name="shop",
                instructions="你是售后客服。",
                tools=agents_tools(box),
                model=OpenAIChatCompletionsModel(model="scenario:" + name, openai_client=client),
                model_settings=ModelSettings(extra_args={"user": user}),
            )
            return await Runner.run(
                agent, sc.user, max_turns=40, run_config=RunConfig(tracing_disabled=True)
            )

    result = asyncio.run(main())
    rec = world.record(user)
    assert rec["termination"] in RUNAWAY
    assert result.final_output == rec["final_answer"] == sc.model.final_text
    assert 0 < len(box.ran) < 15
