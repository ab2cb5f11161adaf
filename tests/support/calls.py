"""Counting the function calls a run makes, by function -- for tests of hot-path mechanisms.

cProfile's counts are deterministic (unlike timings on a shared machine): a test can say "a
quiet step reads no Resolution property" or "the metrics receivers build no label key per
step" and fail when a change brings the call back.  The workload is ``bench/overhead.py``'s:
the shipped config.toml with its limits raised above the run (every guard runs every step,
none fires), a trivial read-only tool, an instant model.

Keys are ``"<file name>:<function>"`` (``"plugin.py:state"``, ``"clock.py:now"``); C
functions keep cProfile's own spelling (``"~:<built-in method time.monotonic>"``).  The calls
from one caller have a key of their own: ``"<callee> <- <file name>:<caller>"``.
"""

from __future__ import annotations

import asyncio
import cProfile
import importlib.util
import pstats
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.run import Run
from loopwarden.tools import ToolRegistry, tool

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def bench_common() -> Any:
    """bench/_common.py (the benches' workload), imported by path."""
    mod = sys.modules.get("_lwbench_common")
    if mod is None:
        spec = importlib.util.spec_from_file_location("_lwbench_common", BENCH / "_common.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_lwbench_common"] = mod
        spec.loader.exec_module(mod)
    return mod


def count_calls(fn: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """``fn()``'s result and the calls it made, by ``"<file name>:<function>"``."""
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    counts: Counter[str] = Counter()
    for (file, _line, name), row in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        if "_lsprof.Profiler" in name:  # the profiler switching itself off
            continue
        key = f"{Path(file).name}:{name}"
        counts[key] += row[1]
        for (cfile, _cline, cname), crow in row[4].items():  # by caller
            counts[f"{key} <- {Path(cfile).name}:{cname}"] += crow[1]
    return result, counts


def shipped_deployment(
    *,
    cooperative: bool = True,
    overrides: dict[str, Any] | None = None,
    lookup: Callable[..., Any] | None = None,
) -> Any:
    """The shipped config.toml with the bench's raised limits, and the trivial tool (taking a
    ``ToolContext`` when ``cooperative``; ``lookup``: a function of ``key`` of your own as the
    tool); ``overrides`` replace top-level config tables."""
    w = bench_common()
    path = default_config_path()
    data = w.bench_config_data(load_toml(path))
    data.update(overrides or {})
    fn = lookup or (w.lookup_ctx if cooperative else w.lookup)
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(fn)])
    return Deployment(parse_config(data, path=str(path)), tools=tools)


def play(dep: Deployment, steps: int, *, is_async: bool = False) -> Run:
    """One run of ``steps`` tool-call steps and the answer; checked to end with it."""
    w = bench_common()
    model = w.WorkloadModel(steps)
    run = asyncio.run(dep.arun(w.USER, model=model)) if is_async else dep.run(w.USER, model=model)
    assert run.outcome is not None and run.outcome.termination == "final_answer", run.record()
    assert run.step == steps + 1
    return run


def calls_per_step(
    dep: Deployment, *, short: int = 5, long: int = 25, is_async: bool = False
) -> dict[str, float]:
    """Calls per step by function: the difference between a run of ``long`` steps and one of
    ``short`` (what every run does once cancels out), after a warm-up run."""
    play(dep, 2, is_async=is_async)
    _, few = count_calls(lambda: play(dep, short, is_async=is_async))
    _, many = count_calls(lambda: play(dep, long, is_async=is_async))
    return {k: (many[k] - few[k]) / (long - short) for k in set(many) | set(few)}
