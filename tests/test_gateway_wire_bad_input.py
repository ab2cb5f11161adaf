"""Bad input and a bad world on the Responses API and Anthropic Messages: each a defined answer.

Real servers under uvicorn on 127.0.0.1: the scripted upstream inside
:class:`support.wire_world.Misbehaving` (a 429 with ``retry-after`` in the wire's own error
shape, or a stream cut in the middle of a ``tool_use`` block / of ``function_call_arguments``,
when the request's ``x-fault`` header asks -- the gateway forwards the client's headers) and
:class:`support.wire_world.Recording` (what reached the upstream), a gateway in front.  Clients
are httpx (the exact bytes on the wire) and the official ``openai`` / ``anthropic`` SDKs where
their reading of the answer matters.  Nothing is mocked.

- a request mixing shapes is a 400 in the path's own shape, never forwarded -- or, where the
  foreign parts are only unknown fields, forwarded and judged; never a 500;
- a tool result for a call id the run never saw is no error: the run goes on, and its record
  is the record of the same run without the stray id;
- an unknown ``previous_response_id``, streamed too, is a new run noting it;
- a stream the upstream cuts inside a ``tool_use`` block (Messages) or inside
  ``function_call_arguments`` (Responses) -- its body ended early, or its connection dropped --
  ends with an error event and the partial call never reaches the client; the run is not
  advanced: the retried step is judged afresh and the run's record is the record of a run
  that was never cut;
- an upstream 429 with ``retry-after`` on ``/v1/messages`` (and ``/v1/responses``) reaches
  the client as the upstream sent it, and the SDK reads it as its own rate-limit error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from support.gateway import serve
from support.wire_world import (
    ANTHROPIC_429,
    ANTHROPIC_429_HEADERS,
    OPENAI_429,
    OPENAI_429_HEADERS,
    Misbehaving,
    Recording,
    Records,
    message_from_sse,
    responses_from_sse,
    sse_events,
    summary,
)
from support.wires import CHAT_TOOLS, MESSAGES_TOOLS, RESPONSES_TOOLS, SCENARIOS, run_tool

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_config
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.gateway.state import MemoryState

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

KEY = "sk-test-wire-bad-input"


@dataclass
class World:
    upstream: str
    recording: Recording
    faults: Misbehaving
    gw: str
    records: Records

    def forwarded(self) -> int:
        return len(self.recording.exchanges)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    logging.getLogger("loopwarden").setLevel(logging.CRITICAL)
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the dropped connection
    records = Records()
    with contextlib.ExitStack() as stack:
        dep = Deployment(load_config(default_config_path()))
        stack.callback(dep.close)
        faults = Misbehaving(ScriptedUpstream(SCENARIOS))
        recording = Recording(faults)
        up = stack.enter_context(serve(recording))
        gw = stack.enter_context(serve(GatewayApp(dep, up + "/v1", MemoryState())))
        records.connect()
        stack.callback(records.disconnect)
        yield World(up, recording, faults, gw, records)


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(
        headers={"authorization": "Bearer " + KEY, "x-api-key": KEY}, timeout=30
    ) as c:
        yield c


def who(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def no_traceback(resp: httpx.Response) -> None:
    assert resp.status_code != 500, resp.text
    assert "Traceback" not in resp.text and "gateway_error" not in resp.text


def openai_error(resp: httpx.Response, status: int, code: str) -> None:
    no_traceback(resp)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code


def anthropic_error(resp: httpx.Response, status: int, kind: str) -> None:
    no_traceback(resp)
    assert resp.status_code == status, resp.text
    data = resp.json()
    assert data["type"] == "error" and data["error"]["type"] == kind and data["error"]["message"]


# -- a request mixing shapes ----------------------------------------------------------------

CHAT_BODY = {
    "model": "scenario:refund",
    "messages": [{"role": "user", "content": SCENARIOS["refund"].user}],
    "tools": CHAT_TOOLS,
}
RESPONSES_BODY = {
    "model": "scenario:refund",
    "input": [{"role": "user", "content": SCENARIOS["refund"].user}],
    "tools": RESPONSES_TOOLS,
}


def test_chat_messages_sent_to_responses_are_a_400_in_openais_shape(
    world: World, http: httpx.Client
) -> None:
    n = world.forwarded()
    for stream in (False, True):
        resp = http.post(world.gw + "/v1/responses", json={**CHAT_BODY, "stream": stream})
        openai_error(resp, 400, "invalid_request")
        assert "input" in resp.json()["error"]["message"]
    assert world.forwarded() == n  # never forwarded
    # and the SDK reads it as the request error it is
    c = openai.OpenAI(base_url=world.gw + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        c.post("/responses", body=CHAT_BODY, cast_to=object)


def test_responses_input_sent_to_messages_is_a_400_in_anthropics_shape(
    world: World, http: httpx.Client
) -> None:
    n = world.forwarded()
    for body in (
        {**RESPONSES_BODY, "max_tokens": 64},
        {**RESPONSES_BODY, "max_tokens": 64, "stream": True},
        # a chat history: a system message and a tool message are no Messages roles
        {
            "model": "scenario:refund",
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": "你是售后客服。"},
                {"role": "user", "content": "hi"},
            ],
        },
    ):
        anthropic_error(
            http.post(world.gw + "/v1/messages", json=body), 400, "invalid_request_error"
        )
    assert world.forwarded() == n
    c = anthropic.Anthropic(base_url=world.gw, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        c.post("/v1/messages", body={**RESPONSES_BODY, "max_tokens": 64}, cast_to=object)
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # Anthropic blocks inside Responses items, Responses items inside Anthropic content,
        # chat tool calls inside a Responses item, both 'input' and 'messages' at once
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": "查订单 88231"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_x", "name": "query_order"}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}],
                    },
                ]
            },
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": "查订单 88231"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_x",
                                "type": "function",
                                "function": {"name": "query_order", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_x", "content": "ok"},
                ]
            },
        ),
        ("/v1/responses", {"input": "查订单 88231", "messages": [{"role": "user"}]}),
        (
            "/v1/messages",
            {
                "max_tokens": 64,
                "messages": [
                    {"role": "user", "content": "查订单 88231"},
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "function_call",
                                "call_id": "call_x",
                                "name": "query_order",
                                "arguments": "{}",
                            }
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "function_call_output", "call_id": "call_x", "output": "ok"}
                        ],
                    },
                ],
            },
        ),
        (
            "/v1/messages",
            {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "input": "hi"},
        ),
    ],
    ids=[
        "anthropic-blocks-in-responses",
        "chat-tool-messages-in-responses",
        "input-and-messages",
        "responses-items-in-messages",
        "messages-and-input",
    ],
)
def test_foreign_parts_in_a_well_formed_request_are_forwarded_and_judged(
    world: World, http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    """What is well-formed for the path but carries another shape's parts: those parts are
    unknown fields -- forwarded to the upstream (whose verdict it is), the answer judged;
    never a 500."""
    user = who("mixed")
    if path.endswith("/messages"):
        body = {**body, "metadata": {"user_id": user}, "tools": MESSAGES_TOOLS}
    else:
        body = {**body, "user": user, "tools": RESPONSES_TOOLS}
    n = world.forwarded()
    resp = http.post(world.gw + path, json={"model": "scenario:always-not-found", **body})
    no_traceback(resp)
    assert resp.status_code == 200, resp.text
    assert world.forwarded() == n + 1
    assert resp.headers.get("x-loopwarden-run")  # judged: a run's answer


# -- a tool result for a call id the run never saw ------------------------------------------


def _responses_steps(
    client: Any, name: str, user: str, tamper: Callable[[int, list[dict[str, Any]]], Any]
) -> list[Any]:
    """A Responses agent continuing by previous_response_id; ``tamper(step, outputs)``
    returns the input it really sends.  The answers it got."""
    prev: str | None = None
    given: Any = SCENARIOS[name].user
    got = []
    for step in range(20):
        r = client.responses.create(
            model="scenario:" + name,
            input=given,
            tools=RESPONSES_TOOLS,
            previous_response_id=prev,
            user=user,
        )
        assert r.status == "completed"
        got.append(r)
        calls = [it for it in r.output if it.type == "function_call"]
        if not calls:
            return got
        prev = r.id
        outputs = [
            {
                "type": "function_call_output",
                "call_id": c.call_id,
                "output": run_tool(c.name, json.loads(c.arguments)),
            }
            for c in calls
        ]
        given = tamper(step, outputs)
    raise AssertionError("not stopped")


@pytest.mark.parametrize("name", ["refund", "always-not-found"])
def test_a_responses_result_for_a_call_id_never_handed_out_is_no_error(
    world: World, name: str
) -> None:
    client = openai.OpenAI(base_url=world.gw + "/v1", api_key=KEY, max_retries=0)
    clean = who("clean")
    _responses_steps(client, name, clean, lambda _s, outs: outs)
    stray = who("stray")

    def add_stray(step: int, outs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if step != 0:
            return outs
        return [*outs, {"type": "function_call_output", "call_id": "call_never", "output": "ok"}]

    _responses_steps(client, name, stray, add_stray)
    assert summary(world.records.one(stray)) == summary(world.records.one(clean))


def test_a_responses_result_whose_call_id_was_rewritten_counts_for_the_call_handed_out(
    world: World,
) -> None:
    """A client that renames the call id (the only result of the step carries an id the run
    never saw): no error, and the result is the handed-out call's -- the same record as a
    client that kept the id."""
    client = openai.OpenAI(base_url=world.gw + "/v1", api_key=KEY, max_retries=0)
    clean, renamed = who("kept-id"), who("renamed-id")
    _responses_steps(client, "refund", clean, lambda _s, outs: outs)

    def rename(step: int, outs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**o, "call_id": f"call_renamed_{step}_{i}"} for i, o in enumerate(outs)]

    _responses_steps(client, "refund", renamed, rename)
    assert summary(world.records.one(renamed)) == summary(world.records.one(clean))


def test_a_messages_result_for_a_tool_use_id_never_seen_is_no_error(world: World) -> None:
    client = anthropic.Anthropic(base_url=world.gw, api_key=KEY, max_retries=0)

    def play(user: str, stray: bool) -> str:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS["refund"].user}]
        for step in range(20):
            m = client.messages.create(
                model="scenario:refund",
                max_tokens=1024,
                messages=msgs,
                tools=MESSAGES_TOOLS,
                metadata={"user_id": user},
            )
            msgs.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in m.content],
                }
            )
            uses = [b for b in m.content if b.type == "tool_use"]
            if not uses:
                return "".join(b.text for b in m.content if b.type == "text")
            results: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": b.id, "content": run_tool(b.name, b.input)}
                for b in uses
            ]
            if stray and step == 0:
                results.append(
                    {"type": "tool_result", "tool_use_id": "toolu_never", "content": "ok"}
                )
            msgs.append({"role": "user", "content": results})
        raise AssertionError("not stopped")

    clean, stray = who("m-clean"), who("m-stray")
    assert play(clean, False) == play(stray, True)
    assert summary(world.records.one(stray)) == summary(world.records.one(clean))


def test_a_first_request_carrying_results_for_unknown_calls_is_a_new_run(
    world: World, http: httpx.Client
) -> None:
    user = who("orphan")
    body = {
        "model": "scenario:refund",
        "user": user,
        "tools": RESPONSES_TOOLS,
        "input": [
            {"role": "user", "content": SCENARIOS["refund"].user},
            {"type": "function_call_output", "call_id": "call_from_elsewhere", "output": "ok"},
        ],
    }
    resp = http.post(world.gw + "/v1/responses", json=body)
    no_traceback(resp)
    assert resp.status_code == 200 and resp.json()["status"] == "completed"
    assert resp.headers["x-loopwarden-run"]


# -- an unknown previous_response_id, streamed ---------------------------------------------


def test_an_unknown_previous_response_id_streamed_is_a_new_run_noting_it(world: World) -> None:
    client = openai.OpenAI(base_url=world.gw + "/v1", api_key=KEY, max_retries=0)
    user = who("unknown-prev")
    prev: str | None = "resp_begun_elsewhere_0001"
    given: Any = [{"type": "function_call_output", "call_id": "call_elsewhere", "output": "ok"}]
    for _ in range(10):
        with client.responses.stream(
            model="scenario:refund",
            input=given,
            tools=RESPONSES_TOOLS,
            previous_response_id=prev,
            user=user,
        ) as s:
            r = s.get_final_response()
        calls = [it for it in r.output if it.type == "function_call"]
        if not calls:
            break
        prev = r.id
        given = [
            {
                "type": "function_call_output",
                "call_id": c.call_id,
                "output": run_tool(c.name, json.loads(c.arguments)),
            }
            for c in calls
        ]
    rec = world.records.one(user)
    assert rec["termination"] == "final_answer"
    assert rec["meta"]["unknown_previous"] == "resp_begun_elsewhere_0001"


# -- a stream cut by the upstream in the middle of a call -----------------------------------


def _messages_request(msgs: list[dict[str, Any]], user: str) -> dict[str, Any]:
    return {
        "model": "scenario:always-not-found",
        "max_tokens": 1024,
        "messages": msgs,
        "tools": MESSAGES_TOOLS,
        "metadata": {"user_id": user},
        "stream": True,
    }


def _messages_cut_run(world: World, http: httpx.Client, user: str, fault: str | None) -> bytes:
    """always-not-found on streamed Messages, its second step cut (when ``fault``) and then
    retried as it was; returns what the client got for the cut step."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS["always-not-found"].user}]
    cut = b""
    for step in range(20):
        if fault is not None and step == 1:
            with http.stream(
                "POST",
                world.gw + "/v1/messages",
                json=_messages_request(msgs, user),
                headers={"x-fault": fault, "x-cut-after": "input_json_delta"},
            ) as resp:
                assert resp.status_code == 200
                cut = b"".join(resp.iter_raw())
        resp = http.post(world.gw + "/v1/messages", json=_messages_request(msgs, user))
        assert resp.status_code == 200, resp.text
        m = message_from_sse(resp.content)
        msgs.append({"role": "assistant", "content": m["content"]})
        uses = [b for b in m["content"] if b["type"] == "tool_use"]
        if not uses:
            return cut
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
    raise AssertionError("not stopped")


