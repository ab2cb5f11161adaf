"""The client side of ``[mcp.servers.<name>]``: sessions on a background event loop, and the
tools they become (:mod:`loopwarden.mcp.servertools`; see :mod:`loopwarden.mcp` for the
settings).

The ``mcp`` SDK's client is asynchronous and its sessions are bound to the task that opened
them (anyio task groups), while a deployment serves sync runs (``Deployment.run``, each on its
caller's thread) and async runs (``arun``, on any event loop) alike.  So one
:class:`McpServers` per deployment owns an event loop in a daemon thread: each server's
session is opened, held and closed by one task there, and every tool call is handed to that
loop (``run_coroutine_threadsafe``) and awaited from the run's own loop (``wrap_future``).
An MCP tool is an async tool to the runtime: a sync run awaits it on an event loop of its own,
as any async tool.  The run's deadline cancels the awaiting side, which cancels the call on
the server loop: a hung server is a tool timeout; a server that died answers every call with
an error at once (the SDK's "Connection closed"), which becomes a tool error with the end of
the server's stderr.  Neither ever hangs a run.

Imported only when a deployment has MCP servers: it imports the SDK (``loopwarden[mcp]``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import difflib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]  # no stubs for a plugin's mypy
import mcp_types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from loopwarden._version import __version__
from loopwarden.exceptions import ConfigError, ToolError
from loopwarden.mcp import TOOL_NAME, expand_variables
from loopwarden.mcp.servertools import _describe, _local_name, make_tool
from loopwarden.mcp.servertools import observation as observation
from loopwarden.tools import Tool

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.mcp import McpServerConfig

__all__ = ["McpServers", "start"]

log = logging.getLogger("loopwarden.mcp")

#: how long closing waits for the servers to shut down before abandoning them
CLOSE_TIMEOUT_S = 5.0
#: how much of a server's stderr an error quotes
STDERR_TAIL = 400
#: a stdio server's stderr file is cut to its last STDERR_KEEP bytes past STDERR_MAX
STDERR_MAX = 1 << 20
STDERR_KEEP = 1 << 14


class _StartError(Exception):
    """A server that could not be started, with the reason to show."""


class _Session:
    """One server's client session, opened, held and closed by one task on the hub's loop."""

    def __init__(self, name: str, cfg: McpServerConfig, config: Config) -> None:
        self.name = name
        self.cfg = cfg
        self.key = f"mcp.servers.{name}"
        self.client: Client | None = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.closing = asyncio.Event()
        #: the connection closed under a call: later calls are refused before being sent
        self.lost = False
        #: the server's stderr (closed with the session): quoted in errors, never printed
        self.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._transport = self._make_transport(config)

    def _make_transport(self, config: Config) -> Any:
        cfg = self.cfg
        if cfg.url is not None:
            headers = {
                k: expand_variables(v, key=f"{self.key}.headers.{k}", path=config.path)
                for k, v in cfg.headers.items()
            }
            http = create_mcp_http_client(headers=headers or None)
            return streamable_http_client(cfg.url, http_client=http)
        assert cfg.command is not None
        env = {
            k: expand_variables(v, key=f"{self.key}.env.{k}", path=config.path)
            for k, v in cfg.env.items()
        }
        params = StdioServerParameters(
            command=cfg.command, args=list(cfg.args), env=env or None, cwd=cfg.cwd
        )
        return stdio_client(params, errlog=self.errlog)

    def stderr_tail(self) -> str:
        """The end of what a stdio server wrote to its stderr (one line, for an error).

        Read with ``pread``: the server writes through the same open file, whose offset a
        seek would move under it."""
        if self.cfg.url is not None:
            return ""
        try:
            fd = self.errlog.fileno()
            size = os.fstat(fd).st_size
            data = os.pread(fd, 4 * STDERR_TAIL, max(0, size - 4 * STDERR_TAIL))
        except (OSError, ValueError):
            return ""
        text = data.decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-STDERR_TAIL:]

    def trim_stderr(self) -> None:
        """Keep a long-lived server's stderr file small: past ``STDERR_MAX`` bytes only its
        end is kept (a server that logs every request would otherwise fill the disk)."""
        if self.cfg.url is not None:
            return
        try:
            fd = self.errlog.fileno()
            size = os.fstat(fd).st_size
            if size <= STDERR_MAX:
                return
            keep = os.pread(fd, STDERR_KEEP, size - STDERR_KEEP)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)  # the offset the server writes at (shared)
            os.write(fd, keep)
        except (OSError, ValueError):
            return

    async def _hold(self) -> None:
        async with Client(
            self._transport,
            cache=None,
            client_info=mcp_types.Implementation(name="loopwarden", version=__version__),
        ) as client:
            self.client = client
            self.ready.set()
            await self.closing.wait()

    async def open(self) -> list[mcp_types.Tool]:
        """Start the server and list its tools, within ``startup_timeout_s``; on failure the
        session's task is cancelled (a stdio server is terminated)."""
        self.task = asyncio.create_task(self._hold(), name=f"loopwarden-mcp-{self.name}")
        try:
            return await asyncio.wait_for(self._start(self.task), self.cfg.startup_timeout_s)
        except asyncio.TimeoutError:
            failure = _StartError(
                f"no answer within startup_timeout_s = {self.cfg.startup_timeout_s:g} s"
                + self._stderr_note()
            )
        except _StartError as exc:
            failure = exc
        except Exception as exc:
            failure = _StartError(f"listing its tools failed: {_describe(exc)}")
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, CLOSE_TIMEOUT_S)
        raise failure

    async def _start(self, task: asyncio.Task[None]) -> list[mcp_types.Tool]:
        ready = asyncio.create_task(self.ready.wait())
        try:
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self.ready.is_set() or task.done():
            raise _StartError(self._why(task))
        return await self._list()

    async def _list(self) -> list[mcp_types.Tool]:
        assert self.client is not None
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(1000):  # a paginator that never ends cannot hang the start
            page = await self.client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    def _why(self, task: asyncio.Task[None]) -> str:
        exc = None if task.cancelled() else task.exception()
        text = _describe(exc) if exc is not None else "it closed the connection"
        return text + self._stderr_note()

    def _stderr_note(self) -> str:
        tail = self.stderr_tail()
        return f" (its stderr: {tail})" if tail else ""

    async def call(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        client = self.client
        if client is None or self.task is None or self.task.done() or self.lost:
            # nothing is sent: a definite failure, not a call in doubt
            raise ToolError(
                f"ERROR: the MCP server {self.name!r} is not running" + self._stderr_note()
            )
        self.trim_stderr()
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self.lost = True
            raise

    async def close(self) -> None:
        self.closing.set()
        if self.task is not None and not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(self.task, 1.0)
            except BaseException:  # the session's own failure: it is closed all the same
                pass
        elif self.task is not None and not self.task.cancelled():
            self.task.exception()  # retrieved: a server that died is not "never retrieved"
        self.errlog.close()


class McpServers:
    """The MCP servers of one deployment, on one event loop in a daemon thread."""

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        #: masks secrets (the servers' env and header values) in the errors it raises
        self.redact: Callable[[str], str] = redact or (lambda text: text)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="loopwarden-mcp", daemon=True
        )
        self._thread.start()
        self._sessions: dict[str, _Session] = {}
        self._closed = False

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def open(self, name: str, cfg: McpServerConfig, config: Config) -> list[mcp_types.Tool]:
        """Start one server (blocking the caller) and return the tools it lists."""

        async def make() -> _Session:
            return _Session(name, cfg, config)

        session = self._submit(make()).result()
        self._sessions[name] = session
        future = self._submit(session.open())
        try:
            tools: list[mcp_types.Tool] = future.result(cfg.startup_timeout_s + 5.0)
        except concurrent.futures.TimeoutError:  # the loop itself is stuck: give up on it
            future.cancel()
            raise _StartError(
                f"no answer within startup_timeout_s = {cfg.startup_timeout_s:g} s"
            ) from None
        return tools

    async def call(
        self, server: str, tool: str, arguments: dict[str, Any]
    ) -> mcp_types.CallToolResult:
        """Call ``tool`` on ``server`` from any event loop (a cancellation reaches the call)."""
        if self._closed:
            raise ToolError(f"the MCP server {server!r} is closed (the deployment was closed)")
        session = self._sessions[server]
        return await asyncio.wrap_future(self._submit(session.call(tool, arguments)))

    def stderr_note(self, server: str) -> str:
        """The end of a stdio server's stderr, for an error (empty for HTTP servers)."""
        session = self._sessions.get(server)
        return session._stderr_note() if session is not None else ""

    def close(self) -> None:
        """Close every session (their stdio servers are terminated), then the loop; a server
        that does not shut down in time is abandoned (the thread is a daemon)."""
        if self._closed:
            return
        self._closed = True
        if threading.current_thread() is self._thread:  # a finalizer on the hub's own loop
            for session in self._sessions.values():
                session.closing.set()
            self._loop.call_soon(self._loop.stop)
            return

        async def close_all() -> None:
            await asyncio.gather(
                *(s.close() for s in self._sessions.values()), return_exceptions=True
            )

        try:
            self._submit(close_all()).result(CLOSE_TIMEOUT_S + 2.0)
        except Exception as exc:
            log.warning("closing the MCP servers: %s", _describe(exc))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2.0)
        if not self._thread.is_alive():
            self._loop.close()


