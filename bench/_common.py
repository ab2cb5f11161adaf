"""Shared by the benchmarks: the trivial workload, the config overrides, machine facts.

The workload is N steps, each one tool call to a trivial tool with distinct arguments and a
distinct result (so no guard ever fires), then a final answer.  The model is instant and
in-process.  Nothing here is part of the installed package.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import heapq
import inspect
import math
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, Usage
from loopwarden.tools import ToolContext

SYSTEM = "You are a benchmark agent."
USER = "Look up every record, then answer."
FINAL = "All records looked up."
BIG = 10**9  # a limit the workload never reaches

#: per plugin: settings raised above the workload, so the guard runs every step but never
#: stops it.  Applied only to plugins the config enables (unknown keys would be config errors).
LIMIT_OVERRIDES: dict[str, dict[str, Any]] = {
    "max_steps": {"max_steps": BIG, "warn_remaining": 0},
    "timeout": {"max_seconds": float(BIG)},
    "token_budget": {"max_context": BIG, "max_total_tokens": BIG},
    # the bench's models are priced like gpt-4o-mini, so the cost guard does its arithmetic
    "cost_budget": {
        "max_cost": BIG,
        "prices": {
            name: {"input": 0.15, "cached_input": 0.075, "output": 0.60}
            for name in ("instant", "slow")
        },
    },
    "tool_calls": {"max_tool_calls": BIG},
    "conversation_limits": {
        "max_turns": BIG,
        "max_model_calls": BIG,
        "max_tool_calls": BIG,
        "max_tokens": BIG,
    },
}


def content(i: int) -> str:
    """The model's text at step ``i``: distinct wording (no_progress sees progress)."""
    return f"Checking record {i}"


def arguments(i: int) -> str:
    """The tool-call arguments at step ``i`` (raw JSON, as a model sends them)."""
    return f'{{"key": "k{i}"}}'


def lookup(key: str) -> str:
    """The trivial tool: a distinct, error-free result for every key."""
    return f"record {key}: value {len(key) * 7919 % 10007}"


def lookup_ctx(key: str, ctx: ToolContext) -> str:
    """The trivial tool, cooperative: it takes the run's ToolContext, so under a deadline the
    loop runs it inline instead of in a worker thread."""
    return lookup(key)


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else (platform.processor() or "unknown CPU")


def machine() -> str:
    return f"{platform.machine()}, {cpu_model()}, {os.cpu_count()} cores ({platform.system()})"


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def bench_config_data(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a parsed config.toml) with a "bench" profile and raised plugin limits."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    run = dict(data.get("run", {}))
    run["profile"] = "bench"
    data["run"] = run
    profiles = dict(data.get("profiles", {}))
    profiles["bench"] = {"max_steps": BIG, "max_tokens": BIG, "max_seconds": float(BIG)}
    data["profiles"] = profiles
    plugins = dict(data.get("plugins", {}))
    enabled = set(plugins.get("enabled", [])) | {"max_steps"}
    for name, extra in LIMIT_OVERRIDES.items():
        if name in enabled:
            plugins[name] = _merge(plugins.get(name, {}), extra)
    data["plugins"] = plugins
    return data


class WorkloadModel:
    """The workload's model: ``n`` tool-call turns, then the final answer.

    Instant in-process by default; with ``latency`` its async path waits that many seconds per
    call (simulated network time), the sync path stays instant.
    """

    def __init__(self, n: int, *, name: str = "instant", latency: float = 0.0) -> None:
        self.n, self.i, self.name, self.latency = n, 0, name, latency

    def complete(self, request: ModelRequest) -> ModelResponse:
        i = self.i
        self.i += 1
        if i >= self.n or request.tool_choice == "none":
            return ModelResponse(content=FINAL, usage=Usage(request.estimated_tokens, 8))
        return ModelResponse(
            content=content(i),
            tool_calls=[ProposedCall("lookup", arguments(i), f"call_{i}")],
            usage=Usage(request.estimated_tokens, 16),
            finish_reason="tool_calls",
        )

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        if self.latency:
            await asyncio.sleep(self.latency)
        return self.complete(request)


