"""Every wire the agents speak: the Responses API and Anthropic Messages through the gateway.

The official ``openai`` SDK's ``responses.create`` / ``responses.stream`` (continuing with
``previous_response_id``: the history stays at the provider) and the official ``anthropic``
SDK's ``messages.create`` / ``messages.stream``, each against a real gateway in front of a
local scripted upstream speaking that shape (``loopwarden.gateway.scripted``), both under
real uvicorn: a runaway is stopped with a final answer the client handles as normal, a
healthy run ends as the model ended it, and the same recorded behaviour gets the same run
record in all three shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from support.gateway import serve
from support.wires import (
    MESSAGES_TOOLS,
    RESPONSES_TOOLS,
    SCENARIOS,
    chat_run,
    messages_run,
    responses_run,
)

from loopwarden import Deployment, signals
from loopwarden.config import default_config_path, load_config
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.gateway.state import MemoryState

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

RUNAWAY = ("always-not-found", "never-finish", "oscillation")
HEALTHY = ("refund", "repeat-then-recover")


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    records: list[dict[str, Any]] = []

    def keep(sender: Any, **kw: Any) -> None:
        records.append(kw["record"])

    logging.getLogger("loopwarden").setLevel(logging.CRITICAL)
    dep = Deployment(load_config(default_config_path()))
    signals.run_stopped.connect(keep, weak=False)
    try:
        with (
            serve(ScriptedUpstream(SCENARIOS)) as upstream,
            serve(GatewayApp(dep, upstream + "/v1", MemoryState())) as gateway,
        ):
            yield gateway, records
    finally:
        signals.run_stopped.disconnect(keep)
        dep.close()


def _record(records: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The last record of the runs made with API key ``key`` (the tenant is its hash)."""
    return records[-1]


def _openai(gateway: str, key: str) -> Any:
    return openai.OpenAI(base_url=gateway + "/v1", api_key=key, max_retries=0)


def _anthropic(gateway: str, key: str) -> Any:
    return anthropic.Anthropic(base_url=gateway, api_key=key, max_retries=0)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", RUNAWAY)
