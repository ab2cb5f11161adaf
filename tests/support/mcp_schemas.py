"""A real MCP server whose tools have the input schemas a test gives it:
``python mcp_schemas.py LOG TOOLS_JSON``.

Written with the ``mcp`` SDK's low-level ``Server``, which publishes each ``inputSchema`` as
given -- ``$ref``, ``allOf``, free-form objects, remote references, costly patterns -- where
``MCPServer`` would derive it from type hints.  ``TOOLS_JSON`` is a file holding a list of
``{"name", "inputSchema", "annotations"?}``.  Every call appends ``name <arguments as JSON>``
to ``LOG`` and answers ``<name> done for <arguments as JSON>`` (a one-time code to the number
it was sent to, say), so a test counts what really ran in the server process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

LOG = Path(sys.argv[1])
SPECS: list[dict[str, Any]] = json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool.model_validate(s) for s in SPECS])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = json.dumps(params.arguments or {}, sort_keys=True)
    with LOG.open("a", encoding="utf-8") as f:
        f.write(f"{params.name} {text}\n")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{params.name} done for {text}")]
    )


server = Server("schemas", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
