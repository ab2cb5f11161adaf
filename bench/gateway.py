"""The gateway's overhead (issue 42): ``loopwarden gateway`` against calling the upstream
directly, and LiteLLM's proxy in front of the same upstream, in the same run.

Everything runs on this machine, the load generator included:

* **the mock upstream** -- a raw asyncio HTTP/1.1 server in a process of its own (uvloop when
  installed), answering ``/v1/chat/completions`` after ``--latency-ms`` (default 20 ms) with a
  canned answer read off the request: a ``lookup`` tool call (distinct arguments every step,
  so no guard ever fires) while the last user turn has fewer than ``STEPS`` tool results,
  else a text answer; JSON, or streamed as server-sent events (text in ``--chunks`` pieces
  ``--chunk-gap-ms`` apart, each piece's text the ``time.monotonic()`` at which it was
  written -- CLOCK_MONOTONIC is one clock for every process of the machine, so the client
  reads each chunk's delay off the chunk itself, through any proxy);
* **the gateway** -- the real command, ``loopwarden gateway --upstream URL --port P
  --config FILE [--workers N] [--state memory|store]``, with the shipped ``config.toml``
  (limits raised above the workload as in ``overhead.py``: every guard runs every step and
  never stops a run), its store a ``redis-server`` of the bench's own (``--redis-url`` to use
  another) -- ``gateway_redis`` -- and, for reference, ``--state memory`` (conversations in
  the process, the store a temporary SQLite file) -- ``gateway_memory``;
* **LiteLLM's proxy** (``litellm --config``: one wildcard model routed to the same mock, no
  database, one worker) when the ``litellm`` command is installed
  (``pip install 'litellm[proxy]'``; the JSON says why when it is not, or did not start);
* **the load generator** -- aiohttp's client on uvloop in this process.  aiohttp, not httpx:
  its HTTP parser and connection pool are C and Cython, so each request costs the generator
  a fraction of httpx's pure-Python request path (``loadgen_cpu_us_per_request`` says how
  much); on two shared cores every microsecond the generator spends is taken from the server
  being measured.  httpx is the fallback when aiohttp is not installed.

**Agent-like requests.**  Each simulated agent starts from a 14-message history (a system
prompt, an earlier user turn with five tool calls and their results and its answer, then a
new user message) and plays one run the way an agent does: it sends the history with the
tool list, appends the assistant message it got and the result of each tool call, and sends
again -- 7 requests of 14 to 26 messages (20 on average), six of them continuing a run whose
tool-call ids the gateway handed out, the seventh answered with text (the run ends).  The
gateway's ``x-loopwarden-run`` on each answer shows it found the run: ``run_continuity`` is
the share of continuing requests answered with the same run id as the step before.

**Open-loop rate, paired rounds.**  ``--rounds`` rounds (default 3); each sends the same
agent-like traffic at ``--rate`` requests per second (default 200) for ``--seconds`` (default
8) to every target in turn -- ``direct`` (the mock itself), the gateway variants, LiteLLM --
the order rotating round by round.  Requests are sent on schedule whether or not earlier
ones have returned (an agent waits for its own answer; a new agent starts when none is
ready).  Per target and round: client latency p50 / p99, the target's own overhead header
(``x-loopwarden-overhead-ms``; LiteLLM's ``x-litellm-overhead-duration-ms``) p50 / p99, the
target process's CPU per request (from ``/proc``, all its processes), and the generator's.
**Added latency** is each round's percentile minus ``direct``'s of the same round; the
figures reported are the median of the rounds with their min and max.

**Other targets of the issue**, each paired against ``direct`` the same way:

* ``light``: the same agent-like requests at ``--light-rate`` (default 25) per second, where
  a target that saturates at ``--rate`` may not -- LiteLLM beside the gateway unsaturated;

* ``long``: 50k-token histories (the five earlier tool results carry ~40k characters each),
  ``--long-rate`` (default 20) requests per second;
* ``stream``: streamed text, 20-message histories whose answer is text, ``--chunks`` chunks;
  per chunk, its delay (arrival minus the mock's stamp), p50 / p99 over every chunk, and the
  last chunk (the one the gateway holds until the answer is judged) apart;
* ``scaling``: closed loop, ``--agents`` agents (default 32) sending back to back for
  ``--seconds``, against one gateway process and against ``--workers 2``, both on the one
  Redis: requests per second and the overhead header at each, ``direct`` beside them;
* ``wrapper``: ``loopwarden.wrap(OpenAI())`` -- CPU per call (all the process's threads)
  of the wrapped client minus the bare client, the same agent-like conversations against an
  in-memory transport, interleaved blocks.  Measured when ``loopwarden.gateway.wrap`` is
  importable, else the JSON says it was skipped.

**Every wire (issue 44)**: ``--wire chat|responses|responses_full|messages|all`` plays the
batches in each shape the gateway judges (``all``: each in turn; the JSON's ``by_wire`` has
each shape's rounds and analysis, ``rounds`` / ``analysis`` stay the first shape's).  The
agents keep the same conversation and speak it as ``/v1/responses`` -- ``responses``
continuing by ``previous_response_id`` (each request after the first carries only the new
``function_call_output`` item; the mock keeps every response's conversation, as a provider
does), ``responses_full`` resending the whole history as ``input`` items each request, no id:
the two styles in the same run -- or as ``/v1/messages`` (Anthropic: ``system`` apart,
``tool_use`` / ``tool_result`` blocks, ``x-api-key``).  The mock answers each in its shape,
JSON or streamed (``response.output_text.delta`` / ``content_block_delta`` events, each
stamped as the chat chunks are, then the shape's closing events).  ``--profile --wire W``
profiles that shape.

``--profile`` plays agent-like requests through the ASGI app in this process (no sockets:
the upstream an ``httpx.MockTransport``) under cProfile and prints the gateway's CPU per
request and where it goes, by function.

    python bench/gateway.py                      # the full run (a few minutes)
    python bench/gateway.py --json
    python bench/gateway.py --profile            # where the gateway's time goes
    python bench/gateway.py --quick --json       # a smoke test of the bench itself
    python bench/gateway.py --wire all --only rounds --no-litellm   # every shape

Speed is never asserted in a test; the smoke test checks the JSON's shape only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W

MODEL = "gpt-4o-mini"
STEPS = 6  # tool calls per run: the 7th answer is text
PREFIX_CALLS = 5  # tool calls of the earlier turn in every agent's first request
LONG_CHARS = 40_000  # characters of each earlier tool result in a "long" history
SYSTEM = "You are a records agent. Look up every record the user names, then answer."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up one record by its key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "update",
            "description": "Update one record.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                "required": ["key", "value"],
            },
        },
    },
]
OVERHEAD_HEADERS = ("x-loopwarden-overhead-ms", "x-litellm-overhead-duration-ms")
MASTER_KEY = "sk-" + uuid.uuid4().hex + uuid.uuid4().hex  # LiteLLM's, for this run only
STAMP = re.compile(rb'"content":\s*"(\d+\.\d+)')


# -- the mock upstream (a process of its own) ---------------------------------------------------


def _reply(body: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], int]:
    """(text, tool calls, prompt tokens) answering a request: a call while the last user turn
    has fewer than STEPS tool results (and tools are on), else text."""
    messages = body.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    k = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "tool")
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 8
    if k >= STEPS or body.get("tool_choice") == "none" or not body.get("tools"):
        return "All records looked up.", [], prompt
    nonce = uuid.uuid4().hex[:12]
    call = {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"key": f"k{k}-{nonce}"})},
    }
    return f"Checking record {k}.", [call], prompt


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(body: dict[str, Any]) -> bytes:
    """The mock's JSON answer to ``body``."""
    text, calls, prompt = _reply(body)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return json.dumps(
        {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or MODEL),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": _usage(prompt, 12),
        }
    ).encode()


