"""The real ``openai`` Python SDK running agent loops through ``loopwarden gateway``.

Everything here is real: uvicorn servers on 127.0.0.1 (the gateway, a scripted upstream that
plays the demo's scenarios, and a deterministic one for byte comparisons), the SDK's own
HTTP stack, the demo shop's tools run by the client.  Nothing is mocked.

- a runaway (sync JSON, ``AsyncOpenAI``, streamed) is stopped and the client's loop ends
  normally on the gateway's final answer;
- a healthy run (refund) through the gateway is byte-identical to the same run sent direct,
  JSON and streamed, and the upstream receives the client's own bytes;
- ``stop_mode = "error"``: a 400 ``loopwarden_stop`` with ``x-should-retry: false`` that the
  SDK does not retry;
- an agent that ends only through its own ``final_answer`` tool (``tool_choice: "required"``,
  like smolagents' ToolCallingAgent) gets the stop as a call to that tool;
- an agent that replays its calls as assistant text and results as user messages (as
  smolagents does) is still found and stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.gateway import scenarios, serve
from support.gw_clients import (
    Counting,
    DeterministicUpstream,
    TeeTransport,
    ToolBox,
    agent_loop,
    agent_loop_async,
    records,
    serve_gateway,
    wait_for_record,
)

from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.models.scenario import Scenario, scenarios_dir

#: the stop reasons a runaway scenario may end on through the gateway (its loop detectors
#: and caps; never final_answer)
RUNAWAY = {"repeat_call", "oscillation", "no_progress", "stall", "max_steps", "failure_streak"}
KEY = "sk-test-gw-clients"

OSCILLATION = "oscillation"
#: every built-in scenario
ALL = tuple(sorted(p.stem for p in scenarios_dir().glob("*.toml")))


@dataclass
class World:
    tmp: Path
    scs: dict[str, Scenario]
    upstream: str  # the scripted upstream (random call ids, like a real model)
    det: DeterministicUpstream
    det_url: str
    gw: str  # the gateway in front of the scripted upstream
    gw_det: str  # the gateway in front of the deterministic upstream
    gw_error: str  # stop_mode = "error", in front of the scripted upstream
    error_app: Counting

    @property
    def runs(self) -> Path:
        return self.tmp / "runs.jsonl"

    def record(self, user: str) -> dict[str, Any]:
        """The run record of the (last finished) run of ``user``."""
        return wait_for_record(self.runs, lambda r: r.get("meta", {}).get("user") == user)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gw-clients")
    scs = scenarios(ALL)
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPWARDEN_DATA_DIR", str(tmp / "data"))

        def gateway(upstream: str, **tables: Any) -> tuple[str, Counting]:
            return serve_gateway(stack, tmp, upstream, **tables)

        up = stack.enter_context(serve(ScriptedUpstream(scs)))
        det = DeterministicUpstream(scs)
        det_url = stack.enter_context(serve(det))
        gw, _ = gateway(up)
        gw_det, _ = gateway(det_url)
        gw_error, error_app = gateway(up, gateway={"stop_mode": "error"})
        yield World(tmp, scs, up, det, det_url, gw, gw_det, gw_error, error_app)


def client(base: str, **kwargs: Any) -> openai.OpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, timeout=30, **kwargs)


def aclient(base: str, **kwargs: Any) -> openai.AsyncOpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key=KEY, timeout=30, **kwargs)


def who(tag: str) -> str:
    """A user id of one test's runs (its tenant, and how its records are found)."""
    return f"{tag}-{uuid.uuid4().hex[:8]}"


# -- runaways are stopped, the client ends normally ---------------------------------------


