"""Per-step overhead of the guarded loop, against a bare loop and the pluggy floor.

The same scripted workload -- N steps, each one tool call to a trivial tool with distinct
arguments and a distinct result (no guard fires), then a final answer, from an instant
in-process model -- runs these ways in one process, interleaved:

``bare``          a plain agent loop of about 20 lines (no validation, no hooks)
``pluggy_floor``  the bare loop calling 6 trivial pluggy plugins on 5 hooks
``empty``         loopwarden with no plugins enabled; max_steps is essential and always loaded,
                  so "empty" means the essential max_steps only
``default``       loopwarden with the shipped config.toml (every plugin it enables), limits
                  raised above the workload through config overrides so the guards run every
                  step but never stop it; every run is checked to end with ``final_answer``.
                  Python logging stays at WARNING (routine events are not written), metrics on.
``default_ctx``   the same, with the trivial tool taking a ``ToolContext``: a cooperative tool
                  runs inline, while a plain blocking one (``default``) runs in a worker thread
                  so that the timeout plugin's deadline can abandon it -- the difference is the
                  cost of that thread hand-off
``default_async``, ``default_ctx_async``  (with ``--async``) ``default`` and ``default_ctx``
                  through ``await Deployment.arun()`` on one reused event loop, with an async
                  model that answers at once: ``async_to_sync`` is the ratio of each to its
                  sync twin, in microseconds per step and in function calls per step
``empty_pluggy``, ``default_ctx_pluggy``  (with ``--via-pluggy``) ``empty`` and ``default_ctx``
                  with the hook facade's direct calls switched off, so that pluggy dispatches
                  every hook (as it does while a hook is wrapped or monitored):
                  ``direct_saves_us`` is what the direct calls save per step
``otel_api``      ``default_ctx`` plus the ``otel`` plugin on the OpenTelemetry API's no-op
                  providers: what the plugin costs when the application set no SDK
``otel_sdk``      ``default_ctx`` plus the ``otel`` plugin on real SDK providers: a
                  ``TracerProvider`` whose batching span processor hands every span to a no-op
                  exporter, a ``MeterProvider`` aggregating in memory -- everything but the
                  network.  ``otel_us_per_step`` is what each adds per step to ``default_ctx``
                  in CPU time of the running thread (targets: ``otel_api`` at most 10 us,
                  ``otel_sdk`` at most 50 us), measured apart from the wall-clock table
                  (:func:`otel_cost`): on a shared machine the wall clock's noise is larger
                  than the figure.  Its ``otel_sdk_floor`` is the SDK alone doing what the
                  plugin asks of it per step -- the same two spans under a run span and three
                  histogram points, with the plugin's attributes -- timed in the same rounds:
                  the part of ``otel_sdk`` that is the SDK's.  All are left out, and the output
                  says so, when opentelemetry-sdk is not installed (``loopwarden[otel]``).

It prints microseconds per step (the median of ``--runs`` runs; per step = run time / N) for
N = 10, 50 and 500, each as a ratio to the bare loop, plus the time of ``import loopwarden``
and of ``loopwarden --help`` in fresh subprocesses.

    python bench/overhead.py            # a table
    python bench/overhead.py --json     # one JSON object
    python bench/overhead.py --quick    # 3 runs per size (a smoke test of the bench itself)
    python bench/overhead.py --profile default --sizes 500 --runs 10   # where the time goes
    python bench/overhead.py --async --calls --sizes 50   # async vs sync: us and calls per step
    python bench/overhead.py --turns 100 --calls --sizes 10   # a 100-turn conversation

``--turns N`` (e.g. 100) also plays one ``loopwarden.Conversation`` of N turns -- each a call
to the trivial tool with that turn's arguments, then the answer -- through the shipped config
(limits raised, ``conversation_limits``' too; every turn is checked to end with its answer,
with no warning or verdict), and the same conversation through the bare loop (the history
carries on, the whole of it resent to the model every turn), interleaved, alternated, median of
9 conversations (3 with ``--quick``) per turn: ``turns.us_per_turn`` gives the mean of the
first and of the last 10 turns and ``last_to_first`` (target: at most 1.2x: conversation state
bounded); with ``--calls`` also ``turns.calls_per_turn``, cProfile's count over the same turns.
The instant model does not read the history, so what grows is loopwarden's own work.

``--calls`` adds ``calls_per_step``: the Python function calls cProfile counts per step of each
variant (N = the last size) -- deterministic, so unlike the timings it does not move with the
load of a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W
import pluggy

VARIANTS = ("bare", "pluggy_floor", "empty", "default", "default_ctx", "otel_api", "otel_sdk")
#: with ``--async``: the async driver (``Deployment.arun``) on the workloads of its sync twin
ASYNC_VARIANTS = {"default_async": "default", "default_ctx_async": "default_ctx"}
#: ``--via-pluggy``: each twin with the facade's direct calls off (pluggy dispatches every hook)
PLUGGY_VARIANTS = {"empty_pluggy": "empty", "default_ctx_pluggy": "default_ctx"}
OTEL_VARIANTS = ("otel_api", "otel_sdk")

# -- 1. the bare loop -------------------------------------------------------------------------


class BareModel:
    """An instant model in OpenAI's message format: N tool-call turns, then the answer."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __call__(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        i = self.i
        self.i += 1
        if i >= self.n:
            return {"content": W.FINAL, "tool_calls": []}
        return {
            "content": W.content(i),
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": W.arguments(i)},
                }
            ],
        }


