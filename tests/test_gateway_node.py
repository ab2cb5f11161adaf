"""A client in another language: Node with the ``openai`` npm package, through the gateway.

``tests/node/agent.mjs`` runs an agent loop (JSON and streamed) against a real gateway in
front of the scripted upstream; the runaway is stopped and the script exits 0 with the
gateway's final answer.  Its tools are small stand-ins written in the script (the demo shop
lives in Python; the loop is what is tested).  ``.ci/run`` installs the package with
``npm ci`` where ``node`` exists; the test skips where ``node`` or the installed package is
absent -- except in CI with ``node`` on the machine, where a missing package is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gateway import scenarios, serve
from support.gw_clients import serve_gateway, wait_for_record

from loopwarden.gateway.scripted import ScriptedUpstream

NODE_DIR = Path(__file__).parent / "node"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node client test needs it")
    if not (NODE_DIR / "node_modules" / "openai" / "package.json").exists():
        if IN_CI:
            pytest.fail("CI: node is here but tests/node has no openai package (.ci/run: npm ci)")
        pytest.skip("tests/node: run `npm ci` there to install the openai npm package")
    return node


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("gw-node")
    scs = scenarios(("always-not-found", "never-finish"))
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPWARDEN_DATA_DIR", str(tmp / "data"))
        up = stack.enter_context(serve(ScriptedUpstream(scs)))
        gw, _ = serve_gateway(stack, tmp, up)
        yield gw, tmp / "runs.jsonl"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_node_openai_client_runaway_is_stopped_and_the_script_exits_0(
    gateway: tuple[str, Path], stream: bool
) -> None:
    node = _node()
    gw, runs = gateway
    user = "node-" + uuid.uuid4().hex[:8]
    sc = scenarios(("always-not-found",))["always-not-found"]
    argv = [node, "agent.mjs", gw + "/v1", "scenario:always-not-found", user]
    proc = subprocess.run(
        [*argv, "--stream"] if stream else argv,
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AGENT_TASK": sc.user},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rec = wait_for_record(runs, lambda r: r.get("meta", {}).get("user") == user)
    assert rec["termination"] == "repeat_call"
    assert rec["final_answer"] == sc.model.final_text
    assert out["answer"].endswith(sc.model.final_text)
    if not stream:  # a streamed answer's headers went out before the stop
        assert out["stop"] == "repeat_call"
        assert out["answer"] == sc.model.final_text
    assert 0 < out["calls"] < 5
