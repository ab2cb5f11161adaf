"""Many concurrent runs on one event loop: wall time against the ideal, CPU, memory per run.

``--runs`` (default 1,000) concurrent ``Deployment.arun()`` calls share one deployment built
from the shipped config.toml (limits raised above the workload, as in ``overhead.py``; with
``--empty``, the essential max_steps only).  Each
run plays ``--steps`` (default 5) model turns -- ``steps - 1`` tool calls to a trivial async
tool, then the final answer -- against an async model that waits ``--latency-ms`` (default
20 ms) per call, as a remote model would.

* ``wall_s`` against ``ideal_s`` = steps x latency: what the runs would take if loopwarden cost
  nothing and the event loop were infinitely fast.
* ``cpu_us_per_step``: process CPU time of the whole batch / (runs x steps).
* ``bare_wall_s`` / ``bare_cpu_us_per_step``: the same batch through a bare async loop (no
  validation, no guards) -- the floor that asyncio itself sets on this machine.
* memory (``tracemalloc``, a second pass, since tracing slows everything down): the peak of
  traced memory while the batch runs, minus the baseline before it, per run
  (``peak_kb_per_run``, everything a live run holds: its message history, its requests and
  responses, its guard state, its task and coroutine frames).  The message history alone
  (``history_kb_per_run``, a deep size of ``run.messages`` at the end of each run) is reported
  beside it, and ``beyond_history_kb_per_run`` is the difference.  ``rss_kb_per_run`` is the
  growth of the process's peak RSS during the first (untraced) pass, for comparison.

**Store I/O and the event loop** (``store_lag``; ``--store-runs``, default 200, ``--no-store``
skips it): ``--store-runs`` concurrent runs of the same workload with ``spend_limits`` (a
tenant/day budget they never reach: a reserve and a settle in the store per model call) on a
SQLite file, on Redis (``--redis-url``, else ``LOOPWARDEN_TEST_REDIS_URL``; skipped without),
and on an unresponsive store (SQLite behind a gate that never opens: every call fails after
0.5 s, as a store that stopped answering does with ``[store] timeout_s = 0.5``; 20 runs).
A probe coroutine sleeps 5 ms over and over beside them; its oversleep is the event loop's
*lag*: how long the loop could not run anything else.  Each store is measured three ways in the
same process: as shipped (``offloaded``: the machine steps of those runs in worker threads),
on the loop with their store calls awaited (``loop``: ``[store] async_calls = "loop"``,
:mod:`loopwarden.store.bridge`; needs ``greenlet``) and with the store calls made inline on
the loop (``inline``: the behaviour before 0.3), reporting ``lag_ms`` p50 / p99 /
max, ``wall_s`` and ``cpu_ms_per_run``, and ``lag_ratio`` = inline / offloaded
for p50 and max.

    python bench/concurrency.py --json
    python bench/concurrency.py --quick --json     # a smoke test of the bench itself
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of ``obj`` and everything it contains (containers and strings; shared objects
    once) -- deterministic, a lower bound of what the allocator holds."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(v, seen) for v in obj)
    return size


def make(latency: float, empty: bool = False) -> tuple[Any, Any]:
    from loopwarden import Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config
    from loopwarden.tools import ToolRegistry, tool

    def SlowModel(n: int) -> W.WorkloadModel:
        return W.WorkloadModel(n, name="slow", latency=latency)

    async def lookup(key: str) -> str:
        """The trivial tool, async (an async deployment's natural tool)."""
        return W.lookup(key)

    lookup.__doc__ = W.lookup.__doc__
    path = default_config_path()
    base = {"plugins": {"enabled": []}} if empty else load_toml(path)
    config = parse_config(W.bench_config_data(base), path="<empty>" if empty else str(path))
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(lookup)])
    return Deployment(config, tools=tools), SlowModel