TOOLS: dict[str, Callable[..., Any]] = {"lookup": W.lookup}


def bare_loop(n: int) -> str:
    model = BareModel(n)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": W.SYSTEM},
        {"role": "user", "content": W.USER},
    ]
    while True:
        reply = model(messages)
        messages.append(
            {"role": "assistant", "content": reply["content"], "tool_calls": reply["tool_calls"]}
        )
        if not reply["tool_calls"]:
            return str(reply["content"])
        for tc in reply["tool_calls"]:
            fn = TOOLS[tc["function"]["name"]]
            args = json.loads(tc["function"]["arguments"])
            out = fn(**args)
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": str(out)})


# -- 2. the pluggy floor: the bare loop + 6 trivial plugins x 5 hooks -------------------------

_spec = pluggy.HookspecMarker("floor")
_impl = pluggy.HookimplMarker("floor")


class _Specs:
    @_spec
    def before_model(self, run: Any, request: Any) -> Any: ...

    @_spec
    def after_response(self, run: Any, response: Any) -> Any: ...

    @_spec
    def before_tool(self, run: Any, call: Any) -> Any: ...

    @_spec
    def after_tool(self, run: Any, call: Any, result: Any) -> Any: ...

    @_spec
    def on_stop(self, run: Any, outcome: Any) -> Any: ...


class _Trivial:
    @_impl
    def before_model(self, run: Any, request: Any) -> None:
        return None

    @_impl
    def after_response(self, run: Any, response: Any) -> None:
        return None

    @_impl
    def before_tool(self, run: Any, call: Any) -> None:
        return None

    @_impl
    def after_tool(self, run: Any, call: Any, result: Any) -> None:
        return None

    @_impl
    def on_stop(self, run: Any, outcome: Any) -> None:
        return None


def make_floor() -> Callable[[int], str]:
    pm = pluggy.PluginManager("floor")
    pm.add_hookspecs(_Specs)
    for i in range(6):
        pm.register(_Trivial(), name=f"p{i}")
    h = pm.hook

    def floor_loop(n: int) -> str:
        model = BareModel(n)
        run: dict[str, Any] = {
            "messages": [
                {"role": "system", "content": W.SYSTEM},
                {"role": "user", "content": W.USER},
            ]
        }
        messages = run["messages"]
        while True:
            h.before_model(run=run, request=messages)
            reply = model(messages)
            messages.append(
                {
                    "role": "assistant",
                    "content": reply["content"],
                    "tool_calls": reply["tool_calls"],
                }
            )
            h.after_response(run=run, response=reply)
            if not reply["tool_calls"]:
                h.on_stop(run=run, outcome=reply["content"])
                return str(reply["content"])
            for tc in reply["tool_calls"]:
                h.before_tool(run=run, call=tc)
                fn = TOOLS[tc["function"]["name"]]
                out = str(fn(**json.loads(tc["function"]["arguments"])))
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": out})
                h.after_tool(run=run, call=tc, result=out)

    return floor_loop