# -- the event loop and the store, timed from the inside (bench/serving.py) -------------------


def pct(values: Sequence[float], p: float) -> float:
    """The ``p`` quantile of ``values`` (nearest rank; 0.0 when empty)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]


def spread(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    """Median, min, max and the quartiles of ``values`` (one figure per paired round)."""
    if not values:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "q1": 0.0, "q3": 0.0, "n": 0}
    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else (ordered[0],) * 3
    return {
        "median": round(statistics.median(ordered), digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "q1": round(q1, digits),
        "q3": round(q3, digits),
        "n": len(ordered),
    }


def _describe(handle: asyncio.Handle) -> str:
    """What an event-loop callback ran: a task's coroutine (and where it stopped next), or the
    callback's name."""
    cb = handle._callback  # type: ignore[attr-defined]
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro: Any = owner.get_coro()
        name = f"task {getattr(coro, '__qualname__', repr(coro))}"
        frame = None  # the innermost frame where the task waits now
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None) or frame
            frame = getattr(coro, "gi_frame", None) or frame
            nxt = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
            coro = nxt or getattr(coro, "gi_yieldfrom", None)
        if frame is not None:
            where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
            name += f" (then waiting in {frame.f_code.co_name}, {where})"
        return name
    return str(getattr(cb, "__qualname__", None) or repr(cb))[:120]


class LoopMonitor:
    """The running event loop's own timing: every callback it runs, and a lag probe.

    :meth:`start` wraps ``asyncio.events.Handle._run`` (process-wide: every ready callback and
    timer of every loop of the process goes through it) so each callback's duration is
    recorded -- wall time, what other tasks wait, and the loop thread's own CPU time in it
    (wall minus CPU: the time the thread waited for the GIL or for a core the OS gave to
    another process) -- the ``top`` longest with what they ran; times every garbage
    collection (``gc.callbacks``); and starts a probe task that sleeps ``probe_s`` over and
    over -- its oversleep is the loop's *lag*, how long anything that became ready waited for
    the loop.  :meth:`stop` restores ``_run`` and returns the figures.
    The wrapper costs a Python frame per callback: the bench installs it on every variant
    alike.
    """

    def __init__(self, probe_s: float = 0.005, top: int = 5) -> None:
        self.probe_s, self.top = probe_s, top
        self.callbacks: array[float] = array("d")
        self.callback_cpu: array[float] = array("d")  # the loop thread's CPU in each
        #: a min-heap of the longest: (wall s, sequence, CPU s, what it ran)
        self.longest: list[tuple[float, int, float, str]] = []
        self.gc_pauses: array[float] = array("d")  # each garbage collection, wall s
        self.lags: array[float] = array("d")
        self._orig: Any = None
        self._probe: asyncio.Task[None] | None = None

    def start(self) -> None:
        orig = self._orig = asyncio.events.Handle._run
        durations, cpu, longest, top = self.callbacks, self.callback_cpu, self.longest, self.top
        clock, thread_clock = time.perf_counter, time.thread_time
        seq = [0]

        def _run(handle: asyncio.Handle) -> None:
            t0, c0 = clock(), thread_clock()
            try:
                orig(handle)
            finally:
                d, c = clock() - t0, thread_clock() - c0
                cpu.append(c)
                durations.append(d)
                if len(longest) < top or d > longest[0][0]:
                    seq[0] += 1
                    entry = (d, seq[0], c, _describe(handle))
                    if len(longest) < top:
                        heapq.heappush(longest, entry)
                    else:
                        heapq.heapreplace(longest, entry)

        asyncio.events.Handle._run = _run  # type: ignore[method-assign]
        gc.callbacks.append(self._gc)
        self._probe = asyncio.get_running_loop().create_task(self._sleeper())

    _gc_t0 = 0.0

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_pauses.append(time.perf_counter() - self._gc_t0)

    async def _sleeper(self) -> None:
        clock, lags, probe = time.perf_counter, self.lags, self.probe_s
        while True:
            t0 = clock()
            await asyncio.sleep(probe)
            lags.append(max(0.0, clock() - t0 - probe))

    async def stop(self) -> dict[str, Any]:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        if self._orig is not None:
            asyncio.events.Handle._run = self._orig  # type: ignore[method-assign]
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._gc)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        cbs, lags = self.callbacks, self.lags
        return {
            "lag_ms": _ms_pcts(lags),
            "probes": len(lags),
            "callback_ms": _ms_pcts(cbs),
            "callback_cpu_ms": _ms_pcts(self.callback_cpu),
            "callbacks": len(cbs),
            "callback_s_total": round(sum(cbs), 3),
            "longest_callbacks": [
                {"ms": round(d * 1e3, 2), "cpu_ms": round(c * 1e3, 2), "what": what}
                for d, _, c, what in sorted(self.longest, reverse=True)
            ],
            # garbage collections (a pause of the loop's thread wherever it falls)
            "gc": {
                "collections": len(self.gc_pauses),
                "total_ms": round(sum(self.gc_pauses) * 1e3, 1),
                "max_ms": round(max(self.gc_pauses, default=0.0) * 1e3, 2),
            },
        }