async def _stream(
    writer: asyncio.StreamWriter, body: dict[str, Any], chunks: int, gap: float
) -> None:
    text, calls, prompt = _reply(body)
    base = {
        "id": "chatcmpl-" + uuid.uuid4().hex[:24],
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": str(body.get("model") or MODEL),
    }

    async def event(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> None:
        chunk = {
            **base,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        piece = b"data: " + json.dumps(chunk).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()

    await event({"role": "assistant", "content": ""})
    if calls:
        await event({"content": text})
        for i, call in enumerate(calls):
            args = call["function"]["arguments"]
            head = {"index": i, "id": call["id"], "type": "function"}
            await event({"tool_calls": [{**head, "function": {"name": "lookup", "arguments": ""}}]})
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                await event({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
        await event({}, "tool_calls")
    else:
        for _ in range(chunks):
            if gap:
                await asyncio.sleep(gap)
            await event({"content": f"{time.monotonic():.6f} "})
        # the last piece comes with the finish: the chunk a gateway holds until it has judged
        await event({"content": f"{time.monotonic():.6f} "}, "stop")
    if (body.get("stream_options") or {}).get("include_usage"):
        await event(None, usage=_usage(prompt, 12))
    writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    await writer.drain()


# -- the mock's other wire shapes: Responses (with the provider's memory) and Messages --------

#: the wire shapes the bench speaks; ``responses`` continues by ``previous_response_id``,
#: ``responses_full`` resends the history each request (no id): the two styles compared
WIRES = ("chat", "responses", "responses_full", "messages")
PATHS = {
    "chat": "/chat/completions",
    "responses": "/responses",
    "responses_full": "/responses",
    "messages": "/messages",
}
#: a streamed text piece's stamp, per shape (the delta events only: a wire's closing events
#: repeat the whole text)
STAMPS = {
    "chat": STAMP,
    "responses": re.compile(rb'"delta":\s*"(\d+\.\d+)'),
    "responses_full": re.compile(rb'"delta":\s*"(\d+\.\d+)'),
    "messages": re.compile(rb'"text_delta",\s*"text":\s*"(\d+\.\d+)'),
}
_HISTORY: dict[str, list[dict[str, Any]]] = {}  # the mock's memory: response id -> history
_HISTORY_MAX = 200_000


def _items_to_chat(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """Responses ``input`` items as chat messages (what ``_reply`` reads)."""
    out: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for it in items or ():
        kind = it.get("type")
        if kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it.get("call_id"), "content": it["output"]})
        elif kind == "function_call":
            call = {"id": it.get("call_id"), "type": "function", "function": {}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            c = it.get("content")
            text = c if isinstance(c, str) else "".join(p.get("text", "") for p in c or ())
            out.append({"role": it.get("role"), "content": text})
    return out


def _blocks_to_chat(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages (what ``_reply`` reads)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str):
            out.append({"role": m["role"], "content": c})
            continue
        texts = []
        for b in c or ():
            if b.get("type") == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": ""})
            elif b.get("type") == "text":
                texts.append(b.get("text", ""))
        if texts or m["role"] == "assistant":
            out.append({"role": m["role"], "content": "".join(texts)})
    return out


def _chat_of(path: bytes, body: dict[str, Any]) -> dict[str, Any]:
    """Any shape's request as the chat body ``_reply`` reads (the Responses history from the
    mock's memory when it continues by ``previous_response_id``)."""
    if path.endswith(b"/responses"):
        msgs = _items_to_chat(body.get("instructions"), body.get("input"))
        prev = body.get("previous_response_id")
        if isinstance(prev, str):
            msgs = [*_HISTORY.get(prev, []), *msgs]
        tc = body.get("tool_choice")
        return {"messages": msgs, "tools": body.get("tools"), "tool_choice": tc}
    if path.endswith(b"/messages"):
        tc = body.get("tool_choice")
        none = isinstance(tc, dict) and tc.get("type") == "none"
        msgs = _blocks_to_chat(body.get("system"), body.get("messages") or [])
        return {
            "messages": msgs,
            "tools": body.get("tools"),
            "tool_choice": "none" if none else None,
        }
    return body


def _remember(rid: str, history: list[dict[str, Any]], text: str | None, calls: list) -> None:
    if len(_HISTORY) >= _HISTORY_MAX:
        for k in list(_HISTORY)[: _HISTORY_MAX // 4]:
            del _HISTORY[k]
    _HISTORY[rid] = [*history, {"role": "assistant", "content": text, "tool_calls": calls}]


def response_body(body: dict[str, Any], chat_body: dict[str, Any]) -> dict[str, Any]:
    """The mock's Responses answer (``status`` completed, ``output`` items, usage)."""
    text, calls, prompt = _reply(chat_body)
    rid = "resp_" + uuid.uuid4().hex[:24]
    _remember(rid, chat_body["messages"], text, calls)
    output: list[dict[str, Any]] = []
    if text:
        output.append(
            {
                "type": "message",
                "id": "msg_" + uuid.uuid4().hex[:24],
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for c in calls:
        output.append(
            {
                "type": "function_call",
                "id": "fc_" + uuid.uuid4().hex[:24],
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
                "status": "completed",
            }
        )
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": str(body.get("model") or MODEL),
        "output": output,
        "usage": {"input_tokens": prompt, "output_tokens": 12, "total_tokens": prompt + 12},
    }


def message_body(body: dict[str, Any], chat_body: dict[str, Any]) -> dict[str, Any]:
    """The mock's Anthropic answer (content blocks, ``stop_reason``, usage)."""
    text, calls, prompt = _reply(chat_body)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for c in calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": "toolu_" + c["id"][5:],
                "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"]),
            }
        )
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": str(body.get("model") or MODEL),
        "content": blocks,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 12},
    }