@pytest.mark.parametrize("fault", ["cut", "reset"], ids=["body-ended", "connection-dropped"])
def test_a_messages_stream_cut_inside_a_tool_use_block_ends_in_an_error_event(
    world: World, http: httpx.Client, fault: str
) -> None:
    clean, cut_user = who("m-uncut"), who(f"m-{fault}")
    _messages_cut_run(world, http, clean, None)
    cuts = world.faults.cuts
    got = _messages_cut_run(world, http, cut_user, fault)
    assert world.faults.cuts == cuts + 1
    events = sse_events(got)
    # the error event, in Anthropic's shape, is the last thing the client got
    name, data = events[-1]
    assert name == "error"
    assert data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "upstream_stream_cut" in data["error"]["message"]
    # the partial tool_use never reached the client, and the message never "ended"
    assert b"tool_use" not in got and b"message_stop" not in got
    assert "Traceback" not in got.decode()
    # the run was not advanced: its record is the record of the run never cut
    assert summary(world.records.one(cut_user)) == summary(world.records.one(clean))


def test_the_anthropic_sdk_raises_on_a_cut_stream(world: World) -> None:
    c = anthropic.Anthropic(base_url=world.gw, api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": SCENARIOS["always-not-found"].user}]
    with (
        pytest.raises(anthropic.APIStatusError) as err,
        c.messages.stream(
            model="scenario:always-not-found",
            max_tokens=1024,
            messages=msgs,  # type: ignore[arg-type]
            tools=MESSAGES_TOOLS,  # type: ignore[arg-type]
            extra_headers={"x-fault": "cut", "x-cut-after": "input_json_delta"},
        ) as s,
    ):
        for _ in s:
            pass
    assert "upstream_stream_cut" in str(err.value)


def _responses_request(given: Any, prev: str | None, user: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "scenario:always-not-found",
        "input": given,
        "tools": RESPONSES_TOOLS,
        "user": user,
        "stream": True,
    }
    if prev:
        body["previous_response_id"] = prev
    return body


def _responses_cut_run(world: World, http: httpx.Client, user: str, fault: str | None) -> bytes:
    prev: str | None = None
    given: Any = SCENARIOS["always-not-found"].user
    cut = b""
    for step in range(20):
        if fault is not None and step == 1:
            with http.stream(
                "POST",
                world.gw + "/v1/responses",
                json=_responses_request(given, prev, user),
                headers={"x-fault": fault, "x-cut-after": "function_call_arguments.delta"},
            ) as resp:
                assert resp.status_code == 200
                cut = b"".join(resp.iter_raw())
        resp = http.post(world.gw + "/v1/responses", json=_responses_request(given, prev, user))
        assert resp.status_code == 200, resp.text
        r = responses_from_sse(resp.content)
        calls = [it for it in r["output"] if it["type"] == "function_call"]
        if not calls:
            return cut
        prev = r["id"]
        given = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": run_tool(c["name"], json.loads(c["arguments"])),
            }
            for c in calls
        ]
    raise AssertionError("not stopped")


