"""A healthy run is the upstream's own bytes, and a run's record is the same on every wire and
through either front end.

Real servers under uvicorn on 127.0.0.1: the scripted upstream wrapped in
:class:`support.wire_world.Recording` (which keeps exactly the bytes the upstream sent for each
request), a gateway in front of it, and the official ``openai`` / ``anthropic`` SDKs as the
clients -- pointed at the gateway, or at the upstream through ``loopwarden.wrap``.

- **byte-identical**: on the Responses API and on Anthropic Messages, JSON and streamed, every
  step of a healthy run reaches the SDK (``with_raw_response`` / ``with_streaming_response``)
  as exactly the bytes the upstream sent for it, one upstream request per step -- the
  upstream's answers restyled (indented, ASCII-escaped JSON; compact ``data:`` lines) so that
  any re-encoding by the gateway would show;
- **one record for one behaviour**: the same recorded behaviour (a scenario) played on chat
  completions, the Responses API and Messages -- through the gateway and through the wrapper,
  JSON and streamed -- gets the same termination, stopper, step and call counts and warnings.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.gateway import serve
from support.wire_world import (
    Recording,
    Records,
    message_from_sse,
    responses_from_sse,
    summary,
)
from support.wires import (
    MESSAGES_TOOLS,
    RESPONSES_TOOLS,
    SCENARIOS,
    chat_run,
    messages_run,
    responses_run,
    run_tool,
)

import loopwarden
from loopwarden import Deployment
from loopwarden.config import default_config_path, load_config
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.gateway.state import MemoryState

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

RUNAWAY = ("always-not-found", "never-finish", "oscillation")
HEALTHY = ("refund", "repeat-then-recover")


@dataclass
class World:
    upstream: str
    recording: Recording
    gw: str
    dep: Deployment
    records: Records


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    logging.getLogger("loopwarden").setLevel(logging.CRITICAL)
    records = Records()
    with contextlib.ExitStack() as stack:
        dep = Deployment(load_config(default_config_path()))
        stack.callback(dep.close)
        recording = Recording(ScriptedUpstream(SCENARIOS), restyle=True)
        up = stack.enter_context(serve(recording))
        gw = stack.enter_context(serve(GatewayApp(dep, up + "/v1", MemoryState())))
        records.connect()
        stack.callback(records.disconnect)
        yield World(up, recording, gw, dep, records)


# -- a healthy run is the upstream's own bytes ----------------------------------------------


def _step(
    world: World, call: Callable[[dict[str, Any]], bytes], args: dict[str, Any]
) -> tuple[bytes, bytes]:
    """Make one request; (the bytes the client got, the bytes the upstream sent for it)."""
    before = len(world.recording.exchanges)
    got = call(args)
    sent = world.recording.exchanges[before:]
    assert len(sent) == 1, "a healthy step is one upstream request"
    assert sent[0].status == 200
    return got, bytes(sent[0].body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_healthy_responses_run_is_the_upstreams_own_bytes(world: World, stream: bool) -> None:
    client = openai.OpenAI(base_url=world.gw + "/v1", api_key="sk-bytes-r", max_retries=0)
    user = f"bytes-responses-{stream}"
    prev: str | None = None
    given: Any = SCENARIOS["refund"].user
    steps = 0

    def call(args: dict[str, Any]) -> bytes:
        if stream:
            with client.responses.with_streaming_response.create(**args, stream=True) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                return b"".join(r.iter_bytes())
        return bytes(client.responses.with_raw_response.create(**args).http_response.content)

    for _ in range(10):
        args: dict[str, Any] = {
            "model": "scenario:refund",
            "input": given,
            "tools": RESPONSES_TOOLS,
            "previous_response_id": prev,
            "user": user,
        }

        got, sent = _step(world, call, args)
        assert got == sent
        assert (b"data:{" if stream else b'{\n "') in got  # the upstream's own style
        steps += 1
        body = responses_from_sse(got) if stream else json.loads(got)
        calls = [it for it in body["output"] if it["type"] == "function_call"]
        if not calls:
            break
        prev = body["id"]
        given = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": run_tool(c["name"], json.loads(c["arguments"])),
            }
            for c in calls
        ]
    rec = world.records.one(user)
    assert rec["termination"] == "final_answer"
    assert rec["steps"] == steps > 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_healthy_messages_run_is_the_upstreams_own_bytes(world: World, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=world.gw, api_key="sk-bytes-m", max_retries=0)
    user = f"bytes-messages-{stream}"
    msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS["refund"].user}]
    steps = 0

    def call(args: dict[str, Any]) -> bytes:
        if stream:
            with client.messages.with_streaming_response.create(**args, stream=True) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                return b"".join(r.iter_bytes())
        return bytes(client.messages.with_raw_response.create(**args).http_response.content)

    for _ in range(10):
        args: dict[str, Any] = {
            "model": "scenario:refund",
            "max_tokens": 1024,
            "messages": msgs,
            "tools": MESSAGES_TOOLS,
            "metadata": {"user_id": user},
        }

        got, sent = _step(world, call, args)
        assert got == sent
        assert (b"data:{" if stream else b'{\n "') in got  # the upstream's own style
        steps += 1
        m = message_from_sse(got) if stream else json.loads(got)
        msgs.append({"role": "assistant", "content": m["content"]})
        uses = [b for b in m["content"] if b["type"] == "tool_use"]
        if not uses:
            assert m["stop_reason"] == "end_turn"
            break
        msgs.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": b["id"],
                        "content": run_tool(b["name"], b["input"]),
                    }
                    for b in uses
                ],
            }
        )
    rec = world.records.one(user)
    assert rec["termination"] == "final_answer"
    assert rec["steps"] == steps > 2


# -- one behaviour, one record: every wire, both front ends ---------------------------------


def _last(world: World, before: int) -> dict[str, Any]:
    got = world.records.got[before:]
    assert len(got) == 1, f"one run was expected, {len(got)} ended"
    return got[0]


@pytest.mark.parametrize("name", [*RUNAWAY, *HEALTHY])
def test_the_same_behaviour_gets_the_same_record_through_the_wrapper_on_every_wire(
    world: World, name: str
) -> None:
    """The gateway's record of a scenario on chat completions is the reference; the wrapper
    (``loopwarden.wrap`` of ``OpenAI`` and ``Anthropic`` clients, the same deployment) gets
    the same one on chat completions, on the Responses API and on Messages, JSON and
    streamed -- and the client gets the same final text each time."""
    ref_client = openai.OpenAI(base_url=world.gw + "/v1", api_key="sk-ref", max_retries=0)
    n = len(world.records.got)
    ref_text, _ = chat_run(ref_client, name)
    reference = summary(_last(world, n))
    oc = loopwarden.wrap(
        openai.OpenAI(base_url=world.upstream + "/v1", api_key="sk-wrap-o", max_retries=0),
        world.dep,
    )
    ac = loopwarden.wrap(
        anthropic.Anthropic(base_url=world.upstream, api_key="sk-wrap-a", max_retries=0),
        world.dep,
    )
    plays = {
        "chat": lambda: chat_run(oc, name),
        "responses-json": lambda: responses_run(oc, name, stream=False),
        "responses-stream": lambda: responses_run(oc, name, stream=True),
        "messages-json": lambda: messages_run(ac, name, stream=False),
        "messages-stream": lambda: messages_run(ac, name, stream=True),
    }
    for label, play in plays.items():
        n = len(world.records.got)
        text, header = play()
        rec = _last(world, n)
        assert summary(rec) == reference, label
        if label.endswith("stream") and rec["termination"] != "final_answer":
            # the step's own text streamed through before its calls were judged
            assert text.endswith(rec["final_answer"]), label
        else:
            assert text == ref_text, label
        if label.endswith("json") and rec["termination"] != "final_answer":
            assert header == rec["termination"], label


def test_the_record_names_the_wire_the_run_spoke(world: World) -> None:
    n = len(world.records.got)
    responses_run(
        openai.OpenAI(base_url=world.gw + "/v1", api_key="sk-wire-r", max_retries=0),
        "always-not-found",
        stream=False,
    )
    assert _last(world, n)["meta"]["wire"] == "responses"
    n = len(world.records.got)
    messages_run(
        anthropic.Anthropic(base_url=world.gw, api_key="sk-wire-m", max_retries=0),
        "always-not-found",
        stream=False,
    )
    assert _last(world, n)["meta"]["wire"] == "messages"


def test_a_wrapped_clients_record_names_the_wrapper_as_its_front(world: World) -> None:
    n = len(world.records.got)
    client = loopwarden.wrap(
        anthropic.Anthropic(base_url=world.upstream, api_key="sk-front", max_retries=0),
        world.dep,
    )
    messages_run(client, "always-not-found", stream=False)
    assert _last(world, n)["meta"]["front"] == "wrap"