# -- 3 and 4. loopwarden ------------------------------------------------------------------------


def _sdk_providers() -> tuple[Any, Any]:
    """A ``TracerProvider`` batching spans to a no-op exporter, a ``MeterProvider`` reading
    in memory: everything but the network."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class NoOpExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(NoOpExporter()))
    return tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()])


def otel_plugins() -> dict[str, Any]:
    """The otel plugin on the API's no-op providers and on SDK providers with a no-op span
    exporter, by variant name (empty without the SDK)."""
    try:
        from opentelemetry.metrics import NoOpMeterProvider
        from opentelemetry.trace import NoOpTracerProvider

        from loopwarden.plugins.otel import OTel

        tracer_provider, meter_provider = _sdk_providers()
    except ImportError:
        return {}
    return {
        "otel_api": OTel(tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider()),
        "otel_sdk": OTel(tracer_provider=tracer_provider, meter_provider=meter_provider),
    }


def otel_sdk_floor() -> Callable[[int], str]:
    """N steps of what ``otel_sdk`` asks of the SDK per step of the workload, and nothing else:
    a ``chat`` and an ``execute_tool`` span under a run span and three histogram points
    (duration, input and output tokens), with the plugin's attributes and instruments."""
    from opentelemetry.trace import SpanKind, set_span_in_context

    from loopwarden.plugins._otel import Instruments
    from loopwarden.plugins.otel import counter_names

    tracer_provider, meter_provider = _sdk_providers()
    tracer = tracer_provider.get_tracer("loopwarden")
    inst = Instruments(meter_provider.get_meter("loopwarden"), counter_names(), meter_provider)
    model = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai"}
    model |= {"gen_ai.request.model": "instant", "gen_ai.response.model": "instant"}
    tokens_in = {**model, "gen_ai.token.type": "input"}
    tokens_out = {**model, "gen_ai.token.type": "output"}

    def floor(n: int) -> str:
        run_span = tracer.start_span("invoke_agent loopwarden", attributes=model)
        ctx = set_span_in_context(run_span)
        for step in range(1, n + 1):
            now = time.time_ns()
            inst.duration.record(0.001, model)
            inst.token_usage.record(100 + step, tokens_in)
            inst.token_usage.record(16, tokens_out)
            chat = {**model, "gen_ai.usage.input_tokens": 100 + step}
            chat |= {"gen_ai.usage.output_tokens": 16, "loopwarden.step": step}
            chat["gen_ai.response.finish_reasons"] = ("tool_calls",)
            tracer.start_span(
                "chat instant", ctx, SpanKind.CLIENT, chat, start_time=now - 1000
            ).end(end_time=now)
            call = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
            call |= {"gen_ai.tool.call.id": f"call_{step}", "gen_ai.tool.type": "function"}
            call |= {"loopwarden.step": step, "loopwarden.tool.outcome": "ok"}
            tracer.start_span(
                "execute_tool lookup", ctx, SpanKind.INTERNAL, call, start_time=now - 1000
            ).end(end_time=now)
        run_span.end()
        return ""

    return floor