@pytest.mark.parametrize("fault", ["cut", "reset"], ids=["body-ended", "connection-dropped"])
def test_a_responses_stream_cut_inside_function_call_arguments_is_not_advanced(
    world: World, http: httpx.Client, fault: str
) -> None:
    clean, cut_user = who("r-uncut"), who(f"r-{fault}")
    _responses_cut_run(world, http, clean, None)
    cuts = world.faults.cuts
    got = _responses_cut_run(world, http, cut_user, fault)
    assert world.faults.cuts == cuts + 1
    # the partial call never reached the client, nor a completed response
    assert b"function_call" not in got and b"response.completed" not in got
    assert b"upstream_stream_cut" in got and b"Traceback" not in got
    # the run was not advanced: the retried step was judged afresh
    assert summary(world.records.one(cut_user)) == summary(world.records.one(clean))


def test_a_cut_responses_stream_ends_in_the_responses_apis_error_event(
    world: World, http: httpx.Client
) -> None:
    with http.stream(
        "POST",
        world.gw + "/v1/responses",
        json=_responses_request(SCENARIOS["always-not-found"].user, None, who("r-shape")),
        headers={"x-fault": "cut", "x-cut-after": "function_call_arguments.delta"},
    ) as resp:
        got = b"".join(resp.iter_raw())
    events = sse_events(got)
    name, data = events[-1]
    # the Responses API's error event: event "error", {"type": "error", "code", "message",
    # "param", "sequence_number"} -- its number after every one the stream carried
    assert name == "error"
    assert data["type"] == "error" and data["code"] == "upstream_stream_cut" and data["message"]
    seqs = [d["sequence_number"] for _, d in events[:-1] if isinstance(d, dict)]
    assert data["sequence_number"] > max(seqs)