def test_responses_runaway_is_stopped_with_a_completed_response(
    world: tuple[str, list[dict[str, Any]]], name: str, stream: bool
) -> None:
    gateway, records = world
    text, header = responses_run(_openai(gateway, f"sk-resp-{name}-{stream}"), name, stream=stream)
    rec = records[-1]
    assert rec["termination"] not in ("final_answer", "running")
    assert rec["meta"]["front"] == "gateway"
    assert text.strip() and text.strip() in (rec["final_answer"] or "")
    if not stream:
        assert header == rec["termination"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", RUNAWAY)
def test_messages_runaway_is_stopped_with_end_turn(
    world: tuple[str, list[dict[str, Any]]], name: str, stream: bool
) -> None:
    gateway, records = world
    text, header = messages_run(_anthropic(gateway, f"sk-ant-{name}-{stream}"), name, stream=stream)
    rec = records[-1]
    assert rec["termination"] not in ("final_answer", "running")
    assert text.strip() and rec["final_answer"] and rec["final_answer"].strip() in text
    if not stream:
        assert header == rec["termination"]


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_runs_end_as_the_model_ends_them_on_every_wire(
    world: tuple[str, list[dict[str, Any]]], name: str
) -> None:
    gateway, records = world
    final, _ = chat_run(_openai(gateway, f"sk-h-c-{name}"), name)
    for text, _ in (
        responses_run(_openai(gateway, f"sk-h-r-{name}"), name, stream=False),
        responses_run(_openai(gateway, f"sk-h-rs-{name}"), name, stream=True),
        messages_run(_anthropic(gateway, f"sk-h-m-{name}"), name, stream=False),
        messages_run(_anthropic(gateway, f"sk-h-ms-{name}"), name, stream=True),
    ):
        assert records[-1]["termination"] == "final_answer"
        assert text == final


@pytest.mark.parametrize("name", [*RUNAWAY, *HEALTHY])
def test_the_same_behaviour_gets_the_same_record_on_all_three_wires(
    world: tuple[str, list[dict[str, Any]]], name: str
) -> None:
    gateway, records = world

    def summary() -> tuple[Any, ...]:
        r = records[-1]
        warned = [(w["step"], w["plugin"]) for w in r["warnings"]]
        return r["termination"], r["stopped_by"], r["steps"], r["tool_calls"], warned

    chat_run(_openai(gateway, f"sk-same-c-{name}"), name)
    chat = summary()
    responses_run(_openai(gateway, f"sk-same-r-{name}"), name, stream=False)
    responses = summary()
    messages_run(_anthropic(gateway, f"sk-same-m-{name}"), name, stream=False)
    messages = summary()
    assert chat == responses == messages


def test_an_unknown_previous_response_id_is_a_new_run_not_an_error(
    world: tuple[str, list[dict[str, Any]]],
) -> None:
    """A request continuing an answer the gateway never saw (a run that began elsewhere, or
    another tenant's): forwarded, judged as a new run, and the record notes the id."""
    gateway, records = world
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-unknown-prev", max_retries=0)
    first = client.responses.create(
        model="scenario:refund", input=SCENARIOS["refund"].user, tools=RESPONSES_TOOLS
    )
    other = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-another-tenant", max_retries=0)
    prev: str | None = first.id
    given: Any = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "ok"}
        for c in first.output
        if c.type == "function_call"
    ]
    for _ in range(10):
        r = other.responses.create(
            model="scenario:refund", input=given, tools=RESPONSES_TOOLS, previous_response_id=prev
        )
        assert r.status == "completed"
        calls = [it for it in r.output if it.type == "function_call"]
        if not calls:
            break
        prev = r.id
        given = [
            {"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls
        ]
    rec = records[-1]
    assert rec["termination"] == "final_answer"
    assert rec["meta"]["unknown_previous"] == first.id


def test_anthropic_tool_results_flagged_is_error_are_failures(
    world: tuple[str, list[dict[str, Any]]],
) -> None:
    """``is_error`` on a tool_result is a failed call: three in a row are a failure streak,
    though their text says nothing of an error."""
    gateway, records = world
    client = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-is-error", max_retries=0)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS["never-finish"].user}]
    for _ in range(40):
        m = client.messages.create(
            model="scenario:never-finish", max_tokens=1024, messages=msgs, tools=MESSAGES_TOOLS
        )
        msgs.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
        )
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            break
        msgs.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": "ok", "is_error": True}
                    for b in uses
                ],
            }
        )
    rec = records[-1]
    assert rec["termination"] == "failure_streak"


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [
        ("/v1/messages", b"{nope", "invalid_request_error"),
        (
            "/v1/messages",
            b'{"model": "m", "messages": [{"role": "tool"}]}',
            "invalid_request_error",
        ),
        ("/v1/responses", b'{"model": "m"}', None),
        ("/v1/responses", b'{"model": "m", "input": [1]}', None),
    ],
)
def test_malformed_requests_get_an_error_in_their_wires_shape(
    world: tuple[str, list[dict[str, Any]]], path: str, body: bytes, kind: str | None
) -> None:
    import httpx

    gateway, _ = world
    r = httpx.post(gateway + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    data = r.json()
    if kind is not None:  # Anthropic's shape
        assert data["type"] == "error" and data["error"]["type"] == kind
    else:  # OpenAI's
        assert data["error"]["code"] in ("invalid_request", "invalid_json")


class _Heard:
    """ASGI middleware keeping the requests an upstream heard (path and headers)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.heard: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            self.heard.append((scope["path"], headers))
        await self.app(scope, receive, send)


def test_each_wire_may_have_its_own_upstream_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[gateway.upstreams]`` sends Anthropic clients to an Anthropic endpoint beside
    OpenAI ones; with ``forward_key = false`` each gets its own key, in its own header."""
    from loopwarden.config import parse_config

    monkeypatch.setenv("LW_TEST_OPENAI_KEY", "sk-openai-upstream")
    monkeypatch.setenv("LW_TEST_ANTHROPIC_KEY", "sk-ant-upstream")
    openai_side, anthropic_side = (
        _Heard(ScriptedUpstream(SCENARIOS)),
        _Heard(ScriptedUpstream(SCENARIOS)),
    )
    with serve(openai_side) as up_openai, serve(anthropic_side) as up_anthropic:
        config = parse_config(
            {
                "gateway": {
                    "forward_key": False,
                    "upstream_key_env": "LW_TEST_OPENAI_KEY",
                    "upstreams": {"messages": up_anthropic},
                    "upstream_key_envs": {"messages": "LW_TEST_ANTHROPIC_KEY"},
                }
            }
        )
        dep = Deployment(config)
        try:
            with serve(GatewayApp(dep, up_openai + "/v1", MemoryState())) as gateway:
                chat_run(_openai(gateway, "sk-client-own"), "refund")
                messages_run(_anthropic(gateway, "sk-client-own"), "refund", stream=False)
        finally:
            dep.close()
    assert openai_side.heard and all(p.endswith("/chat/completions") for p, _ in openai_side.heard)
    assert anthropic_side.heard and all(p == "/v1/messages" for p, _ in anthropic_side.heard)
    for _, h in openai_side.heard:
        assert h["authorization"] == "Bearer sk-openai-upstream" and "x-api-key" not in h
    for _, h in anthropic_side.heard:
        assert h["x-api-key"] == "sk-ant-upstream" and "authorization" not in h


def test_a_wire_upstream_that_is_no_url_is_a_config_error() -> None:
    from loopwarden.config import parse_config
    from loopwarden.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"upstreams\.messages"):
        parse_config({"gateway": {"upstreams": {"messages": "api.anthropic.com"}}})
