"""What loopwarden's adapters add per step to LangChain, the OpenAI Agents SDK and pydantic-ai.

The same scripted workload runs in each framework -- N steps, each one call of a trivial tool
with distinct arguments and a distinct result (no guard fires), then a final answer -- from
the framework's own fake model (LangChain's ``GenericFakeChatModel``, the Agents SDK's
``agents.testing.ScriptedModel``, pydantic-ai's ``FunctionModel``), in one process, the
variants interleaved run by run:

``bare``         the framework alone
``loopwarden``   the same agent guarded by loopwarden's shipped ``config.toml`` (every plugin
                 it enables; limits raised above the workload, as bench/overhead.py does, so
                 the guards run every step but never stop it; Python logging at WARNING)
``limits``       (LangChain only) LangChain's own ``ModelCallLimitMiddleware`` +
                 ``ToolCallLimitMiddleware`` with limits above the workload: the comparison
``hooks``        (LangChain, pydantic-ai) a middleware / capability with the same hooks as
                 loopwarden's adapter, each only passing the call on: what the framework
                 charges for calling hooks at all

and, as a floor, ``driver``: loopwarden's own work for the same steps with no framework at all
(the shared driver of :mod:`loopwarden.adapters` fed the same answers and results) -- what
any adapter adds at least; the rest of an adapter's cost is the framework's hook machinery.

It prints milliseconds per step (the median of ``--runs`` runs; per step = run time / N), the
time each variant adds per step over ``bare``, and that as a ratio to the framework's own
per-step cost.  The headline figures are CPU time of the process (all its threads): on a
shared machine they swing far less than wall time, which is printed beside them (``_wall``
in the JSON).  Every guarded run is checked to end with ``final_answer``.

    python bench/adapters.py            # a table
    python bench/adapters.py --json     # one JSON object
    python bench/adapters.py --quick    # a smoke test of the bench itself
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BIG, FINAL, USER, arguments, bench_config_data, content, lookup, machine

from loopwarden import Deployment, signals
from loopwarden.config import default_config_path, load_toml, parse_config

MODEL = "instant"  # priced in the bench config (bench/_common.py)


def _deployment() -> Deployment:
    data = bench_config_data(load_toml(default_config_path()))
    # the workload's tool is a lookup: declared so (by its bare name it would be taken for a
    # side effect, and the shared ledger would answer later runs' calls without running them)
    data["tools"] = {"lookup": {"read_only": True, "deterministic": True}}
    # a store of its own: nothing from earlier bench runs (or the user's runs) answers a call
    data["store"] = {
        **data.get("store", {}),
        "url": "sqlite:///" + str(Path(tempfile.mkdtemp()) / "store.sqlite3"),
    }
    return Deployment(parse_config(data, path="<bench>"), tools=[])


def _args(i: int) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(arguments(i))
    return parsed


# -- LangChain -------------------------------------------------------------------------------


def langchain_variants(n: int, dep: Deployment) -> dict[str, Callable[[], str]]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        AgentMiddleware,
        ModelCallLimitMiddleware,
        ToolCallLimitMiddleware,
    )
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    from loopwarden.adapters.langchain import LoopwardenMiddleware, LoopwardenState

    class FakeToolModel(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def play() -> Iterator[AIMessage]:
        while True:
            for i in range(n):
                yield AIMessage(
                    content=content(i),
                    tool_calls=[{"name": "lookup", "args": _args(i), "id": f"call_{i}"}],
                    usage_metadata={"input_tokens": 50, "output_tokens": 16, "total_tokens": 66},
                )
            yield AIMessage(content=FINAL)

    @tool("lookup")
    def lookup_tool(key: str) -> str:
        """Look up a record."""
        return lookup(key)

    def make(middleware: list[Any]) -> Callable[[], str]:
        agent = create_agent(FakeToolModel(messages=play()), [lookup_tool], middleware=middleware)

        def once() -> str:
            out = agent.invoke({"messages": [HumanMessage(USER)]})
            return str(out["messages"][-1].content)

        return once

    class PassThrough(AgentMiddleware[Any, Any]):
        state_schema = LoopwardenState

        def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return {"loopwarden_run_id": "-"}

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(request)

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            return handler(request)

        def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return None

    return {
        "bare": make([]),
        "hooks": make([PassThrough()]),
        "loopwarden": make([LoopwardenMiddleware(dep, model_name=MODEL)]),
        "limits": make(
            [
                ModelCallLimitMiddleware(run_limit=BIG, exit_behavior="end"),
                ToolCallLimitMiddleware(run_limit=BIG, exit_behavior="end"),
            ]
        ),
    }


# -- OpenAI Agents SDK -----------------------------------------------------------------------


def openai_agents_variants(n: int, dep: Deployment) -> dict[str, Callable[[], str]]:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
    from agents.usage import Usage

    from loopwarden.adapters.openai_agents import LoopwardenRunner

    usage = Usage(requests=1, input_tokens=50, output_tokens=16, total_tokens=66)

    def model() -> ScriptedModel:
        steps = [
            ModelStep(
                output=[
                    assistant_message(content(i)),
                    function_call("lookup", _args(i), call_id=f"call_{i}"),
                ],
                usage=usage,
            )
            for i in range(n)
        ]
        steps.append(ModelStep(output=[assistant_message(FINAL)], usage=usage))
        return ScriptedModel(steps)

    @function_tool(name_override="lookup")
    def lookup_tool(key: str) -> str:
        """Look up a record."""
        return lookup(key)

    config = RunConfig(tracing_disabled=True)
    runner = LoopwardenRunner(dep, model_name=MODEL)

    def bare() -> str:
        agent = Agent(name="bench", model=model(), tools=[lookup_tool])
        result = asyncio.run(Runner.run(agent, USER, run_config=config, max_turns=BIG))
        return str(result.final_output)

    def guarded() -> str:
        agent = Agent(name="bench", model=model(), tools=[lookup_tool])
        result = asyncio.run(runner.run(agent, USER, run_config=config, max_turns=BIG))
        return str(result.final_output)

    return {"bare": bare, "loopwarden": guarded}


# -- pydantic-ai -----------------------------------------------------------------------------


def pydantic_ai_variants(n: int, dep: Deployment) -> dict[str, Callable[[], str]]:
    from pydantic_ai import Agent
    from pydantic_ai import messages as pm
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage, UsageLimits

    from loopwarden.adapters.pydantic_ai import Loopwarden

    def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        i = sum(isinstance(m, pm.ModelResponse) for m in messages)
        u = RequestUsage(input_tokens=50, output_tokens=16)
        if i >= n:
            return pm.ModelResponse(parts=[pm.TextPart(FINAL)], usage=u)
        return pm.ModelResponse(
            parts=[
                pm.TextPart(content(i)),
                pm.ToolCallPart("lookup", _args(i), tool_call_id=f"call_{i}"),
            ],
            usage=u,
        )

    limits = UsageLimits(request_limit=None)

    def make(capabilities: list[Any]) -> Callable[[], str]:
        agent = Agent(FunctionModel(respond, model_name=MODEL), capabilities=capabilities)

        @agent.tool_plain(name="lookup")
        def lookup_tool(key: str) -> str:
            """Look up a record."""
            return lookup(key)

        def once() -> str:
            return str(asyncio.run(agent.run(USER, usage_limits=limits)).output)

        return once

    class PassThrough(AbstractCapability[Any]):
        async def for_run(self, ctx: Any) -> AbstractCapability[Any]:
            return PassThrough()

        async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
            return await handler()

        async def prepare_tools(self, ctx: Any, tool_defs: Any) -> Any:
            return tool_defs

        async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
            return request_context

        async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
            return await handler(request_context)

        async def wrap_tool_validate(
            self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
        ) -> Any:
            return await handler(args)

        async def wrap_tool_execute(
            self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
        ) -> Any:
            return await handler(args)

    return {
        "bare": make([]),
        "hooks": make([PassThrough()]),
        "loopwarden": make([Loopwarden(dep, model_name=MODEL)]),
    }


def driver_steps(n: int, dep: Deployment) -> Callable[[], str]:
    """The workload through loopwarden's adapter driver alone (no framework)."""
    from loopwarden.adapters._driver import Execute, GuardedRun
    from loopwarden.events import ModelResponse, ProposedCall, ToolResult, Usage

    def once() -> str:
        g = GuardedRun(dep, user=USER, model_name=MODEL)
        g.declare(
            "lookup",
            "Look up a record.",
            {"type": "object", "properties": {"key": {"type": "string"}}},
        )
        for i in range(n):
            g.model_turn()
            g.model_done(
                ModelResponse(
                    content=content(i),
                    usage=Usage(50, 16),
                    tool_calls=[ProposedCall("lookup", _args(i), f"call_{i}")],
                )
            )
            if not isinstance(g.tool(f"call_{i}"), Execute):
                return "refused"
            g.tool_done(f"call_{i}", ToolResult(content=lookup(f"k{i}")))
        g.model_turn()
        g.model_done(ModelResponse(content=FINAL, usage=Usage(50, 8)))
        return g.final_answer

    return once


