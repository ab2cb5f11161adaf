"""Tools from MCP servers (``[mcp.servers.<name>]``), against real server processes.

The server is :mod:`support.mcp_orders`, written with the ``mcp`` SDK and started by
loopwarden as a subprocess (stdio) or run in a subprocess serving streamable HTTP.  Each
execution appends a line to a log file, so a test counts what really ran in the server.
Nothing is mocked; the scripted model proposes the calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mcp_servers import alive, count, http_server, server_pids, stdio_table
from support.stores import store_table

from loopwarden import Deployment, signals
from loopwarden.config import Config, parse_config
from loopwarden.events import ToolCall, ToolResult
from loopwarden.exceptions import ConfigError
from loopwarden.run import Run

pytest.importorskip("mcp")

OrderCall = tuple[str, dict[str, Any]]


def toml_table(args: dict[str, Any]) -> str:
    """Flat arguments as a TOML inline table."""
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in args.items()) + " }"


def scenario(tmp_path: Path, *calls: OrderCall, name: str = "mcp") -> Path:
    """A scenario file: one turn per call, then a final answer."""
    turns = "\n".join(
        f"  {{ tool_calls = [{{ name = {json.dumps(n)}, arguments = {toml_table(a)} }}] }},"
        for n, a in calls
    )
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nuser = "help with order 7"\n[model]\nturns = [\n{turns}\n]\n'
        'then = "final"\nfinal_text = "done"\n',
        encoding="utf-8",
    )
    return path


def config(server: dict[str, Any], path: str = "<test>", **tables: Any) -> Config:
    return parse_config({"mcp": {"servers": {"orders": server}}, **tables}, path=path)


@pytest.fixture
def deployments() -> Iterator[Callable[..., Deployment]]:
    """Deployments closed after the test (their servers with them)."""
    made: list[Deployment] = []

    def make(cfg: Config) -> Deployment:
        dep = Deployment(cfg)
        made.append(dep)
        return dep

    yield make
    for dep in made:
        dep.close()


def results(run_fn: Callable[[], Run]) -> tuple[Run, list[tuple[ToolCall, ToolResult]]]:
    """Run ``run_fn`` and collect each tool call with its result (the tool_finished signal)."""
    seen: list[tuple[ToolCall, ToolResult]] = []

    def got(sender: Any, call: ToolCall, result: ToolResult, **_: Any) -> None:
        seen.append((call, result))

    with signals.tool_finished.connected_to(got):
        run = run_fn()
    return run, seen


def play(dep: Deployment, sc: Path, mode: str) -> tuple[Run, list[tuple[ToolCall, ToolResult]]]:
    """Play scenario ``sc`` in a sync run (``mode`` "sync") or an async one ("async")."""
    if mode == "sync":
        return results(lambda: dep.run(scenario=sc))
    return results(lambda: asyncio.run(dep.arun(scenario=sc)))


LOOKUP: OrderCall = ("lookup_order", {"order_id": "7"})
CANCEL: OrderCall = ("cancel_order", {"order_id": "7"})


# -- the tools and their natures ------------------------------------------------------------


def test_tools_are_listed_with_natures_from_annotations(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    dep = deployments(config(stdio_table(tmp_path / "log")))
    tools = dep.tools
    assert {"lookup_order", "cancel_order", "add_note", "crash", "hang"} <= set(tools.names)
    lookup, cancel, note = (
        tools.get("lookup_order"),
        tools.get("cancel_order"),
        tools.get("add_note"),
    )
    assert lookup is not None and cancel is not None and note is not None
    # readOnlyHint + openWorldHint = false: read-only and deterministic
    assert (lookup.read_only, lookup.deterministic, lookup.side_effect) == (True, True, False)
    # destructiveHint + idempotentHint: a side effect keyed on its arguments
    assert (cancel.read_only, cancel.side_effect) == (False, True)
    assert cancel.idempotency_keys == ("order_id", "reason")
    # no annotations: nothing declared, it runs every time
    assert not note.declared and not note.side_effect and not note.read_only
    # the server's schema is what the model sees
    params = cancel.schema()["function"]["parameters"]
    assert params["required"] == ["order_id"] and "reason" in params["properties"]
    assert cancel.timeout_s == 60.0


@pytest.mark.parametrize("store_url", ["sqlite", "redis"], indirect=True)
def test_read_only_and_destructive_idempotent_twice_ledger_answers(
    tmp_path: Path, store_url: str, deployments: Callable[..., Deployment]
) -> None:
    """The issue's scenario: a read-only tool, then a destructive idempotent one twice -- the
    second is answered by the ledger, not the server, and the record says so.  A second
    run (async) proposing the cancellation again is answered by the shared ledger."""
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log), store=store_table(store_url)))
    sc = scenario(tmp_path, LOOKUP, CANCEL, CANCEL)
    run, seen = results(lambda: dep.run(scenario=sc))
    assert count(log, "lookup_order 7") == 1
    assert count(log, "cancel_order 7") == 1  # executed once, in the server process
    record = run.record()
    assert record["termination"] == "final_answer" and record["tool_calls"] == 3
    assert [(c.name, r.ok, r.skipped) for c, r in seen] == [
        ("lookup_order", True, False),
        ("cancel_order", True, False),
        ("cancel_order", True, True),
    ]
    assert seen[0][1].content == "order 7: shipped"
    second_call, second = seen[2]
    assert second.skipped_by == "loopwarden"  # the core's ledger, not a plugin's skip
    (answer,) = record["ledger_answers"]
    assert answer["tool"] == "cancel_order" and answer["call_id"] == second_call.id
    assert answer["source"] == "conversation" and answer["state"] == "done"

    again = scenario(tmp_path, CANCEL, name="again")
    run2, seen2 = results(lambda: asyncio.run(dep.arun(scenario=again)))
    assert count(log, "cancel_order 7") == 1
    assert [(c.name, r.skipped) for c, r in seen2] == [("cancel_order", True)]
    (answer2,) = run2.record()["ledger_answers"]
    assert answer2["source"] == "shared" and answer2["state"] == "done"


def test_undeclared_tool_runs_every_time(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log)))
    note = ("add_note", {"order_id": "7", "text": "hi"})
    run = dep.run(scenario=scenario(tmp_path, note, note))
    assert count(log, "add_note 7") == 2
    assert run.record()["ledger_answers"] == []


@pytest.mark.parametrize(
    ("server_extra", "tables"),
    [
        ({"trust_annotations": False}, {}),  # the operator refuses the server's declarations
        ({}, {"tools": {"cancel_order": {"side_effect": False}}}),  # [tools.<name>] overrides
    ],
    ids=["trust_annotations_false", "tools_table_overrides"],
)
def test_operator_overrides_the_annotations(
    tmp_path: Path,
    deployments: Callable[..., Deployment],
    server_extra: dict[str, Any],
    tables: dict[str, Any],
) -> None:
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log, **server_extra), **tables))
    cancel = dep.tools.get("cancel_order")
    assert cancel is not None and not cancel.side_effect and cancel.idempotency_keys is None
    dep.run(scenario=scenario(tmp_path, CANCEL, CANCEL))
    assert count(log, "cancel_order 7") == 2


def test_tools_table_declares_what_the_server_does_not(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    log = tmp_path / "log"
    tables = {"tools": {"add_note": {"side_effect": True, "idempotency_keys": ["order_id"]}}}
    dep = deployments(config(stdio_table(log), **tables))
    note = dep.tools.get("add_note")
    assert note is not None and note.declared and note.side_effect
    run = dep.run(
        scenario=scenario(
            tmp_path,
            ("add_note", {"order_id": "7", "text": "a"}),
            ("add_note", {"order_id": "7", "text": "b"}),
        )
    )
    assert count(log, "add_note 7") == 1
    assert [a["tool"] for a in run.record()["ledger_answers"]] == ["add_note"]


def test_prefix_and_allow_list(tmp_path: Path, deployments: Callable[..., Deployment]) -> None:
    log = tmp_path / "log"
    dep = deployments(
        config(stdio_table(log, prefix="orders_", tools=["lookup_order", "cancel_order"]))
    )
    assert dep.tools.names == ["orders_lookup_order", "orders_cancel_order"]
    run = dep.run(scenario=scenario(tmp_path, ("orders_lookup_order", {"order_id": "9"})))
    assert count(log, "lookup_order 9") == 1
    assert run.record()["tool_calls"] == 1


def test_own_tools_and_mcp_tools_together(tmp_path: Path) -> None:
    """MCP tools join the tools a deployment is given (a copy: the caller's registry is not
    changed); a name taken by one of them is a start-up error."""
    from loopwarden.tools import ToolRegistry, tool

    @tool(read_only=True)
    def lookup_order(order_id: str) -> str:
        """A local lookup."""
        return "local"

    own = ToolRegistry([lookup_order])
    log = tmp_path / "log"
    with Deployment(config(stdio_table(log, prefix="orders_")), tools=own) as dep:
        assert {"lookup_order", "orders_lookup_order"} <= set(dep.tools.names)
        assert own.names == ["lookup_order"]
    with pytest.raises(ConfigError, match="set a prefix"):
        Deployment(config(stdio_table(log)), tools=own)


def test_loopwarden_run_with_mcp_tools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``loopwarden run --scenario`` with a config naming a server: the MCP tools beside the
    demo's, the second cancellation answered from the ledger in the printed record."""
    from loopwarden.commands.cli import main

    log = tmp_path / "log"
    server = stdio_table(log)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        "[mcp.servers.orders]\n"
        f"command = {json.dumps(server['command'])}\nargs = {json.dumps(server['args'])}\n"
        f"[store]\nurl = {json.dumps('sqlite:///' + str(tmp_path / 'store.sqlite3'))}\n",
        encoding="utf-8",
    )
    sc = scenario(tmp_path, LOOKUP, CANCEL, CANCEL)
    assert main(["run", "--config", str(cfg), "--scenario", str(sc), "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["tool_calls"] == 3
    assert [a["tool"] for a in record["ledger_answers"]] == ["cancel_order"]
    assert count(log, "cancel_order 7") == 1


def test_invalid_arguments_never_reach_the_server(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log)))
    run, seen = results(
        lambda: dep.run(scenario=scenario(tmp_path, ("cancel_order", {"order": 7})))
    )
    ((call, result),) = seen
    assert call.error == "invalid_arguments" and not result.ok
    assert "order_id" in (call.error_detail or "")
    assert count(log, "cancel_order 7") == 0 and "cancel_order" not in (
        log.read_text(encoding="utf-8") if log.exists() else ""
    )
    assert run.record()["termination"] == "final_answer"