def test_the_openai_sdk_raises_on_a_cut_responses_stream(world: World) -> None:
    """The error event makes the SDK raise (an ``APIError`` naming the cut), not hand the
    agent a response that never completed."""
    c = openai.OpenAI(base_url=world.gw + "/v1", api_key=KEY, max_retries=0)
    with (
        pytest.raises(openai.APIError) as err,
        c.responses.stream(
            model="scenario:always-not-found",
            input=SCENARIOS["always-not-found"].user,
            tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
            extra_headers={"x-fault": "cut", "x-cut-after": "function_call_arguments.delta"},
        ) as s,
    ):
        for _ in s:
            pass
    assert isinstance(err.value.body, dict)
    assert err.value.body["code"] == "upstream_stream_cut"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_a_garbled_upstream_event_ends_the_stream_in_the_wires_own_error(
    world: World, http: httpx.Client, path: str
) -> None:
    """An upstream stream event with an index that is no number: the upstream's fault, a
    defined answer -- the stream ends with an error event in the wire's shape -- not the
    gateway's own failure."""
    if path.endswith("/messages"):
        body = _messages_request(
            [{"role": "user", "content": SCENARIOS["always-not-found"].user}], who("garble-m")
        )
        garble = {"x-garble": '"index": 0', "x-garble-with": '"index": "zero"'}
    else:
        body = _responses_request(SCENARIOS["always-not-found"].user, None, who("garble-r"))
        garble = {"x-garble": '"output_index": 0', "x-garble-with": '"output_index": "zero"'}
    with http.stream(
        "POST", world.gw + path, json=body, headers={"x-fault": "garble", **garble}
    ) as resp:
        assert resp.status_code == 200
        got = b"".join(resp.iter_raw())
    assert b"gateway_error" not in got  # the upstream's fault, not a bug in the gateway
    name, data = sse_events(got)[-1]
    assert name == "error" and data["type"] == "error"