def _ms_pcts(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(pct(values, 0.5) * 1e3, 3),
        "p99": round(pct(values, 0.99) * 1e3, 3),
        "max": round(max(values, default=0.0) * 1e3, 3),
    }


#: the store-call accumulator of the current conversation: [seconds waited, calls]; set by
#: the bench per conversation, read per step (contexts are copied into tasks and workers)
STORE_CELL: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "bench_store_cell", default=None
)


#: the store calls a run makes (budgets, the ledger, circuit breakers): the ones timed
STORE_CALLS = ("reserve", "settle", "claim", "finish", "release", "breaker_admit", "breaker_record")


class TimedStore:
    """Times the calls of a deployment's store as the run waits for them.

    The store object itself is kept (whatever path the driver takes for it stays the same):
    its :data:`STORE_CALLS` methods are replaced, on the instance, by timed ones.  A call
    that returns an awaitable is timed until it is awaited to its end; a plain call from its
    start to its return -- in whatever thread or step made it, waits for I/O awaited on the
    loop included (counted in ``on_main_thread`` when made on the loop's thread).  Each
    duration goes to ``durations[method]`` and to the current conversation's
    :data:`STORE_CELL`, which the bench turns into store wait per step.
    """

    def __init__(self, deployment: Any) -> None:
        self.store = deployment.shared.store  # opened now, outside any run
        self.durations: dict[str, list[float]] = {}
        self.on_main_thread = 0  # calls made on the process's main thread (its event loop's)
        for name in STORE_CALLS:
            method = getattr(self.store, name, None)
            if method is not None:
                setattr(self.store, name, self._timed(name, method))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        clock, note = time.perf_counter, self._note

        async def awaited(aw: Any, t0: float) -> Any:
            try:
                return await aw
            finally:
                note(name, clock() - t0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = method(*args, **kwargs)
            if inspect.isawaitable(out):
                return awaited(out, t0)
            note(name, clock() - t0)
            return out

        return timed

    def _note(self, name: str, seconds: float) -> None:
        self.durations.setdefault(name, []).append(seconds)
        if threading.current_thread() is threading.main_thread():
            self.on_main_thread += 1
        cell = STORE_CELL.get()
        if cell is not None:
            cell[0] += seconds
            cell[1] += 1


# -- a redis-server of the bench's own ---------------------------------------------------------


def free_port() -> int:
    """A free local TCP port (for a server the bench starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server of the bench's own on a free port (nothing saved); yields its URL.

    ``SystemExit`` when there is no ``redis-server`` on PATH, ``RuntimeError`` when it does
    not start within 10 s."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("no redis-server on PATH: pass --redis-url (or leave Redis out)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="lw-bench-redis-") as workdir:
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", workdir]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the bench's redis-server did not start") from None
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(5)
