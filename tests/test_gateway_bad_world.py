"""Bad input and a bad world at the gateway: each a defined answer, never a 500 with a traceback.

Real uvicorn servers on 127.0.0.1: the gateway (``[gateway] upstream_timeout_s`` and
``max_body_bytes`` small) in front of :class:`Faulty`, an upstream that misbehaves on
request -- the request's model names the fault.  Clients are httpx (raw bytes, to see exactly
what went over the wire) and the real ``openai`` SDK where its reading of the answer matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.gateway import free_port, serve
from support.gw_clients import gateway_config, records, wait_for_record

from loopwarden import Deployment
from loopwarden.config import parse_config
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.state import open_state

#: the API key the clients send: it must never show in a log line or a record
SECRET = "sk-live-NEVER-LOG-ME-" + uuid.uuid4().hex
MAX_BODY = 64 * 1024
TIMEOUT_S = 0.5

Message = MutableMapping[str, Any]


class Faulty:
    """An upstream whose fault the request's model names (``fault:KIND``)."""

    def __init__(self) -> None:
        #: (raw body, headers) of every chat request
        self.seen: list[tuple[bytes, dict[str, str]]] = []
        #: requests whose client (the gateway) went away while this upstream still answered
        self.abandoned = 0

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append((body, headers))
        kind = str(json.loads(body).get("model", "")).removeprefix("fault:")

        async def reply(status: int, data: bytes, *extra: tuple[bytes, bytes]) -> None:
            hs = [(b"content-length", str(len(data)).encode()), *extra]
            await send({"type": "http.response.start", "status": status, "headers": hs})
            await send({"type": "http.response.body", "body": data})

        async def gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.abandoned += 1

        async def until_gone(bound_s: float = 20.0) -> None:
            """Wait for the client to go away (at most ``bound_s``)."""
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(gone(), bound_s)

        if kind == "nonjson":
            await reply(200, b"<html><body>502 Bad Gateway (nginx)</body></html>", TEXT_HTML)
        elif kind == "500":
            await reply(500, ERROR_500, JSON_CT, (b"x-request-id", b"req_500"))
        elif kind == "429":
            await reply(429, ERROR_429, JSON_CT, *RATE_LIMITED)
        elif kind == "slow":
            await until_gone()
        elif kind == "stream-cut":  # a few chunks, then the body ends: no finish, no [DONE]
            await send({"type": "http.response.start", "status": 200, "headers": [SSE_CT]})
            chunk = {
                "id": "chatcmpl-cut",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "fault:stream-cut",
                "choices": [
                    {"index": 0, "delta": {"content": "Half an ans"}, "finish_reason": None}
                ],
            }
            data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": False})
        elif kind == "stream-hang":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [SSE_CT]},
            )
            for delta in ({"role": "assistant", "content": ""}, {"content": "Let me look"}):
                chunk = {
                    "id": "chatcmpl-hang",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "fault:stream-hang",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await until_gone()
        else:  # "echo": a plain final answer
            answer = {
                "id": "chatcmpl-echo",
                "object": "chat.completion",
                "created": 1,
                "model": "fault:echo",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "done"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
            await reply(200, json.dumps(answer).encode(), JSON_CT)


JSON_CT = (b"content-type", b"application/json")
TEXT_HTML = (b"content-type", b"text/html")
SSE_CT = (b"content-type", b"text/event-stream")
ERROR_500 = b'{"error": {"message": "The server had an error", "type": "server_error"}}'
ERROR_429 = (
    b'{"error": {"message": "Rate limit reached for gpt-4o-mini, try again in 7s.",'
    b' "type": "requests", "code": "rate_limit_exceeded"}}'
)
RATE_LIMITED = (
    (b"retry-after", b"7"),
    (b"retry-after-ms", b"7000"),
    (b"x-ratelimit-remaining-requests", b"0"),
    (b"x-request-id", b"req_429"),
)


@dataclass
class World:
    tmp: Path
    faulty: Faulty
    upstream: str
    gw: str
    gw_down: str  # a gateway whose upstream is not listening

    @property
    def runs(self) -> Path:
        return self.tmp / "runs.jsonl"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gw-bad-world")
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPWARDEN_DATA_DIR", str(tmp / "data"))
        faulty = Faulty()
        up = stack.enter_context(serve(faulty))
        data = gateway_config(
            tmp, gateway={"upstream_timeout_s": TIMEOUT_S, "max_body_bytes": MAX_BODY}
        )
        config = parse_config(data, path="<gw-bad-world>")
        dep = Deployment(config, tools=[])
        stack.callback(dep.close)
        gw = stack.enter_context(serve(GatewayApp(dep, up + "/v1", open_state(config.store))))
        nobody = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
        gw_down = stack.enter_context(serve(GatewayApp(dep, nobody, open_state(config.store))))
        yield World(tmp, faulty, up, gw, gw_down)


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(headers={"authorization": "Bearer " + SECRET}, timeout=30) as c:
        yield c


def ask(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def assert_defined_error(resp: httpx.Response, status: int, code: str) -> None:
    """The gateway's own answer: that status, an OpenAI-shaped error with that code, no
    traceback."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert "Traceback" not in resp.text
    err = resp.json()["error"]
    assert err["code"] == code
    assert err["message"]


# -- bad input ------------------------------------------------------------------------------


def test_malformed_json_is_a_400(world: World, http: httpx.Client) -> None:
    url = world.gw + "/v1/chat/completions"
    for body in (b'{"model": "fault:echo", "messages": [', b"\xff\xfe", b"[]", b'{"messages": 3}'):
        resp = http.post(url, content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] in ("invalid_json", "invalid_request")
        assert "Traceback" not in resp.text


def test_a_huge_body_is_a_413(world: World, http: httpx.Client) -> None:
    n = len(world.faulty.seen)
    huge = ask("fault:echo", messages=[{"role": "user", "content": "x" * (MAX_BODY * 2)}])
    resp = http.post(world.gw + "/v1/chat/completions", json=huge)
    assert_defined_error(resp, 413, "request_too_large")
    assert len(world.faulty.seen) == n  # never forwarded


def test_unknown_fields_reach_the_upstream_untouched(world: World, http: httpx.Client) -> None:
    body = json.dumps(
        {
            "model": "fault:echo",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
                    ],
                    "name": "ada",
                    "x_vendor_note": 1,
                }
            ],
            "reasoning_effort": "low",
            "seed": 7,
            "x_future_field": {"nested": [1, 2, {"deep": True}]},
            "metadata": {"trace": "abc"},
        },
        separators=(",", ":"),
    ).encode()
    resp = http.post(
        world.gw + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "done"
    forwarded, _ = world.faulty.seen[-1]
    assert forwarded == body


# -- a bad world --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_non_json_upstream_is_a_502(world: World, http: httpx.Client, stream: bool) -> None:
    # JSON: no completion to judge; streamed: no event stream to pass on (an HTML page
    # under a 200 is no stream)
    resp = http.post(world.gw + "/v1/chat/completions", json=ask("fault:nonjson", stream=stream))
    assert_defined_error(resp, 502, "bad_upstream")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_failing_upstream_passes_its_status_through(
    world: World, http: httpx.Client, stream: bool
) -> None:
    resp = http.post(world.gw + "/v1/chat/completions", json=ask("fault:500", stream=stream))
    assert resp.status_code == 500
    assert resp.content == ERROR_500  # the upstream's own error, not a gateway traceback
    assert resp.headers["x-request-id"] == "req_500"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_unreachable_upstream_is_a_502(world: World, http: httpx.Client, stream: bool) -> None:
    resp = http.post(world.gw_down + "/v1/chat/completions", json=ask("fault:echo", stream=stream))
    assert_defined_error(resp, 502, "upstream_unreachable")


def test_a_stream_the_upstream_cuts_ends_in_an_error_event_the_sdk_raises(world: World) -> None:
    c = openai.OpenAI(base_url=world.gw + "/v1", api_key=SECRET, max_retries=0, timeout=30)
    text = ""
    with pytest.raises(openai.APIError) as err:
        for chunk in c.chat.completions.create(
            model="fault:stream-cut", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert text == "Half an ans"  # the text passed through as it came
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "upstream_stream_cut"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_upstream_timeout_is_a_504(world: World, http: httpx.Client, stream: bool) -> None:
    resp = http.post(world.gw + "/v1/chat/completions", json=ask("fault:slow", stream=stream))
    assert_defined_error(resp, 504, "upstream_timeout")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_429_with_retry_after_is_passed_through_faithfully(
    world: World, http: httpx.Client, stream: bool
) -> None:
    body = ask("fault:429", stream=stream)
    direct = http.post(world.upstream + "/v1/chat/completions", json=body)
    via = http.post(world.gw + "/v1/chat/completions", json=body)
    assert via.status_code == direct.status_code == 429
    assert via.content == direct.content == ERROR_429
    for name, value in RATE_LIMITED:
        assert via.headers[name.decode()] == value.decode()
    assert via.headers["content-type"] == "application/json"


def test_the_sdk_sees_the_429_as_the_upstream_sent_it(world: World) -> None:
    c = openai.OpenAI(base_url=world.gw + "/v1", api_key=SECRET, max_retries=0, timeout=30)
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(model="fault:429", messages=[{"role": "user", "content": "hi"}])
    assert err.value.response.headers["retry-after"] == "7"
    assert err.value.code == "rate_limit_exceeded"
    assert err.value.request_id == "req_429"


def test_a_client_that_disconnects_mid_stream_ends_the_run_cancelled(
    world: World, http: httpx.Client
) -> None:
    user = "gone-" + uuid.uuid4().hex[:8]
    abandoned = world.faulty.abandoned
    body = ask("fault:stream-hang", stream=True, user=user)
    with http.stream("POST", world.gw + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        got = b""
        for part in resp.iter_raw():
            got += part
            if b"Let me look" in got:
                break  # the text passed through as it came; now the client goes away
    rec = wait_for_record(world.runs, lambda r: r.get("meta", {}).get("user") == user)
    assert rec["termination"] == "cancelled"
    # and the gateway let go of the upstream's stream
    deadline = time.monotonic() + 20
    while world.faulty.abandoned == abandoned:
        assert time.monotonic() < deadline, "the gateway kept reading the upstream"
        time.sleep(0.02)


def test_the_api_key_is_never_in_a_log_line_or_a_record(
    world: World, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = world.gw + "/v1/chat/completions"
    user = "key-" + uuid.uuid4().hex[:8]
    for model in ("fault:echo", "fault:500", "fault:nonjson", "fault:slow", "fault:429"):
        http.post(url, json=ask(model, user=user))
    http.post(url, content=b"{not json")
    c = openai.OpenAI(base_url=world.gw + "/v1", api_key=SECRET, max_retries=0, timeout=30)
    c.chat.completions.create(model="fault:echo", messages=[{"role": "user", "content": "hi"}])
    wait_for_record(world.runs, lambda r: r.get("meta", {}).get("user") == user)
    # the key went where it belongs (the upstream) ...
    assert any(h.get("authorization") == "Bearer " + SECRET for _, h in world.faulty.seen)
    # ... and nowhere else
    assert caplog.records, "nothing was logged: the check would prove nothing"
    assert SECRET not in caplog.text
    assert SECRET not in world.runs.read_text()
    assert all(SECRET not in json.dumps(r) for r in records(world.runs))
    # nor in the conversations the gateway keeps between requests (the tenant is a hash)
    kept = [p for p in world.tmp.glob("store.sqlite3*") if p.is_file()]
    assert kept and all(SECRET.encode() not in p.read_bytes() for p in kept)
