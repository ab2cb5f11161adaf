"""A local OpenAI-compatible chat-completions server (stdlib, 127.0.0.1, port 0) for tests.

``Stub`` is a queue of canned responses and a log of what the server received.  Besides
well-behaved answers (:meth:`Stub.push`) it plays the hostile behaviours a real endpoint or a
proxy can show, so the client's bounds are tested over real sockets:

* :meth:`Stub.push_slow`         a 200 whose body drips (default: one byte every 1.5 s)
* :meth:`Stub.push_endless`      a 200 whose body never ends, sent as fast as the socket takes
* :meth:`Stub.push_gzip_bomb`    a small gzip body that inflates to many megabytes
* :meth:`Stub.push_echo_auth`    an error whose body echoes the ``Authorization`` header
* :meth:`Stub.push_hang`         no answer at all (not even headers) for a while
* :attr:`Stub.route`            answers computed from each request (concurrent clients)
* :func:`lone_surrogate_completion`, :func:`nested_arguments`: bodies with a lone UTF-16
  surrogate, and tool arguments nested arbitrarily deep (``push`` sends a str body verbatim)

Use :func:`serve` (a context manager) or the ``stub`` fixture, which yield ``(stub, base_url)``.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

__all__ = ["Stub", "completion", "lone_surrogate_completion", "nested_arguments", "serve"]

Writer = Callable[[BaseHTTPRequestHandler, "Stub"], None]


class Stub:
    """A queue of canned responses and a log of received requests."""

    def __init__(self) -> None:
        self.responses: list[tuple[int, Any, dict[str, str]] | Writer] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        #: set at teardown: every hostile handler still writing or waiting gives up
        self.closing = threading.Event()
        #: bytes the hostile handlers managed to send (what a client did not refuse early)
        self.bytes_sent = 0
        #: answers a request when the queue is empty: ``route(payload)`` gives the body (for
        #: concurrent clients, whose requests arrive in no fixed order)
        self.route: Callable[[dict[str, Any]], Any] | None = None

    def push(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        """Queue one answer: ``body`` as JSON (a str is sent verbatim)."""
        self.responses.append((status, body, headers or {}))

    # -- hostile behaviours -------------------------------------------------------------

    def push_slow(self, body: Any = None, *, interval_s: float = 1.5, chunk: int = 1) -> None:
        """A 200 whose body arrives ``chunk`` bytes every ``interval_s`` seconds."""
        data = _encode(body if body is not None else completion("slow"))

        def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
            _head(h, 200, {"content-length": str(len(data))})
            for i in range(0, len(data), chunk):
                if stub.closing.wait(interval_s):
                    return
                stub._send(h, data[i : i + chunk])

        self.responses.append(write)

    def push_endless(self, *, chunk: int = 64 * 1024) -> None:
        """A 200 (no length, no end) streaming ``chunk``-byte pieces until the client leaves."""
        spaces = b" " * chunk

        def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
            _head(h, 200, {})  # no content-length: the body ends when the connection does
            h.close_connection = True
            stub._send(h, b'{"choices": [')
            while not stub.closing.is_set():
                stub._send(h, spaces)

        self.responses.append(write)

    def push_gzip_bomb(self, inflated_bytes: int = 64 * 1024 * 1024) -> None:
        """A 200 with ``content-encoding: gzip`` whose body inflates to ``inflated_bytes``."""
        data = gzip.compress(b'{"choices": [' + b" " * inflated_bytes + b"]}", 9)

        def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
            _head(h, 200, {"content-length": str(len(data)), "content-encoding": "gzip"})
            stub._send(h, data)

        self.responses.append(write)

    def push_echo_auth(self, status: int = 401) -> None:
        """An error whose JSON message repeats the request's ``Authorization`` header."""

        def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
            auth = h.headers.get("authorization", "")
            data = _encode(
                {
                    "error": {
                        "message": f"Incorrect API key provided: {auth}",
                        "type": "invalid_request_error",
                        "auth": auth,
                    }
                }
            )
            _head(h, status, {"content-length": str(len(data))})
            stub._send(h, data)

        self.responses.append(write)

    def push_hang(self, seconds: float = 30.0) -> None:
        """Send nothing for ``seconds`` (or until teardown), then close the connection."""

        def write(h: BaseHTTPRequestHandler, stub: Stub) -> None:
            stub.closing.wait(seconds)
            h.close_connection = True

        self.responses.append(write)

    def _send(self, h: BaseHTTPRequestHandler, data: bytes) -> None:
        h.wfile.write(data)
        h.wfile.flush()
        with self.lock:
            self.bytes_sent += len(data)