async def _stream_other(
    writer: asyncio.StreamWriter, path: bytes, body: dict[str, Any], chunks: int, gap: float
) -> None:
    """A streamed text answer in the Responses or the Messages shape: ``chunks`` + 1 text
    deltas ``gap`` apart, each stamped, then the shape's closing events."""
    chat_body = _chat_of(path, body)
    responses = path.endswith(b"/responses")
    whole = response_body(body, chat_body) if responses else message_body(body, chat_body)

    async def event(kind: str, data: dict[str, Any]) -> None:
        piece = b"event: %s\ndata: %s\n\n" % (
            kind.encode(),
            json.dumps({"type": kind, **data}).encode(),
        )
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()

    texts: list[str] = []
    if responses:
        mid = "msg_" + uuid.uuid4().hex[:24]
        item = {"type": "message", "id": mid, "status": "in_progress", "role": "assistant"}
        await event(
            "response.created", {"response": {**whole, "status": "in_progress", "output": []}}
        )
        await event(
            "response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}
        )
        part = {"type": "output_text", "text": "", "annotations": []}
        at = {"item_id": mid, "output_index": 0, "content_index": 0}
        await event("response.content_part.added", {**at, "part": part})
        for i in range(chunks + 1):
            if gap and i < chunks:
                await asyncio.sleep(gap)
            t = f"{time.monotonic():.6f} "
            texts.append(t)
            await event("response.output_text.delta", {**at, "delta": t})
        text = "".join(texts)
        await event("response.output_text.done", {**at, "text": text})
        await event("response.content_part.done", {**at, "part": {**part, "text": text}})
        content = [{**part, "text": text}]
        done = {**item, "status": "completed", "content": content}
        await event("response.output_item.done", {"output_index": 0, "item": done})
        await event("response.completed", {"response": {**whole, "output": [done]}})
    else:
        head = {**whole, "content": [], "stop_reason": None}
        await event("message_start", {"message": head})
        await event(
            "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
        )
        for i in range(chunks + 1):
            if gap and i < chunks:
                await asyncio.sleep(gap)
            t = f"{time.monotonic():.6f} "
            await event(
                "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}}
            )
        await event("content_block_stop", {"index": 0})
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        await event("message_delta", {"delta": delta, "usage": {"output_tokens": 12}})
        await event("message_stop", {})
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return await reader.readexactly(length) if length else b""
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def _handle(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    latency: float,
    chunks: int,
    gap: float,
) -> None:
    with contextlib.suppress(
        ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError
    ):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            raw = await _read_body(reader, head)
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            path = path.split(b"?")[0]
            if not path.endswith((b"/chat/completions", b"/responses", b"/messages")):
                # anything else (a health check, /models): a small JSON answer
                payload = b'{"object":"list","data":[]}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                )
                await writer.drain()
                continue
            body = json.loads(raw) if raw else {}
            if latency:
                await asyncio.sleep(latency)
            if body.get("stream"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                if path.endswith(b"/chat/completions"):
                    await _stream(writer, body, chunks, gap)
                else:
                    await _stream_other(writer, path, body, chunks, gap)
            else:
                if path.endswith(b"/responses"):
                    payload = json.dumps(response_body(body, _chat_of(path, body))).encode()
                elif path.endswith(b"/messages"):
                    payload = json.dumps(message_body(body, _chat_of(path, body))).encode()
                else:
                    payload = completion(body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                )
                await writer.drain()
    writer.close()


def mock_main(port: int, latency_ms: float, chunks: int, gap_ms: float) -> None:
    """The mock upstream's process (``gateway.py _mock``)."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()

    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _handle(r, w, latency_ms / 1000, chunks, gap_ms / 1000),
            "127.0.0.1",
            port,
            backlog=4096,
            limit=64 * 1024 * 1024,
        )
        async with server:
            await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(main())


# -- processes: the mock, the gateway, LiteLLM -------------------------------------------------


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
                return
        except Exception:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"exited with {proc.returncode} before answering {url}"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer from {url} within {timeout_s:.0f} s") from None
            time.sleep(0.1)


class Server:
    """A server process of the bench's own: started, waited for, CPU read, stopped."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        health: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        log: Path | None = None,
        timeout_s: float = 30,
    ) -> None:
        self.name = name
        out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_http(health, self.proc, timeout_s)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{name}: {exc}; its output ends: {self.tail(800)}") from None

    def cpu_s(self) -> float:
        """CPU seconds of the process and all its descendants (uvicorn's workers)."""
        return sum(_proc_cpu(p) for p in _descendants(self.proc.pid))

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: it and its workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def tail(self, n: int = 1500) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_bytes()[-n:].decode(errors="replace")


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def start_mock(latency_ms: float, chunks: int, gap_ms: float) -> tuple[Server, str]:
    port = W.free_port()
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_mock",
        "--port",
        str(port),
        "--latency-ms",
        str(latency_ms),
        "--chunks",
        str(chunks),
        "--chunk-gap-ms",
        str(gap_ms),
    ]
    srv = Server("mock", argv, f"http://127.0.0.1:{port}/health")
    return srv, f"http://127.0.0.1:{port}/v1"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {type(v).__name__}")


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A parsed config written back as TOML (scalars, lists, nested tables)."""
    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{json.dumps(k)} = {_toml_value(v)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = f"{prefix}.{json.dumps(k)}" if prefix else json.dumps(k)
        out += f"\n[{name}]\n" + to_toml(v, name)
    return out


def write_config(path: Path, store_url: str) -> Path:
    """The shipped config.toml, limits raised (``_common.bench_config_data``), on ``store_url``."""
    from loopwarden.config import default_config_path, load_toml, parse_config

    data = W.bench_config_data(load_toml(default_config_path()))
    data["store"] = {**data.get("store", {}), "url": store_url}
    path.write_text(to_toml(data))
    parse_config(load_toml(path), path=str(path))  # the bench's own check: it still parses
    return path


def start_gateway(
    name: str, upstream: str, config: Path, *, workers: int, state: str, workdir: Path
) -> Server:
    port = W.free_port()
    exe = shutil.which("loopwarden", path=str(Path(sys.executable).parent)) or shutil.which(
        "loopwarden"
    )
    argv = [exe] if exe else [sys.executable, "-m", "loopwarden"]
    argv += [
        "gateway",
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--config",
        str(config),
        "--workers",
        str(workers),
        "--state",
        state,
    ]
    srv = Server(
        name,
        argv,
        f"http://127.0.0.1:{port}/_loopwarden/health",
        cwd=str(workdir),
        log=workdir / f"{name}.log",
        timeout_s=60,
    )
    srv.url = f"http://127.0.0.1:{port}/v1"  # type: ignore[attr-defined]
    return srv


def litellm_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("litellm")
    except Exception:
        return None


def start_litellm(upstream: str, workdir: Path) -> tuple[Server | None, str | None]:
    """LiteLLM's proxy in front of ``upstream`` (a wildcard model, no database, one worker);
    (None, why) when it is not installed or does not start."""
    exe = shutil.which("litellm", path=str(Path(sys.executable).parent)) or shutil.which("litellm")
    if exe is None:
        return None, "the litellm command is not installed (pip install 'litellm[proxy]')"
    cfg = workdir / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        '  - model_name: "*"\n'
        "    litellm_params:\n"
        '      model: "openai/*"\n'
        f'      api_base: "{upstream}"\n'
        '      api_key: "sk-bench"\n'
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
        "general_settings: {}\n"
    )
    port = W.free_port()
    env = {
        # it refuses to start without one; the load generator presents it (Client.keys)
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline: the bundled price map
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
        "NO_DOCS": "True",
    }
    argv = [
        exe,
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    try:
        srv = Server(
            "litellm",
            argv,
            f"http://127.0.0.1:{port}/health/liveliness",
            env=env,
            cwd=str(workdir),
            log=workdir / "litellm.log",
            timeout_s=120,
        )
    except RuntimeError as exc:
        log = workdir / "litellm.log"
        tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
        return None, f"litellm did not start: {exc}; its log ends: {tail}"
    srv.url = f"http://127.0.0.1:{port}/v1"  # type: ignore[attr-defined]
    return srv, None


# -- the agents ----------------------------------------------------------------------------------

_FILLER = "".join(
    f"row {j}: status shipped, weight {j * 7919 % 10007} g, bin {j % 97}\n" for j in range(2000)
)


class Agent:
    """One simulated agent: its history, and the run id the gateway answered last."""

    __slots__ = ("known", "messages", "prev", "requests", "run", "tenant", "wire")

    def __init__(
        self, *, long: bool = False, stream_text: bool = False, wire: str = "chat"
    ) -> None:
        uid = uuid.uuid4().hex[:10]
        self.wire = wire
        self.prev: str | None = None  # the last response id (Responses, continued by it)
        self.known = 0  # messages the provider holds (Responses, continued by id)
        self.tenant = "sk-bench-" + uid[:2]  # a few tenants (a hash of the key)
        self.run: str | None = None
        self.requests = 0
        msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        if stream_text:  # 20 messages whose answer is text: the last turn has STEPS results
            for j in range(3):
                msgs.append({"role": "user", "content": f"Earlier question {j} about batch {uid}."})
                msgs.append({"role": "assistant", "content": f"Earlier answer {j}."})
        msgs.append({"role": "user", "content": f"Look up the records of batch {uid}."})
        calls = STEPS if stream_text else PREFIX_CALLS
        for i in range(calls):
            cid = f"call_p{uid}{i:02d}"
            args = json.dumps({"key": f"b{uid}-{i}"})
            call = {
                "id": cid,
                "type": "function",
                "function": {"name": "lookup", "arguments": args},
            }
            msgs.append(
                {
                    "role": "assistant",
                    "content": f"Checking batch record {i}.",
                    "tool_calls": [call],
                }
            )
            result = f"record b{uid}-{i}: value {i * 131 % 977}"
            if long:
                result += "\n" + uid + _FILLER[: LONG_CHARS - 20]
            msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
        if not stream_text:
            msgs.append({"role": "assistant", "content": f"Batch {uid} is looked up."})
            msgs.append({"role": "user", "content": f"Now batch {uid}-2, please."})
        self.messages = msgs

    def body(self, *, stream: bool = False) -> bytes:
        if self.wire == "chat":
            data: dict[str, Any] = {"model": MODEL, "messages": self.messages, "tools": TOOLS}
        elif self.wire == "messages":
            data = _messages_request(self.messages)
        else:
            data = {"model": MODEL, "input": _items(self.messages[self.known :]), "tools": R_TOOLS}
            if self.prev is not None:
                data["previous_response_id"] = self.prev
        if stream:
            data["stream"] = True
        return json.dumps(data).encode()

    def take(self, answer: dict[str, Any]) -> bool:
        """Append the answer and the results of its calls; True while the run goes on."""
        if self.wire == "chat":
            msg = answer["choices"][0]["message"]
        elif self.wire == "messages":
            msg = _message_of_blocks(answer)
        else:
            msg = _message_of_output(answer)
            if self.wire == "responses":  # the provider holds the history up to this answer
                self.prev = answer["id"]
                self.known = len(self.messages) + 1
        kept = {"role": "assistant", "content": msg.get("content")}
        calls = msg.get("tool_calls") or []
        if calls:
            kept["tool_calls"] = calls
        self.messages.append(kept)
        for tc in calls:
            key = json.loads(tc["function"]["arguments"]).get("key", "")
            self.messages.append(
                {"role": "tool", "tool_call_id": tc["id"], "content": W.lookup(str(key))}
            )
        return bool(calls)


R_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]  # the Responses form
M_TOOLS = [  # Anthropic's form
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


def _items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses ``input`` items."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
            continue
        if role == "system":
            out.append({"role": "developer", "content": m["content"]})
            continue
        if m.get("content"):
            out.append({"role": role, "content": m["content"]})
        for tc in m.get("tool_calls") or ():
            out.append(
                {
                    "type": "function_call",
                    "call_id": tc["id"],
                    "name": tc["function"]["name"],
                    "arguments": tc["function"]["arguments"],
                }
            )
    return out


def _messages_request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat messages as an Anthropic request (system apart, tool results in user turns)."""
    out: list[dict[str, Any]] = []
    system = ""
    for m in messages:
        role = m["role"]
        if role == "system":
            system = m["content"]
        elif role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": m["content"],
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for tc in m.get("tool_calls") or ():
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": tc["id"],
                        "name": tc["function"]["name"],
                        "input": json.loads(tc["function"]["arguments"]),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": m["content"]})
    return {"model": MODEL, "max_tokens": 1024, "system": system, "messages": out, "tools": M_TOOLS}


