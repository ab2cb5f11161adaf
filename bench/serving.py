"""Serving many agents through the real HTTP client: latency added per step, loop lag, store
wait, runs per core, and throughput across processes sharing one Redis store.

A local OpenAI-compatible server answers ``/v1/chat/completions`` after ``--latency-ms``
(default 200 ms), streamed as server-sent events when the request asks for it (usage in the
last chunk) and as one JSON body otherwise.  It runs in ``--server-processes`` processes of
its own (default: one per worker process; one asyncio server each, sharing the port through
``SO_REUSEPORT``), so its CPU is not the workers'; its CPU time is reported (``server``), so a
busy server shows.  It plays a support agent: every user message gets one
``notify_customer`` call (a side effect, keyed by an order id unique to the conversation and
turn: no loop guard ever fires), then an answer.

``--processes`` worker processes (default 1) each run ``--conversations`` (default 200)
concurrent conversations of ``--turns`` (default 5) user messages on their own event loop, each
turn a run of two model calls, in two variants:

* ``bare``: the conversations through ``openai.AsyncOpenAI`` directly (the model call, the
  tool, the history) -- no validation, no guards;
* ``loopwarden``: one :class:`~loopwarden.Deployment` per process from the shipped
  ``config.toml`` (limits raised above the workload as in ``overhead.py``) plus
  ``spend_limits`` with a deployment-wide and a per-tenant budget it never reaches (a reserve
  and a settle per model call), the side-effect ledger on (a claim and a finish per tool call),
  all processes on ONE store (``--store redis``, the default: ``--redis-url``, else a
  ``redis-server`` the bench starts on a free port; ``--store sqlite``: one SQLite file); the
  model through loopwarden's own OpenAI client, runs streamed (``Deployment.astream``; with
  ``--no-stream`` ``arun``, and the bare client does not stream either).

Every process plays the same conversations (the same order ids, the same tenants), so with
two processes every side effect is claimed twice: the ledger must let exactly one execute.

**Paired rounds.**  ``--pairs`` rounds (default 5), each a ``bare`` batch and a ``loopwarden``
batch (the order alternating round by round); with ``--processes N > 1`` also both on one
process, for the scaling line.  Latency added per step is the median over rounds of the
*paired* differences (loopwarden's step p50 / p99 minus the bare batch's of the same round),
with its spread -- one difference of two p99s from separate runs is noise here.

**Measured from the inside of each worker** (``_common.LoopMonitor``, ``_common.TimedStore``):

* every event-loop callback timed (``asyncio.events.Handle._run`` wrapped): wall p50 / p99 /
  max, the loop thread's own CPU time in each beside it (on a shared machine most of a long
  callback's wall time is the OS giving the core to another process), and the longest, with
  what they ran; garbage collections timed (``gc.callbacks``); a probe sleeping 5 ms over and
  over: its oversleep is the loop's *lag* (p50 / p99 / max);
* *store wait*: every store call timed as the run waits for it (the store's own methods
  wrapped in place, so the driver keeps its path for it), summed per step, over the steps
  that used the store; where the calls ran (the loop's thread or worker threads); and the
  store steps' latency added over the bare steps (``added_store_step_ms``);
* *machine steps*: each advance of a store-using run's machine between two effects (its
  hooks, their store calls and the driver's hand-off: a worker thread, or a step awaited on
  the loop), wall time -- comparable across the two designs, where store wait alone is not
  (a worker thread's hand-back of the whole step falls outside any store call);
* ``runs_per_s`` (all processes' runs over the batch's wall time), ``runs_per_s_per_core``
  (runs over the workers' CPU seconds, all their threads), ``cpu_us_per_step``, step p50 / p99
  (a step: one model call and its tool, from the step's start to its end).

**Exactness** (each loopwarden batch, on a fresh store namespace): the store's counters of the
deployment-wide and per-tenant budgets must equal what the runs' records say they spent (runs,
model calls, tool calls, tokens), with nothing left reserved, and every side effect must have
executed exactly once across all processes.

**LangChain** (``--langchain``): the same rounds with LangChain's ``create_agent`` and a stub
chat model that waits ``--latency-ms`` per call (no HTTP): ``bare`` the agent alone,
``loopwarden`` with :class:`~loopwarden.adapters.langchain.LoopwardenMiddleware` on the same
deployment and store -- the loop-lag and store-wait figures of the async middleware.

    python bench/serving.py --processes 2 --conversations 200
    python bench/serving.py --conversations 20 --pairs 7
    python bench/serving.py --langchain --conversations 200
    python bench/serving.py --quick --json      # a smoke test of the bench itself
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import platform
import re
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W

MODEL = "gpt-4o-mini"
SYSTEM = "You are a support agent. Tell the customer where the order is."
TOOL = "notify_customer"
TOOL_SPEC = {
    "type": "function",
    "function": {
        "name": TOOL,
        "description": "Send the customer their order's status (a message: a side effect).",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
ORDER = re.compile(r"order (\w+)")
VARIANTS = ("bare", "loopwarden")


# -- the server (processes of its own) -------------------------------------------------------


def _reply(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], int]:
    """(text, tool calls, prompt size) for a request: the notification first, an answer after."""
    messages = body.get("messages") or []
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 8
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return f"Done: {str(last.get('content'))[:40]}.", [], prompt
    users = [m for m in messages if m.get("role") == "user"]
    order = _order(str(users[-1].get("content") if users else ""))
    n = sum(1 for msg in messages if msg.get("role") == "assistant")
    call = {
        "id": f"call_{order}_{n}",
        "type": "function",
        "function": {"name": TOOL, "arguments": json.dumps({"order_id": order})},
    }
    return "Let me send you the status.", [call], prompt


def _order(text: str) -> str:
    m = ORDER.search(text)
    return m.group(1) if m else "0"


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
            lambda r, w: _handle(r, w, latency), "127.0.0.1", port, backlog=4096, reuse_port=True
        )
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _cpu_of(pid: int | None) -> float | None:
    """CPU seconds (user + system) of another process, where ``/proc`` tells (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """The chat-completions server: ``processes`` processes on one port (``SO_REUSEPORT``)."""

    def __init__(self, latency: float, processes: int) -> None:
        self.port = W.free_port()
        ctx = multiprocessing.get_context("spawn")
        self.procs = []
        for _ in range(processes):
            ready = ctx.Event()
            proc = ctx.Process(target=_serve, args=(self.port, latency, ready), daemon=True)
            proc.start()
            if not ready.wait(30):
                self.close()
                raise RuntimeError("the bench server did not start")
            self.procs.append(proc)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def cpu_s(self) -> float | None:
        values = [_cpu_of(p.pid) for p in self.procs]
        return None if any(v is None for v in values) else sum(v or 0.0 for v in values)

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(5)


@contextlib.contextmanager
def server(latency: float, processes: int = 1) -> Iterator[str]:
    """A chat-completions server in processes of its own; yields its base URL."""
    srv = Server(latency, processes)
    try:
        yield srv.url
    finally:
        srv.close()


# -- the workload ----------------------------------------------------------------------------


def _user(conv: int, turn: int) -> str:
    """The user's message: an order id unique to the conversation and turn (warm-up
    conversations, numbered below zero, have ids of their own)."""
    order = f"w{-conv}t{turn}" if conv < 0 else f"c{conv}t{turn}"
    return f"Where is my order {order}? It has not arrived."


def _tenant(conv: int) -> str:
    return f"t{conv % 10}"


#: side effects executed in this process, by order id (the ledger's key)
EXECUTED: Counter[str] = Counter()


async def _notify(order_id: str) -> str:
    EXECUTED[order_id] += 1
    return f"order {order_id}: shipped, arrives in {len(order_id) % 5 + 1} days; customer told"


class Steps:
    """Per step: its duration (s) and, for steps that used the store, the store wait (s)."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.store_steps: list[float] = []  # durations of the steps that used the store
        self.store_wait: list[float] = []  # their store wait
        self.store_calls = 0

    def close(self, duration: float, cell: list[float] | None) -> None:
        self.durations.append(duration)
        if cell is not None:
            if cell[1]:
                self.store_steps.append(duration)
                self.store_wait.append(cell[0])
                self.store_calls += int(cell[1])
            cell[0] = cell[1] = 0


# -- the OpenAI client, bare and guarded -----------------------------------------------------


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
                result = await _notify(**args)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            steps.close(time.perf_counter() - start, None)
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


def bench_config(store_url: str, namespace: str) -> Any:
    """The shipped config, limits raised, plus budgets on the shared store (never reached)."""
    from loopwarden.config import default_config_path, load_toml, parse_config

    data = W.bench_config_data(load_toml(default_config_path()))
    plugins = data["plugins"]
    plugins["enabled"] = [*plugins["enabled"], "spend_limits"]
    plugins["spend_limits"] = {
        "budgets": [
            {"scope": "deployment", "window": "total", "max_tokens": W.BIG},
            {"scope": "tenant", "window": "day", "max_tokens": W.BIG},
        ]
    }
    data["store"] = {"url": store_url, "namespace": namespace, "ledger": True}
    return parse_config(data, path="<bench>")


def make_deployment(base_url: str, store_url: str, namespace: str) -> Any:
    from loopwarden import Deployment
    from loopwarden.models.openai_chat import OpenAIChatModel
    from loopwarden.tools import ToolRegistry, tool

    async def notify_customer(order_id: str) -> str:
        """Send the customer their order's status (a message: a side effect)."""
        return await _notify(order_id)

    tools = ToolRegistry([tool(side_effect=True, idempotency_keys=["order_id"])(notify_customer)])
    model = OpenAIChatModel(model=MODEL, api_key="sk-bench", base_url=base_url, max_retries=0)
    return Deployment(bench_config(store_url, namespace), tools=tools, model=model)


async def guarded_conversation(dep: Any, conv: int, turns: int, stream: bool) -> int:
    """One conversation through loopwarden; returns its model calls."""
    from loopwarden import Conversation

    W.STORE_CELL.set([0.0, 0])
    conversation = Conversation(f"c{conv}")
    calls = 0
    for t in range(turns):
        kwargs = {"conversation": conversation, "meta": {"tenant": _tenant(conv)}}
        if stream:
            run = None
            async for event in dep.astream(_user(conv, t), **kwargs):
                run = getattr(event, "run", run)
        else:
            run = await dep.arun(_user(conv, t), **kwargs)
        if run is not None:
            calls += run.step
    return calls


class Records:
    """Every loopwarden run of this process as its record says: how it ended, and what it
    spent, in total and per tenant (what the store's counters must hold)."""

    def __init__(self) -> None:
        self.ended: Counter[str] = Counter()
        self.total: Counter[str] = Counter()
        self.tenants: dict[str, Counter[str]] = {}

    def add(self, run: Any, record: dict[str, Any]) -> None:
        self.ended[str(record.get("termination"))] += 1
        spent = {
            "runs": 1,
            "model_calls": int(record.get("steps") or 0),
            "tool_calls": int(record.get("tool_calls") or 0),
            "tokens": int((record.get("tokens") or {}).get("total") or 0),
        }
        self.total.update(spent)
        tenant = (getattr(run, "meta", None) or {}).get("tenant")
        if tenant is not None:
            self.tenants.setdefault(str(tenant), Counter()).update(spent)


def _watch_runs(steps: Steps | None, records: Records) -> Callable[[], None]:
    """Connect to the run signals: every record (``records``) and, with ``steps``, each step
    timed from the run's start or the previous step's end, with its store wait."""
    from loopwarden import signals

    last: dict[int, float] = {}
    closed: Counter[int] = Counter()

    def started(run: Any, **_: Any) -> None:
        last[id(run)] = time.perf_counter()
        cell = W.STORE_CELL.get()
        if cell is not None:  # store calls between runs are no step's
            cell[0] = cell[1] = 0

    def finished(run: Any, **_: Any) -> None:
        now = time.perf_counter()
        if steps is not None:
            steps.close(now - last.get(id(run), now), W.STORE_CELL.get())
        last[id(run)] = now
        closed[id(run)] += 1

    def stopped(run: Any, record: Any = None, **_: Any) -> None:
        now = time.perf_counter()
        start, done = last.pop(id(run), now), closed.pop(id(run), 0)
        # the last step (the final answer) ends with the run: no step_finished for it
        if steps is not None and getattr(run, "step", 0) > done:
            steps.close(now - start, W.STORE_CELL.get())
        if isinstance(record, dict):
            records.add(run, record)

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


# -- LangChain: the async middleware -----------------------------------------------------------


class _Tracker:
    """One LangChain conversation's steps, from model call to model call (the same clock for
    the bare agent and the guarded one): a step starts when a model call starts and ends when
    the next one starts or the turn ends."""

    def __init__(self, steps: Steps) -> None:
        self.steps, self.start = steps, 0.0
        self.cell: list[float] = [0.0, 0]

    def model_call(self) -> None:
        now = time.perf_counter()
        if self.start:
            self.steps.close(now - self.start, self.cell)
        self.start = now

    def turn_end(self) -> None:
        if self.start:
            self.steps.close(time.perf_counter() - self.start, self.cell)
        self.start = 0.0


TRACKER: Any = None  # set per process: a ContextVar[_Tracker | None]


def langchain_agent(latency: float, middleware: list[Any]) -> Any:
    """LangChain's ``create_agent`` with a stub chat model waiting ``latency`` per call."""
    from langchain.agents import create_agent
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    class StubChat(BaseChatModel):
        """The server's support agent, in process: a notification, then an answer."""

        wait_s: float = 0.2

        @property
        def _llm_type(self) -> str:
            return "bench-stub"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _answer(self, messages: list[BaseMessage]) -> ChatResult:
            prompt = sum(len(str(m.content)) for m in messages) // 4 + 8
            usage = {"input_tokens": prompt, "output_tokens": 12, "total_tokens": prompt + 12}
            last = messages[-1] if messages else None
            if isinstance(last, ToolMessage):
                msg = AIMessage(content=f"Done: {str(last.content)[:40]}.", usage_metadata=usage)
            else:
                users = [m for m in messages if isinstance(m, HumanMessage)]
                order = _order(str(users[-1].content) if users else "")
                n = sum(1 for m in messages if isinstance(m, AIMessage))
                msg = AIMessage(
                    content="Let me send you the status.",
                    tool_calls=[
                        {"name": TOOL, "args": {"order_id": order}, "id": f"c_{order}_{n}"}
                    ],
                    usage_metadata=usage,
                )
            return ChatResult(generations=[ChatGeneration(message=msg)])

        def _generate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
            return self._answer(messages)

        async def _agenerate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
            tracker = TRACKER.get()
            if tracker is not None:
                tracker.model_call()
            await asyncio.sleep(self.wait_s)
            return self._answer(messages)

    @tool(TOOL)
    async def notify_customer(order_id: str) -> str:
        """Send the customer their order's status (a message: a side effect)."""
        return await _notify(order_id)

    return create_agent(StubChat(wait_s=latency), [notify_customer], middleware=middleware)


async def langchain_conversation(agent: Any, conv: int, turns: int, steps: Steps | None) -> int:
    """One conversation, a turn per ``ainvoke`` (the history carried over); returns its model
    calls."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    tracker = _Tracker(steps or Steps())
    TRACKER.set(tracker)
    W.STORE_CELL.set(tracker.cell)
    messages: list[Any] = [SystemMessage(SYSTEM)]
    calls = 0
    for t in range(turns):
        out = await agent.ainvoke({"messages": [*messages, HumanMessage(_user(conv, t))]})
        tracker.turn_end()
        new = out["messages"]
        calls += sum(1 for m in new[len(messages) :] if isinstance(m, AIMessage))
        messages = list(new)
    return calls


# -- one batch in a worker process -------------------------------------------------------------


def _time_machine_steps(durations: list[float]) -> Callable[[], None]:
    """Time each advance of a store-using async run's machine between two effects -- its
    hooks, their store calls and whatever hand-off the driver makes (a worker thread, or a
    step awaited on the loop) -- as the run waits for it; returns the undo.  Patches the
    drivers' private ``_Stepper.call`` (the streamed driver uses the same class)."""
    from loopwarden.engine import drivers

    orig = drivers._Stepper.call
    clock = time.perf_counter

    async def call(self: Any, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = clock()
        try:
            return await orig(self, fn, *args)
        finally:
            if self.context is not None:  # a run whose hooks reach the store
                durations.append(clock() - t0)

    drivers._Stepper.call = call  # type: ignore[method-assign]

    def undo() -> None:
        drivers._Stepper.call = orig  # type: ignore[method-assign]

    return undo


async def _batch(spec: dict[str, Any], conn: Any) -> dict[str, Any]:
    """Build the variant, warm it, tell the parent, wait for "go", run the measured batch."""
    import openai

    variant, conversations, turns = spec["variant"], spec["conversations"], spec["turns"]
    stream, framework = spec["stream"], spec["framework"]
    EXECUTED.clear()
    steps, records = Steps(), Records()
    dep: Any = None
    client: Any = None
    timed: Any = None
    disconnect = _watch_runs(None, records)
    stack = contextlib.ExitStack()
    try:
        if variant == "loopwarden":
            if framework == "langchain":
                from loopwarden import Deployment

                dep = Deployment(bench_config(spec["store_url"], spec["namespace"]), tools=[])
            else:
                dep = make_deployment(spec["base_url"], spec["store_url"], spec["namespace"])
            timed = W.TimedStore(dep)
        if framework == "langchain":
            from loopwarden.adapters.langchain import LoopwardenMiddleware

            middleware = []
            if dep is not None:
                middleware = [
                    LoopwardenMiddleware(
                        dep,
                        model_name=MODEL,
                        meta={"tenant": _tenant(0)},
                        tools={TOOL: {"side_effect": True, "idempotency_keys": ["order_id"]}},
                    )
                ]
            agent = langchain_agent(spec["latency"], middleware)

            def one(conv: int, n: int, s: Steps | None) -> Any:
                return langchain_conversation(agent, conv, n, s)

        elif dep is not None:

            def one(conv: int, n: int, s: Steps | None) -> Any:
                return guarded_conversation(dep, conv, n, stream)

        else:
            client = openai.AsyncOpenAI(
                api_key="sk-bench", base_url=spec["base_url"], max_retries=0
            )

            def one(conv: int, n: int, s: Steps | None) -> Any:
                return bare_conversation(client, conv, n, stream, s or Steps())

        # warm the path (connections, imports, the store) before measuring
        await asyncio.gather(*(one(-i - 1, 1, None) for i in range(min(5, conversations))))
        if spec.get("gc_freeze"):  # what was built so far is never collected again
            gc.collect()
            gc.freeze()
        if timed is not None:
            timed.durations.clear()
            timed.on_main_thread = 0
        conn.send("ready")
        if conn.recv() != "go":
            raise RuntimeError("the bench parent did not say go")
        if framework != "langchain" and dep is not None:
            disconnect()
            disconnect = _watch_runs(steps, records)
        machine: list[float] = []
        if framework != "langchain" and dep is not None:
            untime = _time_machine_steps(machine)
            stack.callback(untime)
        monitor = W.LoopMonitor()
        monitor.start()
        cpu0, wall0 = time.process_time(), time.time()
        try:
            calls = await asyncio.gather(*(one(c, turns, steps) for c in range(conversations)))
        finally:
            wall1, cpu1 = time.time(), time.process_time()
            loop = await monitor.stop()
    finally:
        stack.close()
        disconnect()
        if client is not None:
            await client.close()
        if dep is not None:
            await dep.aclose()
    store_calls = {k: len(v) for k, v in (timed.durations if timed else {}).items()}
    store_call_s = [d for v in (timed.durations if timed else {}).values() for d in v]
    return {
        "start": wall0,
        "end": wall1,
        "cpu_s": cpu1 - cpu0,
        "runs": conversations * turns,
        "model_calls": sum(calls),
        "steps": steps.durations,
        "store_steps": steps.store_steps,
        "store_wait": steps.store_wait,
        "store_calls": store_calls,
        "store_calls_on_loop_thread": timed.on_main_thread if timed else 0,
        "store_call_ms": {
            "p50": round(W.pct(store_call_s, 0.5) * 1e3, 3),
            "p99": round(W.pct(store_call_s, 0.99) * 1e3, 3),
        },
        "loop": loop,
        "machine_steps": machine,
        "executed": dict(EXECUTED),
        "ended": dict(records.ended),
        "spent": dict(records.total),
        "spent_by_tenant": {k: dict(v) for k, v in records.tenants.items()},
    }


def _worker(conn: Any) -> None:
    """A worker process: one batch per message, each on an event loop of its own."""
    import contextvars

    global TRACKER
    TRACKER = contextvars.ContextVar("bench_tracker", default=None)
    import logging

    logging.getLogger("loopwarden").setLevel(logging.WARNING)
    while True:
        spec = conn.recv()
        if spec is None:
            return
        try:
            result = asyncio.run(_batch(spec, conn))
        except BaseException:
            conn.send({"error": traceback.format_exc()})
            continue
        conn.send(result)


class Fleet:
    """``n`` worker processes, started once (imports paid once), driven batch by batch."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def batch(self, spec: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """One batch on the first ``n`` workers, started together after their warm-up."""
        conns = self.conns[:n]
        for i, conn in enumerate(conns):
            conn.send({**spec, "worker": i})
        for conn in conns:
            msg = conn.recv()
            if msg != "ready":
                raise RuntimeError(f"a worker failed:\n{msg.get('error') if msg else msg}")
        for conn in conns:
            conn.send("go")
        out = [conn.recv() for conn in conns]
        for r in out:
            if "error" in r:
                raise RuntimeError(f"a worker failed:\n{r['error']}")
        return out

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()


# -- the figures of a batch, the checks, the rounds ---------------------------------------------


def summarise(results: list[dict[str, Any]], server_cpu: float | None) -> dict[str, Any]:
    """One batch, all its processes pooled."""
    steps = [d for r in results for d in r["steps"]]
    store_steps = [d for r in results for d in r["store_steps"]]
    store_wait = [d for r in results for d in r["store_wait"]]
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    runs = sum(r["runs"] for r in results)
    calls = sum(r["model_calls"] for r in results)
    loops = [r["loop"] for r in results]
    out: dict[str, Any] = {
        "processes": len(results),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "runs": runs,
        "model_calls": calls,
        "runs_per_s": round(runs / wall, 2) if wall > 0 else None,
        "runs_per_s_per_core": round(runs / cpu, 2) if cpu > 0 else None,
        "cpu_us_per_step": round(cpu / max(1, calls) * 1e6, 1),
        "step_ms": _ms(steps),
        # the worst process's loop: its lag and callbacks (the lag of a loop is its own)
        "loop_lag_ms": {k: max(x["lag_ms"][k] for x in loops) for k in ("p50", "p99", "max")},
        "callback_ms": {k: max(x["callback_ms"][k] for x in loops) for k in ("p50", "p99", "max")},
        "callback_cpu_ms": {
            k: max(x["callback_cpu_ms"][k] for x in loops) for k in ("p50", "p99", "max")
        },
        "callbacks": sum(x["callbacks"] for x in loops),
        "gc_ms": {
            "total": round(sum(x["gc"]["total_ms"] for x in loops), 1),
            "max": max(x["gc"]["max_ms"] for x in loops),
        },
        "longest_callbacks": sorted(
            (c for x in loops for c in x["longest_callbacks"]), key=lambda c: -c["ms"]
        )[:5],
        "server_cpu_s": None if server_cpu is None else round(server_cpu, 3),
    }
    if store_steps:
        out["store_steps"] = len(store_steps)
        out["store_step_ms"] = _ms(store_steps)
        out["store_wait_ms"] = _ms(store_wait)
        out["store_calls_per_step"] = round(
            sum(sum(r["store_calls"].values()) for r in results) / max(1, len(steps)), 2
        )
        # where the store calls ran: the loop's thread (awaited there) or worker threads
        out["store_calls_on_loop_thread"] = round(
            sum(r["store_calls_on_loop_thread"] for r in results)
            / max(1, sum(sum(r["store_calls"].values()) for r in results)),
            3,
        )
        machine = [d for r in results for d in r.get("machine_steps", ())]
        if machine:
            out["machine_step_ms"] = _ms(machine)
            out["machine_steps_per_step"] = round(len(machine) / max(1, len(steps)), 2)
        out["store_call_ms"] = {
            k: max(r["store_call_ms"][k] for r in results) for k in ("p50", "p99")
        }
    ended: Counter[str] = Counter()
    for r in results:
        ended.update(r["ended"])
    if ended:
        out["ended"] = dict(sorted(ended.items()))
    return out


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(W.pct(values, 0.5) * 1e3, 2),
        "p99": round(W.pct(values, 0.99) * 1e3, 2),
    }


def check_exact(results: list[dict[str, Any]], store_url: str, namespace: str) -> dict[str, Any]:
    """The store's counters against the records of every run (warm-up included), and every
    side effect executed exactly once across the processes."""
    from loopwarden.store import QUANTITIES, open_store

    store = open_store(store_url, namespace=namespace)
    try:
        rows = store.rows()
    finally:
        store.close()
    counted: dict[tuple[str, str], dict[str, int]] = {}
    reserved = 0
    for row in rows:
        got = dict(zip(QUANTITIES, row.committed, strict=True))
        slot = counted.setdefault((row.scope, row.key), Counter())
        slot.update({k: got[k] for k in ("runs", "model_calls", "tool_calls", "tokens")})
        reserved += sum(row.reserved)
    expected: dict[tuple[str, str], Counter[str]] = {}
    for r in results:
        expected.setdefault(("deployment", "*"), Counter()).update(r["spent"])
        for tenant, spent in r["spent_by_tenant"].items():
            expected.setdefault(("tenant", tenant), Counter()).update(spent)
    # the deployment-wide counter's key is the deployment's name: match it by scope
    dep_rows = [v for (scope, _), v in counted.items() if scope == "deployment"]
    budgets_ok = len(dep_rows) == 1 and reserved == 0
    mismatches = []
    for (scope, key), want in expected.items():
        got = dep_rows[0] if scope == "deployment" and dep_rows else counted.get((scope, key))
        if got is None or any(int(got.get(k, 0)) != int(v) for k, v in want.items()):
            budgets_ok = False
            mismatches.append({"scope": scope, "key": key, "expected": dict(want), "counted": got})
    executed: Counter[str] = Counter()
    for r in results:
        executed.update(r["executed"])
    twice = sorted(k for k, n in executed.items() if n > 1)
    total = expected.get(("deployment", "*"), Counter())
    return {
        "budgets_exact": budgets_ok,
        "counted": dict(dep_rows[0]) if dep_rows else None,
        "expected": dict(total),
        "reserved_left": reserved,
        "mismatches": mismatches[:5],
        "ledger_exact": not twice,
        "side_effects": {
            "keys": len(executed),
            "executed": sum(executed.values()),
            "tool_calls": int(total.get("tool_calls", 0)),
            "executed_twice": twice[:5],
        },
    }


def _drop_namespace(store_url: str, namespace: str) -> None:
    """Delete a batch's keys from a Redis server the bench did not start."""
    if not store_url.startswith(("redis://", "rediss://", "unix://")):
        return
    import redis

    client = redis.Redis.from_url(store_url)
    try:
        keys = list(client.scan_iter(match=f"*{{{namespace}}}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


def run_rounds(args: argparse.Namespace, base_url: str, store_url: str, srv: Any) -> dict[str, Any]:
    """``--pairs`` rounds of bare and loopwarden batches (and, on N > 1 processes, both on one
    process too), the order alternating round by round."""
    n = args.processes
    sizes = [n, 1] if n > 1 else [n]
    fleet = Fleet(n)
    batches: dict[str, list[dict[str, Any]]] = {}
    checks: list[dict[str, Any]] = []
    loads = [round(os.getloadavg()[0], 2)]
    try:
        for rnd in range(args.pairs):
            order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
            for size in sizes if rnd % 2 == 0 else sizes[::-1]:
                for variant in order:
                    namespace = f"lw-serving-{uuid.uuid4().hex[:12]}"
                    spec = {
                        "variant": variant,
                        "framework": "langchain" if args.langchain else "openai",
                        "conversations": args.conversations,
                        "turns": args.turns,
                        "stream": args.stream,
                        "latency": args.latency_ms / 1000,
                        "base_url": base_url,
                        "store_url": store_url,
                        "namespace": namespace,
                        "gc_freeze": args.gc_freeze,
                    }
                    cpu0 = srv.cpu_s() if srv is not None else None
                    results = fleet.batch(spec, size)
                    cpu1 = srv.cpu_s() if srv is not None else None
                    server_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
                    row = summarise(results, server_cpu)
                    row["round"] = rnd
                    if variant == "loopwarden":
                        check = check_exact(results, store_url, namespace)
                        check.update(round=rnd, processes=size)
                        checks.append(check)
                        if not args.own_redis:
                            _drop_namespace(store_url, namespace)
                    batches.setdefault(f"{variant}@{size}", []).append(row)
            loads.append(round(os.getloadavg()[0], 2))
    finally:
        fleet.close()
    return {"batches": batches, "checks": checks, "load": loads}


def _med(rows: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for r in rows:
        v: Any = r
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            values.append(float(v))
    return W.spread(values)["median"] if values else None


def paired(bare: list[dict[str, Any]], lw: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per variant and the paired differences of the rounds (loopwarden - bare)."""
    per_variant = {}
    for name, rows in (("bare", bare), ("loopwarden", lw)):
        med: dict[str, Any] = {}
        for path in MEDIANS:
            v = _med(rows, *path)
            if v is not None:
                med[".".join(path)] = v
        per_variant[name] = med
    pairs = list(zip(bare, lw, strict=True))
    store_added = [
        g["store_step_ms"]["p50"] - x["step_ms"]["p50"] for x, g in pairs if "store_step_ms" in g
    ]
    return {
        "median": per_variant,
        "added_step_ms": {
            k: W.spread([g["step_ms"][k] - x["step_ms"][k] for x, g in pairs])
            for k in ("p50", "p99")
        },
        "added_store_step_ms": {"p50": W.spread(store_added)},
        "guard_cpu_us_per_step": W.spread(
            [g["cpu_us_per_step"] - x["cpu_us_per_step"] for x, g in pairs], digits=1
        ),
        "runs_per_core_ratio": W.spread(
            [g["runs_per_s_per_core"] / x["runs_per_s_per_core"] for x, g in pairs], digits=3
        ),
    }


#: the figures whose median over the rounds is reported per variant
MEDIANS = [
    ("runs_per_s",),
    ("runs_per_s_per_core",),
    ("cpu_us_per_step",),
    ("step_ms", "p50"),
    ("step_ms", "p99"),
    ("loop_lag_ms", "p50"),
    ("loop_lag_ms", "p99"),
    ("loop_lag_ms", "max"),
    ("callback_ms", "p99"),
    ("callback_ms", "max"),
    ("callback_cpu_ms", "p99"),
    ("callback_cpu_ms", "max"),
    ("store_wait_ms", "p50"),
    ("store_wait_ms", "p99"),
    ("store_calls_per_step",),
    ("store_call_ms", "p50"),
    ("store_call_ms", "p99"),
    ("machine_step_ms", "p50"),
    ("machine_step_ms", "p99"),
    ("store_calls_on_loop_thread",),
    ("gc_ms", "max"),
    ("server_cpu_s",),
]


def analyse(data: dict[str, Any], n: int) -> dict[str, Any]:
    """The paired figures on ``n`` processes (and on one, when ``n > 1``), the exactness of
    every batch, and the scaling line's figures."""
    b = data["batches"]
    out: dict[str, Any] = paired(b[f"bare@{n}"], b[f"loopwarden@{n}"])
    checks = data["checks"]
    out["budgets_exact"] = all(c["budgets_exact"] for c in checks)
    out["ledger_exact"] = all(c["ledger_exact"] for c in checks)
    if n > 1:
        out["one_process"] = paired(b["bare@1"], b["loopwarden@1"])

        def ratio(one: list[dict[str, Any]], many: list[dict[str, Any]]) -> dict[str, float]:
            return W.spread(
                [m["runs_per_s"] / o["runs_per_s"] for o, m in zip(one, many, strict=True)],
                digits=3,
            )

        out["scaling"] = {
            "runs_per_s_1": _med(b["loopwarden@1"], "runs_per_s"),
            f"runs_per_s_{n}": _med(b[f"loopwarden@{n}"], "runs_per_s"),
            "ratio": ratio(b["loopwarden@1"], b[f"loopwarden@{n}"]),
            "bare_ratio": ratio(b["bare@1"], b[f"bare@{n}"]),
        }
    return out


def scaling_line(data: dict[str, Any]) -> str:
    n = data["processes"]
    a = data["analysis"]
    s = a["scaling"]
    last = [c for c in data["checks"] if c["processes"] == n][-1]
    counted, expected = last["counted"] or {}, last["expected"]
    quantities = ("runs", "model_calls", "tool_calls", "tokens")
    fx = last["side_effects"]
    if a["ledger_exact"]:
        ledger = (
            f"yes ({fx['keys']} side effects claimed by {fx['tool_calls']} tool calls in {n} "
            f"processes, executed {fx['executed']} times, none twice)"
        )
    else:
        ledger = f"NO (executed twice: {fx['executed_twice']})"
    return (
        f"{n} processes: {s[f'runs_per_s_{n}']:.1f} runs/s = {s['ratio']['median']:.2f}x one "
        f"process ({s['ratio']['min']:.2f}-{s['ratio']['max']:.2f} over {s['ratio']['n']} "
        f"rounds; target >= 1.8x; the bare client {s['bare_ratio']['median']:.2f}x); "
        f"budgets exact: {'yes' if a['budgets_exact'] else 'NO'} in all "
        f"{len(data['checks'])} batches (last: "
        + ", ".join(f"{q} {counted.get(q)} == {expected.get(q)}" for q in quantities)
        + f", reserved left {last['reserved_left']}); ledger exact: {ledger}"
    )


def _table(a: dict[str, Any]) -> list[str]:
    head = ["", "runs/s", "runs/s/core", "CPU µs/step", "step p50/p99 ms", "loop lag p50/p99/max"]
    head += ["callback p99/max (CPU)", "store wait p50/p99"]
    rows = []
    for name in VARIANTS:
        m = a["median"][name]

        def g(key: str, fmt: str = "{:.1f}", m: dict[str, Any] = m) -> str:
            v = m.get(key)
            return "-" if v is None else fmt.format(v)

        rows.append(
            [
                name,
                g("runs_per_s"),
                g("runs_per_s_per_core"),
                g("cpu_us_per_step", "{:.0f}"),
                f"{g('step_ms.p50')} / {g('step_ms.p99')}",
                f"{g('loop_lag_ms.p50', '{:.2f}')} / {g('loop_lag_ms.p99', '{:.2f}')} / "
                f"{g('loop_lag_ms.max')}",
                f"{g('callback_ms.p99', '{:.2f}')} / {g('callback_ms.max')} "
                f"({g('callback_cpu_ms.p99', '{:.2f}')} / {g('callback_cpu_ms.max')})",
                f"{g('store_wait_ms.p50', '{:.2f}')} / {g('store_wait_ms.p99', '{:.2f}')}",
            ]
        )
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).rjust(widths[i]) for i, c in enumerate(r)) for r in [head, *rows]]

    def sp(s: dict[str, Any], unit: str = " ms") -> str:
        return f"{s['median']}{unit} (min {s['min']}, max {s['max']}, IQR {s['q1']}-{s['q3']})"

    return [
        *lines,
        f"latency added per step (paired, loopwarden - bare): p50 {sp(a['added_step_ms']['p50'])}"
        f"; p99 {sp(a['added_step_ms']['p99'])}",
        f"store-using steps, p50 added: {sp(a['added_store_step_ms']['p50'])}",
        f"guard CPU per step: {sp(a['guard_cpu_us_per_step'], ' µs')}; runs/s/core "
        f"loopwarden / bare: {sp(a['runs_per_core_ratio'], '')} (target >= 0.85)",
    ]


def render(data: dict[str, Any]) -> str:
    a, n = data["analysis"], data["processes"]
    lines = [
        f"{data['framework']}: {n} process(es) x {data['conversations']} conversations x "
        f"{data['turns']} turns, {data['latency_ms']} ms model latency, streamed: "
        f"{data['streamed']}, store: {data['store']}, {data['pairs']} paired rounds (medians), "
        f"server processes: {data['server_processes']}, load {data['load']}",
        "",
        f"{n} process(es):",
        *_table(a),
    ]
    if "one_process" in a:
        lines += ["", "1 process:", *_table(a["one_process"])]
    lw_rows = data["batches"][f"loopwarden@{n}"]
    longest = max(lw_rows, key=lambda r: r["callback_ms"]["max"])["longest_callbacks"][:3]
    lines += [
        "",
        "longest loopwarden callbacks: "
        + "; ".join(f"{c['ms']} ms (CPU {c.get('cpu_ms')}) {c['what']}" for c in longest),
        f"machine steps of store-using runs (hooks + store + hand-offs, wall) p50 / p99: "
        f"{a['median']['loopwarden'].get('machine_step_ms.p50')} / "
        f"{a['median']['loopwarden'].get('machine_step_ms.p99')} ms; store calls p50 / p99: "
        f"{a['median']['loopwarden'].get('store_call_ms.p50')} / "
        f"{a['median']['loopwarden'].get('store_call_ms.p99')} ms",
        f"store calls made on the event loop's thread: "
        f"{a['median']['loopwarden'].get('store_calls_on_loop_thread', 0):.0%} (else in "
        f"worker threads); longest garbage collection: "
        f"{a['median']['loopwarden'].get('gc_ms.max')} ms; server CPU per batch: "
        f"{a['median']['loopwarden'].get('server_cpu_s')} s",
        f"budgets exact: {a['budgets_exact']}; ledger exact: {a['ledger_exact']}",
    ]
    if "scaling" in a:
        lines.append(scaling_line(data))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--conversations", type=int, default=200, help="per process")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--pairs", type=int, default=5, help="paired rounds (default 5)")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--store", choices=("redis", "sqlite"), default="redis")
    parser.add_argument("--redis-url", help="default: a redis-server the bench starts")
    parser.add_argument("--server-processes", type=int, help="default: one per worker")
    parser.add_argument("--langchain", action="store_true", help="LangChain's async middleware")
    parser.add_argument(
        "--quick", action="store_true", help="10 conversations of 2 turns, 20 ms, 2 pairs"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() in each worker after its warm-up, on both sides",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # a terminated bench still stops its server, workers and redis-server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.conversations, args.turns, args.latency_ms, args.pairs = 10, 2, 20.0, 2
    args.pairs = max(1, args.pairs)
    servers = args.server_processes or args.processes
    with contextlib.ExitStack() as stack:
        args.own_redis = False
        if args.store == "sqlite":
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-serving-"))
            store_url = f"sqlite:///{Path(tmp) / 'store.sqlite3'}"
        elif args.redis_url:
            store_url = args.redis_url
        else:
            store_url = stack.enter_context(W.redis_server())
            args.own_redis = True
        srv = None
        base_url = ""
        if not args.langchain:
            srv = Server(args.latency_ms / 1000, servers)
            stack.callback(srv.close)
            base_url = srv.url
        data = run_rounds(args, base_url, store_url, srv)
    data.update(
        framework="langchain" if args.langchain else "openai",
        processes=args.processes,
        conversations=args.conversations,
        turns=args.turns,
        latency_ms=args.latency_ms,
        pairs=args.pairs,
        streamed=args.stream and not args.langchain,
        store=args.store,
        gc_freeze=args.gc_freeze,
        server_processes=0 if args.langchain else servers,
        machine=W.machine(),
        python=platform.python_version(),
    )
    data["analysis"] = analyse(data, args.processes)
    if args.processes > 1:
        data["scaling_line"] = scaling_line(data)
    print(json.dumps(data) if args.json else render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