def start(
    config: Config, redact: Callable[[str], str] | None = None
) -> tuple[McpServers, list[Tool]]:
    """Start every server of ``config.mcp``, list its tools and declare them; any failure is
    a :class:`ConfigError` naming the server's table (the servers already started are
    closed)."""
    servers = McpServers(redact)
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    mask = servers.redact
    try:
        for name, cfg in config.mcp.servers.items():
            key = f"mcp.servers.{name}"
            try:
                listed = servers.open(name, cfg, config)
            except _StartError as exc:
                where = cfg.url if cfg.url is not None else cfg.command
                raise ConfigError(
                    mask(f"cannot start the MCP server ({where}): {exc}"),
                    path=config.path,
                    key=key,
                ) from None
            by_name = {t.name: t for t in listed}
            wanted = cfg.tools if cfg.tools is not None else list(by_name)
            for remote in wanted:
                spec = by_name.get(remote)
                if spec is None:
                    close = difflib.get_close_matches(remote, list(by_name), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ConfigError(
                        f"the server lists no tool {remote!r}{hint}",
                        path=config.path,
                        key=f"{key}.tools",
                        expected="one of: " + (", ".join(sorted(by_name)) or "(no tools)"),
                    )
                local = _local_name(cfg.prefix, remote)
                if not TOOL_NAME.match(local):
                    raise ConfigError(
                        f"tool {remote!r} would be named {local!r}, which a model API refuses "
                        "(1 to 64 letters, digits, '_' or '-')",
                        path=config.path,
                        key=f"{key}.prefix",
                    )
                if local in seen:
                    raise ConfigError(
                        f"tool name {local!r} is taken by {seen[local]}: set a prefix",
                        path=config.path,
                        key=f"{key}.prefix",
                    )
                seen[local] = f"[{key}]"
                table = config.tools.get(local)
                flags = table.model_dump(exclude_none=True) if table is not None else None
                try:
                    tools.append(make_tool(servers, name, cfg, spec, local, flags))
                except jsonschema.SchemaError as exc:
                    raise ConfigError(
                        mask(
                            f"tool {remote!r} has an invalid inputSchema: {exc.message} "
                            f"(at {'/'.join(map(str, exc.path)) or 'the top'})"
                        ),
                        path=config.path,
                        key=f"{key}.tools",
                        expected="a JSON Schema object; list the server's other tools in "
                        "tools = [...] to leave this one out",
                    ) from None
            log.info("MCP server %r: %d tools", name, len(wanted))
    except BaseException:
        servers.close()
        raise
    return servers, tools