def make_loopwarden(
    shipped: bool,
    cooperative: bool = False,
    otel: Any = None,
    is_async: bool = False,
    via_pluggy: bool = False,
) -> tuple[Callable[[int], str], list[str]]:
    from loopwarden import Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config
    from loopwarden.tools import ToolRegistry, tool

    InstantModel = W.WorkloadModel

    if shipped:
        path = default_config_path()
        base = load_toml(path)
    else:
        path, base = Path("<empty>"), {"plugins": {"enabled": []}}
    data = W.bench_config_data(base)
    if otel is not None:
        data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "otel"]
    config = parse_config(data, path=str(path))
    fn = W.lookup_ctx if cooperative else W.lookup
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(fn)])
    dep = Deployment(config, tools=tools, plugins={"otel": otel} if otel is not None else None)
    if via_pluggy:  # the facade's direct calls off: every hook through pluggy's own dispatch
        dep.hooks._ours = False

    loop = asyncio.new_event_loop() if is_async else None

    def lw_loop(n: int) -> str:
        if loop is not None:
            run = loop.run_until_complete(dep.arun(W.USER, model=InstantModel(n)))
        else:
            run = dep.run(W.USER, model=InstantModel(n))
        o = run.outcome
        if o is None or o.termination != "final_answer" or run.step != n + 1:
            raise SystemExit(
                f"bench: a {'default' if shipped else 'empty'} run of N={n} did not end with "
                f"final_answer after {n + 1} steps: {run.record()}"
            )
        return o.final_answer or ""

    return lw_loop, dep.plugins.names


# -- 5. a conversation of many turns ----------------------------------------------------------

#: turns averaged at each end of a conversation (``--turns``): its first and its last ten
TURN_WINDOW = 10


def turn_user(t: int) -> str:
    """The user's message of turn ``t``: distinct, so no guard sees a repeated turn."""
    return f"{W.USER} (turn {t})"


def turn_model(t: int) -> W.WorkloadModel:
    """The model of turn ``t``: one call to the trivial tool with turn ``t``'s arguments (so
    they differ from every earlier turn's), then the answer."""
    model = W.WorkloadModel(t + 1)
    model.i = t
    return model