def _message_of_output(answer: dict[str, Any]) -> dict[str, Any]:
    """A Responses answer's ``output`` as a chat assistant message."""
    text, calls = [], []
    for it in answer["output"]:
        if it["type"] == "message":
            text.extend(p.get("text", "") for p in it["content"])
        elif it["type"] == "function_call":
            fn = {"name": it["name"], "arguments": it["arguments"]}
            calls.append({"id": it["call_id"], "type": "function", "function": fn})
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _message_of_blocks(answer: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic answer's content blocks as a chat assistant message."""
    text, calls = [], []
    for b in answer["content"]:
        if b["type"] == "text":
            text.append(b["text"])
        elif b["type"] == "tool_use":
            fn = {"name": b["name"], "arguments": json.dumps(b["input"])}
            calls.append({"id": b["id"], "type": "function", "function": fn})
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


_Agent = Agent

# -- the load generator ------------------------------------------------------------------------


class Client:
    """aiohttp (preferred, see the module doc) or httpx: POST and read, with headers."""

    def __init__(self) -> None:
        #: base URL -> the key a target wants instead of the agent's own (LiteLLM's master key)
        self.keys: dict[str, str] = {}
        try:
            import aiohttp

            self.kind = "aiohttp"
            self._aiohttp = aiohttp
            self.session: Any = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=120),
                auto_decompress=False,
            )
        except ImportError:
            import httpx

            self.kind = "httpx"
            self.session = httpx.AsyncClient(
                timeout=120,
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=1000),
            )

    def version(self) -> str:
        mod = self._aiohttp if self.kind == "aiohttp" else __import__("httpx")
        return f"{self.kind} {mod.__version__}"

    def _headers(self, url: str, tenant: str) -> dict[str, str]:
        key = next((k for base, k in self.keys.items() if url.startswith(base)), tenant)
        if url.endswith("/messages"):  # Anthropic's SDK sends its key so
            return {
                "content-type": "application/json",
                "x-api-key": key,
                "anthropic-version": "2023-06-01",
            }
        return {"content-type": "application/json", "authorization": "Bearer " + key}

    async def post(self, url: str, body: bytes, tenant: str) -> tuple[int, dict[str, str], bytes]:
        headers = self._headers(url, tenant)
        if self.kind == "aiohttp":
            async with self.session.post(url, data=body, headers=headers) as r:
                data = await r.read()
                return r.status, {k.lower(): v for k, v in r.headers.items()}, data
        r = await self.session.post(url, content=body, headers=headers)
        return r.status_code, dict(r.headers), r.content

    async def stream(
        self, url: str, body: bytes, tenant: str
    ) -> tuple[int, dict[str, str], list[tuple[float, bytes]]]:
        """Each line of a streamed answer with its arrival (``time.monotonic()``)."""
        headers = self._headers(url, tenant)
        clock = time.monotonic
        lines: list[tuple[float, bytes]] = []
        if self.kind == "aiohttp":
            async with self.session.post(url, data=body, headers=headers) as r:
                async for line in r.content:
                    lines.append((clock(), line))
                return r.status, {k.lower(): v for k, v in r.headers.items()}, lines
        async with self.session.stream("POST", url, content=body, headers=headers) as r:
            async for line in r.aiter_lines():
                lines.append((clock(), line.encode()))
            return r.status_code, dict(r.headers), lines

    async def close(self) -> None:
        if self.kind == "aiohttp":
            await self.session.close()
        else:
            await self.session.aclose()


def _overhead(headers: dict[str, str]) -> float | None:
    for h in OVERHEAD_HEADERS:
        v = headers.get(h)
        if v is not None:
            try:
                return float(v)
            except ValueError:
                return None
    return None


