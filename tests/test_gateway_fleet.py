"""Two ``loopwarden gateway`` processes on one Redis serve one run between them.

Real processes (``python -m loopwarden gateway --config FILE``, whose ``[store] url`` is a real
``redis-server``), a scripted upstream on 127.0.0.1, the real ``openai`` SDK.  Each scenario is
run twice: every request through process A, then with its requests alternated A, B, A, B...
Both give the same verdicts: the same stop at the same step for the same reason, the same
final answer, the same warnings -- what a fleet of stateless workers must do.

The Redis URL: ``LOOPWARDEN_TEST_REDIS_URL`` (``.ci/run`` starts a server), else a
``redis-server`` on PATH started for the session, else a skip -- a failure under ``CI=true``
(the ``redis_server`` fixture of tests/support/stores.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.gateway import free_port, scenarios, serve
from support.gw_clients import ToolBox, gateway_config, wait_for_record

from loopwarden.config import load_config
from loopwarden.gateway.scripted import ScriptedUpstream
from loopwarden.models.scenario import Scenario
from loopwarden.traffic.calibrate import dump_toml

KEY = "sk-test-gw-fleet"


def _command(
    launcher: str, cfg: Path, upstream: str, port: int
) -> tuple[list[str], dict[str, str]]:
    """How a gateway process is started: the CLI (``python -m loopwarden gateway``), or
    uvicorn's own command on the factory the CLI hands to uvicorn (the same application,
    configured through the same environment variables)."""
    if launcher == "cli":
        argv = [
            sys.executable,
            "-m",
            "loopwarden",
            "gateway",
            "--upstream",
            upstream + "/v1",
            "--port",
            str(port),
            "--config",
            str(cfg),
        ]
        return argv, {}
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "loopwarden.gateway.serve:factory",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    env = {
        "LOOPWARDEN_GATEWAY_CONFIG": str(cfg),
        "LOOPWARDEN_GATEWAY_UPSTREAM": upstream + "/v1",
        "LOOPWARDEN_GATEWAY_STATE": "store",
    }
    return argv, env


@dataclass
class Fleet:
    scs: dict[str, Scenario]
    a: str
    b: str
    runs: Path


def _start(
    launcher: str, cfg: Path, upstream: str, tmp: Path, name: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv, env = _command(launcher, cfg, upstream, port)
    with (tmp / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "LOOPWARDEN_DATA_DIR": str(tmp / "data")},
        )
    return proc, f"http://127.0.0.1:{port}"


def _wait_up(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the gateway at {url} exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/_loopwarden/health", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            pytest.fail(f"the gateway at {url} did not come up: {log.read_text()}")
        time.sleep(0.05)


@pytest.fixture(scope="module", params=["cli", "uvicorn"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: str
) -> Iterator[Fleet]:
    launcher: str = request.param
    tmp = tmp_path_factory.mktemp("gw-fleet-" + launcher)
    scs = scenarios()
    data = gateway_config(
        tmp, store={"url": redis_server, "namespace": "lw-fleet-" + uuid.uuid4().hex[:8]}
    )
    cfg = tmp / "fleet.toml"
    cfg.write_text(dump_toml(data))
    assert load_config(cfg).store.url == redis_server  # the file says what the test means
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(serve(ScriptedUpstream(scs)))
        procs = [_start(launcher, cfg, up, tmp, name) for name in ("a", "b")]
        for proc, _ in procs:

            def stop(p: subprocess.Popen[bytes] = proc) -> None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)

            stack.callback(stop)
        for (proc, url), name in zip(procs, ("a", "b"), strict=True):
            _wait_up(proc, url, tmp / f"{name}.log")
        yield Fleet(scs, procs[0][1], procs[1][1], tmp / "runs.jsonl")


@dataclass
class Played:
    steps: int
    stops: list[str | None]
    answer: str
    served_by: list[str]
    record: dict[str, Any]


def play(fleet: Fleet, name: str, bases: list[str], shop: Path) -> Played:
    """Run ``name``'s agent loop, step ``i``'s request to ``bases[i % len(bases)]``."""
    sc = fleet.scs[name]
    box = ToolBox(sc, shop)
    user = f"fleet-{uuid.uuid4().hex[:8]}"
    clients = [
        openai.OpenAI(base_url=b + "/v1", api_key=KEY, max_retries=0, timeout=30) for b in bases
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": sc.user}]
    stops: list[str | None] = []
    served: list[str] = []
    for step in range(40):
        c = clients[step % len(clients)]
        raw = c.chat.completions.with_raw_response.create(
            model="scenario:" + name, messages=messages, tools=box.schemas, user=user
        )
        served.append(str(c.base_url))
        stops.append(raw.headers.get("x-loopwarden-stop"))
        msg = raw.parse().choices[0].message
        calls = [tc.model_dump() for tc in msg.tool_calls or []]
        messages.append(
            {
                "role": "assistant",
                "content": msg.content,
                **({"tool_calls": calls} if calls else {}),
            }
        )
        if not calls:
            rec = wait_for_record(fleet.runs, lambda r: r.get("meta", {}).get("user") == user)
            return Played(step + 1, stops, msg.content or "", served, rec)
        for tc in calls:
            fn = tc["function"]
            out = box.run(fn["name"], fn["arguments"])
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": out})
    raise AssertionError("the agent loop never ended")


def verdicts(p: Played) -> dict[str, Any]:
    """What must not depend on which process served which step."""
    r = p.record
    return {
        "client_steps": p.steps,
        "stop_headers": p.stops,
        "answer": p.answer,
        "termination": r["termination"],
        "stopped_by": r["stopped_by"],
        "soft": r["soft"],
        "steps": r["steps"],
        "tool_calls": r["tool_calls"],
        "duplicate_calls": r["duplicate_calls"],
        "final_answer": r["final_answer"],
        "warnings": [(w["step"], w["plugin"]) for w in r["warnings"]],
        "evidence_rule": (r.get("evidence") or {}).get("rule"),
    }


@pytest.mark.parametrize("name", ["always-not-found", "never-finish", "refund"])
def test_alternating_two_processes_gives_the_verdicts_of_one(
    fleet: Fleet, tmp_path: Path, name: str
) -> None:
    one = play(fleet, name, [fleet.a], tmp_path / "one")
    two = play(fleet, name, [fleet.a, fleet.b], tmp_path / "two")
    assert two.steps > 1 and len(set(two.served_by)) == 2  # both processes served the run
    assert verdicts(two) == verdicts(one)
    if name == "refund":
        assert one.record["termination"] == "final_answer"
    else:
        assert one.record["termination"] != "final_answer"
        assert one.stops[-1] == one.record["termination"]
    json.dumps(verdicts(one))  # plain data, comparable across processes


# -- why the fleet agrees: a step's state is in the store before its answer leaves ----------


class _SavingState:
    """A state store that notes each save in ``events``."""

    def __init__(self, inner: Any, events: list[str]) -> None:
        self.inner = inner
        self.events = events

    def fetch(self, direct: str | None, aliases: Any) -> Any:
        return self.inner.fetch(direct, aliases)

    def save(self, conv: str, blob: bytes, aliases: Any, ttl_s: float) -> None:
        self.inner.save(conv, blob, aliases, ttl_s)
        self.events.append("save")

    def close(self) -> None:
        self.inner.close()


class _LastByte:
    """ASGI middleware that notes in ``events`` when an answer's last byte is handed to the
    server (before it goes out)."""

    def __init__(self, app: Any, events: list[str]) -> None:
        self.app = app
        self.events = events

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def spy(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.events.append("sent")
            await send(message)

        await self.app(scope, receive, spy)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_a_step_is_saved_before_its_answer_goes_out(tmp_path: Path, stream: bool) -> None:
    """A client sends its next request the moment it has read an answer -- to any process.
    If the answer left before the step was saved, another process could read the previous
    step's state (a race the alternating test above hits only now and then): the order is
    checked here, in one process, without timing."""
    from loopwarden import Deployment
    from loopwarden.config import parse_config
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.state import open_state

    events: list[str] = []
    config = parse_config(gateway_config(tmp_path), path="<order>")
    dep = Deployment(config, tools=[])
    state = _SavingState(open_state(config.store), events)
    sc = scenarios(("always-not-found",))["always-not-found"]
    with contextlib.ExitStack() as stack:
        stack.callback(dep.close)
        up = stack.enter_context(serve(ScriptedUpstream({sc.name: sc})))
        gw = stack.enter_context(serve(_LastByte(GatewayApp(dep, up + "/v1", state), events)))
        box = ToolBox(sc, tmp_path)
        c = openai.OpenAI(base_url=gw + "/v1", api_key=KEY, max_retries=0, timeout=30)
        got = c.chat.completions.create(
            model="scenario:" + sc.name,
            messages=[{"role": "user", "content": sc.user}],
            tools=box.schemas,  # type: ignore[arg-type]
            stream=stream,
        )
        if stream:
            assert any(ch.choices and ch.choices[0].delta.tool_calls for ch in got)  # type: ignore[union-attr]
        else:
            assert got.choices[0].message.tool_calls  # type: ignore[union-attr]
    assert events == ["save", "sent"]