@pytest.mark.parametrize("name", ["always-not-found", "never-finish", OSCILLATION])
def test_sync_runaway_is_stopped_with_a_final_answer(
    world: World, tmp_path: Path, name: str
) -> None:
    sc = world.scs[name]
    user = who("sync")
    box = ToolBox(sc, tmp_path)
    loop = agent_loop(client(world.gw), "scenario:" + name, box, user=user)
    rec = world.record(user)
    assert rec["termination"] in RUNAWAY
    # the stop reached the client as an ordinary answer, named in a header
    assert loop.stop == rec["termination"]
    assert loop.answer and loop.answer == rec["final_answer"]
    assert json.loads(loop.bodies[-1])["choices"][0]["finish_reason"] == "stop"
    # the client's requests: no more than the run's model turns (a skip's re-ask and a soft
    # stop's wrap-up are upstream calls the client never makes)
    assert loop.steps <= rec["steps"] < 20


def test_async_runaway_is_stopped_with_a_final_answer(world: World, tmp_path: Path) -> None:
    sc = world.scs["never-finish"]
    user = who("async")

    async def main() -> Any:
        async with aclient(world.gw) as c:
            return await agent_loop_async(
                c, "scenario:never-finish", ToolBox(sc, tmp_path), user=user
            )

    loop = asyncio.run(main())
    rec = world.record(user)
    assert rec["termination"] in RUNAWAY
    assert loop.stop == rec["termination"]
    assert loop.answer == rec["final_answer"] == sc.model.final_text


@pytest.mark.parametrize("name", ["always-not-found", OSCILLATION])
def test_streamed_runaway_is_stopped_and_the_stream_ends_well_formed(
    world: World, tmp_path: Path, name: str
) -> None:
    sc = world.scs[name]
    user = who("stream")
    tee = TeeTransport()
    c = client(world.gw, http_client=httpx.Client(transport=tee))
    loop = agent_loop(c, "scenario:" + name, ToolBox(sc, tmp_path), stream=True, tee=tee, user=user)
    rec = world.record(user)
    assert rec["termination"] in RUNAWAY
    assert loop.answer and loop.answer.endswith(rec["final_answer"])
    last = loop.bodies[-1]
    assert last.endswith(b"data: [DONE]\n\n")
    finishes = [
        ch["choices"][0]["finish_reason"]
        for ev in last.split(b"\n\n")
        if ev.startswith(b"data: {")
        for ch in [json.loads(ev[6:])]
        if ch.get("choices")
    ]
    assert [f for f in finishes if f] == ["stop"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_a_skipped_repeat_never_reaches_the_client_and_the_reask_does(
    world: World, tmp_path: Path, stream: bool
) -> None:
    """repeat-then-recover: the model asks for the same order twice; repeat_call answers the
    repeat from the first result, the model is asked again and answers.  The client gets that
    answer -- never the skipped call (streamed, it was held back while being judged)."""
    sc = world.scs["repeat-then-recover"]
    user = who("skip")
    box = ToolBox(sc, tmp_path)
    tee = TeeTransport()
    c = client(world.gw, http_client=httpx.Client(transport=tee))
    loop = agent_loop(c, "scenario:" + sc.name, box, stream=stream, tee=tee, user=user, max_steps=6)
    rec = world.record(user)
    assert rec["termination"] == "final_answer"
    assert box.ran == [("query_order", {"order_id": "88231"})]  # the repeat never ran
    assert loop.steps == 2
    assert loop.answer is not None and loop.answer.endswith(sc.model.final_text)
    assert rec["final_answer"] == sc.model.final_text


def _verdicts(rec: dict[str, Any]) -> dict[str, Any]:
    keys = ("termination", "stopped_by", "soft", "steps", "tool_calls", "duplicate_calls")
    return {
        **{k: rec[k] for k in keys},
        "warnings": [(w["step"], w["plugin"]) for w in rec["warnings"]],
        "final_answer": rec["final_answer"],
    }


@pytest.mark.parametrize("name", ALL)
def test_every_scenario_gets_the_same_verdicts_streamed_as_json(
    world: World, tmp_path: Path, name: str
) -> None:
    """Each built-in scenario, played by the SDK through the gateway JSON and streamed: the
    same run record either way, and a runaway never ends as a final answer."""
    sc = world.scs[name]
    got = {}
    for stream in (False, True):
        user = who(f"both-{int(stream)}")
        tee = TeeTransport()
        c = client(world.gw, http_client=httpx.Client(transport=tee))
        box = ToolBox(sc, tmp_path / str(stream))
        loop = agent_loop(c, "scenario:" + name, box, stream=stream, tee=tee, user=user)
        got[stream] = (loop, box.ran, world.record(user))
    (j_loop, j_ran, j_rec), (s_loop, s_ran, s_rec) = got[False], got[True]
    assert _verdicts(s_rec) == _verdicts(j_rec)
    assert s_ran == j_ran and s_loop.steps == j_loop.steps
    assert s_loop.answer is not None and s_loop.answer.endswith(j_loop.answer or "")
    if sc.expect.healthy is False:
        assert j_rec["termination"] != "final_answer"


def test_concurrent_agents_with_one_key_are_told_apart(world: World, tmp_path: Path) -> None:
    """Six agents at once, one API key, no user or session id, identical histories by
    pairs: the gateway tells their runs apart (its own call ids), and each is stopped as it
    would be alone."""
    names = ["always-not-found", "never-finish"] * 3
    before = len(records(world.runs))

    async def one(i: int, name: str) -> Any:
        async with aclient(world.gw) as c:
            box = ToolBox(world.scs[name], tmp_path / str(i))
            return await agent_loop_async(c, "scenario:" + name, box)

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(one(i, n) for i, n in enumerate(names))))

    loops = asyncio.run(main())
    run_ids = [loop.headers[-1]["x-loopwarden-run"] for loop in loops]
    assert len(set(run_ids)) == len(names)
    for name, loop, run_id in zip(names, loops, run_ids, strict=True):
        rec = wait_for_record(world.runs, lambda r, run_id=run_id: r["run_id"] == run_id)
        assert rec["termination"] == loop.stop == "repeat_call"
        assert loop.answer == rec["final_answer"] == world.scs[name].model.final_text
    # every request of an agent landed in its own run: one record each, no strays (a
    # request taken for a new run would have left one more)
    assert len(records(world.runs)) - before == len(names)