async def bare_run(steps: int, latency: float) -> str:
    """The bare async loop (no guards): the floor that the event loop itself sets."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": W.SYSTEM},
        {"role": "user", "content": W.USER},
    ]
    for i in range(steps):
        await asyncio.sleep(latency)  # the model call
        if i == steps - 1:
            messages.append({"role": "assistant", "content": W.FINAL})
            return W.FINAL
        args = json.loads(W.arguments(i))
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "lookup", "arguments": W.arguments(i)},
        }
        messages.append({"role": "assistant", "content": W.content(i), "tool_calls": [call]})
        out = await _alookup(**args)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    return W.FINAL


async def _alookup(key: str) -> str:
    return W.lookup(key)


async def bare_batch(runs: int, steps: int, latency: float) -> None:
    await asyncio.gather(*(bare_run(steps, latency) for _ in range(runs)))


async def batch(dep: Any, model_cls: Any, runs: int, steps: int) -> list[Any]:
    done = await asyncio.gather(
        *(dep.arun(W.USER, model=model_cls(steps - 1)) for _ in range(runs))
    )
    for run in done:
        o = run.outcome
        if o is None or o.termination != "final_answer" or run.step != steps:
            raise SystemExit(f"bench: a run did not end with final_answer: {run.record()}")
    return list(done)


LAG_PROBE_S = 0.005  # the probe's sleep: its oversleep is the event loop's lag


async def _probe(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(max(0.0, time.perf_counter() - t - LAG_PROBE_S))


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else 0.0


async def _lagged_batch(dep: Any, model_cls: Any, runs: int, steps: int) -> tuple[Any, ...]:
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(lags, stop))
    await asyncio.sleep(0)
    t0, c0 = time.perf_counter(), time.process_time()
    done = await asyncio.gather(
        *(
            dep.arun(W.USER, model=model_cls(steps - 1), meta={"tenant": f"t{i % 7}"})
            for i in range(runs)
        )
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    await probe
    ends: dict[str, int] = {}
    for run in done:
        term = run.outcome.termination if run.outcome else "?"
        ends[term] = ends.get(term, 0) + 1
    return lags, wall, ends, cpu


def store_lag(
    url: str, namespace: str, runs: int, steps: int, latency: float, *, hung: bool = False
) -> dict[str, Any]:
    """Loop lag of ``runs`` concurrent store-using runs, offloaded and forced inline."""
    import loopwarden.engine.drivers as drivers
    from loopwarden import Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config
    from loopwarden.store import bridge
    from loopwarden.testing.faults import GatedStore, install_store

    data = W.bench_config_data(load_toml(default_config_path()))
    plugins = data["plugins"]
    plugins["enabled"] = [*plugins["enabled"], "spend_limits"]
    plugins["spend_limits"] = {
        "budgets": [{"scope": "tenant", "window": "day", "max_tokens": W.BIG}]
    }
    # the shipped store timeout (5 s); the unresponsive store answers nothing within 0.5 s
    data["store"] = {"url": url, "namespace": namespace, "timeout_s": 0.5 if hung else 5.0}
    config = parse_config(data, path="<bench>")
    _, model_cls = make(latency)
    from loopwarden.tools import ToolRegistry, tool

    async def lookup(key: str) -> str:
        return W.lookup(key)

    lookup.__doc__ = W.lookup.__doc__
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(lookup)])
    out: dict[str, Any] = {}
    shipped, on_loop = drivers.blocking_io, drivers.steps_on_loop
    modes = (
        ("offloaded", shipped, on_loop),  # as shipped: steps in worker threads
        ("loop", shipped, lambda deployment: bridge.available()),  # async_calls = "loop"
        ("inline", lambda run: False, on_loop),  # before 0.3: the loop waits for the store
    )
    for label, decide, where in modes:
        dep = Deployment(config, tools=tools)
        if hung:  # a store that no longer answers: each call fails after timeout_s
            install_store(dep, lambda s: GatedStore(s, guard_s=0.5))
        drivers.blocking_io = decide  # type: ignore[assignment]
        drivers.steps_on_loop = where  # type: ignore[assignment]
        try:
            if not hung:
                asyncio.run(_lagged_batch(dep, model_cls, min(runs, 20), steps))  # warm up
            lags, wall, ends, cpu = asyncio.run(_lagged_batch(dep, model_cls, runs, steps))
        finally:
            drivers.blocking_io, drivers.steps_on_loop = shipped, on_loop
            dep.close()
        out[label] = {
            "wall_s": round(wall, 3),
            "cpu_ms_per_run": round(cpu / runs * 1e3, 3),
            "lag_ms": {
                "p50": round(_pct(lags, 0.5) * 1e3, 2),
                "p99": round(_pct(lags, 0.99) * 1e3, 2),
                "max": round(max(lags, default=0.0) * 1e3, 2),
            },
            "probes": len(lags),
            "runs": dict(sorted(ends.items())),
        }
    off, inl = out["offloaded"]["lag_ms"], out["inline"]["lag_ms"]
    out["lag_ratio"] = {
        k: round(inl[k] / off[k], 1) if off[k] > 0 else None for k in ("p50", "max")
    }
    out["concurrent_runs"] = runs
    return out


def store_lags(runs: int, steps: int, latency: float, redis_url: str | None) -> dict[str, Any]:
    import os
    import tempfile
    import uuid

    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-lag-"))
    ns = "lwbench-" + uuid.uuid4().hex[:8]
    result: dict[str, Any] = {
        "sqlite": store_lag(f"sqlite:///{tmp}/store.sqlite3", ns, runs, steps, latency)
    }
    redis_url = redis_url or os.environ.get("LOOPWARDEN_TEST_REDIS_URL")
    if redis_url:
        result["redis"] = store_lag(redis_url, ns, runs, steps, latency)
    else:
        result["redis"] = {"skipped": "no Redis (give --redis-url)"}
    hung_runs = min(runs, 20)
    result["unresponsive"] = store_lag(
        f"sqlite:///{tmp}/hung.sqlite3", ns, hung_runs, steps, latency, hung=True
    )
    if redis_url:
        import redis

        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match="{" + ns + "}:*", count=500))
        if keys:
            r.delete(*keys)
        r.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    ap.add_argument("--runs", type=int, default=None, help="concurrent runs (default 1000)")
    ap.add_argument("--steps", type=int, default=5, help="model turns per run (default 5)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="model latency per call")
    ap.add_argument(
        "--empty",
        action="store_true",
        help="no plugins but the essential max_steps, instead of the shipped config",
    )
    ap.add_argument("--store-runs", type=int, default=None, help="store lag runs (200)")
    ap.add_argument("--no-store", action="store_true", help="skip the store lag section")
    ap.add_argument("--redis-url", default=None, help="Redis for the store lag section")
    args = ap.parse_args(argv)
    runs = args.runs or (20 if args.quick else 1000)
    steps = max(1, args.steps)
    latency = args.latency_ms / 1000
    dep, model_cls = make(latency, empty=args.empty)

    asyncio.run(batch(dep, model_cls, min(runs, 20), steps))  # warm up
    gc.collect()

    # pass 1: wall and CPU time (untraced)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu0, t0 = time.process_time(), time.perf_counter()
    done = asyncio.run(batch(dep, model_cls, runs, steps))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    rss_kb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / runs  # KiB on Linux
    del done
    gc.collect()

    # the floor: the same batch through a bare async loop
    asyncio.run(bare_batch(min(runs, 20), steps, latency))
    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(bare_batch(runs, steps, latency))
    bare_wall = time.perf_counter() - t0
    bare_cpu = time.process_time() - cpu0
    gc.collect()

    # pass 2: memory (traced)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    done = asyncio.run(batch(dep, model_cls, runs, steps))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    history = sum(deep_size(r.messages) for r in done) / runs
    del done

    ideal = steps * latency
    result: dict[str, Any] = {
        "runs": runs,
        "wall_s": round(wall, 4),
        "ideal_s": round(ideal, 4),
        "cpu_us_per_step": round(cpu / (runs * steps) * 1e6, 2),
        "peak_kb_per_run": round(peak / runs / 1024, 2),
        "wall_to_ideal": round(wall / ideal, 2),
        "bare_wall_s": round(bare_wall, 4),
        "bare_cpu_us_per_step": round(bare_cpu / (runs * steps) * 1e6, 2),
        "steps": steps,
        "latency_ms": args.latency_ms,
        "cpu_s": round(cpu, 4),
        "history_kb_per_run": round(history / 1024, 2),
        "beyond_history_kb_per_run": round((peak - history * runs) / runs / 1024, 2),
        "rss_kb_per_run": round(rss_kb, 2),
        "memory_method": "tracemalloc peak during the batch minus baseline, per run; "
        "history = deep sys.getsizeof of run.messages",
        "plugins": dep.plugins.names,
        "python": platform.python_version(),
        "machine": W.machine(),
    }
    dep.close()
    if not args.no_store:
        store_runs = args.store_runs or (10 if args.quick else 200)
        result["store_lag"] = store_lags(store_runs, steps, latency, args.redis_url)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"loopwarden concurrency -- python {result['python']} on {result['machine']}")
    print(f"{runs} concurrent arun() x {steps} steps, model latency {args.latency_ms:g} ms")
    print(
        f"wall {wall:.3f} s against ideal {ideal:.3f} s ({result['wall_to_ideal']:.2f}x); "
        f"CPU {cpu:.3f} s = {result['cpu_us_per_step']:.1f} us per step"
    )
    print(
        f"bare async loop, same batch: wall {bare_wall:.3f} s, "
        f"CPU {result['bare_cpu_us_per_step']:.1f} us per step"
    )
    print(
        f"memory per run: peak {result['peak_kb_per_run']:.1f} KB (tracemalloc), of which "
        f"message history {result['history_kb_per_run']:.1f} KB, beyond it "
        f"{result['beyond_history_kb_per_run']:.1f} KB; peak RSS growth "
        f"{result['rss_kb_per_run']:.1f} KB"
    )
    print("plugins: " + ", ".join(result["plugins"]))
    for name, lag in result.get("store_lag", {}).items():
        if "skipped" in lag:
            print(f"store lag, {name}: skipped ({lag['skipped']})")
            continue
        print(
            f"store lag, {name}, {lag['concurrent_runs']} runs: loop lag p50/max "
            f"{lag['offloaded']['lag_ms']['p50']}/{lag['offloaded']['lag_ms']['max']} ms "
            f"(inline: {lag['inline']['lag_ms']['p50']}/{lag['inline']['lag_ms']['max']} ms, "
            f"x{lag['lag_ratio']['p50']}/x{lag['lag_ratio']['max']}; steps on the loop: "
            f"{lag['loop']['lag_ms']['p50']}/{lag['loop']['lag_ms']['max']} ms); wall "
            f"{lag['offloaded']['wall_s']} s (inline {lag['inline']['wall_s']} s, loop "
            f"{lag['loop']['wall_s']} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
