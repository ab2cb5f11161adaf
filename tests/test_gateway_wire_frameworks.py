"""Agent frameworks on the Responses API and Anthropic Messages, pointed at ``loopwarden gateway``.

pydantic-ai with its Responses model (``OpenAIResponsesModel`` on an ``OpenAIProvider`` whose
``base_url`` is the gateway's ``/v1``) and with its Anthropic model (``AnthropicModel`` on an
``AnthropicProvider`` whose ``base_url`` is the gateway's root), and the OpenAI Agents SDK with
its default model, the Responses one (``OpenAIResponsesModel`` on an ``AsyncOpenAI`` pointed at
the gateway, tracing off) -- each with real tools (``@agent.tool_plain`` /
``@function_tool``) running the demo shop (:class:`support.gw_clients.ToolBox`), against a
real gateway under uvicorn in front of the scripted upstream (also under uvicorn), JSON and
streamed.  Nothing is mocked.

- a runaway is stopped by the gateway and the framework returns the gateway's final answer as
  the run's ordinary output (no exception, no retry), the record naming the stop;
- a healthy run ends as the model ends it: the same output as the same agent sent straight
  to the upstream, and a ``final_answer`` record;
- the Agents SDK on its default client (``set_default_openai_client``, a model named by
  string) is judged as on a named model;
- both frameworks continuing by ``previous_response_id`` (pydantic-ai's
  ``openai_previous_response_id="auto"``, the Agents SDK's ``auto_previous_response_id``)
  get the same record as when they resend their whole history.

Each run is told apart by its ``user`` (``openai_user`` / ``metadata.user_id`` / the Agents
SDK's ``extra_args``), which the gateway puts in the record's ``meta.user``; the records come
from ``loopwarden.signals.run_stopped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.gateway import scenarios, serve
from support.gw_clients import ToolBox, gateway_config
from support.wire_world import Recording, Records, summary

from loopwarden import Deployment
from loopwarden.config import parse_config
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.gateway.state import MemoryState
from loopwarden.models.scenario import Scenario

pytest.importorskip("pydantic_ai", reason="the adapters extra (pydantic-ai) is not installed")
pytest.importorskip("anthropic", reason="the anthropic SDK is not installed")
pytest.importorskip("agents", reason="the adapters extra (openai-agents) is not installed")

RUNAWAY = ("always-not-found", "never-finish")
STOPS = {"repeat_call", "oscillation", "no_progress", "stall", "max_steps", "failure_streak"}
KEY = "sk-test-gw-wire-frameworks"


@dataclass
class World:
    scs: dict[str, Scenario]
    upstream: str
    gw: str
    records: Records
    recording: Recording


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gw-wire-frameworks")
    scs = scenarios()
    records = Records()
    logging.getLogger("loopwarden").setLevel(logging.CRITICAL)
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPWARDEN_DATA_DIR", str(tmp / "data"))
        config = parse_config(gateway_config(tmp), path="<gw-wire-frameworks>")
        dep = Deployment(config, tools=[])
        stack.callback(dep.close)
        recording = Recording(ScriptedUpstream(scs))
        up = stack.enter_context(serve(recording))
        gw = stack.enter_context(serve(GatewayApp(dep, up + "/v1", MemoryState())))
        records.connect()
        stack.callback(records.disconnect)
        yield World(scs, up, gw, records, recording)


def who(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


# -- pydantic-ai --------------------------------------------------------------------------


def pydantic_ai_agent(
    kind: str, base: str, name: str, user: str, box: ToolBox, *, previous: bool = False
) -> Any:
    """A pydantic-ai agent on ``kind``'s model ("responses" / "anthropic") at ``base`` (the
    gateway or the upstream), with the shop's six tools; ``previous``: the Responses model
    continues by ``previous_response_id`` (``openai_previous_response_id="auto"``)."""
    from pydantic_ai import Agent

    if kind == "responses":
        from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
        from pydantic_ai.providers.openai import OpenAIProvider

        model: Any = OpenAIResponsesModel(
            "scenario:" + name, provider=OpenAIProvider(base_url=base + "/v1", api_key=KEY)
        )
        settings: Any = OpenAIResponsesModelSettings(openai_user=user, max_retries=0)
        if previous:
            settings["openai_previous_response_id"] = "auto"
    else:
        from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
        from pydantic_ai.providers.anthropic import AnthropicProvider

        model = AnthropicModel(
            "scenario:" + name, provider=AnthropicProvider(base_url=base, api_key=KEY)
        )
        settings = AnthropicModelSettings(anthropic_metadata={"user_id": user}, max_retries=0)
    agent = Agent(model, instructions="你是售后客服。", model_settings=settings)

    @agent.tool_plain
    def query_order(order_id: str) -> str:
        """查询订单详情：商品、金额、状态、签收时间、运单号。"""
        return box.run("query_order", {"order_id": order_id})

    @agent.tool_plain
    def query_logistics(tracking_no: str) -> str:
        """查询运单的物流轨迹。"""
        return box.run("query_logistics", {"tracking_no": tracking_no})

    @agent.tool_plain
    def search_knowledge(query: str) -> str:
        """检索售后知识库（退货、退款、保修、发货政策）。"""
        return box.run("search_knowledge", {"query": query})

    @agent.tool_plain
    def get_current_time() -> str:
        """获取当前时间（北京时间）。"""
        return box.run("get_current_time", {})

    @agent.tool_plain
    def apply_refund(order_id: str, reason: str) -> str:
        """为订单提交退款申请（每个订单只会受理一次退款）。"""
        return box.run("apply_refund", {"order_id": order_id, "reason": reason})

    @agent.tool_plain
    def transfer_to_human(reason: str) -> str:
        """转人工客服。"""
        return box.run("transfer_to_human", {"reason": reason})

    return agent


def run_pydantic_ai(agent: Any, prompt: str, *, streamed: bool) -> tuple[str, int]:
    """The agent's output, and how many stream events its handler saw (streamed: every model
    request is a streamed one)."""
    seen = 0

    async def handler(ctx: Any, stream: Any) -> None:
        nonlocal seen
        async for _ in stream:
            seen += 1

    async def main() -> Any:
        if streamed:
            return await agent.run(prompt, event_stream_handler=handler)
        return await agent.run(prompt)

    result = asyncio.run(main())
    assert isinstance(result.output, str)
    return result.output, seen


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize("kind", ["responses", "anthropic"])
@pytest.mark.parametrize("name", RUNAWAY)
def test_pydantic_ai_runaway_is_stopped_and_returns_normal_output(
    world: World, tmp_path: Path, name: str, kind: str, streamed: bool
) -> None:
    sc = world.scs[name]
    user = who(f"pai-{kind}")
    box = ToolBox(sc, tmp_path)
    out, seen = run_pydantic_ai(
        pydantic_ai_agent(kind, world.gw, name, user, box), sc.user, streamed=streamed
    )
    rec = world.records.one(user)
    assert rec["termination"] in STOPS
    assert rec["meta"]["front"] == "gateway"
    assert rec["final_answer"] == sc.model.final_text
    if streamed:
        assert seen > 0
        # the step's own text had streamed through before its calls were judged; the
        # gateway continued the same stream into the final answer
        assert out.endswith(sc.model.final_text)
    else:
        assert out == sc.model.final_text
    # the tools really ran, and the agent did not run away
    assert 0 < len(box.ran) < 15
    assert rec["tool_calls"] >= len(box.ran)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize("kind", ["responses", "anthropic"])
def test_pydantic_ai_healthy_run_ends_as_the_model_ends_it(
    world: World, tmp_path: Path, kind: str, streamed: bool
) -> None:
    sc = world.scs["refund"]
    user = who(f"pai-ok-{kind}")
    (tmp_path / "via").mkdir()
    (tmp_path / "direct").mkdir()
    via_box, direct_box = ToolBox(sc, tmp_path / "via"), ToolBox(sc, tmp_path / "direct")
    via, _ = run_pydantic_ai(
        pydantic_ai_agent(kind, world.gw, "refund", user, via_box), sc.user, streamed=streamed
    )
    direct, _ = run_pydantic_ai(
        pydantic_ai_agent(kind, world.upstream, "refund", who("direct"), direct_box),
        sc.user,
        streamed=streamed,
    )
    rec = world.records.one(user)
    assert rec["termination"] == "final_answer"
    assert via == direct and via.strip()
    # the same tools with the same arguments, refund and all (a turn's calls run concurrently)
    assert sorted(map(repr, via_box.ran)) == sorted(map(repr, direct_box.ran))
    assert any(n == "apply_refund" for n, _ in via_box.ran)
    assert rec["tool_calls"] == len(via_box.ran)


# -- the OpenAI Agents SDK, on its default (Responses) model -------------------------------


def agents_sdk_tools(box: ToolBox) -> list[Any]:
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
        """获取当前时间（北京时间）。"""
        return box.run("get_current_time", {})

    @function_tool
    def apply_refund(order_id: str, reason: str) -> str:
        """为订单提交退款申请（每个订单只会受理一次退款）。"""
        return box.run("apply_refund", {"order_id": order_id, "reason": reason})

    return [query_order, query_logistics, search_knowledge, get_current_time, apply_refund]


def run_agents_sdk(
    base: str,
    name: str,
    user: str,
    box: ToolBox,
    *,
    streamed: bool,
    default: bool = False,
    previous: bool = False,
) -> Any:
    """An Agents SDK agent on the Responses model: named (``OpenAIResponsesModel`` on a client
    pointed at ``base``), or with ``default`` the SDK's own default -- a model given by name
    only, through the client set by ``set_default_openai_client`` (restored after);
    ``previous``: the run continues by ``previous_response_id``
    (``auto_previous_response_id=True``)."""
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        set_default_openai_client,
    )
    from agents.models import _openai_shared

    async def main() -> Any:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=30)
        before = _openai_shared.get_default_openai_client()
        async with client:
            model: Any = OpenAIResponsesModel(model="scenario:" + name, openai_client=client)
            if default:
                assert _openai_shared.get_use_responses_by_default()
                set_default_openai_client(client, use_for_tracing=False)
                model = "scenario:" + name
            agent = Agent(
                name="shop",
                instructions="你是售后客服。",
                tools=agents_sdk_tools(box),
                model=model,
                model_settings=ModelSettings(extra_args={"user": user}),
            )
            config = RunConfig(tracing_disabled=True)
            try:
                if not streamed:
                    return await Runner.run(
                        agent,
                        box.scenario.user,
                        max_turns=40,
                        run_config=config,
                        auto_previous_response_id=previous,
                    )
                result = Runner.run_streamed(
                    agent, box.scenario.user, max_turns=40, run_config=config
                )
                async for _ in result.stream_events():
                    pass
                return result
            finally:
                _openai_shared.set_default_openai_client(before)  # type: ignore[arg-type]

    return asyncio.run(main())


@pytest.mark.parametrize("default", [False, True], ids=["named-model", "default-client"])
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize("name", RUNAWAY)
def test_agents_sdk_on_responses_is_stopped_and_runner_returns_a_final_output(
    world: World, tmp_path: Path, name: str, streamed: bool, default: bool
) -> None:
    sc = world.scs[name]
    user = who("agents-resp")
    box = ToolBox(sc, tmp_path)
    result = run_agents_sdk(world.gw, name, user, box, streamed=streamed, default=default)
    rec = world.records.one(user)
    assert rec["termination"] in STOPS
    assert rec["meta"]["front"] == "gateway"
    assert rec["final_answer"] == sc.model.final_text
    assert isinstance(result.final_output, str)
    if streamed:
        assert result.final_output.endswith(sc.model.final_text)
    else:
        assert result.final_output == sc.model.final_text
    assert 0 < len(box.ran) < 15


def test_agents_sdk_on_responses_healthy_run_ends_as_the_model_ends_it(
    world: World, tmp_path: Path
) -> None:
    sc = world.scs["refund"]
    user = who("agents-ok")
    (tmp_path / "via").mkdir()
    (tmp_path / "direct").mkdir()
    via_box, direct_box = ToolBox(sc, tmp_path / "via"), ToolBox(sc, tmp_path / "direct")
    via = run_agents_sdk(world.gw, "refund", user, via_box, streamed=False)
    direct = run_agents_sdk(world.upstream, "refund", who("direct"), direct_box, streamed=False)
    rec = world.records.one(user)
    assert rec["termination"] == "final_answer"
    assert via.final_output == direct.final_output
    assert sorted(map(repr, via_box.ran)) == sorted(map(repr, direct_box.ran))


# -- continuing by previous_response_id (the history stays at the provider) ----------------


@pytest.mark.parametrize("framework", ["pydantic-ai", "agents-sdk"])
@pytest.mark.parametrize("name", [*RUNAWAY, "refund"])
def test_frameworks_continuing_by_previous_response_id_are_judged_the_same(
    world: World, tmp_path: Path, framework: str, name: str
) -> None:
    """pydantic-ai's ``openai_previous_response_id="auto"`` and the Agents SDK's
    ``auto_previous_response_id=True`` send only what is new each step: the gateway finds the
    run by the answer it continues, and the record is the record of the same agent resending
    its whole history."""
    sc = world.scs[name]
    outs, recs = [], []
    for previous in (False, True):
        user = who(f"{framework}-prev-{previous}")
        (tmp_path / str(previous)).mkdir()
        box = ToolBox(sc, tmp_path / str(previous))
        before = len(world.recording.exchanges)
        if framework == "pydantic-ai":
            agent = pydantic_ai_agent("responses", world.gw, name, user, box, previous=previous)
            out, _ = run_pydantic_ai(agent, sc.user, streamed=False)
        else:
            out = run_agents_sdk(
                world.gw, name, user, box, streamed=False, previous=previous
            ).final_output
        sent = [json.loads(e.request) for e in world.recording.exchanges[before:]]
        continued = [b for b in sent if b.get("previous_response_id")]
        assert bool(continued) == previous
        if previous:  # only what is new: never the first user message again
            assert all(sc.user not in json.dumps(b["input"], ensure_ascii=False) for b in continued)
        outs.append(out)
        recs.append(world.records.one(user))
    assert outs[0] == outs[1]
    assert summary(recs[0]) == summary(recs[1])
    if name in RUNAWAY:
        assert recs[1]["termination"] in STOPS and outs[1] == sc.model.final_text
    else:
        assert recs[1]["termination"] == "final_answer"
