"""Serving many agents through the real HTTP client: what the guards cost per step and per core.

A local OpenAI-compatible server (its own process, so its CPU is not counted) answers
``/v1/chat/completions`` after ``--latency-ms`` (default 200 ms), streamed as server-sent events
when the request asks for it (``stream=True``, usage in the last chunk) and as one JSON body
otherwise.  It plays a support agent: every user message gets one ``query_order`` call (an order
id unique to the conversation and turn, so no loop guard ever fires), then an answer.

``--conversations`` (default 200) conversations of ``--turns`` (default 5) user messages run
concurrently on one event loop, each turn a run of two model calls, twice:

* ``bare``: the same conversations through ``openai.AsyncOpenAI`` directly (the model call, the
  tool, the history) -- no validation, no guards;
* ``loopwarden``: one :class:`~loopwarden.Deployment` from the shipped ``config.toml`` (limits
  raised above the workload as in ``overhead.py``) plus ``spend_limits`` with a tenant budget it
  never reaches, the shared store on (a SQLite file: a reserve and a settle per model call, the
  side-effect ledger), the model through loopwarden's own OpenAI client.  With ``--stream`` and
  a deployment that streams (``Deployment.astream``), the runs are streamed; otherwise
  ``arun``, and the bare client does not stream either (a streamed call costs the client more
  CPU than one body: both sides are measured alike).

Reported per variant: ``wall_s``; ``cpu_s`` (this process only); ``cpu_us_per_step``;
``runs_per_s_per_core`` = runs / CPU seconds (how many runs one busy core drives);
``step_ms`` p50 / p99 (a step: one model call and its tool, timed from the step's start to its
end inside the process).  Then ``guard_cpu_us_per_step`` = loopwarden's CPU per step minus the
bare client's, and ``added_step_ms`` p50 / p99 = loopwarden's step percentiles minus the bare
ones.  Printed as a table; ``--json`` prints the same as one object.

    python bench/serving.py
    python bench/serving.py --quick --json      # a smoke test of the bench itself
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W

MODEL = "gpt-4o-mini"
SYSTEM = "You are a support agent. Look the order up, then answer."
TOOL_SPEC = {
    "type": "function",
    "function": {
        "name": "query_order",
        "description": "An order's status by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
ORDER = re.compile(r"order (\w+)")


# -- the server (its own process) ----------------------------------------------------------


def _reply(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], int]:
    """(text, tool calls, prompt size) for a request: a lookup first, an answer after it."""
    messages = body.get("messages") or []
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 8
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return f"Your order is on its way ({str(last.get('content'))[:40]}).", [], prompt
    users = [m for m in messages if m.get("role") == "user"]
    m = ORDER.search(str(users[-1].get("content") if users else ""))
    order = m.group(1) if m else "0"
    n = sum(1 for msg in messages if msg.get("role") == "assistant")
    call = {
        "id": f"call_{order}_{n}",
        "type": "function",
        "function": {"name": "query_order", "arguments": json.dumps({"order_id": order})},
    }
    return "Let me look that up.", [call], prompt


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(body: dict[str, Any]) -> bytes:
    text, calls, prompt = _reply(body)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": _usage(prompt, 12),
        }
    ).encode()


def _chunks(body: dict[str, Any]) -> list[bytes]:
    """The same answer as server-sent events: text in pieces, the tool call, usage, [DONE]."""
    text, calls, prompt = _reply(body)

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta else [],
            **extra,
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    words = text.split(" ")
    out = [event({"role": "assistant", "content": ""})]
    out += [
        event({"content": w + (" " if i < len(words) - 1 else "")}) for i, w in enumerate(words)
    ]
    for i, call in enumerate(calls):
        out.append(event({"tool_calls": [{"index": i, **call}]}))
    out.append(event({"content": None}, "tool_calls" if calls else "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(event({}, usage=_usage(prompt, 12)))
    out.append(b"data: [DONE]\n\n")
    return out


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: float
) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            body = json.loads(await reader.readexactly(length)) if length else {}
            await asyncio.sleep(latency)
            if body.get("stream"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for piece in _chunks(body):
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                writer.write(b"0\r\n\r\n")
            else:
                payload = _completion(body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                )
            await writer.drain()
    writer.close()


def _serve(port: int, latency: float, ready: Any) -> None:
    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _handle(r, w, latency), "127.0.0.1", port, backlog=2048
        )
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(latency: float) -> Any:
    """A chat-completions server in its own process; yields its base URL."""
    port = _free_port()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve, args=(port, latency, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the bench server did not start")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.join(5)


# -- the two clients -----------------------------------------------------------------------


def _user(conv: int, turn: int) -> str:
    return f"Where is my order c{conv}t{turn}? It has not arrived."


async def _lookup(order_id: str) -> str:
    return f"order {order_id}: shipped, arrives in {len(order_id) % 5 + 1} days"


class Steps:
    """Step durations (s): from a step's start to its end."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    def pct(self, p: float) -> float:
        values = sorted(self.durations)
        if not values:
            return 0.0
        return values[min(len(values) - 1, max(0, round(p * len(values)) - 1))]