# -- a healthy run is byte-identical to going direct --------------------------------------


def _refund_twice(
    world: World, tmp_path: Path, run: Callable[[str, ToolBox], Any]
) -> tuple[Any, Any]:
    sc = world.scs["refund"]
    n = len(world.det.requests)
    via = run(world.gw_det, ToolBox(sc, tmp_path / "via"))
    k = len(world.det.requests)
    direct = run(world.det_url, ToolBox(sc, tmp_path / "direct"))
    # the upstream got the client's own bytes from the gateway, nothing added
    for a, b in zip(world.det.requests[n:k], world.det.requests[k:], strict=True):
        assert json.loads(a) == json.loads(b)
        assert a == b
    # and the client got the upstream's headers (request ids, rate-limit counters), with
    # the gateway's own added
    for h_via, h_direct in zip(via.headers, direct.headers, strict=True):
        for name, value in h_direct.items():
            if name not in ("date", "server", "content-length"):
                assert h_via.get(name) == value, name
        # one of each (the gateway's server writes its own date and server)
        assert len(h_via.get_list("date")) == len(h_via.get_list("server")) == 1
        assert "x-loopwarden-stop" not in h_via
    return via, direct


def test_sync_healthy_run_is_byte_identical_to_direct(world: World, tmp_path: Path) -> None:
    user = who("same")
    via, direct = _refund_twice(
        world,
        tmp_path,
        lambda base, box: agent_loop(client(base), "scenario:refund", box, user=user),
    )
    assert via.steps == direct.steps == 4
    assert via.bodies == direct.bodies
    assert via.answer == direct.answer == world.scs["refund"].model.turns[-1].content
    assert via.stop is None
    assert world.record(user)["termination"] == "final_answer"


