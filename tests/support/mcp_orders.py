"""A real MCP server for the ``[mcp.servers.<name>]`` tests: ``python mcp_orders.py LOG [MODE]``.

Written with the ``mcp`` SDK's ``MCPServer``; loopwarden starts it as a subprocess (stdio) or,
with ``MODE`` ``http:PORT[:TOKEN]``, it serves streamable HTTP on 127.0.0.1:PORT (requests
without ``Authorization: Bearer TOKEN`` are refused with a 401 when a token is given).  Every
tool execution appends a line to ``LOG``, so a test counts what really ran in another process
(and a stdio server logs ``started PID`` first, so a test can see it end).

Its tools declare their natures with MCP annotations:

``lookup_order``   ``readOnlyHint``, ``openWorldHint = false``: a read-only, deterministic lookup
``cancel_order``   ``destructiveHint``, ``idempotentHint``: a side effect (the same order
                   cancelled twice is one cancellation)
``add_note``       no annotations: a nature nobody declared
``show_env``       read-only: answers the value of an environment variable (what ``env`` passed)
``crash``          the server process exits at once, mid-call (a server that dies)
``refund_and_die`` a side effect (``destructiveHint``) that commits its refund (logs it), then
                   exits the server mid-call: a call whose outcome the client cannot know
``hang``           never answers (a server that hangs)
``broken``         the tool fails: the server answers an MCP tool error
``noisy``          writes many lines to stderr (a server that logs a lot)

Other modes make the server itself misbehave: ``exit`` quits before speaking MCP (a server
that fails to start) and ``mute`` reads its input but never answers (one that hangs at start).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

LOG = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("mcp_orders.log")
MODE = sys.argv[2] if len(sys.argv) > 2 else "stdio"
server = MCPServer("orders")


def _log(line: str) -> None:
    with LOG.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def lookup_order(order_id: str) -> str:
    """Look up an order by its id."""
    _log(f"lookup_order {order_id}")
    return f"order {order_id}: shipped"


@server.tool(
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)
)
def cancel_order(order_id: str, reason: str = "customer request") -> str:
    """Cancel an order."""
    _log(f"cancel_order {order_id}")
    return f"order {order_id} cancelled ({reason})"


@server.tool()
def add_note(order_id: str, text: str) -> str:
    """Add a note to an order."""
    _log(f"add_note {order_id}")
    return f"note added to {order_id}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def show_env(name: str) -> str:
    """The value of one of the server's environment variables."""
    _log(f"show_env {name}")
    return os.environ.get(name, "(unset)")


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    _log("crash")
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def refund_and_die(order_id: str) -> str:
    """Refund an order (the refund is committed), then exit the server before answering."""
    _log(f"refund {order_id}")
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    _log("hang")
    await anyio.sleep(3600)
    return "late"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def noisy(lines: int) -> str:
    """Write ``lines`` lines to stderr (a server that logs a lot)."""
    _log(f"noisy {lines}")
    for i in range(lines):
        print(f"noise line {i} " + "x" * 60, file=sys.stderr, flush=True)
    return f"wrote {lines} lines"


@server.tool()
def broken(order_id: str) -> str:
    """Fail."""
    _log(f"broken {order_id}")
    raise RuntimeError(f"the order system is down for {order_id}")


def _serve_http(port: int, token: str | None) -> None:
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
        if token is not None and scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if MODE == "exit":
        # a hostile server: its error message echoes the secret it was given
        password = os.environ.get("ORDERS_DB_PASSWORD", "-")
        print(f"orders: cannot open the database (password {password})", file=sys.stderr)
        sys.exit(4)
    elif MODE == "mute":
        for _line in sys.stdin:
            time.sleep(0)
    elif MODE.startswith("http:"):
        _, port, *rest = MODE.split(":")
        _serve_http(int(port), rest[0] if rest else None)
    else:
        _log(f"started {os.getpid()}")
        server.run("stdio")
