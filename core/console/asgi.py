"""The console under ``loopwarden gateway`` (``[gateway] console = true``): an ASGI adapter
over :meth:`loopwarden.console.app.Console.handle`, served at ``/console/``.

The gateway may listen on any address, and a browser cannot send its gateway key, so the
console keeps its own access rule there: the token ``LOOPWARDEN_CONSOLE_TOKEN`` when it is set;
without one, only requests from this machine (a loopback peer and a loopback ``Host``) are
answered.  The handler reads files and the store, so it runs on a worker thread, never on the
gateway's event loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from loopwarden.console.app import Console

if TYPE_CHECKING:
    from loopwarden.config import Config

__all__ = ["PREFIX", "TOKEN_ENV", "ConsoleASGI"]

#: where the gateway serves the console
PREFIX = "/console/"
#: the environment variable holding the console's token
TOKEN_ENV = "LOOPWARDEN_CONSOLE_TOKEN"
#: the largest request body read (a reset form is a few hundred bytes)
MAX_BODY = 64 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ConsoleASGI:
    """The console as an ASGI application mounted at :data:`PREFIX`."""

    def __init__(self, console: Console, close: Callable[[], None] | None = None) -> None:
        self.console = console
        self._close = close

    @classmethod
    def from_config(cls, config: Config) -> ConsoleASGI:
        """The console of ``config`` (its records, its store), token from the environment."""
        from loopwarden.console.assemble import console_from_config
        from loopwarden.store import Shared

        shared = Shared(config.store)
        console = console_from_config(
            config, shared, token=os.environ.get(TOKEN_ENV) or None, base=PREFIX
        )
        console.require_local_peer = True

        def close() -> None:
            console.index.close()
            shared.close()

        return cls(console, close)

    @staticmethod
    def serves(path: str) -> bool:
        """Whether ``path`` is the console's."""
        return path == PREFIX.rstrip("/") or path.startswith(PREFIX)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        body = b""
        if scope["method"] == "POST":
            parts: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                parts.append(message.get("body", b""))
                size += len(parts[-1])
                if size > MAX_BODY:
                    await _send(send, 413, b"request body too large", [])
                    return
                if not message.get("more_body"):
                    break
            body = b"".join(parts)
        client = scope.get("client")
        peer = str(client[0]) if client else None
        query = scope.get("query_string", b"").decode("latin-1")
        resp = await asyncio.to_thread(
            self.console.handle, scope["method"], scope["path"], query, headers, body, peer=peer
        )
        await _send(send, resp.status, resp.body, resp.headers)

    def close(self) -> None:
        if self._close is not None:
            self._close()


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
