"""Tools from MCP servers: the ``[mcp.servers.<name>]`` tables and their settings.

Each table names one Model Context Protocol server -- a ``command`` started as a subprocess
that speaks MCP over its stdin/stdout, or the ``url`` of a streamable-HTTP endpoint.  A
:class:`~loopwarden.Deployment` starts its servers once, lists their tools and adds them to its
tool registry, where they run through the same guards, side-effect ledger, records and
metrics as Python tools (see docs/mcp.md).  The servers are closed with the deployment.

The settings are read with the rest of ``config.toml`` (:mod:`loopwarden.config.mcp`,
re-exported here); this module imports nothing of the ``mcp`` SDK: the client side lives in
:mod:`loopwarden.mcp.client`, imported only when a deployment has servers (extra
``loopwarden[mcp]``).

Secrets come from the environment, never from the file: a value of ``env`` or ``headers`` may
hold ``${NAME}`` references, replaced by the variable's value when the server starts (``$$``
is a literal ``$``).  A variable that is not set is a start-up error naming the key and the
variable, never a value; the values are added to the deployment's redactor, so an error that
echoes them is masked in records, logs and alerts.

May import: the public vocabulary (config, exceptions) and :mod:`loopwarden.tools`; only
deployments (and the commands) import it -- the config reads its ``[mcp]`` tables itself.
The ``mcp`` SDK is imported only by :mod:`loopwarden.mcp.client`, and only when a server is
configured.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loopwarden.config.mcp import REFERENCE as _REFERENCE
from loopwarden.config.mcp import McpConfig, McpServerConfig
from loopwarden.exceptions import ConfigError

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.tools import Tool

__all__ = [
    "McpConfig",
    "McpServerConfig",
    "annotation_nature",
    "expand_variables",
    "secret_values",
]

#: what a tool name may hold in a chat-completions request (OpenAI's function-name rule)
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def expand_variables(
    value: str, *, key: str, path: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """``value`` with its ``${NAME}`` references replaced from ``environ`` (the process's
    environment); an unset variable is a :class:`ConfigError` naming ``key`` and the
    variable -- never the value."""
    env = os.environ if environ is None else environ

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        if name is None:  # refused by validation; kept as written if it gets here
            return m.group(0)
        if name not in env:
            raise ConfigError(
                f"the environment variable {name} is not set",
                path=path,
                key=key,
                expected=f"{name} set in the environment of the process that starts the server",
            )
        return env[name]

    return _REFERENCE.sub(sub, value)


def secret_values(config: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """The values the ``${NAME}`` references of every server's ``env`` and ``headers`` stand
    for (the header values whole, as they carry credentials): the deployment's redactor masks
    them.  Raises :class:`ConfigError` for a variable that is not set."""
    out: list[str] = []
    for name, server in config.mcp.servers.items():
        for table, values in (("env", server.env), ("headers", server.headers)):
            for k, v in values.items():
                key = f"mcp.servers.{name}.{table}.{k}"
                expanded = expand_variables(v, key=key, path=config.path, environ=environ)
                if table == "headers":
                    out.append(expanded)
                for m in _REFERENCE.finditer(v):
                    if m.group(1) is not None:
                        out.append((os.environ if environ is None else environ)[m.group(1)])
    return [s for s in out if s]


def annotation_nature(
    annotations: Mapping[str, Any] | None, arguments: list[str] | None
) -> dict[str, Any]:
    """The loopwarden nature an MCP server declares for a tool with its annotations, in the
    shape of a ``[tools.<name>]`` table (flags not declared are left out).

    ``annotations`` holds the hints the server sent (``readOnlyHint``, ``destructiveHint``,
    ``idempotentHint``, ``openWorldHint``; a hint it did not send is absent or None: the MCP
    defaults are not declarations).  ``readOnlyHint = true`` is read-only, and deterministic
    when ``openWorldHint = false`` as well (a closed world); ``readOnlyHint = false``, or a
    ``destructiveHint`` / ``idempotentHint`` without it, is a side effect -- keyed on all of
    ``arguments`` when ``idempotentHint = true`` (the server says a repeat has no further
    effect, so the runtime may retry a transient failure), else on all arguments with no
    retries; ``openWorldHint = true`` is not deterministic.  ``arguments`` None: the schema
    does not say which arguments there are (free-form, unresolvable): no keys are declared,
    and the side effect is keyed on each call's actual arguments (never on a shared empty
    set), with no retries.
    """
    if not annotations:
        return {}
    read_only = annotations.get("readOnlyHint")
    destructive = annotations.get("destructiveHint")
    idempotent = annotations.get("idempotentHint")
    open_world = annotations.get("openWorldHint")
    flags: dict[str, Any] = {}
    if read_only is True:
        flags.update(read_only=True, side_effect=False)
        if open_world is False:
            flags["deterministic"] = True
    elif read_only is False or destructive is not None or idempotent is not None:
        flags.update(read_only=False, side_effect=True)
        if idempotent is True and arguments is not None:
            flags["idempotency_keys"] = list(arguments)
    if open_world is True:
        flags["deterministic"] = False
    return flags


def merge_nature(declared: Mapping[str, Any], table: Mapping[str, Any] | None) -> dict[str, Any]:
    """A server's declared nature with a ``[tools.<name>]`` table over it, flag by flag; a
    table that says read-only (or not a side effect) drops the annotations' side effect."""
    flags = dict(declared)
    if not table:
        return flags
    flags.update(table)
    if table.get("read_only") is True and "side_effect" not in table:
        flags["side_effect"] = False
    if table.get("side_effect") is True and "read_only" not in table:
        flags["read_only"] = False
    if flags.get("side_effect") is not True:
        flags.pop("idempotency_keys", None)
    return flags


def start_servers(config: Config, redact: Any = None) -> tuple[Any, list[Tool]]:
    """Start ``config``'s MCP servers and list their tools (see
    :func:`loopwarden.mcp.client.start`); a missing ``mcp`` package is a :class:`ConfigError`
    saying which extra to install."""
    try:
        from loopwarden.mcp import client as _mcp_client
    except ImportError as exc:  # the SDK is missing (or broken)
        first = next(iter(config.mcp.servers))
        raise ConfigError(
            f"MCP servers need the mcp package ({exc}): pip install 'loopwarden[mcp]'",
            path=config.path,
            key=f"mcp.servers.{first}",
        ) from None
    return _mcp_client.start(config, redact)