def _encode(body: Any) -> bytes:
    text = body if isinstance(body, str) else json.dumps(body)
    return text.encode("utf-8", "surrogatepass")


def _head(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
    h.send_response(status)
    h.send_header("content-type", "application/json")
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()


def stub_model(
    url: str, monkeypatch: pytest.MonkeyPatch, key: str = "sk-stub", **model: Any
) -> dict[str, Any]:
    """The ``[model]`` table of the built-in client calling the stub at ``url`` (its key in
    ``STUB_KEY``, set here; no retries unless ``model`` says so)."""
    monkeypatch.setenv("STUB_KEY", key)
    return {
        "provider": "openai",
        "name": "stub-model",
        "base_url": url,
        "api_key_env": "STUB_KEY",
        "max_retries": 0,
        **model,
    }


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat.completion body with ``content`` and/or ``tool_calls`` ({name, arguments})."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": tc["name"], "arguments": tc["arguments"]},
            }
            for i, tc in enumerate(tool_calls)
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def lone_surrogate_completion(where: str = "content") -> str:
    """A completion (JSON text) with a lone surrogate (``\\ud83d``, half an emoji) in the
    answer (``where="content"``), in a tool's arguments (``"arguments"``) or its name
    (``"name"``).  JSON allows it; Python decodes it to a str that cannot be UTF-8 encoded."""
    lone = "\\ud83d"
    usage = {"prompt_tokens": 5, "completion_tokens": 5}
    if where == "content":
        body = json.dumps(completion("broken emoji: @@", usage=usage))
    elif where == "arguments":
        body = json.dumps(
            completion(
                None, [{"name": "query_order", "arguments": '{"order_id": "@@"}'}], usage=usage
            )
        )
    else:
        body = json.dumps(
            completion(None, [{"name": "query_order@@", "arguments": "{}"}], usage=usage)
        )
    # json.dumps escapes the backslash of a nested JSON string twice
    return body.replace("@@", lone if where != "arguments" else "\\" + lone)


def nested_arguments(depth: int, name: str = "query_order") -> dict[str, Any]:
    """A completion whose tool call's arguments are ``{"a": [[[...]]]}`` ``depth`` deep."""
    args = '{"a": ' + "[" * depth + "]" * depth + "}"
    return completion(
        None,
        [{"name": name, "arguments": args}],
        usage={"prompt_tokens": 5, "completion_tokens": 5},
    )


@contextmanager
def serve() -> Iterator[tuple[Stub, str]]:
    """Run a stub server for the block; yields ``(stub, base_url)`` (``.../v1``)."""
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real endpoints: clients pool connections

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            payload = json.loads(self.rfile.read(length) or b"{}")
            with state.lock:
                state.requests.append(payload)
                state.headers.append({k.lower(): v for k, v in self.headers.items()})
                if state.responses:
                    queued = state.responses.pop(0)
                elif state.route is not None:
                    queued = (200, state.route(payload), {})
                else:
                    queued = (500, {"error": {"message": "no response"}}, {})
            try:
                if callable(queued):
                    queued(self, state)
                    return
                status, body, headers = queued
                data = _encode(body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up: fine
                self.close_connection = True

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        state.closing.set()
        server.shutdown()
        server.server_close()
