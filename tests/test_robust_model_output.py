"""Model output is untrusted input: nothing it says may crash a run or lose its record.

Lone UTF-16 surrogates (a truncated emoji, which JSON escapes allow) are replaced before they
are stored or sent; arguments nested too deep become a malformed-arguments observation; a
tool name with a surrogate becomes an unknown-tool observation -- in ``run``, ``arun`` and
``replay``, through the scripted model and through the real OpenAI client over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment
from loopwarden.config import Config, default_config_path, load_toml, parse_config
from loopwarden.demo import shop_tools
from loopwarden.models.scenario import Scenario
from loopwarden.report import load_records
from loopwarden.testing import script, tool_call, turn
from loopwarden.traffic.replay import replay_trajectory

DEEP_500 = '{"order_id": ' + "[" * 500 + "]" * 500 + "}"
DEEP_100K = '{"order_id": ' + "[" * 100_000 + "]" * 100_000 + "}"

# name -> (turns, the error kind of the first tool observation, or None for no tool call)
CASES: dict[str, tuple[list[dict[str, Any]], str | None]] = {
    "surrogate in the answer": ([turn("the parcel is on its way \ud83d")], None),
    "surrogate in the arguments": (
        [turn("x", tool_call("query_order", order_id="88231\ud800")), turn("done")],
        None,
    ),
    "escaped surrogate in the arguments": (
        [turn("x", tool_call("query_order", '{"order_id": "8823\\udc00"}')), turn("done")],
        None,
    ),
    "surrogate in the tool name": (
        [turn("x", tool_call("query_\udc00order", order_id="88231")), turn("done")],
        "unknown_tool",
    ),
    "arguments nested 500 deep": (
        [turn("x", tool_call("query_order", DEEP_500)), turn("done")],
        "malformed_arguments",
    ),
    "arguments nested 100,000 deep": (
        [turn("x", tool_call("query_order", DEEP_100K)), turn("done")],
        "malformed_arguments",
    ),
    "unknown tool nested 500 deep": (
        [turn("x", tool_call("no_such_tool", DEEP_500)), turn("done")],
        "malformed_arguments",
    ),
    "a 5000-digit number": (
        [turn("x", tool_call("query_order", '{"order_id": ' + "9" * 5000 + "}")), turn("done")],
        "malformed_arguments",
    ),
}


def _config(tmp_path: Path) -> Config:
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "run_record"]
    data["plugins"]["run_record"] = {"path": str(tmp_path / "runs.jsonl"), "trajectory": True}
    data["plugins"]["token_budget"] = {"max_context": 10**7, "max_total_tokens": 10**8}
    return parse_config(data, path="<test>")


def _strict_utf8_json(record: dict[str, Any]) -> None:
    json.dumps(record, ensure_ascii=False).encode("utf-8")  # raises on a surrogate


@pytest.mark.parametrize("mode", ["run", "arun"])
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_model_output_ends_with_a_writable_record(
    case: str, mode: str, tmp_path: Path
) -> None:
    turns, error = CASES[case]
    sc = Scenario(
        name=case,
        user="where is order 88231?",
        model=script(turns, then="final", final_text="done"),
    )
    with Deployment(_config(tmp_path), tools=shop_tools()) as dep:
        run = dep.run(scenario=sc) if mode == "run" else asyncio.run(dep.arun(scenario=sc))
    record = run.record()
    _strict_utf8_json(record)
    assert record["termination"] == "final_answer", record
    assert record["errors"] == []
    for m in run.messages:  # what would be sent to a model next
        json.dumps(m, ensure_ascii=False).encode("utf-8")
    tool_messages = [m for m in run.messages if m["role"] == "tool"]
    if error == "unknown_tool":
        assert "unknown tool" in tool_messages[0]["content"]
    elif error == "malformed_arguments":
        assert "not a valid JSON object" in tool_messages[0]["content"]
        assert record["tools_executed"] == 0
    loaded = load_records(tmp_path / "runs.jsonl")
    assert (len(loaded.records), loaded.skipped) == (1, 0)
    assert loaded.records[0]["run_id"] == record["run_id"]


def test_surrogates_are_replaced_not_dropped(tmp_path: Path) -> None:
    sc = Scenario(
        name="s",
        user="hi \udfff",
        model=script([turn("emoji \ud83d\ude00 split, and a lone \ud83d")], then="final"),
    )
    with Deployment(_config(tmp_path), tools=shop_tools()) as dep:
        run = dep.run(scenario=sc)
    assert run.record()["final_answer"] == "emoji \U0001f600 split, and a lone \ufffd"
    assert run.messages[1]["content"] == "hi \ufffd"


def test_replay_of_hostile_trajectories(tmp_path: Path) -> None:
    traj = {
        "id": "t1",
        "steps": [
            {
                "content": "x",
                "tool_calls": [
                    {"name": "query_order", "arguments": DEEP_500},
                    {"name": "lookup", "arguments": DEEP_100K},
                ],
                "observations": ["a", "b"],
            },
            {"content": "done", "tool_calls": [], "observations": []},
        ],
    }
    with Deployment(_config(tmp_path), tools=shop_tools()) as dep:
        result = replay_trajectory(dep, traj)
    assert result.runs == 1
    for record in result.records:
        _strict_utf8_json(record)


# -- the real OpenAI client over HTTP ------------------------------------------------------


class _Canned:
    """A local chat-completions endpoint that answers with raw JSON bodies, in order."""

    def __init__(self, bodies: list[str]) -> None:
        self.bodies = bodies
        self.received: list[bytes] = []

    def __enter__(self) -> str:
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                canned.received.append(self.rfile.read(length))
                body = (canned.bodies.pop(0) if canned.bodies else _body("the end")).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _body(content: str | None, calls: list[tuple[str, str]] | None = None) -> str:
    """A completion as JSON text; ``content`` and call parts are inserted verbatim, so that
    they may carry escapes such as ``\\ud83d``."""
    msg = '"content": ' + ("null" if content is None else f'"{content}"')
    if calls:
        msg += (
            ', "tool_calls": ['
            + ", ".join(
                f'{{"id": "c{i}", "type": "function", "function": {{"name": "{n}", '
                f'"arguments": {json.dumps(a)}}}}}'
                for i, (n, a) in enumerate(calls)
            )
            + "]"
        )
    return (
        '{"id": "x", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini", '
        '"choices": [{"index": 0, "message": {"role": "assistant", ' + msg + "}, "
        '"finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}'
    )


HOSTILE_BODIES = [
    _body(
        "checking \\ud83d",
        [
            ("query_\\udc00order", '{"order_id": "88231"}'),
            ("query_order", DEEP_500),
            ("search_knowledge", '{"query": "return policy \\ud800"}'),
        ],
    ),
    _body("your parcel \\ud83d\\ude00 arrives \\udbff"),
]


def _http_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "config.toml"
    shipped = default_config_path().read_text(encoding="utf-8")
    path.write_text(
        shipped.replace("[model]\n", f'[model]\nbase_url = "{url}"\n', 1), encoding="utf-8"
    )
    assert f'base_url = "{url}"' in path.read_text(encoding="utf-8")
    return path


@pytest.mark.parametrize("mode", ["run", "arun"])
def test_hostile_http_responses_keep_every_request_encodable(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-000000000000")
    with _Canned(list(HOSTILE_BODIES)) as url:
        config = _http_config(tmp_path, url)
        with Deployment.from_config(config, tools=shop_tools()) as dep:
            run = (
                dep.run("where is 88231?")
                if mode == "run"
                else asyncio.run(dep.arun("where is 88231?"))
            )
    record = run.record()
    _strict_utf8_json(record)
    assert record["termination"] == "final_answer", record["evidence"]
    assert record["final_answer"] == "your parcel \U0001f600 arrives \ufffd"
    tool_texts = [m["content"] for m in run.messages if m["role"] == "tool"]
    assert "unknown tool" in tool_texts[0]
    assert "not a valid JSON object" in tool_texts[1]
    assert record["tools_executed"] == 1


def test_hostile_http_requests_sent_back_are_valid_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-000000000000")
    server = _Canned(list(HOSTILE_BODIES))
    with (
        server as url,
        Deployment.from_config(_http_config(tmp_path, url), tools=shop_tools()) as dep,
    ):
        dep.run("where is 88231?")
    assert len(server.received) == 2
    second = json.loads(server.received[1].decode("utf-8"))
    sent = json.dumps(second, ensure_ascii=False)
    sent.encode("utf-8")  # no lone surrogate went back to the model
    assert "query_\ufffdorder" in sent


def test_run_json_prints_a_record_for_a_hostile_answer(tmp_path: Path) -> None:
    server = _Canned([_body("lone \\ud83d")])
    with server as url:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "loopwarden",
                "run",
                "hi",
                "--json",
                "--config",
                str(_http_config(tmp_path, url)),
            ],
            capture_output=True,
            timeout=120,
            check=False,
            env={
                **os.environ,
                "OPENAI_API_KEY": "sk-test-000000000000",
                "PYTHONIOENCODING": "utf-8",
            },
        )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    record = json.loads(proc.stdout.decode("utf-8"))
    assert record["final_answer"] == "lone \ufffd"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield
