"""MCP servers that die, lie or point elsewhere (issue 33), against real ``mcp`` SDK servers.

A server killed mid-call leaves its side effect in doubt: recorded as "may have taken effect"
in the shared ledger, never executed again by a later run -- over stdio and streamable HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from support.mcp_servers import count, http_server, stdio_table
from support.stores import store_table
from test_mcp import config, deployments, results, scenario

from loopwarden import Deployment

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
