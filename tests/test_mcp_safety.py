"""MCP servers that die, lie or point elsewhere (issue 33), against real ``mcp`` SDK servers.

A server killed mid-call leaves its side effect in doubt: recorded as "may have taken effect"
in the shared ledger, never executed again by a later run -- over stdio and streamable HTTP.
A tool's ``inputSchema`` is the server's choice: idempotency keys come from the resolved
schema (or the actual arguments), a remote ``$ref`` is never fetched (a local HTTP server
counts any request), an unresolvable one and a catastrophic ``pattern`` make the call
``invalid_arguments`` -- never an exception or a hang.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.cli import loopwarden
from support.mcp_servers import count, http_server, stdio_table
from support.stores import store_table
from test_mcp import config, deployments, play, results, scenario

from loopwarden import Deployment
from loopwarden.exceptions import ConfigError

pytest.importorskip("mcp")

__all__ = ["deployments"]  # the fixture, imported from test_mcp

REFUND: tuple[str, dict[str, Any]] = ("refund_and_die", {"order_id": "7"})


def _server(transport: str, log: Path) -> AbstractContextManager[dict[str, Any]]:
    """A fresh ``mcp_orders`` server table of ``transport`` (an HTTP one serves in the block)."""
    if transport == "stdio":
        return nullcontext(stdio_table(log, timeout_s=600))

    class _Http:
        def __enter__(self) -> dict[str, Any]:
            self._cm = http_server(log)
            return {"url": self._cm.__enter__(), "timeout_s": 600}

        def __exit__(self, *exc: object) -> None:
            self._cm.__exit__(None, None, None)

    return _Http()


@pytest.mark.parametrize("store_url", ["sqlite", "redis"], indirect=True)
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_server_killed_mid_call_leaves_the_side_effect_in_doubt(
    tmp_path: Path, store_url: str, transport: str, deployments: Callable[..., Deployment]
) -> None:
    """The server commits the refund, then dies before answering.  The call is in doubt
    (``unknown_outcome``, "may have taken effect"); a later run on another deployment and
    server sharing the store is answered by the ledger -- the refund happens once."""
    log = tmp_path / "log"
    sc = scenario(tmp_path, REFUND)
    with _server(transport, log) as server:
        dep = deployments(config(server, store=store_table(store_url)))
        run, seen = results(lambda: dep.run(scenario=sc))
    assert count(log, "refund 7") == 1
    assert [(c.name, r.ok, r.error) for c, r in seen] == [
        ("refund_and_die", False, "unknown_outcome")
    ]
    assert "Connection closed" in seen[0][1].content
    assert run.record()["termination"] == "final_answer"

    with _server(transport, log) as server:  # a new server (the old one is dead), same store
        dep2 = deployments(config(server, store=store_table(store_url)))
        run2, seen2 = results(lambda: dep2.run(scenario=sc))
    assert count(log, "refund 7") == 1  # never a silent second execution
    ((_, again),) = seen2
    assert again.skipped and again.error == "unknown_outcome"
    assert "may have taken effect" in again.content
    (answer,) = run2.record()["ledger_answers"]
    assert answer["source"] == "shared" and answer["state"] == "unknown"


def test_server_killed_mid_call_in_doubt_within_the_run(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    """Without a shared store: the same call again in the same run is answered "may have
    taken effect" by the run's own ledger, not sent to a server."""
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log, timeout_s=600), store={"ledger": False}))
    run, seen = results(lambda: dep.run(scenario=scenario(tmp_path, REFUND, REFUND)))
    assert count(log, "refund 7") == 1
    assert [(r.error, r.skipped) for _, r in seen] == [
        ("unknown_outcome", False),
        ("unknown_outcome", True),
    ]
    assert "may have taken effect" in seen[1][1].content
    assert run.record()["ledger_answers"][0]["state"] == "unknown"


# -- schemas a server chose: keys, references, patterns -------------------------------------

SCHEMAS = Path(__file__).parent / "support" / "mcp_schemas.py"
SIDE_EFFECT_IDEMPOTENT = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True}


def schema_server(tmp_path: Path, specs: list[dict[str, Any]]) -> dict[str, Any]:
    """The table of a :mod:`support.mcp_schemas` server publishing ``specs``."""
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(specs), encoding="utf-8")
    return {"command": sys.executable, "args": [str(SCHEMAS), str(tmp_path / "log"), str(path)]}


