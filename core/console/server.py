"""The console's stand-alone front end: the standard library's threading HTTP server over
:meth:`loopwarden.console.app.Console.handle` (nothing to install but the package)."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from loopwarden.console.app import Console

__all__ = ["MAX_BODY", "make_server"]

log = logging.getLogger("loopwarden.console")

#: the largest request body read (a reset form is a few hundred bytes)
MAX_BODY = 64 * 1024


class _Handler(BaseHTTPRequestHandler):
    console: Console
    server_version = "loopwarden-console"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def _serve(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        length = self.headers.get("Content-Length") or "0"
        try:
            size = int(length)
        except ValueError:
            size = -1
        if size < 0 or size > MAX_BODY:
            self.send_error(413 if size > MAX_BODY else 400)
            return
        body = self.rfile.read(size) if size else b""
        resp = self.console.handle(method, path, query, dict(self.headers.items()), body)
        self.send_response(resp.status)
        for name, value in resp.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(resp.body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(resp.body)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s " + format, self.address_string(), *args)


def make_server(console: Console, host: str, port: int) -> ThreadingHTTPServer:
    """A threading HTTP server for ``console`` on ``host``:``port`` (0: a free port)."""
    handler = type("ConsoleHandler", (_Handler,), {"console": console})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
