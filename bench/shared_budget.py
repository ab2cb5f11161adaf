"""Shared budgets and the shared ledger under real concurrency: many processes, one tenant.

``--workers`` (default 8) processes each play ``--runs`` (default 25) runs of the built-in
``refund`` scenario for tenant ``acme``, all at once, against one ``tenant/day`` cost budget
(``--max-cost``, default 0.05 USD: about half of what the runs would spend) and one demo shop
whose order 88231 every run tries to refund.  Each worker is a separate process with its own
deployment (the shipped guards: config.toml without the observers, plus ``spend_limits``) on
the same store -- once on SQLite, once on Redis.

Reported per store:

* ``spent_cost`` / ``spent_tokens``: what the store recorded; ``bound`` = budget + one
  reserved request per worker (the largest reservation any worker made), and ``within_bound``;
* ``runs``: how the runs ended (``final_answer``; ``max_cost (cut short)``: stopped after
  some calls, ``max_cost (refused)``: refused before the first);
* ``refund_executions``: how often ``apply_refund`` actually executed across all workers (the
  shared ledger: 1), ``refund_rows`` in the shop;
* ``store_us_per_model_call``: p50 / p99 of the time spent in ``spend_limits`` per model call
  (its ``before_model`` reserve + ``after_response`` settle, each one store round trip),
  beside ``other_guards_us_per_model_call``: the rest of the guard stack's hooks for the same
  call; ``single_worker`` has the same figures for one worker alone (no CPU contention);
  ``store_cpu_us_per_model_call``: the CPU the calling thread spent in them (what a store call
  can hold an event loop's thread for, waits excluded);
* ``round_trips``: per reserve and per settle, the round trips to the store (Redis: requests;
  SQLite: transactions) and SQLite's statements, counted in each worker's second run (which
  is not timed) by :mod:`loopwarden.testing.roundtrips`;
* ``bare_round_trip_us`` (Redis): a ``PING`` on the store's connection after each settle
  (outside the timings above): the floor of one round trip at that moment, on that machine;
* ``in_flight``: one process, the store alone (no guards): p50 / p99 µs of one reserve +
  settle on a tenant's counter while 0, 100 and 1,000 other reservations of that counter are
  in flight (``--in-flight``) -- what a reserve costs when many runs of one tenant call their
  models at once (a server of async runs, a fleet of workers);
* ``load_before`` / ``load_after``: the machine's load averages (1, 5, 15 min) around the
  bench -- these figures are only comparable at a similar load.

Then two worst cases for the overspend bound, per store, each with ``--capped-workers``
(default 4) processes x ``--capped-runs`` (default 25) one-call runs against a ``tenant/day``
budget of ``--capped-budget`` (default 50,000) tokens, by a model that answers every call with
all the output it may (:class:`loopwarden.testing.faults.CappedModel`:
``--max-output-tokens``, default 4,000, the ``[model] max_output_tokens`` cap its client
sends).  What the runs *really* spent -- the usage the model reported, what a provider bills --
is compared with the bound (budget + one largest reservation per worker):

* ``capped_output``: a healthy store.  ``cap_from_config`` beside it: the same runs by a model
  that does not say its cap (no ``max_output_tokens`` of its own): the deployment's
  ``[model] max_output_tokens`` is on its requests all the same, so reservations cover it (in
  0.3 they fell back to ``reserve_output_tokens`` = 1,000 and went past the bound);
* ``flaky_store``: the same runs on a store that times out half of its calls
  (:class:`loopwarden.testing.faults.FlakyStore`: each reserve / settle fails with probability
  1/2, in turn before reaching the store and after it -- a lost answer), ``on_store_error =
  "fail_closed"``; ``store_calls`` / ``store_timeouts`` count them, ``recorded_tokens`` /
  ``held_tokens`` are what the store counts as spent / still reserved (a reservation whose
  settle failed keeps counting until ``[store] reservation_ttl_s``).

    python bench/shared_budget.py --json
    python bench/shared_budget.py --quick --json     # a smoke test of the bench itself
    python bench/shared_budget.py --timing-only       # the timed race only (no worst cases)

Redis: ``--redis-url``, else ``LOOPWARDEN_TEST_REDIS_URL``, else a ``redis-server`` on PATH
started on a free port for the bench; without any, the Redis half is reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W

from loopwarden import ModelRequest, ModelResponse, Run, Verdict, hookimpl, signals
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.demo import config_tools
from loopwarden.deployment import Deployment
from loopwarden.plugins.spend_limits import SpendLimits
from loopwarden.store import COST_UNIT, QUANTITIES, Counter, RedisStore, open_store
from loopwarden.testing.faults import CappedModel, FlakyStore, install_store
from loopwarden.testing.roundtrips import count_round_trips

OBSERVERS = ("logging", "metrics", "alerting", "run_record")


class TimedSpendLimits(SpendLimits):
    """spend_limits, timing its own hooks per model call (wall and this thread's CPU) -- or,
    while ``counting``, counting their round trips to the store instead (untimed: the
    counting itself costs a little)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.samples: list[float] = []
        self.cpu: list[float] = []
        self.pings: list[float] = []  # Redis: a bare PING after each settle (untimed above)
        self.pending: dict[str, tuple[float, float]] = {}
        self.max_reserved = 0  # the largest cost reservation, in store units
        self.max_reserved_tokens = 0  # the largest token reservation
        self.counting = False
        #: per counted call: ("reserve" | "settle", round trips, statements)
        self.counted: list[tuple[str, int, int]] = []

    def _counted(self, what: str, run: Run, hook: Any, arg: Any) -> Verdict | None:
        st = self.state(run)
        if st.shared is None:
            return cast("Verdict | None", hook(run, arg))
        with count_round_trips(st.shared.store) as counts:
            verdict = hook(run, arg)
        self.counted.append((what, counts.round_trips, len(counts.statements)))
        return cast("Verdict | None", verdict)

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        if self.counting:
            return self._counted("reserve", run, super().before_model, request)
        c, t = time.thread_time(), time.perf_counter()
        verdict = super().before_model(run, request)
        self.pending[run.run_id] = (time.perf_counter() - t, time.thread_time() - c)
        st = self.state(run)
        if st.pending is not None:
            self.max_reserved = max(self.max_reserved, st.pending[1][QUANTITIES.index("cost")])
            self.max_reserved_tokens = max(
                self.max_reserved_tokens, st.pending[1][QUANTITIES.index("tokens")]
            )
        return verdict

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        if self.counting:
            return self._counted("settle", run, super().after_response, response)
        c, t = time.thread_time(), time.perf_counter()
        verdict = super().after_response(run, response)
        wall, cpu = self.pending.pop(run.run_id, (0.0, 0.0))
        self.samples.append(wall + time.perf_counter() - t)
        self.cpu.append(cpu + time.thread_time() - c)
        st = self.state(run)
        store = st.shared.store if st.shared is not None else None
        if isinstance(store, RedisStore):  # the floor: a bare round trip, same moment
            t = time.perf_counter()
            store._r.ping()
            self.pings.append(time.perf_counter() - t)
        return verdict


def _config(store: dict[str, Any], shop: str, max_cost: float) -> Any:
    data = load_toml(default_config_path())
    plugins = data["plugins"]
    plugins["enabled"] = [n for n in plugins["enabled"] if n not in OBSERVERS] + ["spend_limits"]
    plugins["spend_limits"] = {
        "budgets": [{"scope": "tenant", "window": "day", "max_cost": max_cost}]
    }
    data["store"] = {**data.get("store", {}), **store}
    data["shop"] = {"db_path": shop}
    return parse_config(data, path="<bench>")


def worker(
    store: dict[str, Any], shop: str, max_cost: float, runs: int, start: float
) -> dict[str, Any]:
    """One process: ``runs`` refund runs for tenant acme; returns its outcomes and timings."""
    config = _config(store, shop, max_cost)
    dep = Deployment(config, plugins={"spend_limits": TimedSpendLimits}, tools=config_tools(config))
    plugin: TimedSpendLimits = dep.plugins.get("spend_limits")
    engine_hooks = dep.engine.hooks
    guard_time: list[float] = []
    inner_bm, inner_ar = engine_hooks.before_model, engine_hooks.after_response
    began: dict[str, float] = {}

    def before_model(run: Run, request: ModelRequest) -> Any:
        t = time.perf_counter()
        res = inner_bm(run, request)
        began[run.run_id] = time.perf_counter() - t
        return res

    def after_response(run: Run, response: ModelResponse) -> Any:
        t = time.perf_counter()
        res = inner_ar(run, response)
        guard_time.append(began.pop(run.run_id, 0.0) + time.perf_counter() - t)
        return res

    engine_hooks.before_model = before_model  # type: ignore[method-assign]
    engine_hooks.after_response = after_response  # type: ignore[method-assign]
    executions = [0]

    def on_tool(run: Run, *, call: Any, result: Any, **_: Any) -> None:
        if call.name == "apply_refund" and not result.skipped:
            executions[0] += 1

    dep.connect(signals.tool_finished, on_tool)
    while time.time() < start:
        time.sleep(0.001)
    ends: dict[str, int] = {}
    for i in range(runs):
        # the second run (connections open, scripts loaded) is counted instead of timed
        plugin.counting = i == 1
        n = len(guard_time)
        run = dep.run(scenario="refund", meta={"tenant": "acme"})
        if plugin.counting:
            del guard_time[n:]  # untimed by spend_limits: no "other guards" figure either
        term = run.outcome.termination if run.outcome else "?"
        if term != "final_answer":  # cut short (soft stop) or refused before the first call
            term += " (refused)" if run.step == 0 else " (cut short)"
        ends[term] = ends.get(term, 0) + 1
    dep.close()
    others = [total - own for total, own in zip(guard_time, plugin.samples, strict=False)]
    return {
        "ends": ends,
        "executions": executions[0],
        "store_s": plugin.samples,
        "store_cpu_s": plugin.cpu,
        "ping_s": plugin.pings,
        "others_s": others,
        "max_reserved": plugin.max_reserved,
        "counted": plugin.counted,
    }


class HiddenCapModel(CappedModel):
    """A CappedModel that does not say its cap (no ``max_output_tokens`` of its own): it
    answers with the request's ``max_output_tokens`` -- the deployment's -- else ``cap``."""

    def __init__(self, cap: int) -> None:
        super().__init__(None, default_output=cap)


def capped_worker(
    store: dict[str, Any],
    budget_tokens: int,
    max_output: int,
    runs: int,
    start: float,
    variant: str,
) -> dict[str, Any]:
    """One process: ``runs`` one-call runs for tenant acme by a model that answers with all
    the output it may; ``variant``: "capped", "hidden" (the model does not say its cap) or
    "flaky" (a store that times out half of its calls).  ``[model] max_output_tokens`` is set
    in every variant."""
    config = parse_config(
        {
            "model": {"max_output_tokens": max_output},
            "store": {**store, "timeout_s": 2.0},
            "plugins": {
                "enabled": ["spend_limits"],
                "spend_limits": {
                    "budgets": [{"scope": "tenant", "window": "day", "max_tokens": budget_tokens}]
                },
            },
        },
        path="<bench>",
    )
    dep = Deployment(config, plugins={"spend_limits": TimedSpendLimits})
    plugin: TimedSpendLimits = dep.plugins.get("spend_limits")
    flaky = (
        install_store(dep, lambda s: FlakyStore(s, every=2, seed=os.getpid()))
        if variant == "flaky"
        else None
    )
    while time.time() < start:
        time.sleep(0.001)
    ends: dict[str, int] = {}
    billed = 0
    for _ in range(runs):
        model = HiddenCapModel(max_output) if variant == "hidden" else CappedModel(max_output)
        run = dep.run("Summarise the quarterly report.", model=model, meta={"tenant": "acme"})
        billed += run.usage.total  # what the model reported: what a provider bills
        term = run.outcome.termination if run.outcome else "?"
        if term != "final_answer":  # a soft stop's answered last turn, or refused
            term += " (refused)" if run.step == 0 else " (cut short)"
        ends[term] = ends.get(term, 0) + 1
    dep.close()
    return {
        "ends": ends,
        "billed_tokens": billed,
        "max_reserved_tokens": plugin.max_reserved_tokens,
        "store_calls": flaky.calls if flaky is not None else 0,
        "store_timeouts": len(flaky.failed) if flaky is not None else 0,
    }


def measure_capped(
    name: str,
    store: dict[str, Any],
    workers: int,
    runs: int,
    budget_tokens: int,
    max_output: int,
    variant: str,
) -> dict[str, Any]:
    """``workers`` processes of :func:`capped_worker` at once on a fresh budget."""
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 2.0 + 0.3 * workers
    args = (store, budget_tokens, max_output, runs, start, variant)
    with ctx.Pool(workers) as pool:
        results = pool.starmap(capped_worker, [args] * workers)
    st = open_store(store["url"], namespace=store.get("namespace", "loopwarden"))
    rows = [r for r in st.rows() if r.scope == "tenant" and r.key == "acme"]
    st.close()
    tokens = QUANTITIES.index("tokens")
    billed = sum(r["billed_tokens"] for r in results)
    largest = max(r["max_reserved_tokens"] for r in results)
    bound = budget_tokens + workers * largest
    ends: dict[str, int] = {}
    for r in results:
        for k, v in r["ends"].items():
            ends[k] = ends.get(k, 0) + v
    out: dict[str, Any] = {
        "workers": workers,
        "runs_per_worker": runs,
        "budget_tokens": budget_tokens,
        "max_output_tokens": max_output,
        "spent_tokens": billed,
        "largest_reservation_tokens": largest,
        "bound_tokens": bound,
        "within_bound": billed <= bound,
        "within_budget": billed <= budget_tokens,
        "overspend_tokens": max(0, billed - budget_tokens),
        "recorded_tokens": rows[0].committed[tokens] if rows else 0,
        "held_tokens": rows[0].reserved[tokens] if rows else 0,
        "runs": dict(sorted(ends.items())),
    }
    if variant == "flaky":
        out["store_calls"] = sum(r["store_calls"] for r in results)
        out["store_timeouts"] = sum(r["store_timeouts"] for r in results)
    return out


def measure_in_flight(
    url: str, namespace: str, counts: list[int], pairs: int = 400
) -> dict[str, dict[str, float]]:
    """p50 / p99 µs of one reserve + settle on a counter while ``n`` other reservations of it
    are in flight, for each ``n`` in ``counts`` (rising: the held ones accumulate)."""
    store = open_store(url, namespace=namespace)
    c = Counter("tenant", "acme", "day", "bench", (None, None, None, None, 10**15), None)
    amount, usage = (0, 1, 0, 1000, 5000), (0, 1, 0, 900, 4000)
    out: dict[str, dict[str, float]] = {}
    held = 0
    try:
        for n in sorted(counts):
            while held < n:
                store.reserve([c], amount, token=f"held-{held}", ttl_s=3600)
                held += 1
            for i in range(pairs // 10):  # warm-up
                store.reserve([c], amount, token=f"w{i}", ttl_s=60)
                store.settle([c], f"w{i}", usage)
            times = []
            for i in range(pairs):
                t = time.perf_counter()
                store.reserve([c], amount, token=f"p{i}", ttl_s=60)
                store.settle([c], f"p{i}", usage)
                times.append((time.perf_counter() - t) * 1e6)
            out[str(n)] = {"p50": round(_pct(times, 0.5), 1), "p99": round(_pct(times, 0.99), 1)}
        store.reset("tenant", "acme")
    finally:
        store.close()
    return out


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def measure(
    name: str, store: dict[str, Any], workers: int, runs: int, max_cost: float
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"lw-bench-{name}-"))
    try:
        shop = str(tmp / "shop.sqlite3")
        from loopwarden.demo.shop import Shop

        Shop(shop).refunds()  # created and seeded once, before the race
        ctx = multiprocessing.get_context("spawn")
        start = time.time() + 3.0 + 0.3 * workers
        with ctx.Pool(workers) as pool:
            results = pool.starmap(worker, [(store, shop, max_cost, runs, start)] * workers)
        st = open_store(store["url"], namespace=store.get("namespace", "loopwarden"))
        rows = [r for r in st.rows() if r.scope == "tenant" and r.key == "acme"]
        st.close()
        committed = rows[0].committed if rows else (0,) * len(QUANTITIES)
        spent = Decimal(committed[QUANTITIES.index("cost")]) * COST_UNIT
        reserved_max = Decimal(max(r["max_reserved"] for r in results)) * COST_UNIT
        bound = Decimal(str(max_cost)) + workers * reserved_max
        ends: dict[str, int] = {}
        for r in results:
            for k, v in r["ends"].items():
                ends[k] = ends.get(k, 0) + v
        store_us = [s * 1e6 for r in results for s in r["store_s"]]
        cpu_us = [s * 1e6 for r in results for s in r["store_cpu_s"]]
        ping_us = [s * 1e6 for r in results for s in r["ping_s"]]
        other_us = [s * 1e6 for r in results for s in r["others_s"]]
        counted = [c for r in results for c in r["counted"]]
        return {
            "workers": workers,
            "runs_per_worker": runs,
            "budget_cost": max_cost,
            "spent_cost": float(spent),
            "spent_tokens": committed[QUANTITIES.index("tokens")],
            "runs_counted": committed[QUANTITIES.index("runs")],
            "largest_reservation_cost": float(reserved_max),
            "bound": float(bound),
            "within_bound": spent <= bound,
            "overspend_cost": float(max(Decimal(0), spent - Decimal(str(max_cost)))),
            "runs": dict(sorted(ends.items())),
            "refund_executions": sum(r["executions"] for r in results),
            "refund_rows": len(Shop(shop).refunds()),
            "model_calls": len(store_us),
            "store_us_per_model_call": {
                "p50": round(_pct(store_us, 0.5), 1),
                "p99": round(_pct(store_us, 0.99), 1),
            },
            "store_cpu_us_per_model_call": {
                "p50": round(_pct(cpu_us, 0.5), 1),
                "p99": round(_pct(cpu_us, 0.99), 1),
            },
            "round_trips": _round_trips(counted),
            "bare_round_trip_us": {  # Redis: a PING, the floor of any round trip
                "p50": round(_pct(ping_us, 0.5), 1),
                "p99": round(_pct(ping_us, 0.99), 1),
            }
            if ping_us
            else None,
            "other_guards_us_per_model_call": {
                "p50": round(_pct(other_us, 0.5), 1),
                "p99": round(_pct(other_us, 0.99), 1),
            },
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _round_trips(counted: list[tuple[str, int, int]]) -> dict[str, Any]:
    """Per reserve and per settle: the most round trips and statements (SQLite) any took,
    and the median of statements (a prune every 8th write adds two)."""
    out: dict[str, Any] = {}
    for what in ("reserve", "settle"):
        calls = [c for c in counted if c[0] == what]
        out[what] = {
            "calls": len(calls),
            "round_trips": max((c[1] for c in calls), default=0),
            "statements": max((c[2] for c in calls), default=0),
            "statements_p50": int(_pct([c[2] for c in calls], 0.5)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=25, help="runs per worker")
    parser.add_argument("--max-cost", type=float, default=0.05, help="the tenant/day budget in USD")
    parser.add_argument("--stores", default="sqlite,redis")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--quick", action="store_true", help="2 workers x 3 runs (smoke test)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="only the timed race and the one worker alone (no worst cases for the bound)",
    )
    parser.add_argument("--capped-workers", type=int, default=4)
    parser.add_argument("--capped-runs", type=int, default=25, help="one-call runs per worker")
    parser.add_argument("--capped-budget", type=int, default=50_000, help="tenant/day tokens")
    parser.add_argument("--max-output-tokens", type=int, default=4000)
    parser.add_argument(
        "--in-flight",
        type=int,
        nargs="*",
        default=[0, 100, 1000],
        help="reservations held on the counter while one reserve + settle is timed",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.runs, args.max_cost = 2, 3, 0.01
        args.capped_workers, args.capped_runs, args.capped_budget = 2, 4, 10_000
        args.in_flight = [0, 10]
    out: dict[str, Any] = {
        "bench": "shared_budget",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "stores": {},
    }
    with contextlib.ExitStack() as stack:
        for name in args.stores.split(","):
            if name == "sqlite":
                tmp = tempfile.mkdtemp(prefix="lw-bench-store-")
                store = {"url": f"sqlite:///{tmp}/store.sqlite3"}
            else:
                url = args.redis_url or os.environ.get("LOOPWARDEN_TEST_REDIS_URL")
                if url is None and shutil.which("redis-server"):
                    url = stack.enter_context(W.redis_server())
                if url is None:
                    out["stores"][name] = {"skipped": "no redis-server (give --redis-url)"}
                    continue
                store = {"url": url, "namespace": "lwbench-" + uuid.uuid4().hex[:8]}
            out["stores"][name] = result = measure(
                name, store, args.workers, args.runs, args.max_cost
            )
            # the same store, one worker, a budget it never reaches: the store's round trips
            # without 8 processes competing for the CPU (and, for Redis, with its server)
            alone = {**store, "url": store["url"].replace("store.sqlite3", "alone.sqlite3")}
            if "namespace" in store:
                alone["namespace"] = store["namespace"] + "-alone"
            single = measure(name, alone, 1, args.runs, 1000.0)
            result["single_worker"] = {
                k: single[k]
                for k in (
                    "model_calls",
                    "store_us_per_model_call",
                    "store_cpu_us_per_model_call",
                    "other_guards_us_per_model_call",
                    "round_trips",
                    "bare_round_trip_us",
                )
            }
            if args.in_flight:
                result["in_flight"] = measure_in_flight(
                    alone["url"].replace("alone.sqlite3", "in-flight.sqlite3"),
                    store.get("namespace", "loopwarden") + "-in-flight",
                    args.in_flight,
                    pairs=40 if args.quick else 400,
                )
            for variant, key in (
                ()
                if args.timing_only
                else (
                    ("capped", "capped_output"),
                    ("hidden", "cap_from_config"),
                    ("flaky", "flaky_store"),
                )
            ):
                fresh = {
                    **store,
                    "url": store["url"].replace("store.sqlite3", f"{variant}.sqlite3"),
                }
                if "namespace" in store:
                    fresh["namespace"] = f"{store['namespace']}-{variant}"
                result[key] = measure_capped(
                    name,
                    fresh,
                    args.capped_workers,
                    args.capped_runs,
                    args.capped_budget,
                    args.max_output_tokens,
                    variant,
                )
            if name == "sqlite":
                shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, r in out["stores"].items():
        if "skipped" in r:
            print(f"{name}: skipped ({r['skipped']})")
            continue
        print(
            f"{name}: {r['workers']} workers x {r['runs_per_worker']} runs, budget "
            f"{r['budget_cost']} USD: spent {r['spent_cost']:.6f} (bound {r['bound']:.6f}, "
            f"within: {r['within_bound']}); runs {r['runs']}; refund executions "
            f"{r['refund_executions']}, rows {r['refund_rows']}; store "
            f"{r['store_us_per_model_call']} us per model call, other guards "
            f"{r['other_guards_us_per_model_call']} us; one worker alone: store "
            f"{r['single_worker']['store_us_per_model_call']} us, other guards "
            f"{r['single_worker']['other_guards_us_per_model_call']} us"
        )
        for what in ("reserve", "settle"):
            rt = r["round_trips"][what]
            print(
                f"  per {what}: {rt['round_trips']} round trip(s)"
                + (
                    f", SQLite statements {rt['statements_p50']} (at most {rt['statements']})"
                    if rt["statements"]
                    else ""
                )
            )
        if "in_flight" in r:
            print(
                "  one reserve + settle with N others in flight (us p50 / p99): "
                + "; ".join(f"N={n}: {v['p50']} / {v['p99']}" for n, v in r["in_flight"].items())
            )
        for key in ("capped_output", "cap_from_config", "flaky_store"):
            if key not in r:
                continue
            c = r[key]
            print(
                f"  {key}: {c['workers']} workers x {c['runs_per_worker']} runs, budget "
                f"{c['budget_tokens']} tokens, max_output_tokens {c['max_output_tokens']}: "
                f"spent {c['spent_tokens']} (bound {c['bound_tokens']}, within: "
                f"{c['within_bound']}); runs {c['runs']}"
                + (
                    f"; store timeouts {c['store_timeouts']} of {c['store_calls']} calls"
                    if "store_calls" in c
                    else ""
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