def test_env_from_variables_reaches_the_server(
    tmp_path: Path, deployments: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``${NAME}`` references are filled from the environment; the rest of loopwarden's
    environment is not passed on; the values are masked in error texts."""
    monkeypatch.setenv("ORDERS_SECRET", "s3cret-value-42")
    monkeypatch.setenv("UNRELATED_SECRET", "not-for-the-server")
    server = stdio_table(tmp_path / "log", env={"ORDERS_TOKEN": "tok:${ORDERS_SECRET}:$$"})
    dep = deployments(config(server))
    show = [("show_env", {"name": "ORDERS_TOKEN"}), ("show_env", {"name": "UNRELATED_SECRET"})]
    _, seen = results(lambda: dep.run(scenario=scenario(tmp_path, *show)))
    assert [r.content for _, r in seen] == ["tok:s3cret-value-42:$", "(unset)"]
    masked = dep.redactor.text("leaked s3cret-value-42")
    assert "s3cret-value-42" not in masked and masked.startswith("leaked ")


# -- servers that die, hang or do not start ---------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_server_that_dies_is_a_tool_error_with_a_record(
    tmp_path: Path, deployments: Callable[..., Deployment], mode: str
) -> None:
    """The server exits mid-call: that call is in doubt (``unknown_outcome``: it may have
    taken effect) and every later one a tool error at once (not a timeout: the deadline is
    far); the run ends with its record."""
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log, timeout_s=600)))
    sc = scenario(tmp_path, ("crash", {}), LOOKUP)
    run, seen = play(dep, sc, mode)
    assert [(c.name, r.ok, r.error) for c, r in seen] == [
        ("crash", False, "unknown_outcome"),
        ("lookup_order", False, "tool_error"),
    ]
    assert "Connection closed" in seen[0][1].content and "'orders'" in seen[0][1].content
    assert count(log, "lookup_order 7") == 0
    record = run.record()
    assert record["termination"] == "final_answer" and record["tool_calls"] == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_server_that_hangs_is_a_timeout_and_the_server_serves_on(
    tmp_path: Path, deployments: Callable[..., Deployment], mode: str
) -> None:
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log, timeout_s=3.0)))
    sc = scenario(tmp_path, ("hang", {}), LOOKUP)
    run, seen = play(dep, sc, mode)
    assert [(c.name, r.ok, r.error) for c, r in seen] == [
        ("hang", False, "timeout"),
        ("lookup_order", True, None),
    ]
    assert count(log, "hang") == 1 and count(log, "lookup_order 7") == 1
    assert run.record()["termination"] == "final_answer"


@pytest.mark.parametrize(
    ("mode", "extra", "says"),
    [
        ("exit", {}, "cannot open the database"),  # the server's stderr, quoted
        ("mute", {"startup_timeout_s": 1.5}, "no answer within startup_timeout_s = 1.5 s"),
    ],
)
def test_server_that_does_not_start_is_a_clear_startup_error(
    tmp_path: Path, mode: str, extra: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clear error naming the table, quoting the server's stderr -- with the secret it was
    given (and echoes) masked."""
    monkeypatch.setenv("ORDERS_PW", "pw-0123456789")
    env = {"ORDERS_DB_PASSWORD": "${ORDERS_PW}"}
    cfg = config(stdio_table(tmp_path / "log", mode, env=env, **extra), path="deploy.toml")
    with pytest.raises(ConfigError) as err:
        Deployment(cfg)
    assert err.value.key == "mcp.servers.orders" and err.value.path == "deploy.toml"
    assert "cannot start the MCP server" in str(err.value) and says in str(err.value)
    assert "pw-0123456789" not in str(err.value)


def test_command_not_found_is_a_startup_error() -> None:
    cfg = config({"command": "loopwarden-no-such-mcp-server"})
    with pytest.raises(ConfigError, match=r"mcp\.servers\.orders: cannot start the MCP server"):
        Deployment(cfg)


def test_tool_not_listed_by_the_server(tmp_path: Path) -> None:
    cfg = config(stdio_table(tmp_path / "log", tools=["lookup_ordr"]))
    with pytest.raises(ConfigError) as err:
        Deployment(cfg)
    assert err.value.key == "mcp.servers.orders.tools"
    assert "did you mean 'lookup_order'?" in str(err.value)


@pytest.mark.parametrize("mode", ["close", "aclose"])
def test_closing_the_deployment_ends_its_servers(tmp_path: Path, mode: str) -> None:
    """Servers start once per deployment and end with it (``close`` or ``async with``);
    a run on a closed deployment gets a tool error, not a hang."""
    log = tmp_path / "log"
    cfg = config(stdio_table(log))
    sc = scenario(tmp_path, LOOKUP)
    if mode == "close":
        dep = Deployment(cfg)
        dep.run(scenario=sc)
        dep.close()
    else:

        async def use() -> Deployment:
            async with Deployment(cfg) as dep:
                await dep.arun(scenario=sc)
            return dep

        dep = asyncio.run(use())
    (pid,) = server_pids(log)  # one server process, for both runs
    assert not alive(pid)
    assert count(log, "lookup_order 7") == 1
    _, seen = results(lambda: dep.run(scenario=sc))
    assert not seen[0][1].ok and "closed" in seen[0][1].content
    assert count(log, "lookup_order 7") == 1


def test_concurrent_runs_share_one_server(
    tmp_path: Path, deployments: Callable[..., Deployment]
) -> None:
    """Sync runs on several threads and async runs on one event loop, at once, through one
    server session."""
    log = tmp_path / "log"
    dep = deployments(config(stdio_table(log)))
    scenarios = [
        scenario(tmp_path, ("lookup_order", {"order_id": str(i)}), name=f"s{i}") for i in range(8)
    ]

    async def async_runs() -> list[Run]:
        return list(await asyncio.gather(*(dep.arun(scenario=s) for s in scenarios[4:])))

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        threads = [pool.submit(dep.run, scenario=s) for s in scenarios[:4]]
        runs = [*asyncio.run(async_runs()), *(f.result() for f in threads)]
    assert all(r.record()["termination"] == "final_answer" for r in runs)
    assert [count(log, f"lookup_order {i}") for i in range(8)] == [1] * 8
    assert len(server_pids(log)) == 1


def test_a_chatty_servers_stderr_is_kept_small(
    tmp_path: Path, deployments: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stderr a stdio server writes is kept for error messages, cut to its end once it
    grows past a bound (lowered here), and still quoted when the server dies."""
    from loopwarden.mcp import client as _mcp_client

    monkeypatch.setattr(_mcp_client, "STDERR_MAX", 4000)
    monkeypatch.setattr(_mcp_client, "STDERR_KEEP", 1000)
    dep = deployments(config(stdio_table(tmp_path / "log")))
    noisy = ("noisy", {"lines": 200})
    _, seen = results(
        lambda: dep.run(scenario=scenario(tmp_path, noisy, noisy, noisy, ("crash", {})))
    )
    assert [r.ok for _, r in seen] == [True, True, True, False]
    assert "noise line 199" in seen[-1][1].content  # the end of its stderr, quoted
    errlog = dep.mcp._sessions["orders"].errlog
    # each call trims what came before it: at most one call's output besides the kept end
    assert os.fstat(errlog.fileno()).st_size < 1000 + 200 * 80


# -- streamable HTTP ----------------------------------------------------------------------------


def test_streamable_http_server_with_headers_from_variables(
    tmp_path: Path, deployments: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server over streamable HTTP behind a bearer token from a variable: the same ledger;
    a wrong token is a start-up error that shows no secret; a server that goes away is a
    tool error."""
    log = tmp_path / "log"
    monkeypatch.setenv("ORDERS_TOKEN", "tok-123456789")
    with http_server(log, token="tok-123456789") as url:
        server = {
            "url": url,
            "headers": {"Authorization": "Bearer ${ORDERS_TOKEN}"},
            "timeout_s": 600,
        }
        dep = deployments(config(server))
        cancel = dep.tools.get("cancel_order")
        assert cancel is not None and cancel.side_effect
        run = dep.run(scenario=scenario(tmp_path, LOOKUP, CANCEL, CANCEL))
        assert count(log, "lookup_order 7") == 1 and count(log, "cancel_order 7") == 1
        assert [a["tool"] for a in run.record()["ledger_answers"]] == ["cancel_order"]
        # without the header the server refuses: a start-up error that shows no secret
        monkeypatch.setenv("ORDERS_TOKEN", "wrong-token-987654")
        with pytest.raises(ConfigError) as err:
            Deployment(config(server))
        assert "cannot start the MCP server" in str(err.value)
        assert "wrong-token-987654" not in str(err.value)
    # the server is gone: an error at once (the deadline is far), and a record.  The SDK
    # reports a refused connection as it reports one dropped mid-call ("Connection closed"),
    # so the first call after is in doubt -- the safe side -- and later ones refused unsent
    sc = scenario(tmp_path, LOOKUP, LOOKUP, name="gone")
    run, seen = results(lambda: dep.run(scenario=sc))
    assert [(r.ok, r.error) for _, r in seen] == [(False, "unknown_outcome"), (False, "tool_error")]
    assert "MCP server 'orders'" in seen[0][1].content
    assert run.record()["termination"] == "final_answer"


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "key", "says"),
    [
        ({"comand": "x"}, "mcp.servers.orders.comand", "did you mean 'command'?"),
        ({"command": "x", "url": "http://h/mcp"}, "mcp.servers.orders", "either command"),
        ({}, "mcp.servers.orders", "either command"),
        ({"url": "http://h/mcp", "env": {"A": "b"}}, "mcp.servers.orders", "not with url"),
        ({"command": "x", "headers": {"A": "b"}}, "mcp.servers.orders", "not with command"),
        ({"url": "ftp://h/mcp"}, "mcp.servers.orders", "http://"),
        ({"command": "x", "env": {"A": "${1X}"}}, "mcp.servers.orders", "env.A"),
        ({"command": "x", "env": {"A": "${X"}}, "mcp.servers.orders", "env.A"),
        ({"command": "x", "prefix": "a.b"}, "mcp.servers.orders", "prefix"),
        ({"command": "x", "timeout_s": 0}, "mcp.servers.orders.timeout_s", "greater than 0"),
    ],
)
def test_bad_server_tables_fail_validation(server: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(server)
    assert err.value.key == key and says in str(err.value)


def test_unset_variable_names_the_key_not_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORDERS_MISSING", raising=False)
    cfg = config({"url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": "k ${ORDERS_MISSING}"}})
    with pytest.raises(ConfigError) as err:
        Deployment(cfg)
    assert err.value.key == "mcp.servers.orders.headers.X-Key"
    assert "ORDERS_MISSING is not set" in str(err.value)