def test_async_healthy_run_is_byte_identical_to_direct(world: World, tmp_path: Path) -> None:
    user = who("same-async")

    def run(base: str, box: ToolBox) -> Any:
        async def main() -> Any:
            async with aclient(base) as c:
                return await agent_loop_async(c, "scenario:refund", box, user=user)

        return asyncio.run(main())

    via, direct = _refund_twice(world, tmp_path, run)
    assert via.steps == 4
    assert via.bodies == direct.bodies
    assert world.record(user)["termination"] == "final_answer"


def test_streamed_healthy_run_is_byte_identical_to_direct(world: World, tmp_path: Path) -> None:
    user = who("same-stream")

    def run(base: str, box: ToolBox) -> Any:
        tee = TeeTransport()
        c = client(base, http_client=httpx.Client(transport=tee))
        return agent_loop(
            c,
            "scenario:refund",
            box,
            stream=True,
            tee=tee,
            user=user,
            stream_options={"include_usage": True},
        )

    via, direct = _refund_twice(world, tmp_path, run)
    assert via.steps == 4
    assert via.bodies == direct.bodies
    assert via.answer == direct.answer
    assert world.record(user)["termination"] == "final_answer"


# -- stop_mode = "error" ------------------------------------------------------------------


def test_stop_mode_error_is_a_400_the_sdk_does_not_retry(world: World, tmp_path: Path) -> None:
    sc = world.scs["always-not-found"]
    box = ToolBox(sc, tmp_path)
    user = who("error")
    before = world.error_app.count
    # the SDK's default retries (2): a 429 or a 5xx would be sent three times
    c = openai.OpenAI(base_url=world.gw_error + "/v1", api_key=KEY, timeout=30)
    with pytest.raises(openai.BadRequestError) as err:
        agent_loop(c, "scenario:always-not-found", box, user=user)
    exc = err.value
    assert exc.status_code == 400
    assert exc.code == "loopwarden_stop"
    assert exc.response.headers["x-should-retry"] == "false"
    rec = world.record(user)
    assert exc.response.headers["x-loopwarden-stop"] == rec["termination"] in RUNAWAY
    # one request per step the agent took: the failing one was sent once
    assert world.error_app.count - before == len(box.ran) + 1


def test_stop_mode_error_streamed_ends_in_an_error_the_sdk_raises_once(
    world: World, tmp_path: Path
) -> None:
    sc = world.scs["always-not-found"]
    box = ToolBox(sc, tmp_path)
    user = who("error-stream")
    before = world.error_app.count
    tee = TeeTransport()
    c = openai.OpenAI(
        base_url=world.gw_error + "/v1",
        api_key=KEY,
        timeout=30,
        http_client=httpx.Client(transport=tee),
    )
    with pytest.raises(openai.APIError) as err:
        agent_loop(c, "scenario:always-not-found", box, stream=True, tee=tee, user=user)
    body = err.value.body
    assert isinstance(body, dict) and body.get("code") == "loopwarden_stop", body
    assert world.record(user)["termination"] in RUNAWAY
    assert world.error_app.count - before == len(box.ran) + 1


# -- agents that end only through a tool of their own -------------------------------------

FINAL_ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": "final_answer",
        "description": "Provides a final answer to the given problem.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer"}},
            "required": ["answer"],
        },
    },
}


@dataclass
class _Call:
    id: str
    name: str
    arguments: str


