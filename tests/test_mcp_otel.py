"""MCP tools in OpenTelemetry traces: a real MCP server process, the ``otel`` plugin on an
in-memory SDK pipeline.  The issue's scenario -- a read-only tool, then a destructive
idempotent one twice -- and the second call is answered by the ledger: the record says so,
and so do the spans."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("opentelemetry.sdk")

from support.mcp_servers import count, stdio_table
from support.otel import Telemetry

from loopwarden import Deployment
from loopwarden.config import parse_config
from loopwarden.plugins.otel import OTel, OTelSettings

LOOKUP = ("lookup_order", {"order_id": "7"})
CANCEL = ("cancel_order", {"order_id": "7", "reason": "changed my mind"})


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.shutdown()


def _scenario(tmp_path: Path, *calls: tuple[str, dict[str, Any]]) -> Path:
    def inline(args: dict[str, Any]) -> str:
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in args.items()) + " }"
        )

    turns = "\n".join(
        f"  {{ tool_calls = [{{ name = {json.dumps(n)}, arguments = {inline(a)} }}] }},"
        for n, a in calls
    )
    path = tmp_path / "mcp.toml"
    path.write_text(
        f'name = "mcp"\nuser = "help with order 7"\n[model]\nturns = [\n{turns}\n]\n'
        'then = "final"\nfinal_text = "done"\n',
        encoding="utf-8",
    )
    return path


def test_an_mcp_call_answered_by_the_ledger_says_so_in_record_and_spans(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    log = tmp_path / "log"
    config = parse_config(
        {
            "mcp": {"servers": {"orders": stdio_table(log)}},
            "plugins": {"enabled": ["max_steps", "otel"]},
            "store": {"url": f"sqlite:///{tmp_path / 'store.sqlite3'}"},
        },
        path="<test>",
    )
    otel = OTel(
        OTelSettings(),
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    with Deployment(config, plugins={"otel": otel}) as dep:
        run = dep.run(scenario=_scenario(tmp_path, LOOKUP, CANCEL, CANCEL))
    # the server executed the cancellation once; the second proposal never reached it
    assert count(log, "lookup_order 7") == 1 and count(log, "cancel_order 7") == 1
    record = run.record()
    (answer,) = record["ledger_answers"]
    assert answer["tool"] == "cancel_order" and answer["state"] == "done"

    tools = telemetry.spans("execute_tool")
    assert [s.attributes["gen_ai.tool.name"] for s in tools] == [
        "lookup_order",
        "cancel_order",
        "cancel_order",
    ]
    first, second = tools[1], tools[2]
    assert "loopwarden.ledger.answered" not in first.attributes
    assert second.attributes["loopwarden.ledger.answered"] is True
    assert second.attributes["loopwarden.ledger.source"] == "conversation"
    assert second.attributes["gen_ai.tool.call.id"] == answer["call_id"]
    root = telemetry.one("invoke_agent")
    assert root.attributes["loopwarden.ledger_answers"] == 1
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in tools)
