"""A real MCP server over stdio for the Agents SDK adapter's tests: ``python mcp_shop.py LOG``.

Its tools are a shop's: ``apply_refund`` (a side effect: every execution appends a line to
``LOG``, so a test counts what really ran, in another process), ``query_order`` (a lookup,
also logged) and ``flaky_lookup`` (always fails: the server answers an MCP error).  The SDK's
``MCPServerStdio`` starts it as a subprocess and speaks MCP to it over stdin/stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

LOG = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("mcp_shop.log")
server = MCPServer("shop")


def _log(line: str) -> None:
    with LOG.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


@server.tool()
def apply_refund(order_id: str, reason: str) -> str:
    """Refund an order."""
    _log(f"apply_refund {order_id}")
    return f"refund #1 created for order {order_id}"


@server.tool()
def query_order(order_id: str) -> str:
    """Look up an order by its id."""
    _log(f"query_order {order_id}")
    return f"NOT_FOUND: order {order_id} does not exist"


@server.tool()
def flaky_lookup(order_id: str) -> str:
    """Look up an order in the old system (down today)."""
    _log(f"flaky_lookup {order_id}")
    raise RuntimeError("the old order system is down")


if __name__ == "__main__":
    server.run("stdio")