# -- an upstream 429 with retry-after --------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_an_upstream_429_passes_through_in_the_wires_own_shape(
    world: World, http: httpx.Client, path: str, stream: bool
) -> None:
    if path.endswith("/messages"):
        body: dict[str, Any] = {
            "model": "scenario:refund",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
        want, extra = ANTHROPIC_429, ANTHROPIC_429_HEADERS
    else:
        body = {**RESPONSES_BODY, "stream": stream}
        want, extra = OPENAI_429, OPENAI_429_HEADERS
    fault = {"x-fault": "429"}
    direct = http.post(world.upstream + path, json=body, headers=fault)
    via = http.post(world.gw + path, json=body, headers=fault)
    assert via.status_code == direct.status_code == 429
    assert via.content == direct.content == want
    for name, value in extra:
        assert via.headers[name.decode()] == value.decode()
    assert via.headers["content-type"] == "application/json"


def test_the_anthropic_sdk_sees_the_429_as_anthropic_sent_it(world: World) -> None:
    c = anthropic.Anthropic(base_url=world.gw, api_key=KEY, max_retries=0)
    for stream in (False, True):
        with pytest.raises(anthropic.RateLimitError) as err:
            c.messages.create(
                model="scenario:refund",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
                stream=stream,  # type: ignore[call-overload]
                extra_headers={"x-fault": "429"},
            )
        assert err.value.response.headers["retry-after"] == "13"
        assert err.value.request_id == "req_ant_429"
        assert err.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]


def test_a_429_abandons_the_turn_the_retry_is_judged_afresh(world: World) -> None:
    """The client's retry after a 429 continues the run as if the 429 never happened."""
    client = anthropic.Anthropic(base_url=world.gw, api_key=KEY, max_retries=0)

    def play(user: str, limited: bool) -> None:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS["never-finish"].user}]
        for step in range(40):
            args: dict[str, Any] = {
                "model": "scenario:never-finish",
                "max_tokens": 1024,
                "messages": msgs,
                "tools": MESSAGES_TOOLS,
                "metadata": {"user_id": user},
            }
            if limited and step in (1, 3):
                with pytest.raises(anthropic.RateLimitError):
                    client.messages.create(**args, extra_headers={"x-fault": "429"})
            m = client.messages.create(**args)
            msgs.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in m.content],
                }
            )
            uses = [b for b in m.content if b.type == "tool_use"]
            if not uses:
                return
            msgs.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": b.id,
                            "content": run_tool(b.name, b.input),
                        }
                        for b in uses
                    ],
                }
            )
        raise AssertionError("not stopped")

    clean, limited = who("429-clean"), who("429-limited")
    play(clean, False)
    play(limited, True)
    assert summary(world.records.one(limited)) == summary(world.records.one(clean))
