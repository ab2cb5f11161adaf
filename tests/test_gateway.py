"""The gateway's judging, one request at a time (loopwarden.gateway.exchange).

Each test plays an agent loop against :class:`Gate` directly -- requests as an agent sends
them, the upstream's answers from a scenario script -- so what is checked is the run rebuilt
from the wire: how a request finds its run, what crosses between requests through the store
(two ``Gate`` objects on one store are two workers), and what the client gets.  The HTTP
face and real clients are in tests/test_gateway_clients.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment, signals
from loopwarden.config import default_config_path, load_config, parse_config
from loopwarden.gateway import chat
from loopwarden.gateway.exchange import Deliver, Forward, Gate, history_hash
from loopwarden.gateway.scripted import turn_of
from loopwarden.gateway.state import MemoryState, RedisState, SQLiteState, StateStore
from loopwarden.hookspecs import hookimpl
from loopwarden.models.scenario import load_scenario, scenario_path

PREFIX = "[loopwarden] "
SHOP_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in keys}},
        },
    }
    for name, keys in (
        ("query_order", ["order_id"]),
        ("query_logistics", ["tracking_no"]),
        ("apply_refund", ["order_id", "reason"]),
        ("get_current_time", []),
    )
]


class Agent:
    """A plain agent loop speaking chat completions to a :class:`Gate`: its upstream is a
    scenario script; tool results come from ``results`` (name -> text)."""

    def __init__(
        self,
        gates: list[Gate],
        scenario: str,
        *,
        results: Callable[[str, dict[str, Any]], str] | None = None,
        headers: dict[str, str] | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        as_text: bool = False,
    ) -> None:
        self.gates = gates
        self.sc = load_scenario(scenario_path(scenario))
        self.results = results or (lambda name, args: f"{name} result")
        self.headers = {"authorization": "Bearer sk-test-key", **(headers or {})}
        self.tools = tools if tools is not None else SHOP_TOOLS
        self.tool_choice = tool_choice
        self.as_text = as_text
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": self.sc.user}]
        self.delivered: list[Deliver] = []
        self.upstream_calls = 0
        self.forwarded: list[dict[str, Any]] = []

    def step(self, i: int, *, keep: bool = True) -> Deliver:
        body: dict[str, Any] = {"model": "m", "messages": self.messages, "tools": self.tools}
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        req = chat.parse_request(json.dumps(body).encode(), 10**8)
        ex = self.gates[i % len(self.gates)].exchange(req, self.headers)
        step = ex.start()
        last: dict[str, Any] | None = None
        while isinstance(step, Forward):
            fwd = json.loads(step.body)
            self.forwarded.append(fwd)
            self.upstream_calls += 1
            content, calls = turn_of(
                self.sc.model, fwd["messages"], fwd.get("tool_choice") == "none", PREFIX
            )
            wire = [
                {"id": "call_" + uuid.uuid4().hex[:12], "type": "function", "function": c}
                for c in calls
            ]
            last = {"role": "assistant", "content": content}
            if wire:
                last["tool_calls"] = wire
            step = ex.answer(chat.parse_response({"choices": [{"message": last}]}))
        ex.close()
        self.delivered.append(step)
        if step.kind == "pass":
            assert last is not None
            message = last
        elif step.kind == "message":
            assert step.message is not None
            message = step.message
        elif step.finish_call is not None:
            name, args = step.finish_call
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_fin",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        else:
            message = {"role": "assistant", "content": step.text}
        self.last_message = message
        if keep:
            self._keep(message)
        return step

    def _keep(self, message: dict[str, Any]) -> None:
        calls = message.get("tool_calls") or []
        if self.as_text and calls:
            # as smolagents replays its memory: the calls as text, results as user messages
            self.messages.append({"role": "assistant", "content": f"Calling tools:\n{calls!r}"})
            for tc in calls:
                fn = tc["function"]
                out = self.results(fn["name"], json.loads(fn["arguments"] or "{}"))
                self.messages.append(
                    {"role": "user", "content": f"Call id: {tc['id']}\nObservation:\n{out}"}
                )
            return
        self.messages.append(message)
        for tc in calls:
            fn = tc["function"]
            out = self.results(fn["name"], json.loads(fn["arguments"] or "{}"))
            self.messages.append({"role": "tool", "tool_call_id": tc["id"], "content": out})

    def play(self, cap: int = 40) -> Deliver:
        for i in range(cap):
            step = self.step(i)
            last = self.messages[-1]
            if last.get("role") == "assistant" and not last.get("tool_calls"):
                return step
            if step.finish_call is not None:
                return step
        raise AssertionError(f"not stopped within {cap} requests")


@pytest.fixture
def records() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def keep(sender: Any, **kw: Any) -> None:
        got.append(kw["record"])

    with signals.run_stopped.connected_to(keep):
        yield got


@pytest.fixture
def dep() -> Iterator[Deployment]:
    d = Deployment(load_config(default_config_path()))
    yield d
    d.close()


def not_found(name: str, args: dict[str, Any]) -> str:
    return "NOT_FOUND: 订单 99999 不存在"


def test_a_runaway_is_stopped_with_an_answer_the_agent_finishes_on(
    dep: Deployment, records: list[dict[str, Any]]
) -> None:
    agent = Agent([Gate(dep, MemoryState())], "always-not-found", results=not_found)
    end = agent.play()
    assert end.kind == "answer"
    assert end.stop is not None and end.stop["reason"] in ("repeat_call", "failure_streak")
    assert end.text  # the wrap-up turn's answer
    [rec] = records
    assert rec["termination"] == end.stop["reason"]
    assert rec["meta"]["front"] == "gateway"
    assert "sk-test-key" not in json.dumps(rec)  # the tenant is a hash of the key


def test_a_healthy_run_passes_every_answer_untouched(
    dep: Deployment, records: list[dict[str, Any]]
) -> None:
    agent = Agent([Gate(dep, MemoryState())], "refund")
    end = agent.play()
    assert all(d.kind == "pass" for d in agent.delivered)
    assert end.stop is None
    [rec] = records
    assert rec["termination"] == "final_answer"
    assert rec["steps"] == len(agent.delivered)


@pytest.mark.parametrize("kind", ["sqlite", "redis", "memory"])
def test_two_workers_on_one_store_judge_a_run_as_one(
    kind: str, tmp_path: Path, records: list[dict[str, Any]], request: pytest.FixtureRequest
) -> None:
    """Requests of one run alternated across two workers (two Gates, two deployments, one
    store) get the verdicts one worker gives."""

    namespace = "lwgw-" + uuid.uuid4().hex[:8]
    redis_url = request.getfixturevalue("redis_server") if kind == "redis" else ""

    def state() -> StateStore:
        if kind == "redis":
            return RedisState(redis_url, namespace)
        return SQLiteState(tmp_path / "gw.sqlite3") if kind == "sqlite" else shared_memory

    shared_memory = MemoryState()
    ends = []
    for n_workers in (1, 2):
        deps = [Deployment(load_config(default_config_path())) for _ in range(n_workers)]
        try:
            agent = Agent([Gate(d, state()) for d in deps], "always-not-found", results=not_found)
            end = agent.play()
            ends.append((end.stop, len(agent.delivered), end.text))
        finally:
            for d in deps:
                d.close()
    assert ends[0] == ends[1]
    assert [r["termination"] for r in records] == [ends[0][0]["reason"]] * 2  # type: ignore[index]


def test_a_worker_without_the_store_would_not_know_the_run(dep: Deployment) -> None:
    """The control for the test above: two workers with separate state lose the run."""
    other = Deployment(load_config(default_config_path()))
    try:
        agent = Agent(
            [Gate(dep, MemoryState()), Gate(other, MemoryState())],
            "always-not-found",
            results=not_found,
        )
        with pytest.raises(AssertionError, match="not stopped"):
            agent.play(cap=12)
    finally:
        other.close()


def test_runs_never_cross_tenants(dep: Deployment) -> None:
    """Two tenants send the very same conversation: each has its own run."""
    gate = Gate(dep, MemoryState())
    a = Agent([gate], "always-not-found", results=not_found, headers={"authorization": "Bearer A"})
    b = Agent([gate], "always-not-found", results=not_found, headers={"authorization": "Bearer B"})
    for i in range(2):
        a.step(i)
        b.step(i)
    # b's third request would be the third repeat if it shared a's run; it is b's second
    assert gate.tenant({"authorization": "Bearer A"}, _req()) != gate.tenant(
        {"authorization": "Bearer B"}, _req()
    )
    end_a, end_b = a.play(), b.play()
    assert len(a.delivered) == len(b.delivered)
    assert end_a.stop == end_b.stop


def _req(**body: Any) -> chat.ChatRequest:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return chat.parse_request(json.dumps(body).encode(), 10**6)


def test_the_tenant_is_never_the_key() -> None:
    dep = Deployment(parse_config({}))
    try:
        gate = Gate(dep, MemoryState())
        t = gate.tenant({"authorization": "Bearer sk-secret-123"}, _req())
        assert "sk-secret-123" not in t
        assert gate.tenant({"x-loopwarden-tenant": "acme"}, _req()) == "h:acme"
        assert gate.tenant({}, _req(user="u-7")) == "u:u-7"
        assert gate.tenant({}, _req(metadata={"user_id": "u-8"})) == "u:u-8"
    finally:
        dep.close()


def test_a_session_header_names_the_run(dep: Deployment) -> None:
    """With an explicit session id, even a client that drops the call ids and rewrites
    its history is followed."""
    gate = Gate(dep, MemoryState())
    agent = Agent([gate], "always-not-found", results=not_found, headers={"x-session-id": "s-1"})
    agent.step(0)
    for m in agent.messages:
        m.pop("tool_call_id", None)
        for tc in m.get("tool_calls") or ():
            tc["id"] = "renamed"
    assert agent.play().stop is not None


def test_calls_replayed_as_text_still_find_their_run(dep: Deployment) -> None:
    agent = Agent([Gate(dep, MemoryState())], "always-not-found", results=not_found, as_text=True)
    end = agent.play()
    assert end.stop is not None


def test_a_stop_is_a_call_to_the_agents_finish_tool_when_it_must_call_one(
    dep: Deployment,
) -> None:
    tools = [
        *SHOP_TOOLS,
        {
            "type": "function",
            "function": {
                "name": "final_answer",
                "parameters": {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}},
                    "required": ["answer"],
                },
            },
        },
    ]
    agent = Agent(
        [Gate(dep, MemoryState())],
        "always-not-found",
        results=not_found,
        tools=tools,
        tool_choice="required",
    )
    end = agent.play()
    assert end.finish_call is not None
    name, args = end.finish_call
    assert name == "final_answer" and args == {"answer": end.text}


def test_the_next_user_turn_continues_the_conversation(
    dep: Deployment, records: list[dict[str, Any]]
) -> None:
    gate = Gate(dep, MemoryState())
    agent = Agent([gate], "refund")
    agent.play()
    first = records[-1]
    agent.messages.append({"role": "user", "content": "谢谢，那物流呢？"})
    agent.play()
    second = records[-1]
    assert second["run_id"] != first["run_id"]
    assert second["conversation_id"] == first["conversation_id"]


def test_a_side_effect_already_done_never_reaches_the_client_again(tmp_path: Path) -> None:
    """A refund declared a side effect: the second identical call in the conversation is
    answered from the ledger, and the model is asked again; the client never runs it."""
    config = parse_config(
        {
            "tools": {"apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]}},
            "store": {"url": f"sqlite:///{tmp_path / 'store.sqlite3'}"},
        }
    )
    dep = Deployment(config)
    executed: list[dict[str, Any]] = []

    def results(name: str, args: dict[str, Any]) -> str:
        if name == "apply_refund":
            executed.append(args)
        return "OK"

    try:
        agent = Agent([Gate(dep, MemoryState())], "refund", results=results)
        # the scripted refund asks for one refund; ask for the same again by replaying it
        agent.play()
        assert len(executed) == 1
        agent.messages.append({"role": "user", "content": "再退一次 88231"})
        agent.sc = agent.sc.model_copy(
            update={
                "model": agent.sc.model.model_copy(
                    update={
                        "turns": [
                            t
                            for t in agent.sc.model.turns
                            if t.tool_calls and t.tool_calls[0].name == "apply_refund"
                        ],
                        "then": "final",
                    }
                )
            }
        )
        agent.play()
        assert len(executed) == 1
        assert any(d.kind in ("message", "answer") or d.kind == "pass" for d in agent.delivered)
    finally:
        dep.close()


def test_an_unreadable_snapshot_starts_afresh(
    dep: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    state = MemoryState()
    gate = Gate(dep, state)
    agent = Agent([gate], "always-not-found", results=not_found)
    agent.step(0)
    for key, (until, _old) in list(state._data.items()):
        if key.startswith("c:"):
            state._data[key] = (until, b"not a pickle")
    agent.step(1)  # no exception: a new run
    assert "unreadable" in caplog.text


def test_history_hash_leaves_out_system_messages_and_reminders() -> None:
    a = [
        {"role": "system", "content": "You are X. Today is Monday."},
        {"role": "user", "content": "hi <system-reminder>todo list empty</system-reminder>"},
        {
            "role": "assistant",
            "content": "hello",
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}],
        },
    ]
    b = [
        {"role": "system", "content": "You are X. Today is Tuesday."},
        {"role": "user", "content": "hi <system-reminder>todo list: 1 item</system-reminder>"},
        {
            "role": "assistant",
            "content": "hello",
            "tool_calls": [{"id": "2", "function": {"name": "f", "arguments": '{"b":2,"a":1}'}}],
        },
    ]
    assert history_hash(a) == history_hash(b)
    b[1]["content"] = "hi there"
    assert history_hash(a) != history_hash(b)


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[]", 400, "invalid_request"),
        (b'{"messages": []}', 400, "invalid_request"),
        (b'{"messages": [{"content": "x"}]}', 400, "invalid_request"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": {}}', 400, "invalid_request"),
    ],
)
def test_malformed_requests_get_a_clear_error(raw: bytes, status: int, code: str) -> None:
    with pytest.raises(chat.WireError) as info:
        chat.parse_request(raw, 10**6)
    assert (info.value.status, info.value.code) == (status, code)


def test_a_body_over_the_limit_is_refused() -> None:
    with pytest.raises(chat.WireError) as info:
        chat.parse_request(b"x" * 2048, 1024)
    assert info.value.status == 413


def test_unknown_fields_are_forwarded_untouched() -> None:
    raw = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "seed": 7,
            "x_vendor": {"a": 1},
        }
    ).encode()
    req = chat.parse_request(raw, 10**6)
    assert chat.forward_body(req, [], final=False) is raw


def test_the_gateway_demo_prints_the_demo_table() -> None:
    pytest.importorskip("uvicorn")
    out = subprocess.run(
        [sys.executable, "-m", "loopwarden", "gateway", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "runaway scenarios stopped by a guard: 9/9" in out.stdout
    assert "healthy scenarios finished as expected: 2/2" in out.stdout
    assert "through loopwarden gateway" in out.stdout


class _Sockety:
    """A plugin keeping a live resource in its per-run state (as a tracer's span is)."""

    name = "sockety"

    @hookimpl
    def on_start(self, run: Any) -> None:
        run.state["sockety"] = socket.socket()  # cannot be pickled

    @hookimpl
    def on_stop(self, run: Any, outcome: Any) -> None:
        sock = run.state.get("sockety")
        if sock is not None:
            sock.close()


def test_a_plugin_state_that_cannot_be_saved_is_left_out_not_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = load_config(default_config_path())
    dep = Deployment(config, plugins={"sockety": _Sockety()})
    try:
        agent = Agent([Gate(dep, MemoryState())], "always-not-found", results=not_found)
        end = agent.play()
        assert end.stop is not None  # the other guards still judged the whole run
        assert "plugin sockety keeps per-run state that cannot be saved" in caplog.text
    finally:
        dep.close()


def test_shadow_mode_passes_every_answer_and_records_what_would_have_stopped(
    records: list[dict[str, Any]],
) -> None:
    config = load_config(default_config_path())
    config = config.model_copy(update={"run": config.run.model_copy(update={"mode": "shadow"})})
    dep = Deployment(config)
    try:
        agent = Agent([Gate(dep, MemoryState())], "always-not-found", results=not_found)
        for i in range(8):
            assert agent.step(i).kind == "pass"
        # the upstream got the client's own requests: no note was added
        assert all(
            not str(m.get("content")).startswith(PREFIX)
            for body in agent.forwarded
            for m in body["messages"]
        )
    finally:
        dep.close()


def test_warnings_reach_the_upstream_as_notes(dep: Deployment) -> None:
    """The control for shadow mode: enforced, the same run's requests carry notes."""
    agent = Agent([Gate(dep, MemoryState())], "always-not-found", results=not_found)
    agent.play()
    assert any(
        str(m.get("content")).startswith(PREFIX)
        for body in agent.forwarded
        for m in body["messages"]
    )


def test_a_retried_request_is_asked_again_not_taken_as_a_side_effect_in_doubt(
    tmp_path: Path,
) -> None:
    """The answer handing out a refund never reached the client, which sends the same
    request again: the refund was not made, so it is handed out again (not answered "may
    have taken effect"), and made once."""
    config = load_config(default_config_path())
    config = config.model_copy(
        update={
            "tools": {
                "apply_refund": config.tools.get("apply_refund")
                or parse_config(
                    {
                        "tools": {
                            "apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]}
                        }
                    }
                ).tools["apply_refund"]
            },
            "store": config.store.model_copy(update={"url": f"sqlite:///{tmp_path / 's.sqlite3'}"}),
        }
    )
    dep = Deployment(config)
    made: list[dict[str, Any]] = []

    def results(name: str, args: dict[str, Any]) -> str:
        if name == "apply_refund":
            made.append(args)
        return "OK"

    try:
        agent = Agent([Gate(dep, MemoryState())], "refund", results=results)
        for i in range(10):
            lost = agent.step(i, keep=False)
            calls = agent.last_message.get("tool_calls") or []
            if any(c["function"]["name"] == "apply_refund" for c in calls):
                break
            agent._keep(agent.last_message)
        else:
            raise AssertionError("the refund was never proposed")
        assert lost.kind == "pass" and not made
        again = agent.step(i + 1)  # the same request again: its answer was lost
        assert again.kind == "pass"
        calls = agent.last_message.get("tool_calls") or []
        assert [c["function"]["name"] for c in calls] == ["apply_refund"]
        assert len(made) == 1
        agent.play()
        assert len(made) == 1
    finally:
        dep.close()


def test_text_held_behind_a_tool_call_is_not_counted_as_sent() -> None:
    """A stream's text after its first tool-call fragment is held with it: a stop's answer
    then continues from what the client really got."""
    asm = chat.StreamAssembler()

    def ev(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return chat.sse(
            {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    assert asm.add(ev({"content": "Hello"}))
    assert not asm.add(
        ev(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}
                ]
            }
        )
    )
    assert not asm.add(ev({"content": " world"}))
    assert asm.sent_text() == "Hello"
    assert asm.response().content == "Hello world"


@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_a_body_nested_100000_deep_is_a_400_not_a_crash(wire: str) -> None:
    from loopwarden.gateway.wires import wire_for

    codec = wire_for({"chat": "/v1/chat/completions"}.get(wire, "/v1/" + wire))
    assert codec is not None
    key = "messages" if wire != "responses" else "input"
    raw = b'{"' + key.encode() + b'": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(chat.WireError) as info:
        codec.parse_request(raw, 10**8)
    assert (info.value.status, info.value.code) == (400, "invalid_json")


@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_a_lone_surrogate_survives_a_forwarded_request_with_notes(wire: str) -> None:
    """A JSON ``\\ud800`` escape decodes to a lone surrogate, which UTF-8 cannot encode: a
    request re-written with a guard's note still goes out, the escape as the client sent it."""
    from loopwarden.gateway.wires import wire_for

    codec = wire_for({"chat": "/v1/chat/completions"}.get(wire, "/v1/" + wire))
    assert codec is not None
    text = '"hi \\ud800 there"'
    if wire == "responses":
        raw = ('{"model": "m", "input": [{"role": "user", "content": ' + text + "}]}").encode()
    else:
        raw = ('{"model": "m", "messages": [{"role": "user", "content": ' + text + "}]}").encode()
    req = codec.parse_request(raw, 10**6)
    note = {"role": "system", "content": "[loopwarden] a note"}
    body = codec.forward_body(req, [note], final=True)
    body.decode("utf-8")  # valid UTF-8
    assert "\ud800" in json.dumps(json.loads(body), ensure_ascii=False)


NO_REFUNDS = """
from loopwarden import Plugin, Stop, hookimpl


class NoRefunds(Plugin):
    @hookimpl
    def before_tool(self, run, call):
        if call.name == "apply_refund":
            return Stop(reason="refunds need a human", soft=False)
        return None
"""


def test_a_hard_stop_before_a_side_effect_tells_the_client_nothing_was_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the gateway as in the loop: a hard stop before a declared side effect answers
    with ``[run.texts] side_effect_blocked``, never the model's "submitting your refund"."""
    module = f"gw_no_refunds_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(NO_REFUNDS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_config(
        {
            "plugins": {"enabled": ["max_steps", f"{module}:NoRefunds"]},
            "tools": {"apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]}},
        }
    )
    dep = Deployment(config)
    executed: list[dict[str, Any]] = []

    def results(name: str, args: dict[str, Any]) -> str:
        if name == "apply_refund":
            executed.append(args)
        return "OK"

    try:
        end = Agent([Gate(dep, MemoryState())], "refund", results=results).play()
    finally:
        dep.close()
    assert executed == []
    assert end.text == config.run.texts.side_effect_blocked.format(
        name="apply_refund", reason="refunds need a human"
    )
    assert "退款" not in (end.text or "")