def _turn(
    c: openai.OpenAI, stream: bool, **kwargs: Any
) -> tuple[str | None, list[_Call], httpx.Headers]:
    """One completion, JSON or streamed (the stream's tool-call fragments assembled)."""
    raw = c.chat.completions.with_raw_response.create(stream=stream, **kwargs)
    if not stream:
        msg = raw.parse().choices[0].message
        calls = [
            _Call(tc.id, tc.function.name, tc.function.arguments) for tc in msg.tool_calls or []
        ]
        return msg.content, calls, raw.headers
    text, acc = "", {}
    for chunk in raw.parse():
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            slot = acc.setdefault(tc.index, _Call("", "", ""))
            slot.id = tc.id or slot.id
            if tc.function is not None:
                slot.name += tc.function.name or ""
                slot.arguments += tc.function.arguments or ""
    return text or None, [acc[i] for i in sorted(acc)], raw.headers


def _tool_calling_agent(
    c: openai.OpenAI,
    sc: Scenario,
    box: ToolBox,
    user: str,
    *,
    as_text: bool,
    stream: bool = False,
) -> tuple[str, int, httpx.Headers]:
    """A ToolCallingAgent-like loop: tool_choice "required", ends only when the model calls
    ``final_answer``; ``as_text`` replays past calls as assistant text and results as user
    messages, the way smolagents writes its memory back."""
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are an expert assistant who can solve any task using tool calls.",
        },
        {"role": "user", "content": "New task:\n" + sc.user},
    ]
    tools = [*box.schemas, FINAL_ANSWER_TOOL]
    for step in range(1, 30):
        content, calls, headers = _turn(
            c,
            stream,
            model="scenario:" + sc.name,
            messages=messages,
            tools=tools,
            tool_choice="required",
            user=user,
        )
        assert calls, "tool_choice=required: the agent treats plain text as a malformed step"
        for tc in calls:
            if tc.name == "final_answer":
                return json.loads(tc.arguments)["answer"], step, headers
        if as_text:
            listed = [
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": json.loads(tc.arguments)},
                }
                for tc in calls
            ]
            messages.append({"role": "assistant", "content": "Calling tools:\n" + str(listed)})
            for tc in calls:
                out = box.run(tc.name, tc.arguments)
                messages.append(
                    {"role": "user", "content": f"Call id: {tc.id}\nObservation:\n{out}"}
                )
        else:
            wire = [
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments},
                }
                for tc in calls
            ]
            messages.append({"role": "assistant", "content": content, "tool_calls": wire})
            for tc in calls:
                out = box.run(tc.name, tc.arguments)
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": out})
    raise AssertionError("the agent never called final_answer")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize("as_text", [False, True], ids=["tool-messages", "replayed-as-text"])
def test_an_agent_that_ends_through_its_final_answer_tool_gets_the_stop_as_that_call(
    world: World, tmp_path: Path, as_text: bool, stream: bool
) -> None:
    sc = world.scs["always-not-found"]
    user = who("finish-tool")
    box = ToolBox(sc, tmp_path)
    answer, steps, headers = _tool_calling_agent(
        client(world.gw), sc, box, user, as_text=as_text, stream=stream
    )
    rec = world.record(user)
    # found and stopped (also when the history came back as text), by the same detector as a
    # tool-message agent, delivered as a call to the agent's own finish tool
    assert rec["termination"] == "repeat_call"
    if not stream:  # a streamed answer's headers went out before its calls were judged
        assert headers["x-loopwarden-stop"] == "repeat_call"
    assert answer == rec["final_answer"] == sc.model.final_text
    assert steps <= rec["steps"] < 10
    assert len(box.ran) == steps - 1


def test_a_replayed_as_text_run_is_one_run_not_one_per_request(
    world: World, tmp_path: Path
) -> None:
    """The gateway finds the run from the call ids it handed out, printed in the text: every
    request of the agent lands in one run (one record), not a new run per request."""
    sc = world.scs["always-not-found"]
    user = who("as-text")
    _tool_calling_agent(client(world.gw), sc, ToolBox(sc, tmp_path), user, as_text=True)
    mine = [r for r in records(world.runs) if r.get("meta", {}).get("user") == user]
    assert len(mine) == 1