def bare_conversation(turns: int, clock: Callable[[], int] = time.perf_counter_ns) -> list[int]:
    """Nanoseconds of each turn of a conversation through the bare loop: the history carries on,
    each turn appends the user's message and resends the whole history to the model."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": W.SYSTEM}]
    out = []
    for t in range(turns):
        t0 = clock()
        model = BareModel(t + 1)
        model.i = t
        messages.append({"role": "user", "content": turn_user(t)})
        while True:
            reply = model(messages)
            messages.append(
                {
                    "role": "assistant",
                    "content": reply["content"],
                    "tool_calls": reply["tool_calls"],
                }
            )
            if not reply["tool_calls"]:
                break
            for tc in reply["tool_calls"]:
                fn = TOOLS[tc["function"]["name"]]
                result = str(fn(**json.loads(tc["function"]["arguments"])))
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
        out.append(clock() - t0)
    return out


def make_conversation() -> tuple[Callable[[int], list[int]], list[str]]:
    """A function playing one ``loopwarden.Conversation`` of N turns through a Deployment with
    the shipped config (limits raised, ``conversation_limits``' too), returning the
    nanoseconds of each turn; every turn is checked to end with its answer after two steps,
    with no warning and no verdict (nothing grew into a limit)."""
    from loopwarden import Conversation, Deployment
    from loopwarden.config import default_config_path, load_toml, parse_config
    from loopwarden.tools import ToolRegistry, tool

    path = default_config_path()
    config = parse_config(W.bench_config_data(load_toml(path)), path=str(path))
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(W.lookup)])
    dep = Deployment(config, tools=tools)

    def conversation(turns: int, clock: Callable[[], int] = time.perf_counter_ns) -> list[int]:
        conv = Conversation()
        out = []
        for t in range(turns):
            t0 = clock()
            run = dep.run(turn_user(t), model=turn_model(t), conversation=conv)
            out.append(clock() - t0)
            o = run.outcome
            if (
                o is None
                or o.termination != "final_answer"
                or run.step != 2
                or run.warnings
                or run.verdicts
            ):
                raise SystemExit(
                    f"bench: turn {t} of a conversation did not end with final_answer after "
                    f"2 steps, without a warning or verdict: {run.record()}"
                )
        return out

    return conversation, dep.plugins.names


def _ends(per_turn: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last :data:`TURN_WINDOW` turns."""
    k = min(TURN_WINDOW, max(1, len(per_turn) // 2))
    return statistics.fmean(per_turn[:k]), statistics.fmean(per_turn[-k:])


def measure_turns(
    fns: dict[str, Callable[[int], list[int]]], turns: int, runs: int, warmup: int = 1
) -> dict[str, dict[str, float]]:
    """Microseconds per turn of the first and the last turns of a conversation of ``turns``
    turns, and ``last_to_first``: each turn's median over ``runs`` conversations (variants
    interleaved, order alternated), then the mean of the first and last ten turns."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(turns)
    times: dict[str, list[list[int]]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(runs):
        for name in names if r % 2 == 0 else names[::-1]:
            gc.collect()
            times[name].append(fns[name](turns))
    out: dict[str, dict[str, float]] = {}
    for name, convs in times.items():
        per_turn = [statistics.median(c[t] for c in convs) / 1000 for t in range(turns)]
        first, last = _ends(per_turn)
        out[name] = {
            "first_us": round(first, 1),
            "last_us": round(last, 1),
            "last_to_first": round(last / first, 2),
        }
    return out


def calls_per_turn(fn: Callable[..., list[int]], turns: int) -> dict[str, float]:
    """Python function calls per turn, as cProfile counts them, in the first and in the last
    :data:`TURN_WINDOW` turns of one conversation: what grows with the number of turns,
    independent of the machine's load.  The profiler is switched on only around those turns
    (the clock's calls switch it)."""
    import cProfile
    import pstats

    k = min(TURN_WINDOW, max(1, turns // 2))
    profs = {"first": cProfile.Profile(), "last": cProfile.Profile()}
    counter = iter(range(2 * turns))

    def clock() -> int:
        i = next(counter)  # even: a turn starts; odd: it ended
        t, end = divmod(i, 2)
        prof = profs["first"] if t < k else profs["last"] if t >= turns - k else None
        if prof is not None and end:
            prof.disable()
        elif prof is not None:
            prof.enable()
        return 0

    fn(turns, clock)
    calls = {name: pstats.Stats(p).total_calls / k for name, p in profs.items()}
    return {
        "first": round(calls["first"], 1),
        "last": round(calls["last"], 1),
        "last_to_first": round(calls["last"] / calls["first"], 2),
    }


# -- measuring ----------------------------------------------------------------------------------


def measure(
    fns: dict[str, Callable[[int], str]],
    n: int,
    runs: int,
    warmup: int = 3,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, float]:
    """Median microseconds per step of each variant; variants interleaved, order rotated."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(n)
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(runs):
        gc.collect()
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = fns[name]
            t0 = clock()
            fn(n)
            times[name].append((clock() - t0) / 1000 / n)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def otel_cost(
    fns: dict[str, Callable[[int], str]], sizes: list[int], runs: int, warmup: int
) -> dict[str, dict[str, float]]:
    """What each otel variant adds per step to ``default_ctx``, in CPU time of the running
    thread (``time.thread_time_ns``): everything runs inline there with a cooperative tool, and
    on a shared machine the wall clock also counts the time other processes hold the CPU --
    more than the few microseconds measured here."""
    names = ["default_ctx", *(v for v in OTEL_VARIANTS if v in fns)]
    cost: dict[str, dict[str, float]] = {v: {} for v in names[1:]}
    timed = {k: fns[k] for k in names}
    if "otel_sdk" in fns:  # the SDK's share of it, in the same rounds
        timed["otel_sdk_floor"] = otel_sdk_floor()
        cost["otel_sdk_floor"] = {}
    for n in sizes:
        cpu = measure(timed, n, runs, warmup, clock=time.thread_time_ns)
        for v in names[1:]:
            cost[v][str(n)] = round(cpu[v] - cpu["default_ctx"], 2)
        if "otel_sdk_floor" in cpu:
            cost["otel_sdk_floor"][str(n)] = round(cpu["otel_sdk_floor"], 2)
    return cost


def _subprocess_ms(cmd: list[str], repeat: int, inner: bool = False) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        wall = (time.perf_counter() - t0) * 1000
        out.append(float(proc.stdout.strip().splitlines()[-1]) if inner else wall)
    return round(statistics.median(out), 2)


def import_ms(repeat: int) -> float:
    """Median time of ``import loopwarden`` in fresh interpreters (the import only)."""
    code = (
        "import time; t = time.perf_counter(); import loopwarden; "
        "print((time.perf_counter() - t) * 1000)"
    )
    return _subprocess_ms([sys.executable, "-c", code], repeat, inner=True)


def _console_script() -> list[str]:
    """The installed ``loopwarden`` command next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).parent / "loopwarden"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "loopwarden"]


def startup_ms(repeat: int) -> dict[str, float]:
    """Median wall times of whole processes: python itself, ``loopwarden --help``, and
    ``import loopwarden`` plus what a first run needs (Deployment)."""
    deployment = (
        "import time; t = time.perf_counter(); from loopwarden import Deployment; "
        "print((time.perf_counter() - t) * 1000)"
    )
    return {
        "python_startup_ms": _subprocess_ms([sys.executable, "-c", "pass"], repeat),
        "help_ms": _subprocess_ms([*_console_script(), "--help"], repeat),
        "import_deployment_ms": _subprocess_ms(
            [sys.executable, "-c", deployment], repeat, inner=True
        ),
    }


def _profiled(fn: Callable[[int], str], n: int, runs: int, warmup: int) -> Any:
    """``pstats.Stats`` of ``runs`` runs of N steps under cProfile, after ``warmup`` runs."""
    import cProfile
    import pstats

    for _ in range(warmup):
        fn(n)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        fn(n)
    prof.disable()
    return pstats.Stats(prof)


def calls_per_step(fns: dict[str, Callable[[int], str]], n: int, runs: int = 3) -> dict[str, float]:
    """Python function calls per step of each variant, as cProfile counts them (after a
    warm-up run): a deterministic measure of the work, unmoved by the machine's load."""
    return {
        name: round(_profiled(fn, n, runs, warmup=1).total_calls / runs / n, 1)
        for name, fn in fns.items()
    }


def profile(fn: Callable[[int], str], n: int, runs: int) -> int:
    """Where the time goes: cProfile over ``runs`` runs of N steps, by own time."""
    _profiled(fn, n, runs, warmup=3).strip_dirs().sort_stats("tottime").print_stats(40)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="3 runs per size, few import timings: a smoke test of the bench",
    )
    ap.add_argument("--runs", type=int, default=None, help="runs per size and variant (>= 30)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N")
    ap.add_argument(
        "--async",
        dest="with_async",
        action="store_true",
        help="also time default and default_ctx through Deployment.arun (async_to_sync)",
    )
    ap.add_argument(
        "--via-pluggy",
        action="store_true",
        help="also time empty and default_ctx with every hook dispatched by pluggy "
        "(direct_saves_us: what the hook facade's direct calls save per step)",
    )
    ap.add_argument(
        "--calls",
        action="store_true",
        help="also count Python function calls per step of each variant (cProfile)",
    )
    ap.add_argument(
        "--profile",
        choices=(*VARIANTS, *ASYNC_VARIANTS, *PLUGGY_VARIANTS),
        default=None,
        help="instead of timing: run this variant under cProfile (N = the last "
        "size) and print the 40 most expensive functions",
    )
    ap.add_argument(
        "--turns",
        type=int,
        default=None,
        metavar="N",
        help="also play one Conversation of N turns (e.g. 100; each a tool call then an "
        "answer) through the shipped stack and the bare loop: us per turn of the first and "
        "last 10 turns and their ratio (last_to_first); with --calls, also cProfile's calls "
        "per turn",
    )
    args = ap.parse_args(argv)
    if args.turns is not None and args.turns < 2:
        ap.error("--turns: at least 2")
    sizes = args.sizes or [10, 50, 500]
    runs = args.runs or (3 if args.quick else 31)
    repeat = 2 if args.quick else 9
    logging.basicConfig(level=logging.WARNING)

    default_fn, default_plugins = make_loopwarden(shipped=True)
    ctx_fn, _ = make_loopwarden(shipped=True, cooperative=True)
    empty_fn, empty_plugins = make_loopwarden(shipped=False)
    fns = {
        "bare": bare_loop,
        "pluggy_floor": make_floor(),
        "empty": empty_fn,
        "default": default_fn,
        "default_ctx": ctx_fn,
    }
    otel = otel_plugins()
    for name, plugin in otel.items():
        fns[name], _ = make_loopwarden(shipped=True, cooperative=True, otel=plugin)
    if args.profile in PLUGGY_VARIANTS:
        args.via_pluggy = True
    if args.with_async or args.profile in ASYNC_VARIANTS:
        fns["default_async"], _ = make_loopwarden(shipped=True, is_async=True)
        fns["default_ctx_async"], _ = make_loopwarden(shipped=True, cooperative=True, is_async=True)
    if args.via_pluggy:
        fns["empty_pluggy"], _ = make_loopwarden(shipped=False, via_pluggy=True)
        fns["default_ctx_pluggy"], _ = make_loopwarden(
            shipped=True, cooperative=True, via_pluggy=True
        )
    variants = [v for v in (*VARIANTS, *ASYNC_VARIANTS, *PLUGGY_VARIANTS) if v in fns]
    if args.profile and args.profile not in fns:
        ap.error(f"{args.profile}: opentelemetry-sdk is not installed (loopwarden[otel])")
    if args.profile:
        return profile(fns[args.profile], sizes[-1], runs)
    per_step: dict[str, dict[str, float]] = {}
    for n in sizes:
        per_step[str(n)] = measure(fns, n, runs, warmup=1 if args.quick else 3)
    ratios = {
        n: {k: round(v / row["bare"], 2) for k, v in row.items()} for n, row in per_step.items()
    }
    result: dict[str, Any] = {
        "us_per_step": per_step,
        "import_ms": import_ms(repeat),
        "python": platform.python_version(),
        "machine": W.machine(),
        "ratio_to_bare": ratios,
        "otel_us_per_step": otel_cost(fns, sizes, runs, 1 if args.quick else 3),
        **startup_ms(repeat),
        "runs": runs,
        "plugins": {"empty": empty_plugins, "default": default_plugins},
        "note": '"empty" = the essential max_steps only (it cannot be disabled)',
    }
    if args.with_async:
        result["async_to_sync"] = {
            n: {a: round(row[a] / row[s], 2) for a, s in ASYNC_VARIANTS.items()}
            for n, row in per_step.items()
        }
    if args.via_pluggy:
        result["direct_saves_us"] = {
            n: {d: round(row[p] - row[d], 1) for p, d in PLUGGY_VARIANTS.items()}
            for n, row in per_step.items()
        }
    if args.calls:
        calls = calls_per_step({k: fns[k] for k in variants}, sizes[-1])
        result["calls_per_step"] = {str(sizes[-1]): calls}
        if args.with_async:
            result["async_to_sync_calls"] = {
                a: round(calls[a] / calls[s], 2) for a, s in ASYNC_VARIANTS.items()
            }
    if args.turns:
        conversation_fn, _ = make_conversation()
        turn_fns = {"bare": bare_conversation, "default": conversation_fn}
        result["turns"] = {
            "turns": args.turns,
            "runs": 3 if args.quick else 9,
            "us_per_turn": measure_turns(turn_fns, args.turns, 3 if args.quick else 9),
        }
        if args.calls:
            result["turns"]["calls_per_turn"] = {
                k: calls_per_turn(fn, args.turns) for k, fn in turn_fns.items()
            }
    if len(sizes) >= 2:
        a, b = str(sizes[-2]), str(sizes[-1])
        result["growth"] = {
            f"{b}/{a}": {k: round(per_step[b][k] / per_step[a][k], 2) for k in variants}
        }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"loopwarden overhead -- python {result['python']} on {result['machine']}")
    print(f"median of {runs} runs, interleaved; microseconds per step (ratio to bare)")
    print(f"{'N':>6}  " + "  ".join(f"{v:>17}" for v in variants))
    for n, row in per_step.items():
        cells = [f"{row[v]:>8.1f} ({ratios[n][v]:>5.1f}x)" for v in variants]
        print(f"{n:>6}  " + "  ".join(cells))
    for label, growth in result.get("growth", {}).items():
        print(f"growth {label}: " + ", ".join(f"{k} {v:.2f}x" for k, v in growth.items()))
    print("empty   = " + ", ".join(empty_plugins) + "  (max_steps is essential: always loaded)")
    print("default = " + ", ".join(default_plugins) + "  (the shipped config.toml)")
    print("default_ctx = default with a cooperative tool (takes ToolContext: runs inline)")
    for n, row in result.get("async_to_sync", {}).items():
        print(f"async/sync N={n}: " + ", ".join(f"{k} {v:.2f}x" for k, v in row.items()))
    for n, row in result.get("direct_saves_us", {}).items():
        print(
            f"direct calls save N={n} (us per step, against pluggy's dispatch): "
            + ", ".join(f"{k} {v:+.1f}" for k, v in row.items())
        )
    for n, row in result.get("calls_per_step", {}).items():
        print(f"calls per step N={n}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))
    if "async_to_sync_calls" in result:
        ratios_c = result["async_to_sync_calls"]
        print("async/sync calls: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios_c.items()))
    if "turns" in result:
        tr = result["turns"]
        print(
            f"a conversation of {tr['turns']} turns (each: a tool call, then the answer; "
            f"median of {tr['runs']} conversations): us per turn, first {TURN_WINDOW} -> "
            f"last {TURN_WINDOW}"
        )
        for k, row in tr["us_per_turn"].items():
            calls = tr.get("calls_per_turn", {}).get(k)
            extra = (
                f"; calls per turn {calls['first']:.0f} -> {calls['last']:.0f} "
                f"({calls['last_to_first']:.2f}x)"
                if calls
                else ""
            )
            print(
                f"  {k:>8}: {row['first_us']:.1f} -> {row['last_us']:.1f} "
                f"(last_to_first {row['last_to_first']:.2f}x){extra}"
            )
    if not otel:
        print("otel_api, otel_sdk: left out (opentelemetry-sdk is not installed: loopwarden[otel])")
    for v, label in (("otel_api", "API no-op providers"), ("otel_sdk", "SDK, no-op exporter")):
        if v in otel:
            added = ", ".join(
                f"N={n}: {us:+.1f}" for n, us in result["otel_us_per_step"][v].items()
            )
            print(f"{v} = default_ctx + otel ({label}): CPU us added per step {added}")
    if "otel_sdk_floor" in result["otel_us_per_step"]:
        floor = ", ".join(
            f"N={n}: {us:.1f}" for n, us in result["otel_us_per_step"]["otel_sdk_floor"].items()
        )
        print(f"otel_sdk_floor = the SDK alone, the same 2 spans and 3 points: CPU us {floor}")
    print(
        f"import loopwarden: {result['import_ms']:.1f} ms; "
        f"from loopwarden import Deployment: {result['import_deployment_ms']:.1f} ms; "
        f"loopwarden --help: {result['help_ms']:.1f} ms "
        f"(python -c pass: {result['python_startup_ms']:.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
