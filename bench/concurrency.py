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
    return 0


if __name__ == "__main__":
    sys.exit(main())