async def bare_conversation(client: Any, conv: int, turns: int, stream: bool, steps: Steps) -> int:
    """One conversation straight through the OpenAI client; returns its model calls."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    calls = 0
    for t in range(turns):
        messages.append({"role": "user", "content": _user(conv, t)})
        while True:
            start = time.perf_counter()
            text, tool_calls = await _bare_call(client, messages, stream)
            calls += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": text,
                    **({"tool_calls": tool_calls} if tool_calls else {}),
                }
            )
            for call in tool_calls:
                args = json.loads(call["function"]["arguments"])
                result = await _lookup(**args)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            steps.durations.append(time.perf_counter() - start)
            if not tool_calls:
                break
    return calls


async def _bare_call(
    client: Any, messages: list[dict[str, Any]], stream: bool
) -> tuple[str, list[dict[str, Any]]]:
    params: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": [TOOL_SPEC]}
    if not stream:
        done = await client.chat.completions.create(**params)
        msg = done.choices[0].message
        calls = [c.model_dump() for c in msg.tool_calls or []]
        return msg.content or "", [
            {"id": c["id"], "type": "function", "function": c["function"]} for c in calls
        ]
    text: list[str] = []
    parts: dict[int, dict[str, Any]] = {}
    events = await client.chat.completions.create(
        **params, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in events:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for tc in delta.tool_calls or []:
                part = parts.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                part["id"] = tc.id or part["id"]
                if tc.function is not None:
                    part["name"] += tc.function.name or ""
                    part["arguments"] += tc.function.arguments or ""
    calls = [
        {
            "id": p["id"],
            "type": "function",
            "function": {"name": p["name"], "arguments": p["arguments"]},
        }
        for _, p in sorted(parts.items())
    ]
    return "".join(text), calls


def make_deployment(base_url: str, store_dir: str) -> Any:
    from loopwarden import Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config
    from loopwarden.models.openai_chat import OpenAIChatModel
    from loopwarden.tools import ToolRegistry, tool

    data = W.bench_config_data(load_toml(default_config_path()))
    plugins = data["plugins"]
    plugins["enabled"] = [*plugins["enabled"], "spend_limits"]
    plugins["spend_limits"] = {
        "budgets": [{"scope": "tenant", "window": "day", "max_tokens": W.BIG}]
    }
    data["store"] = {"url": f"sqlite:///{Path(store_dir) / 'store.sqlite3'}"}
    config = parse_config(data, path="<bench>")

    async def query_order(order_id: str) -> str:
        """An order's status by its id."""
        return await _lookup(order_id)

    tools = ToolRegistry([tool(read_only=True, deterministic=True)(query_order)])
    model = OpenAIChatModel(model=MODEL, api_key="sk-bench", base_url=base_url, max_retries=0)
    return Deployment(config, tools=tools, model=model)


async def guarded_conversation(
    dep: Any, conv: int, turns: int, stream: bool, steps: Steps
) -> tuple[int, list[str]]:
    """One conversation through loopwarden; returns its model calls and how its runs ended."""
    from loopwarden import Conversation

    conversation = Conversation(f"c{conv}")
    calls, ends = 0, []
    for t in range(turns):
        kwargs = {"conversation": conversation, "meta": {"tenant": f"t{conv % 10}"}}
        if stream and hasattr(dep, "astream"):
            run = None
            async for event in dep.astream(_user(conv, t), **kwargs):
                run = getattr(event, "run", run)
        else:
            run = await dep.arun(_user(conv, t), **kwargs)
        if run is not None:
            calls += run.step
            ends.append(str(run.outcome.termination) if run.outcome else "?")
    return calls, ends


def _step_timer(dep: Any, steps: Steps) -> Callable[[], None]:
    """Time each step of every run from the run's start or the previous step's end."""
    from loopwarden import signals

    last: dict[int, float] = {}

    def started(run: Any, **_: Any) -> None:
        last[id(run)] = time.perf_counter()

    def finished(run: Any, **_: Any) -> None:
        now = time.perf_counter()
        steps.durations.append(now - last.get(id(run), now))
        last[id(run)] = now

    def stopped(run: Any, **_: Any) -> None:
        last.pop(id(run), None)

    pairs = [
        (signals.run_started, started),
        (signals.step_finished, finished),
        (signals.run_stopped, stopped),
    ]
    for sig, fn in pairs:
        sig.connect(fn, weak=False)

    def disconnect() -> None:
        for sig, fn in pairs:
            sig.disconnect(fn)

    return disconnect