def config_file(tmp_path: Path, server: dict[str, Any]) -> Path:
    """A config.toml with ``server`` as ``[mcp.servers.s]`` (for ``loopwarden`` commands)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f"[mcp.servers.s]\ncommand = {json.dumps(server['command'])}\n"
        f"args = {json.dumps(server['args'])}\n",
        encoding="utf-8",
    )
    return cfg


def executed(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    """The arguments of each execution of ``name`` in the schema server's log."""
    log = tmp_path / "log"
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").splitlines()
    return [json.loads(ln.split(" ", 1)[1]) for ln in lines if ln.split(" ", 1)[0] == name]


SMS = {
    "type": "object",
    "$ref": "#/$defs/Sms",
    "$defs": {
        "Sms": {
            "type": "object",
            "properties": {"phone": {"type": "string"}, "text": {"type": "string"}},
            "required": ["phone", "text"],
        }
    },
}
NOTIFY = {
    "type": "object",
    "allOf": [{"properties": {"to": {"type": "string"}}}, {"properties": {"body": {}}}],
}
FREE = {"type": "object"}


def test_idempotent_keys_come_from_the_resolved_schema_or_the_actual_arguments(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    """``idempotentHint`` tools whose schema is a ``$ref``, an ``allOf`` or free-form: a
    second SMS to another number is sent (and shows that number's code, not the first
    user's); the same SMS again is answered by the ledger."""
    specs = [
        {"name": n, "inputSchema": s, "annotations": SIDE_EFFECT_IDEMPOTENT}
        for n, s in (("send_sms", SMS), ("notify", NOTIFY), ("free_form", FREE))
    ]
    dep = deployments(config(schema_server(tmp_path, specs)))
    keys = {n: dep.tools.get(n).idempotency_keys for n in ("send_sms", "notify", "free_form")}  # type: ignore[union-attr]
    assert keys == {"send_sms": ("phone", "text"), "notify": ("body", "to"), "free_form": None}
    a = {"phone": "+100", "text": "your code 111"}
    b = {"phone": "+200", "text": "your code 222"}
    sc = scenario(
        tmp_path,
        ("send_sms", a),
        ("send_sms", b),
        ("send_sms", a),
        ("notify", {"to": "x", "body": "1"}),
        ("notify", {"to": "y", "body": "1"}),
        ("free_form", {"to": "x"}),
        ("free_form", {"to": "y"}),
    )
    run, seen = results(lambda: dep.run(scenario=sc))
    assert executed(tmp_path, "send_sms") == [a, b]  # the repeat of a: from the ledger
    assert "222" in seen[1][1].content and "111" not in seen[1][1].content
    assert seen[2][1].skipped
    assert [x["to"] for x in executed(tmp_path, "notify")] == ["x", "y"]
    assert [x["to"] for x in executed(tmp_path, "free_form")] == ["x", "y"]
    assert [a["call_id"] for a in run.record()["ledger_answers"]] == [seen[2][0].id]


class _Counter(BaseHTTPRequestHandler):
    """Counts every request, whatever its method, and answers a schema."""

    hits: ClassVar[list[str]] = []

    def _any(self) -> None:
        type(self).hits.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _any

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def counting_server() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that counts every request made to it: ``(base URL, paths)``."""
    _Counter.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", _Counter.hits
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_remote_reference_is_never_fetched(
    tmp_path: Path,
    deployments: Callable[..., Deployment],
    counting_server: tuple[str, list[str]],
) -> None:
    """A schema whose ``$ref`` (or ``$id``-relative reference) points at a URL: nothing
    requests it -- at start-up or when a call is checked -- and the call, whose arguments
    cannot be checked, is an ``invalid_arguments`` observation that never reaches the server."""
    base, hits = counting_server
    specs = [
        {
            "name": "lookup",
            "inputSchema": {
                "type": "object",
                "properties": {"x": {"$ref": f"{base}/x.json"}},
            },
            "annotations": {"readOnlyHint": True},
        },
        {
            "name": "relative",
            "inputSchema": {
                "$id": f"{base}/root.json",
                "type": "object",
                "properties": {"x": {"$ref": "other.json"}},
            },
            "annotations": {"readOnlyHint": True},
        },
    ]
    dep = deployments(config(schema_server(tmp_path, specs)))
    run, seen = results(
        lambda: dep.run(
            scenario=scenario(tmp_path, ("lookup", {"x": "1"}), ("relative", {"x": "2"}))
        )
    )
    assert hits == []
    assert [(r.error, r.ok) for _, r in seen] == [("invalid_arguments", False)] * 2
    assert "never fetched" in seen[0][1].content
    assert executed(tmp_path, "lookup") == executed(tmp_path, "relative") == []
    assert run.record()["termination"] == "final_answer"


def test_an_unresolvable_reference_is_an_invalid_arguments_observation(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    """A ``$ref`` to a definition the schema does not hold: the run goes on (in a sync and
    an async run), the call is ``invalid_arguments`` and never sent."""
    specs = [
        {
            "name": "broken_ref",
            "inputSchema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
            "annotations": SIDE_EFFECT_IDEMPOTENT,
        }
    ]
    dep = deployments(config(schema_server(tmp_path, specs)))
    assert dep.tools.get("broken_ref").idempotency_keys == ("x",)  # type: ignore[union-attr]
    sc = scenario(tmp_path, ("broken_ref", {"x": "1"}))
    for mode in ("sync", "async"):
        run, seen = play(dep, sc, mode)
        assert [(r.error, r.ok) for _, r in seen] == [("invalid_arguments", False)]
        assert "cannot be resolved" in seen[0][1].content
        assert run.record()["termination"] == "final_answer"
    assert executed(tmp_path, "broken_ref") == []


@pytest.mark.slow
def test_a_catastrophic_pattern_does_not_hang_the_check(tmp_path: Path) -> None:
    """``^(a|a)*$`` against 40 a's and a ``!`` backtracks for longer than anyone waits; the
    check is bounded, so ``loopwarden run`` ends (the subprocess's timeout is only the test's
    guard against a hang) with the call ``invalid_arguments``, never sent."""
    specs = [
        {
            "name": "match",
            "inputSchema": {
                "type": "object",
                "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}},
            },
            "annotations": {"readOnlyHint": True},
        }
    ]
    server = schema_server(tmp_path, specs)
    cfg = config_file(tmp_path, server)
    sc = scenario(tmp_path, ("match", {"s": "a" * 40 + "!"}))
    proc = loopwarden("run", "--config", str(cfg), "--scenario", str(sc), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)
    assert record["termination"] == "final_answer" and record["tool_calls"] == 1
    assert executed(tmp_path, "match") == []


@pytest.mark.slow
def test_properties_as_a_list_is_a_config_error_exit_2(tmp_path: Path) -> None:
    """A tool whose ``inputSchema`` is no JSON Schema (``properties`` a list): a
    :class:`ConfigError` naming the server's table and the tool -- from ``Deployment()``,
    and exit 2 from ``config check`` and ``run`` -- never a traceback."""
    specs = [
        {
            "name": "bad",
            "inputSchema": {"type": "object", "properties": ["a", "b"]},
            "annotations": SIDE_EFFECT_IDEMPOTENT,
        }
    ]
    server = schema_server(tmp_path, specs)
    with pytest.raises(ConfigError) as err:
        Deployment(config(server)).close()
    assert err.value.key == "mcp.servers.orders.tools" and "'bad'" in str(err.value)
    cfg = config_file(tmp_path, server)
    sc = scenario(tmp_path, ("bad", {"a": "1"}))
    for argv in (["config", "check"], ["run", "--scenario", str(sc)]):
        proc = loopwarden(*argv, "--config", str(cfg))
        assert proc.returncode == 2, (argv, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
        assert "mcp.servers.s.tools" in proc.stderr and "invalid inputSchema" in proc.stderr


def test_an_argument_outside_the_schema_still_tells_two_calls_apart(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    """``idempotentHint`` on a schema open to extra properties (no ``additionalProperties:
    false``): the keys it names, and any other argument a call carries, make the key -- a
    second SMS by another channel is sent, not answered with the first one's record."""
    schema = {
        "type": "object",
        "properties": {"phone": {"type": "string"}, "text": {"type": "string"}},
    }
    specs = [{"name": "send_sms", "inputSchema": schema, "annotations": SIDE_EFFECT_IDEMPOTENT}]
    dep = deployments(config(schema_server(tmp_path, specs)))
    assert dep.tools.get("send_sms").idempotency_keys == ("phone", "text")  # type: ignore[union-attr]
    a = {"phone": "+100", "text": "code 111", "channel": "sms"}
    b = {**a, "channel": "whatsapp"}
    run, seen = results(
        lambda: dep.run(
            scenario=scenario(tmp_path, ("send_sms", a), ("send_sms", b), ("send_sms", a))
        )
    )
    assert executed(tmp_path, "send_sms") == [a, b]  # the repeat of a: from the ledger
    assert [r.skipped for _, r in seen] == [False, False, True]
    assert [a["state"] for a in run.record()["ledger_answers"]] == ["done"]