def test_config_check_starts_the_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loopwarden.commands.cli import main

    good = tmp_path / "good.toml"
    bad = tmp_path / "bad.toml"
    server = [str(Path(__file__).parent / "support" / "mcp_orders.py"), str(tmp_path / "l")]
    head = f"[mcp.servers.orders]\ncommand = {json.dumps(sys.executable)}\n"
    good.write_text(head + f"args = {json.dumps(server)}\n", encoding="utf-8")
    bad.write_text(head + f"args = {json.dumps([*server, 'exit'])}\n", encoding="utf-8")
    assert main(["config", "check", str(good)]) == 0
    assert main(["config", "check", str(bad)]) == 2
    assert "mcp.servers.orders: cannot start the MCP server" in capsys.readouterr().err


def test_named_tables_get_did_you_mean() -> None:
    """A typo inside a table of named tables ([tools.<name>], [mcp.servers.<name>]) is
    answered with the keys that table accepts."""
    with pytest.raises(ConfigError, match="did you mean 'side_effect'"):
        parse_config({"tools": {"cancel_order": {"side_efect": True}}})
    with pytest.raises(ConfigError, match="did you mean 'trust_annotations'"):
        config({"command": "x", "trust_annotation": False})


@pytest.mark.parametrize(
    ("hints", "nature"),
    [
        ({"readOnlyHint": True}, {"read_only": True, "side_effect": False}),
        (
            {"readOnlyHint": True, "openWorldHint": False},
            {"read_only": True, "side_effect": False, "deterministic": True},
        ),
        (
            {"readOnlyHint": True, "openWorldHint": True},
            {"read_only": True, "side_effect": False, "deterministic": False},
        ),
        ({"readOnlyHint": False}, {"read_only": False, "side_effect": True}),
        ({"destructiveHint": True}, {"read_only": False, "side_effect": True}),
        ({"destructiveHint": False}, {"read_only": False, "side_effect": True}),
        (
            {"idempotentHint": True},
            {"read_only": False, "side_effect": True, "idempotency_keys": ["a", "b"]},
        ),
        (
            {"readOnlyHint": False, "idempotentHint": False},
            {"read_only": False, "side_effect": True},
        ),
        ({"openWorldHint": True}, {"deterministic": False}),
        ({"openWorldHint": None, "readOnlyHint": None}, {}),  # not sent: nothing declared
        (None, {}),
    ],
)
def test_annotation_natures(hints: dict[str, Any] | None, nature: dict[str, Any]) -> None:
    from loopwarden.mcp import annotation_nature

    assert annotation_nature(hints, ["a", "b"]) == nature


def test_the_docs_toml_examples_are_valid_configs() -> None:
    """Every TOML block of docs/mcp.md and the README's MCP section validates as written."""
    import re

    import jsonschema

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10
        import tomli as tomllib

    root = Path(__file__).parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Tools from MCP servers", 1)[1].split("\n## ", 1)[0]
    text = (root / "docs" / "mcp.md").read_text(encoding="utf-8") + section
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    schema = json.loads((root / "docs" / "config.schema.json").read_text(encoding="utf-8"))
    for block in blocks:
        data = tomllib.loads(block)
        cfg = parse_config(data, path="docs/mcp.md")
        assert cfg.mcp.servers
        jsonschema.validate(data, schema)  # what editors check against
    bad = {"mcp": {"servers": {"orders": {"comand": "x"}}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