FRAMEWORKS: dict[str, tuple[str, Callable[[int, Deployment], dict[str, Callable[[], str]]]]] = {
    "langchain": ("langchain", langchain_variants),
    "openai_agents": ("openai-agents", openai_agents_variants),
    "pydantic_ai": ("pydantic-ai-slim", pydantic_ai_variants),
}


def measure(
    fns: dict[str, Callable[[], str]], runs: int, warmup: int
) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds per run of each variant, interleaved run by run."""
    for fn in fns.values():
        for _ in range(warmup):
            if fn() != FINAL:
                raise SystemExit("a warm-up run did not end with the final answer")
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            out = fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            if out != FINAL:
                raise SystemExit(f"{name}: the run ended with {out!r}, not the final answer")
    return {
        name: {"wall": statistics.median(wall[name]), "cpu": statistics.median(cpu[name])}
        for name in fns
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="tiny N and few runs (a smoke test)")
    ap.add_argument("--steps", type=int, help="tool steps per run (default 20; 3 with --quick)")
    ap.add_argument("--runs", type=int, help="timed runs per variant (default 15; 2 quick)")
    args = ap.parse_args(argv)
    n = args.steps or (3 if args.quick else 20)
    runs = args.runs or (2 if args.quick else 15)
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("loopwarden").setLevel(logging.WARNING)
    terminations: list[str] = []

    def seen(sender: Any, **kw: Any) -> None:
        terminations.append(kw["outcome"].termination)

    signals.run_stopped.connect(seen, weak=False)
    dep = _deployment()
    result: dict[str, Any] = {
        "steps": n,
        "runs": runs,
        "python": platform.python_version(),
        "machine": machine(),
        "plugins": dep.plugins.names,
        "versions": {},
        "frameworks": {},
    }
    for key, (dist, variants) in FRAMEWORKS.items():
        result["versions"][dist] = importlib.metadata.version(dist)
        fns = variants(n, dep)
        medians = measure(fns, runs, warmup=1 if args.quick else 3)
        row: dict[str, Any] = {}
        for clock in ("cpu", "wall"):
            per_step = {k: v[clock] / n * 1000 for k, v in medians.items()}
            bare = per_step["bare"]
            added = {k: v - bare for k, v in per_step.items() if k != "bare"}
            suffix = "" if clock == "cpu" else "_wall"
            row[f"ms_per_step{suffix}"] = {k: round(v, 4) for k, v in per_step.items()}
            row[f"added_ms_per_step{suffix}"] = {k: round(v, 4) for k, v in added.items()}
            row[f"added_ratio{suffix}"] = {k: round(v / bare, 3) for k, v in added.items()}
        result["frameworks"][key] = row
    if any(t != "final_answer" for t in terminations) or not terminations:
        raise SystemExit(f"guarded runs did not all end with final_answer: {set(terminations)}")
    floor = measure({"driver": driver_steps(n, dep)}, runs, warmup=1)["driver"]
    result["driver_ms_per_step"] = round(floor["cpu"] / n * 1000, 4)
    lc = result["frameworks"]["langchain"]["added_ms_per_step"]
    result["loopwarden_vs_langchain_limits"] = (
        round(lc["loopwarden"] / lc["limits"], 3) if lc["limits"] > 0 else None
    )
    dep.close()
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{n} tool steps per run, median of {runs} runs; {result['machine']}, "
        f"Python {result['python']}"
    )
    print(
        f"{'framework':<15}{'variant':<12}{'CPU ms/step':>12}{'added':>9}"
        f"{'added/framework':>17}{'wall ms/step':>14}{'added':>9}"
    )
    for key, row in result["frameworks"].items():
        for variant, ms in row["ms_per_step"].items():
            add = row["added_ms_per_step"].get(variant)
            ratio = row["added_ratio"].get(variant)
            wadd = row["added_ms_per_step_wall"].get(variant)
            print(
                f"{key:<15}{variant:<12}{ms:>12.3f}"
                f"{'' if add is None else f'{add:.3f}':>9}"
                f"{'' if ratio is None else f'{ratio:.2f}x':>17}"
                f"{row['ms_per_step_wall'][variant]:>14.3f}"
                f"{'' if wadd is None else f'{wadd:.3f}':>9}"
            )
    print(
        f"loopwarden's own work, no framework (driver): {result['driver_ms_per_step']:.3f} "
        "CPU ms/step"
    )
    print(
        "loopwarden's added cost / LangChain's two limit middlewares' added cost: "
        f"{result['loopwarden_vs_langchain_limits']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