async def _measure(batch: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = await batch()
    return time.perf_counter() - wall0, time.process_time() - cpu0, result


def _row(wall: float, cpu: float, model_calls: int, runs: int, steps: Steps) -> dict[str, Any]:
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "model_calls": model_calls,
        "runs": runs,
        "cpu_us_per_step": round(cpu / max(1, model_calls) * 1e6, 1),
        "runs_per_s_per_core": round(runs / cpu, 1) if cpu > 0 else None,
        "step_ms": {
            "p50": round(steps.pct(0.5) * 1e3, 2),
            "p99": round(steps.pct(0.99) * 1e3, 2),
        },
    }


async def run_bench(base_url: str, conversations: int, turns: int, stream: bool) -> dict[str, Any]:
    import openai

    from loopwarden import Deployment

    # both sides stream, or neither: a streamed call costs the client more CPU than one body
    stream = stream and hasattr(Deployment, "astream")

    out: dict[str, Any] = {}
    client = openai.AsyncOpenAI(api_key="sk-bench", base_url=base_url, max_retries=0)
    try:
        # warm both paths (connections, imports) before measuring
        await asyncio.gather(
            *(bare_conversation(client, -i - 1, 1, stream, Steps()) for i in range(5))
        )
        steps = Steps()

        async def bare_batch() -> list[int]:
            return await asyncio.gather(
                *(bare_conversation(client, c, turns, stream, steps) for c in range(conversations))
            )

        wall, cpu, calls = await _measure(bare_batch)
        out["bare"] = _row(wall, cpu, sum(calls), conversations * turns, steps)
    finally:
        await client.close()

    with tempfile.TemporaryDirectory(prefix="lw-serving-") as store_dir:
        dep = make_deployment(base_url, store_dir)
        try:
            await asyncio.gather(
                *(guarded_conversation(dep, -i - 1, 1, stream, Steps()) for i in range(5))
            )
            steps = Steps()
            disconnect = _step_timer(dep, steps)

            async def guarded_batch() -> list[tuple[int, list[str]]]:
                return await asyncio.gather(
                    *(
                        guarded_conversation(dep, c, turns, stream, steps)
                        for c in range(conversations)
                    )
                )

            try:
                wall, cpu, results = await _measure(guarded_batch)
            finally:
                disconnect()
            ends: dict[str, int] = {}
            for _, e in results:
                for end in e:
                    ends[end] = ends.get(end, 0) + 1
            row = _row(wall, cpu, sum(c for c, _ in results), conversations * turns, steps)
            row["ended"] = dict(sorted(ends.items()))
            row["streamed"] = stream
            out["loopwarden"] = row
        finally:
            close = getattr(dep, "aclose", None)
            if close is not None:
                await close()
            else:
                dep.close()
    bare, lw = out["bare"], out["loopwarden"]
    out["guard_cpu_us_per_step"] = round(lw["cpu_us_per_step"] - bare["cpu_us_per_step"], 1)
    out["added_step_ms"] = {
        k: round(lw["step_ms"][k] - bare["step_ms"][k], 2) for k in ("p50", "p99")
    }
    return out


def render(data: dict[str, Any]) -> str:
    head = ["", "wall s", "CPU s", "CPU µs/step", "runs/s/core", "step p50 ms", "step p99 ms"]
    rows = []
    for name in ("bare", "loopwarden"):
        r = data[name]
        rows.append(
            [
                name,
                f"{r['wall_s']:.2f}",
                f"{r['cpu_s']:.2f}",
                f"{r['cpu_us_per_step']:.0f}",
                f"{r['runs_per_s_per_core']}",
                f"{r['step_ms']['p50']:.1f}",
                f"{r['step_ms']['p99']:.1f}",
            ]
        )
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).rjust(widths[i]) for i, c in enumerate(r)) for r in [head, *rows]]
    lines += [
        "",
        f"{data['conversations']} conversations x {data['turns']} turns, {data['latency_ms']} ms "
        f"model latency, streamed: {data['loopwarden'].get('streamed')}; "
        f"loopwarden runs ended: {data['loopwarden'].get('ended')}",
        f"guard CPU per step: {data['guard_cpu_us_per_step']} µs; added per step: "
        f"p50 {data['added_step_ms']['p50']} ms, p99 {data['added_step_ms']['p99']} ms",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--quick", action="store_true", help="10 conversations of 2 turns, 20 ms")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.conversations, args.turns, args.latency_ms = 10, 2, 20.0
    with server(args.latency_ms / 1000) as url:
        data = asyncio.run(run_bench(url, args.conversations, args.turns, args.stream))
    data.update(
        conversations=args.conversations,
        turns=args.turns,
        latency_ms=args.latency_ms,
        machine=W.machine(),
        load=os.getloadavg()[0],
    )
    print(json.dumps(data) if args.json else render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
