"""An MCP server's tools as loopwarden tools: arguments checked against the tool's
``inputSchema`` before anything is sent, natures from its annotations (unless
``[tools.<name>]`` says otherwise), and each call's outcome -- a result, an ``isError``, a
server that died mid-call (in doubt) -- as the observation the model reads.

Used by :mod:`loopwarden.mcp.client`, whose sessions carry the calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import mcp_types
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, model_validator

from loopwarden.exceptions import ToolError
from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, idempotency_key
from loopwarden.mcp import annotation_nature, merge_nature
from loopwarden.mcp.schema import argument_names, checker
from loopwarden.tools import Tool
from loopwarden.tools.recorded import recorded_tool

if TYPE_CHECKING:
    from loopwarden.mcp import McpServerConfig
    from loopwarden.mcp.client import McpServers


def _describe(exc: BaseException | None) -> str:
    """An exception as one line; an exception group by its first leaf (anyio wraps the SDK's
    errors in task-group groups)."""
    while True:
        inner: Any = getattr(exc, "exceptions", None)
        if not (isinstance(inner, tuple) and inner):
            break
        exc = inner[0]
    if exc is None:
        return "unknown error"
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if type(exc).__name__ == "MCPError" and len(args) >= 2:
        return f"MCP error {args[0]}: {args[1]}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _args_model(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A model that checks arguments against the tool's JSON Schema (``inputSchema``) and
    keeps them as given: the model's arguments are validated before anything is sent --
    references resolved within the schema only, patterns matched under a time bound (see
    :mod:`loopwarden.mcp.schema`).  Raises ``jsonschema.SchemaError`` for a schema that is
    not a JSON Schema."""
    check = checker(schema)

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _check(cls, data: Any) -> Any:
            errors = check(data)
            if errors:
                raise ValueError("; ".join(errors))
            return data

    Arguments.__name__ = f"{name}_arguments"
    return Arguments


def observation(result: mcp_types.CallToolResult) -> str:
    """A tool result's content as the observation text: text parts as they are, other parts
    named (an image's type and size), structured content as JSON when there is no text."""
    parts: list[str] = []
    for c in result.content:
        if isinstance(c, mcp_types.TextContent):
            parts.append(c.text)
        elif isinstance(c, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{c.type}: {c.mime_type}, {len(c.data)} base64 characters]")
        elif isinstance(c, mcp_types.ResourceLink):
            parts.append(f"[resource: {c.uri}]")
        elif isinstance(c, mcp_types.EmbeddedResource):
            text = getattr(c.resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource: {c.resource.uri}]")
        else:  # a content type of a later protocol revision
            parts.append(f"[{getattr(c, 'type', type(c).__name__)}]")  # type: ignore[unreachable, unused-ignore]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _caller(servers: McpServers, server: str, remote: str, retryable: bool) -> Callable[..., Any]:
    """The body of an MCP tool: the call, its result as text, a failure as a ToolError."""

    async def call_mcp_tool(**arguments: Any) -> str:
        try:
            result = await servers.call(server, remote, arguments)
        except ToolError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection, the protocol: the server's failure
            text = f"ERROR: MCP server {server!r}: {_describe(exc)}" + servers.stderr_note(server)
            raise ToolError(
                servers.redact(text), retryable=retryable, in_doubt=_in_doubt(exc)
            ) from exc
        text = observation(result)
        if result.is_error:
            raise ToolError(servers.redact(text or f"ERROR: {remote} failed"), retryable=retryable)
        return text

    call_mcp_tool.__name__ = remote
    return call_mcp_tool


def _in_doubt(exc: BaseException) -> bool:
    """Whether a call that raised ``exc`` may have taken effect: the request was sent and no
    answer came -- the connection closed (the server died mid-call), the request timed out,
    the transport failed.  Only an error the server itself answered (a JSON-RPC error other
    than those two) is a definite failure."""
    while True:  # anyio wraps the SDK's errors in exception groups
        inner: Any = getattr(exc, "exceptions", None)
        if not (isinstance(inner, tuple) and inner):
            break
        exc = inner[0]
    if isinstance(exc, MCPError):
        return exc.code in (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT)
    return True


def _hints(tool: mcp_types.Tool) -> dict[str, Any] | None:
    ann = tool.annotations
    if ann is None:
        return None
    return {
        "readOnlyHint": ann.read_only_hint,
        "destructiveHint": ann.destructive_hint,
        "idempotentHint": ann.idempotent_hint,
        "openWorldHint": ann.open_world_hint,
    }


def _local_name(prefix: str, remote: str) -> str:
    return prefix + "".join(
        ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in remote
    )


class _AllArgumentsKeyed(Tool):
    """An MCP tool whose idempotency keys come from its schema: a call's key covers those
    arguments *and* any other it carries (a schema open to extra properties), so two calls
    that differ in any argument never share a key -- one is never answered with the other's
    recorded result."""

    @classmethod
    def of(cls, tool: Tool) -> _AllArgumentsKeyed:
        return cls(**{f.name: getattr(tool, f.name) for f in dataclasses.fields(tool)})

    def idempotency_key(
        self, arguments: Mapping[str, Any], volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS
    ) -> str:
        keys = sorted(set(self.idempotency_keys or ()) | set(arguments))
        return idempotency_key(
            self.name,
            arguments,
            keys,
            normalize=self.normalize_arguments,
            volatile_keys=volatile_keys,
        )


def make_tool(
    servers: McpServers,
    server: str,
    cfg: McpServerConfig,
    spec: mcp_types.Tool,
    name: str,
    table: dict[str, Any] | None,
) -> Tool:
    """One MCP tool as a loopwarden :class:`~loopwarden.tools.Tool`: its schema as the server
    gives it, its nature from the annotations (when trusted) under its ``[tools.<name>]``
    table, a deadline of ``timeout_s``."""
    schema = dict(spec.input_schema or {"type": "object"})
    arguments = argument_names(schema)  # None: keyed on each call's actual arguments
    declared = annotation_nature(_hints(spec), arguments) if cfg.trust_annotations else {}
    flags = merge_nature(declared, table)
    base = recorded_tool(name, flags)
    parameters = {k: v for k, v in schema.items() if k not in ("$schema", "title")}
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    description = spec.description or spec.title or f"{spec.name} (MCP server {server})"
    # keys the annotations declared (every argument the schema names) also take any other
    # argument a call carries; keys a [tools.<name>] table names are the operator's choice
    keyed_on_all = base.idempotency_keys is not None and not (
        table and table.get("idempotency_keys") is not None
    )
    return dataclasses.replace(
        _AllArgumentsKeyed.of(base) if keyed_on_all else base,
        func=_caller(servers, server, spec.name, bool(flags.get("retryable"))),
        description=description,
        args_model=_args_model(name, schema),
        retryable=(),
        timeout_s=cfg.timeout_s,
        context_param=None,
        is_async=True,
        server=server,
        _schema={
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        },
    )