class Tally:
    """One batch's figures."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.over: list[float] = []
        self.errors: dict[str, int] = {}
        self.late: list[float] = []  # how late each request left against its schedule
        self.continued = 0
        self.same_run = 0
        self.chunk: list[float] = []
        self.last_chunk: list[float] = []
        self.ttfb: list[float] = []
        self.chunks_per_answer: list[int] = []

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def agent_step(client: Client, url: str, agent: Agent, tally: Tally) -> bool:
    """One request of an agent; True while its run goes on."""
    body = agent.body()
    t0 = time.perf_counter()
    try:
        status, headers, data = await client.post(url, body, agent.tenant)
    except Exception as exc:  # a refused connection, a timeout: counted, the agent dropped
        tally.error(type(exc).__name__)
        return False
    tally.lat.append((time.perf_counter() - t0) * 1000)
    if status != 200:
        tally.error(f"HTTP {status}")
        return False
    over = _overhead(headers)
    if over is not None:
        tally.over.append(over)
    run = headers.get("x-loopwarden-run")
    if agent.requests and run is not None:
        tally.continued += 1
        tally.same_run += run == agent.run
    agent.run = run
    agent.requests += 1
    try:
        return agent.take(json.loads(data))
    except (ValueError, KeyError, IndexError, TypeError):
        tally.error("unreadable answer")
        return False


async def stream_step(client: Client, url: str, agent: Agent, tally: Tally) -> bool:
    body = agent.body(stream=True)
    t0 = time.monotonic()
    try:
        status, _, lines = await client.stream(url, body, agent.tenant)
    except Exception as exc:
        tally.error(type(exc).__name__)
        return False
    if status != 200:
        tally.error(f"HTTP {status}")
        return False
    delays = []
    stamp = STAMPS[agent.wire]
    for at, line in lines:
        m = stamp.search(line)
        if m:
            delays.append((at - float(m.group(1))) * 1000)
    if not delays:
        tally.error("no stamped chunk")
        return False
    tally.ttfb.append((lines[0][0] - t0) * 1000)
    tally.chunk.extend(delays)
    tally.last_chunk.append(delays[-1])
    tally.chunks_per_answer.append(len(delays))
    return False


async def open_loop(
    client: Client,
    url: str,
    rate: float,
    seconds: float,
    make: Callable[[], Agent],
    step: Callable[[Client, str, Agent, Tally], Any],
) -> Tally:
    """Requests at ``rate`` per second for ``seconds``, on schedule: each from an agent
    whose last answer has come (a new agent when none has)."""
    tally = Tally()
    ready: deque[Agent] = deque()
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def one(agent: Agent) -> None:
        if await step(client, url, agent, tally):
            ready.append(agent)

    n = max(1, int(rate * seconds))
    t0 = loop.time() + 0.02
    for i in range(n):
        target = t0 + i / rate
        delay = target - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tally.late.append(max(0.0, loop.time() - target) * 1000)
        agent = ready.popleft() if ready else make()
        task = loop.create_task(one(agent))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return tally


async def closed_loop(client: Client, url: str, agents: int, seconds: float) -> tuple[Tally, float]:
    """``agents`` agents sending back to back for ``seconds``: (figures, wall seconds)."""
    tally = Tally()
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def worker() -> None:
        agent = Agent()
        while loop.time() < end:
            if not await agent_step(client, url, agent, tally):
                agent = Agent()

    t0 = loop.time()
    await asyncio.gather(*(worker() for _ in range(agents)))
    return tally, loop.time() - t0


def summary(t: Tally, seconds: float, cpu: dict[str, float]) -> dict[str, Any]:
    n = len(t.lat)
    out: dict[str, Any] = {
        "requests": n,
        "rps": round(n / seconds, 1) if seconds else 0.0,
        "errors": dict(t.errors),
        "latency_ms": _pcts(t.lat),
        "late_ms": _pcts(t.late) if t.late else None,
    }
    if t.over:
        out["overhead_header_ms"] = _pcts(t.over)
    if t.continued:
        out["run_continuity"] = round(t.same_run / t.continued, 4)
    if t.chunk:
        out["chunk_delay_ms"] = _pcts(t.chunk)
        out["last_chunk_delay_ms"] = _pcts(t.last_chunk)
        out["ttfb_ms"] = _pcts(t.ttfb)
        out["chunks_per_answer"] = round(sum(t.chunks_per_answer) / len(t.chunks_per_answer), 1)
        out["requests"] = len(t.ttfb)
    for k, v in cpu.items():
        out[k] = v
    return out


def _pcts(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(W.pct(values, 0.5), 3),
        "p99": round(W.pct(values, 0.99), 3),
        "max": round(max(values, default=0.0), 3),
    }


async def measured(
    name: str,
    server: Server | None,
    coro: Any,
    seconds: float | None = None,
) -> dict[str, Any]:
    """Run one batch, with the target's and the generator's CPU around it."""
    c0 = server.cpu_s() if server is not None else 0.0
    g0 = time.process_time()
    w0 = time.perf_counter()
    got = await coro
    wall = time.perf_counter() - w0
    tally, span = got if isinstance(got, tuple) else (got, seconds or wall)
    gen = time.process_time() - g0
    n = max(1, len(tally.lat) or len(tally.ttfb))
    cpu = {"loadgen_cpu_us_per_request": round(gen / n * 1e6, 1)}
    if server is not None:
        cpu["server_cpu_us_per_request"] = round((server.cpu_s() - c0) / n * 1e6, 1)
    return summary(tally, span, cpu)


# -- the rounds -----------------------------------------------------------------------------------


def paired(
    rounds: list[dict[str, dict[str, Any]]], key: str, base: str = "direct"
) -> dict[str, Any]:
    """Per target, per percentile: the median over rounds of (target - base) of ``key``."""
    out: dict[str, Any] = {}
    targets = {t for r in rounds for t in r} - {base}
    for t in sorted(targets):
        row = {}
        for p in ("p50", "p99"):
            diffs = [
                r[t][key][p] - r[base][key][p]
                for r in rounds
                if t in r and base in r and key in r[t] and key in r[base]
            ]
            row[p] = W.spread(diffs, 3)
        out[t] = row
    return out


def pooled(rounds: list[dict[str, dict[str, Any]]], key: str) -> dict[str, Any]:
    """Per target: the median over rounds of each percentile of ``key`` (the header)."""
    out: dict[str, Any] = {}
    for t in sorted({t for r in rounds for t in r}):
        vals = [r[t][key] for r in rounds if t in r and key in r[t]]
        if vals:
            out[t] = {p: W.spread([v[p] for v in vals], 3) for p in ("p50", "p99")}
    return out


def rotate(items: list[str], k: int) -> list[str]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


async def run_rounds(
    args: argparse.Namespace,
    targets: dict[str, tuple[str, Server | None]],
    client: Client,
    wire: str = "chat",
) -> dict[str, Any]:
    """Every batch of one wire shape (``wire``: see ``WIRES``)."""
    names = list(targets)
    path = PATHS[wire]

    def Agent(**kw: Any) -> _Agent:  # the agents of this shape
        return _Agent(wire=wire, **kw)

    out: dict[str, Any] = {"agent_like": [], "light": [], "long": [], "stream": []}
    # warm-up: connections, caches, the first runs of every target
    for name in names:
        url, srv = targets[name]
        await open_loop(
            client,
            url + path,
            min(args.rate, 50),
            0.3 if args.quick else 1.5,
            Agent,
            agent_step,
        )
    for r in range(args.rounds):
        order = rotate(names, r)
        row: dict[str, Any] = {}
        for name in order:
            url, srv = targets[name]
            row[name] = await measured(
                name,
                srv,
                open_loop(client, url + path, args.rate, args.seconds, Agent, agent_step),
                args.seconds,
            )
            row[name]["load"] = os.getloadavg()[0]
        out["agent_like"].append(row)
        _progress(args, f"{wire} round {r + 1}/{args.rounds} agent-like", row)
    long_targets = [n for n in names if n in ("direct", "gateway_redis", "litellm")]
    for r in range(args.light_rounds):  # the same requests at a rate no target saturates at
        row = {}
        for name in rotate(long_targets, r):
            url, srv = targets[name]
            row[name] = await measured(
                name,
                srv,
                open_loop(
                    client,
                    url + path,
                    args.light_rate,
                    args.seconds,
                    Agent,
                    agent_step,
                ),
                args.seconds,
            )
            row[name]["load"] = os.getloadavg()[0]
        out["light"].append(row)
        _progress(
            args,
            f"{wire} round {r + 1}/{args.light_rounds} agent-like at {args.light_rate:.0f}/s",
            row,
        )
    for r in range(args.long_rounds):
        row = {}
        for name in rotate(long_targets, r):
            url, srv = targets[name]
            row[name] = await measured(
                name,
                srv,
                open_loop(
                    client,
                    url + path,
                    args.long_rate,
                    args.seconds,
                    lambda: Agent(long=True),
                    agent_step,
                ),
                args.seconds,
            )
        out["long"].append(row)
        _progress(args, f"{wire} round {r + 1}/{args.long_rounds} 50k-token", row)
    for r in range(args.stream_rounds):
        row = {}
        for name in rotate(long_targets, r):
            url, srv = targets[name]
            row[name] = await measured(
                name,
                srv,
                open_loop(
                    client,
                    url + path,
                    args.stream_rate,
                    args.seconds,
                    lambda: Agent(stream_text=True),
                    stream_step,
                ),
                args.seconds,
            )
        out["stream"].append(row)
        _progress(args, f"{wire} round {r + 1}/{args.stream_rounds} stream", row)
    return out


def _progress(args: argparse.Namespace, what: str, row: dict[str, Any]) -> None:
    """One line per round on stderr (the JSON goes to stdout)."""
    parts = []
    for name, s in row.items():
        over = s.get("overhead_header_ms")
        lat = s.get("chunk_delay_ms") or s["latency_ms"]
        o = f" hdr {over['p50']:.2f}/{over['p99']:.2f}" if over else ""
        parts.append(
            f"{name} {lat['p50']:.2f}/{lat['p99']:.2f}{o} ({s['requests']}, "
            f"cpu {s.get('server_cpu_us_per_request', 0):.0f}us)"
        )
    print(f"  {what}: " + "; ".join(parts), file=sys.stderr, flush=True)


async def run_scaling(
    args: argparse.Namespace, client: Client, targets: dict[str, tuple[str, Server | None]]
) -> list[dict[str, Any]]:
    rows = []
    for r in range(args.scale_rounds):
        row: dict[str, Any] = {}
        for name in rotate(list(targets), r):
            url, srv = targets[name]
            row[name] = await measured(
                name, srv, closed_loop(client, url + "/chat/completions", args.agents, args.seconds)
            )
            row[name]["load"] = os.getloadavg()[0]
        rows.append(row)
        _progress(args, f"round {r + 1}/{args.scale_rounds} scaling", row)
    return rows


# -- the wrapper ---------------------------------------------------------------------------------


def bench_wrapper(calls: int, blocks: int, store_url: str) -> dict[str, Any]:
    """CPU per call of ``loopwarden.wrap(OpenAI())`` minus the bare client (see the module doc).

    Measured only where ``loopwarden.gateway.wrap`` is importable (the wrapper of issue 42)."""
    try:
        from loopwarden.gateway.wrap import wrap
    except ImportError as exc:
        return {"skipped": f"loopwarden.gateway.wrap is not importable on this branch ({exc})"}
    import httpx
    import openai

    from loopwarden import Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config

    data = W.bench_config_data(load_toml(default_config_path()))
    data["store"] = {**data.get("store", {}), "url": store_url}
    dep = Deployment(parse_config(data, path=str(default_config_path())))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            content=completion(json.loads(request.content)),
            headers={"content-type": "application/json"},
        )

    def client() -> Any:
        return openai.OpenAI(
            api_key="sk-bench",
            base_url="http://mock.invalid/v1",
            max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        )

    bare = client()
    wrapped = wrap(client(), dep)

    def play(c: Any, n: int) -> float:
        agent, t0 = Agent(), time.process_time()
        for _ in range(n):
            resp = c.chat.completions.create(model=MODEL, messages=agent.messages, tools=TOOLS)
            if not agent.take(resp.model_dump()):
                agent = Agent()
        return (time.process_time() - t0) / n

    play(bare, 20), play(wrapped, 20)  # warm-up
    b, w = [], []
    for i in range(blocks):
        for which in ((bare, b), (wrapped, w)) if i % 2 == 0 else ((wrapped, w), (bare, b)):
            which[1].append(play(which[0], calls) * 1e6)
    added = [y - x for x, y in zip(b, w, strict=True)]
    with contextlib.suppress(Exception):
        wrapped.close()
    dep.close()
    return {
        "calls_per_block": calls,
        "blocks": blocks,
        "bare_cpu_us_per_call": W.spread(b, 1),
        "wrapped_cpu_us_per_call": W.spread(w, 1),
        "added_cpu_us_per_call": W.spread(added, 1),
    }


# -- the profile: the ASGI app in process ---------------------------------------------------------


def profile(args: argparse.Namespace, store_url: str) -> dict[str, Any]:
    """Agent-like requests through GatewayApp in this process (ASGI called directly, the
    upstream an httpx.MockTransport) under cProfile: CPU per request, and where it goes."""
    import cProfile
    import pstats

    import httpx

    from loopwarden import Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.state import open_state

    data = W.bench_config_data(load_toml(default_config_path()))
    data["store"] = {**data.get("store", {}), "url": store_url}
    dep = Deployment(parse_config(data, path=str(default_config_path())))

    wire = "chat" if args.wire == "all" else args.wire

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        path = request.url.path.encode()
        if path.endswith(b"/responses"):
            content = json.dumps(response_body(body, _chat_of(path, body))).encode()
        elif path.endswith(b"/messages"):
            content = json.dumps(message_body(body, _chat_of(path, body))).encode()
        else:
            content = completion(body)
        return httpx.Response(200, content=content, headers={"content-type": "application/json"})

    up = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    app = GatewayApp(
        dep,
        "http://mock.invalid/v1",
        open_state(dep.config.store, memory=args.profile_state == "memory"),
        client=up,
    )

    async def call(agent: Agent) -> tuple[bool, float]:
        body = agent.body()
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        got: dict[str, Any] = {"body": b"", "headers": []}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                got["headers"] = msg["headers"]
            else:
                got["body"] += msg.get("body", b"")

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1" + PATHS[agent.wire],
            "query_string": b"",
            "headers": [
                (b"content-type", b"application/json"),
                (b"authorization", ("Bearer " + agent.tenant).encode()),
            ],
        }
        await app(scope, receive, send)
        over = float(dict(got["headers"]).get(b"x-loopwarden-overhead-ms", b"0"))
        return agent.take(json.loads(got["body"])), over

    async def play(n: int, long: bool) -> list[float]:
        agent, overs = Agent(long=long, wire=wire), []
        for _ in range(n):
            more, over = await call(agent)
            overs.append(over)
            if not more:
                agent = Agent(long=long, wire=wire)
        return overs

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": args.profile_state,
            "store": store_url.split(":")[0],
            "wire": wire,
        }
        for long in (False, True):
            n = args.profile_requests // (5 if long else 1)
            await play(14, long)  # warm-up
            t0 = time.process_time()
            overs = await play(n, long)
            cpu = (time.process_time() - t0) / n * 1e6
            prof = cProfile.Profile()
            prof.enable()
            await play(n, long)
            prof.disable()
            st = pstats.Stats(prof)
            total = st.total_tt  # type: ignore[attr-defined]
            rows = []
            for (file, line, fn), (_, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
                rows.append((ct, tt, nc, f"{Path(file).name}:{line}({fn})"))
            key = "long" if long else "agent_like"
            out[key] = {
                "requests": n,
                "cpu_us_per_request": round(cpu, 1),
                "overhead_header_ms": _pcts(overs),
                "profiled_calls_per_request": round(sum(r[2] for r in rows) / n, 1),
                "top_cumulative": [
                    {
                        "share": round(ct / total, 3),
                        "calls_per_request": round(nc / n, 2),
                        "where": w,
                    }
                    for ct, tt, nc, w in sorted(rows, reverse=True)[: args.profile_top]
                ],
                "top_own": [
                    {
                        "share": round(tt / total, 3),
                        "calls_per_request": round(nc / n, 2),
                        "where": w,
                    }
                    for ct, tt, nc, w in sorted(rows, key=lambda r: -r[1])[: args.profile_top]
                ],
            }
        await app.aclose()
        dep.close()
        return out

    return asyncio.run(main())


# -- main ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str | None]:
    if url:
        yield url
        return
    if shutil.which("redis-server") is None:
        yield None
        return
    with W.redis_server() as u:
        yield u


def analyse(data: dict[str, Any]) -> dict[str, Any]:
    a: dict[str, Any] = {}
    rounds = data["rounds"]
    a["agent_like_added_ms"] = paired(rounds["agent_like"], "latency_ms")
    a["agent_like_header_ms"] = pooled(rounds["agent_like"], "overhead_header_ms")
    a["light_added_ms"] = paired(rounds["light"], "latency_ms")
    a["light_header_ms"] = pooled(rounds["light"], "overhead_header_ms")
    a["long_added_ms"] = paired(rounds["long"], "latency_ms")
    a["long_header_ms"] = pooled(rounds["long"], "overhead_header_ms")
    a["stream_added_per_chunk_ms"] = paired(rounds["stream"], "chunk_delay_ms")
    a["stream_added_last_chunk_ms"] = paired(rounds["stream"], "last_chunk_delay_ms")
    cpu: dict[str, Any] = {}
    for kind in ("agent_like", "light", "long", "stream"):
        for row in rounds[kind]:
            for t, s in row.items():
                if "server_cpu_us_per_request" in s:
                    cpu.setdefault(kind, {}).setdefault(t, []).append(
                        s["server_cpu_us_per_request"]
                    )
    a["server_cpu_us_per_request"] = {
        k: {t: W.spread(v, 1) for t, v in d.items()} for k, d in cpu.items()
    }
    sc = data.get("scaling") or []
    if sc and all("gateway_1" in r and "gateway_2" in r for r in sc):
        ratios = [
            r["gateway_2"]["rps"] / r["gateway_1"]["rps"] for r in sc if r["gateway_1"]["rps"]
        ]
        a["scaling"] = {
            "rps": {t: W.spread([r[t]["rps"] for r in sc], 1) for t in sc[0]},
            "ratio_2_to_1": W.spread(ratios, 3),
            "header_p50_ms": {
                t: W.spread(
                    [r[t]["overhead_header_ms"]["p50"] for r in sc if "overhead_header_ms" in r[t]],
                    3,
                )
                for t in ("gateway_1", "gateway_2")
            },
            "header_p99_ms": {
                t: W.spread(
                    [r[t]["overhead_header_ms"]["p99"] for r in sc if "overhead_header_ms" in r[t]],
                    3,
                )
                for t in ("gateway_1", "gateway_2")
            },
        }
    return a


def _span(s: dict[str, float]) -> str:
    return f"{s['median']:+.2f} [{s['min']:+.2f}..{s['max']:+.2f}]"


def targets_line(a: dict[str, Any], t: str) -> str:
    row = a["agent_like_added_ms"].get(t)
    hdr = a["agent_like_header_ms"].get(t)
    if not row:
        return f"{t}: -"
    h = f"; header p50 {hdr['p50']['median']:.2f} p99 {hdr['p99']['median']:.2f} ms" if hdr else ""
    return f"{t}: added p50 {_span(row['p50'])} p99 {_span(row['p99'])} ms{h}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="agent-like requests per second")
    parser.add_argument("--seconds", type=float, default=8.0, help="per batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--light-rate",
        type=float,
        default=25.0,
        help="agent-like requests per second that no target saturates at",
    )
    parser.add_argument("--light-rounds", type=int, default=2)
    parser.add_argument("--long-rate", type=float, default=20.0)
    parser.add_argument("--long-rounds", type=int, default=3)
    parser.add_argument("--stream-rate", type=float, default=50.0)
    parser.add_argument("--stream-rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=40, help="text chunks per streamed answer")
    parser.add_argument("--chunk-gap-ms", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the mock's time per answer")
    parser.add_argument(
        "--agents", type=int, default=32, help="scaling: agents sending back to back"
    )
    parser.add_argument("--scale-rounds", type=int, default=2)
    parser.add_argument("--wrapper-calls", type=int, default=200)
    parser.add_argument("--redis-url", help="default: a redis-server the bench starts")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM's proxy out")
    parser.add_argument("--no-memory", action="store_true", help="leave gateway_memory out")
    parser.add_argument("--only", choices=("rounds", "scaling", "wrapper"), help="one part only")
    parser.add_argument(
        "--wire",
        choices=("chat", "responses", "responses_full", "messages", "all"),
        default="chat",
        help="the shape the agents speak: responses plays both styles (continued by "
        "previous_response_id, and resending the history); all: every shape in turn",
    )
    parser.add_argument(
        "--profile", action="store_true", help="where the gateway's time goes (in process)"
    )
    parser.add_argument("--profile-requests", type=int, default=700)
    parser.add_argument("--profile-state", choices=("store", "memory"), default="store")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 1 round of 0.8 s at 40 req/s, no LiteLLM",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rate, args.seconds, args.rounds = 40.0, 0.8, 1
        args.long_rate, args.long_rounds = 8.0, 1
        args.light_rate, args.light_rounds = 8.0, 1
        args.stream_rate, args.stream_rounds, args.chunks = 10.0, 1, 8
        args.scale_rounds, args.agents, args.wrapper_calls = 1, 4, 10
        args.no_litellm = True
        args.profile_requests = 70

    with (
        _redis(args.redis_url) as redis_url,
        tempfile.TemporaryDirectory(prefix="lw-gw-bench-") as tmp,
    ):
        work = Path(tmp)
        if args.profile:
            data = profile(args, redis_url or f"sqlite:///{work / 'store.db'}")
            print(json.dumps(data, indent=2 if not args.json else None))
            return 0
        result: dict[str, Any] = {
            "python": platform.python_version(),
            "machine": W.machine(),
            "load_before": [round(x, 2) for x in os.getloadavg()],
            "settings": {
                k: getattr(args, k)
                for k in (
                    "rate",
                    "seconds",
                    "rounds",
                    "light_rate",
                    "light_rounds",
                    "long_rate",
                    "long_rounds",
                    "stream_rate",
                    "stream_rounds",
                    "chunks",
                    "chunk_gap_ms",
                    "latency_ms",
                    "agents",
                    "scale_rounds",
                    "quick",
                )
            },
            "steps_per_run": STEPS + 1,
            "messages_per_request": {
                "min": 2 + 2 * PREFIX_CALLS + 2,
                "max": 2 + 2 * PREFIX_CALLS + 2 + 2 * STEPS,
            },
            "redis": bool(redis_url),
        }
        result["long_history_tokens"] = _tokens(Agent(long=True).messages)
        result["agent_history_tokens"] = _tokens(Agent().messages)
        servers: list[Server] = []
        try:
            mock, upstream = start_mock(args.latency_ms, args.chunks, args.chunk_gap_ms)
            servers.append(mock)
            targets: dict[str, tuple[str, Server | None]] = {"direct": (upstream, mock)}
            if not args.no_memory:
                cfg_mem = write_config(work / "memory.toml", f"sqlite:///{work / 'mem-store.db'}")
                gm = start_gateway(
                    "gateway_memory", upstream, cfg_mem, workers=1, state="memory", workdir=work
                )
                servers.append(gm)
                targets["gateway_memory"] = (gm.url, gm)  # type: ignore[attr-defined]
            cfg_redis = None
            if redis_url:
                cfg_redis = write_config(work / "redis.toml", redis_url)
                gr = start_gateway(
                    "gateway_redis", upstream, cfg_redis, workers=1, state="store", workdir=work
                )
                servers.append(gr)
                targets["gateway_redis"] = (gr.url, gr)  # type: ignore[attr-defined]
            else:
                result["gateway_redis"] = {"skipped": "no redis-server on PATH and no --redis-url"}
            if args.no_litellm:
                result["litellm"] = {"skipped": "--quick or --no-litellm"}
            else:
                ll, why = start_litellm(upstream, work)
                if ll is None:
                    result["litellm"] = {"skipped": why, "version": litellm_version()}
                else:
                    servers.append(ll)
                    targets["litellm"] = (ll.url, ll)  # type: ignore[attr-defined]
                    result["litellm"] = {"version": litellm_version(), "workers": 1}

            async def go() -> None:
                with contextlib.suppress(ImportError):
                    import uvloop

                    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
                client = Client()
                if "litellm" in targets:
                    client.keys[targets["litellm"][0]] = MASTER_KEY
                result["loadgen"] = client.version()
                try:
                    if args.only in (None, "rounds"):
                        wires = {
                            "chat": ["chat"],
                            "responses": ["responses", "responses_full"],
                            "responses_full": ["responses_full"],
                            "messages": ["messages"],
                            "all": list(WIRES),
                        }[args.wire]
                        for w in wires:
                            got = await run_rounds(args, targets, client, w)
                            result.setdefault("by_wire", {})[w] = {
                                "rounds": got,
                                "load_after": [round(x, 2) for x in os.getloadavg()],
                            }
                        result["rounds"] = result["by_wire"][wires[0]]["rounds"]
                    if args.only in (None, "scaling"):
                        if cfg_redis is None:
                            result["scaling"] = None
                        else:
                            g2 = start_gateway(
                                "gateway_2",
                                upstream,
                                cfg_redis,
                                workers=2,
                                state="store",
                                workdir=work,
                            )
                            servers.append(g2)
                            sc_targets = {
                                "direct": targets["direct"],
                                "gateway_1": targets["gateway_redis"],
                                "gateway_2": (g2.url, g2),
                            }  # type: ignore[attr-defined]
                            for name in sc_targets:  # warm-up
                                await closed_loop(
                                    client,
                                    sc_targets[name][0] + "/chat/completions",
                                    args.agents,
                                    0.5,
                                )
                            result["scaling"] = await run_scaling(args, client, sc_targets)
                finally:
                    await client.close()

            with contextlib.suppress(ImportError):
                import uvloop

                uvloop.install()
            asyncio.run(go())
        finally:
            for s in servers:
                s.stop()
        if args.only in (None, "wrapper"):
            result["wrapper"] = bench_wrapper(
                args.wrapper_calls, 2 if args.quick else 10, f"sqlite:///{work / 'wrap-store.db'}"
            )
        result["load_after"] = [round(x, 2) for x in os.getloadavg()]
        if "rounds" in result:
            result["analysis"] = analyse(result)
            for d in result["by_wire"].values():
                d["analysis"] = analyse({"rounds": d["rounds"]})
        elif result.get("scaling"):
            result["rounds"] = {"agent_like": [], "light": [], "long": [], "stream": []}
            result["analysis"] = analyse(result)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0


def _tokens(messages: list[dict[str, Any]]) -> int:
    from loopwarden.models.tokens import estimate_message, estimate_text

    return sum(estimate_message(m, estimate_text) for m in messages)


def report(r: dict[str, Any]) -> None:
    print(
        f"{r['machine']}, Python {r['python']}, load {r['load_before']} -> {r['load_after']}, "
        f"load generator {r.get('loadgen')}"
    )
    wires = r.get("by_wire") or {}
    if len(wires) > 1:
        for w, d in wires.items():
            print(f"\n== wire: {w} (load after its batches {d.get('load_after')}) ==")
            _report_rounds(r, d.get("analysis") or {})
        print()
        _report_rounds(r, {}, rest=True)
    else:
        _report_rounds(r, r.get("analysis") or {}, rest=True)


def _report_rounds(r: dict[str, Any], a: dict[str, Any], *, rest: bool = False) -> None:
    if rest and not a:
        a = {"scaling": (r.get("analysis") or {}).get("scaling")}
    if a.get("agent_like_added_ms"):
        print(
            f"agent-like requests at {r['settings']['rate']:.0f}/s (added client latency "
            "vs direct, "
            "median of rounds [min..max]; the target's own overhead header):"
        )
        for t in a["agent_like_added_ms"]:
            print("  " + targets_line(a, t))
    if a.get("light_added_ms"):
        print(f"the same at {r['settings']['light_rate']:.0f}/s:")
        for t, row in a["light_added_ms"].items():
            hdr = a["light_header_ms"].get(t)
            h = (
                f"; header p50 {hdr['p50']['median']:.2f} p99 {hdr['p99']['median']:.2f}"
                if hdr
                else ""
            )
            print(
                f"  {t}: added p50 {row['p50']['median']:+.2f} "
                f"p99 {row['p99']['median']:+.2f} ms{h}"
            )
    if a.get("long_added_ms"):
        print(f"50k-token histories ({r['long_history_tokens']} tokens):")
        for t, row in a["long_added_ms"].items():
            hdr = a["long_header_ms"].get(t)
            h = (
                f"; header p50 {hdr['p50']['median']:.2f} p99 {hdr['p99']['median']:.2f}"
                if hdr
                else ""
            )
            print(
                f"  {t}: added p50 {row['p50']['median']:+.2f} "
                f"p99 {row['p99']['median']:+.2f} ms{h}"
            )
    if a.get("stream_added_per_chunk_ms"):
        print("streamed text, added per chunk (p50 / p99), and to the last chunk:")
        for t, row in a["stream_added_per_chunk_ms"].items():
            last = a["stream_added_last_chunk_ms"][t]
            print(
                f"  {t}: {row['p50']['median']:+.3f} / {row['p99']['median']:+.3f} ms; last "
                f"{last['p50']['median']:+.2f} / {last['p99']['median']:+.2f} ms"
            )
    if a.get("server_cpu_us_per_request"):
        print("server CPU per request (us, median of rounds):")
        for kind, d in a["server_cpu_us_per_request"].items():
            print(f"  {kind}: " + ", ".join(f"{t} {v['median']:.0f}" for t, v in d.items()))
    if a.get("scaling"):
        s = a["scaling"]
        print(
            f"scaling ({r['settings']['agents']} agents back to back): "
            + ", ".join(f"{t} {v['median']:.0f} req/s" for t, v in s["rps"].items())
            + f"; 2 processes / 1: {s['ratio_2_to_1']['median']:.2f}x"
        )
    w = r.get("wrapper") if rest else None
    if w:
        if "skipped" in w:
            print(f"wrapper: skipped ({w['skipped']})")
        else:
            print(
                f"wrapper: +{w['added_cpu_us_per_call']['median']:.0f} us CPU per call "
                f"(bare {w['bare_cpu_us_per_call']['median']:.0f}, "
                f"wrapped {w['wrapped_cpu_us_per_call']['median']:.0f})"
            )
    ll = (r.get("litellm") or {}) if rest else {}
    if "skipped" in ll:
        print(f"litellm: skipped ({ll['skipped'][:300]})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_mock":
        p = argparse.ArgumentParser()
        p.add_argument("_mock")
        p.add_argument("--port", type=int)
        p.add_argument("--latency-ms", type=float)
        p.add_argument("--chunks", type=int)
        p.add_argument("--chunk-gap-ms", type=float)
        a = p.parse_args()
        mock_main(a.port, a.latency_ms, a.chunks, a.chunk_gap_ms)
        sys.exit(0)
    sys.exit(main())
