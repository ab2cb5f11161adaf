"""``loopwarden.wrap(client)``: the gateway's judgement in process, for every SDK surface.

Real ``openai`` and ``anthropic`` clients (sync and async, JSON and streamed) against a local
scripted upstream under real uvicorn, wrapped: the agent code is unchanged, and a runaway
ends on an answer it handles as normal while a healthy run ends as the model ended it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from support.gateway import serve
from support.wires import (
    CHAT_TOOLS,
    MESSAGES_TOOLS,
    SCENARIOS,
    chat_run,
    messages_run,
    responses_run,
    run_tool,
)

import loopwarden
from loopwarden import Deployment, signals
from loopwarden.config import default_config_path, load_config
from loopwarden.gateway.scripted import ScriptedUpstream

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    logging.getLogger("loopwarden").setLevel(logging.CRITICAL)
    with serve(ScriptedUpstream(SCENARIOS)) as url:
        yield url


@pytest.fixture
def dep() -> Iterator[Deployment]:
    d = Deployment(load_config(default_config_path()))
    yield d
    d.close()


@pytest.fixture
def records() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def keep(sender: Any, **kw: Any) -> None:
        got.append(kw["record"])

    with signals.run_stopped.connected_to(keep):
        yield got


def test_a_wrapped_openai_client_is_stopped_in_chat_and_responses(
    upstream: str, dep: Deployment, records: list[dict[str, Any]]
) -> None:
    client = loopwarden.wrap(
        openai.OpenAI(base_url=upstream + "/v1", api_key="sk-w", max_retries=0), dep
    )
    text, _ = chat_run(client, "always-not-found")
    assert records[-1]["termination"] == "repeat_call"
    assert text == records[-1]["final_answer"]
    for stream in (False, True):
        text, _ = responses_run(client, "always-not-found", stream=stream)
        assert records[-1]["termination"] == "repeat_call"
        assert text == records[-1]["final_answer"]


def test_a_wrapped_openai_client_leaves_a_healthy_run_alone(
    upstream: str, dep: Deployment, records: list[dict[str, Any]]
) -> None:
    bare = openai.OpenAI(base_url=upstream + "/v1", api_key="sk-w", max_retries=0)
    wrapped = loopwarden.wrap(bare, dep)
    assert chat_run(wrapped, "refund")[0] == chat_run(bare, "refund")[0]
    assert records[-1]["termination"] == "final_answer"


def test_a_wrapped_anthropic_client_is_stopped_json_and_streamed(
    upstream: str, dep: Deployment, records: list[dict[str, Any]]
) -> None:
    client = loopwarden.wrap(
        anthropic.Anthropic(base_url=upstream, api_key="sk-a", max_retries=0), dep
    )
    for stream in (False, True):
        text, header = messages_run(client, "always-not-found", stream=stream)
        assert records[-1]["termination"] == "repeat_call"
        assert text == records[-1]["final_answer"]
        if not stream:
            assert header == "repeat_call"


def test_wrapped_async_clients_stream_and_are_stopped(
    upstream: str, dep: Deployment, records: list[dict[str, Any]]
) -> None:
    async def main() -> tuple[str, str]:
        oc = loopwarden.wrap(
            openai.AsyncOpenAI(base_url=upstream + "/v1", api_key="sk-aw", max_retries=0), dep
        )
        msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS["never-finish"].user}]
        for _ in range(40):
            stream = await oc.chat.completions.create(
                model="scenario:never-finish", messages=msgs, tools=CHAT_TOOLS, stream=True
            )
            text, calls = "", {}
            async for chunk in stream:
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    for tc in ch.delta.tool_calls or ():
                        c = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                        c["id"] = tc.id or c["id"]
                        c["name"] += (tc.function.name or "") if tc.function else ""
                        c["args"] += (tc.function.arguments or "") if tc.function else ""
            wire = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
            msgs.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    **({"tool_calls": wire} if wire else {}),
                }
            )
            if not wire:
                break
            for c in wire:
                fn = c["function"]
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": c["id"],
                        "content": run_tool(fn["name"], json.loads(fn["arguments"])),
                    }
                )
        first = records[-1]["termination"]
        ac = loopwarden.wrap(
            anthropic.AsyncAnthropic(base_url=upstream, api_key="sk-aa", max_retries=0), dep
        )
        amsgs: list[dict[str, Any]] = [
            {"role": "user", "content": SCENARIOS["always-not-found"].user}
        ]
        for _ in range(40):
            async with ac.messages.stream(
                model="scenario:always-not-found",
                max_tokens=512,
                messages=amsgs,
                tools=MESSAGES_TOOLS,
            ) as s:
                m = await s.get_final_message()
            amsgs.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in m.content],
                }
            )
            uses = [b for b in m.content if b.type == "tool_use"]
            if not uses:
                break
            amsgs.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": b.id,
                            "content": run_tool(b.name, dict(b.input)),
                        }
                        for b in uses
                    ],
                }
            )
        return first, records[-1]["termination"]

    first, second = asyncio.run(main())
    assert first == "repeat_call"
    assert second == "repeat_call"


def test_loopwarden_run_names_the_run_of_a_client_that_rewrites_its_history(
    upstream: str, dep: Deployment, records: list[dict[str, Any]]
) -> None:
    """A client that renames every call id between requests loses its run -- unless the
    run is named: ``with loopwarden.run(id)``."""
    client = loopwarden.wrap(
        openai.OpenAI(base_url=upstream + "/v1", api_key="sk-r", max_retries=0), dep
    )

    def forgetful(n: int) -> int:
        msgs: list[dict[str, Any]] = [
            {"role": "user", "content": SCENARIOS["always-not-found"].user}
        ]
        for i in range(n):
            m = (
                client.chat.completions.create(
                    model="scenario:always-not-found", messages=msgs, tools=CHAT_TOOLS
                )
                .choices[0]
                .message
            )
            calls = [tc.model_dump(include={"id", "type", "function"}) for tc in m.tool_calls or ()]
            if not calls:
                return i + 1
            for k, c in enumerate(calls):
                c["id"] = f"renamed-{i}-{k}"  # the client keeps no id the gateway handed out
            msgs.append({"role": "assistant", "content": m.content, "tool_calls": calls})
            msgs.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": "NOT_FOUND"} for c in calls
            )
        return n

    assert forgetful(8) == 8  # never found again: never stopped
    with loopwarden.run("ticket-4711"):
        assert forgetful(8) < 8
    assert records[-1]["termination"] != "final_answer"


def test_wrap_refuses_what_it_cannot_wrap(dep: Deployment) -> None:
    with pytest.raises(TypeError, match="openai or anthropic client"):
        loopwarden.wrap(object(), dep)
