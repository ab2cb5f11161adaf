"""The ``[mcp]`` tables: the MCP servers whose tools a deployment takes.

Validated with the rest of ``config.toml`` (:class:`~loopwarden.config.Config` holds an
:class:`McpConfig`); :mod:`loopwarden.mcp` starts the servers and re-exports these names.

May import: :mod:`loopwarden.config.values` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import ConfigDict, Field, model_validator

from loopwarden.config.values import PositiveSeconds, TypedTable

__all__ = ["REFERENCE", "McpConfig", "McpServerConfig"]

#: ``${NAME}`` (a variable), ``$$`` (a literal ``$``), or a ``$`` that starts neither
REFERENCE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$\{[^}]*\}?")


class _Strict(TypedTable):
    model_config = ConfigDict(extra="forbid", frozen=True)


class McpServerConfig(_Strict):
    """``[mcp.servers.<name>]``: one MCP server -- a stdio ``command`` or a streamable-HTTP
    ``url`` -- and how far its tools are trusted."""

    command: str | None = Field(
        default=None,
        min_length=1,
        description="the program that starts a stdio server (looked up on PATH)",
    )
    args: list[str] = Field(default_factory=list, description="the command's arguments")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="variables the command gets, besides a minimal safe set (PATH, HOME, ...): "
        'values may hold ${NAME} references to this process\'s environment, "$$" for "$"',
    )
    cwd: str | None = Field(default=None, description="the command's working directory")
    url: str | None = Field(
        default=None, description="the streamable-HTTP endpoint (http:// or https://)"
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="HTTP headers sent with every request; values may hold ${NAME} references "
        '(e.g. Authorization = "Bearer ${ORDERS_TOKEN}")',
    )
    startup_timeout_s: PositiveSeconds = Field(
        default=30.0,
        description="the longest the server may take to start, answer the handshake and list "
        "its tools; longer is a start-up error",
    )
    timeout_s: PositiveSeconds = Field(
        default=60.0,
        description="the longest one tool call may take (a hung server is a tool timeout); "
        "the run's time left lowers it",
    )
    prefix: str = Field(
        default="",
        description="put before each tool's name in the deployment (two servers with the same "
        'tool names: "orders_", "crm_")',
    )
    tools: list[str] | None = Field(
        default=None,
        description="the only tools to take from the server, by the names it lists (default: all)",
    )
    trust_annotations: bool = Field(
        default=True,
        description="take tool natures from the server's MCP annotations (readOnlyHint, "
        "destructiveHint, idempotentHint, openWorldHint); false: only [tools.<name>] "
        "tables declare them",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                "give either command (a stdio server) or url (a streamable-HTTP server)"
            )
        if self.url is not None:
            if self.args or self.env or self.cwd is not None:
                raise ValueError("args, env and cwd start a stdio command: not with url")
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        elif self.headers:
            raise ValueError("headers are sent to a url: not with command")
        if self.prefix and not re.fullmatch(r"[A-Za-z0-9_-]+", self.prefix):
            raise ValueError(
                f"prefix may hold letters, digits, '_' and '-' only, got {self.prefix!r}"
            )
        for table, values in (("env", self.env), ("headers", self.headers)):
            for key, value in values.items():
                bad = next(_bad_references(value), None)
                if bad is not None:
                    raise ValueError(
                        f"{table}.{key}: {bad!r} is not a variable reference: write ${{NAME}} "
                        "(letters, digits, '_'), or $$ for a '$'"
                    )
        return self


class McpConfig(_Strict):
    """``[mcp]``: the MCP servers whose tools the deployment takes (``[mcp.servers.<name>]``)."""

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)


def _bad_references(value: str) -> Iterator[str]:
    for m in REFERENCE.finditer(value):
        text = m.group(0)
        if text != "$$" and m.group(1) is None:
            yield text
