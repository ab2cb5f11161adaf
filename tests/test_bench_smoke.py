"""The benchmarks run and print the promised JSON; guard state per run is bounded.

No timing is asserted here (the machine is shared and noisy): the benches are smoke-tested for
their output shape only.  The bounded-state test measures structure, not time: the per-run
state of the whole shipped guard stack is the same size after 300 steps and after 2,000.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import platform
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FunctionType, MethodType, ModuleType
from typing import Any

import pytest

from loopwarden import Deployment, FakeClock
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, Usage
from loopwarden.run import Run
from loopwarden.tools import Tool, ToolRegistry, tool

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench(script: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_overhead_bench_prints_the_promised_json() -> None:
    data = _bench("overhead.py")
    assert set(data["us_per_step"]) == {"10", "50", "500"}
    for row in data["us_per_step"].values():
        assert {"bare", "pluggy_floor", "empty", "default"} <= set(row)
        assert all(_number(v) and v > 0 for v in row.values())
    assert _number(data["import_ms"])
    assert data["python"] == platform.python_version()
    assert isinstance(data["machine"], str) and data["machine"]
    assert set(data["ratio_to_bare"]) == {"10", "50", "500"}
    assert data["plugins"]["empty"] == ["max_steps"]  # the essential plugin only
    assert "max_steps" in data["plugins"]["default"]


def test_overhead_bench_sets_async_beside_sync_in_us_and_in_calls() -> None:
    data = _bench("overhead.py", "--async", "--calls", "--sizes", "5")
    pairs = {"default_async": "default", "default_ctx_async": "default_ctx"}
    assert set(data["async_to_sync"]["5"]) == set(pairs)
    calls = data["calls_per_step"]["5"]
    for a, s in pairs.items():
        assert _number(data["us_per_step"]["5"][a]) and data["us_per_step"]["5"][a] > 0
        assert calls[a] > calls["bare"] and calls[s] > calls["bare"]
        assert data["async_to_sync_calls"][a] == pytest.approx(calls[a] / calls[s], abs=0.01)


def test_overhead_bench_times_the_facade_against_pluggys_own_dispatch() -> None:
    """``--via-pluggy``: the twins really go through pluggy -- more Python calls per step
    (deterministic), and ``direct_saves_us`` is each twin's difference."""
    data = _bench("overhead.py", "--via-pluggy", "--calls", "--sizes", "5")
    row, calls = data["us_per_step"]["5"], data["calls_per_step"]["5"]
    saves = data["direct_saves_us"]["5"]
    assert set(saves) == {"empty", "default_ctx"}
    for direct in saves:
        assert _number(row[f"{direct}_pluggy"]) and row[f"{direct}_pluggy"] > 0
        assert calls[f"{direct}_pluggy"] > calls[direct]
        assert saves[direct] == pytest.approx(row[f"{direct}_pluggy"] - row[direct], abs=0.11)


def test_overhead_bench_plays_a_conversation_whose_turns_cost_no_more_calls_at_its_end() -> None:
    """``--turns``: the first and last turns of one conversation, in us and in cProfile's
    calls per turn -- deterministic, so the flat count is asserted (a turn that recounted the
    whole history made 1.9x the calls in the last ten turns of 40)."""
    data = _bench("overhead.py", "--turns", "40", "--calls", "--sizes", "5")
    turns = data["turns"]
    assert turns["turns"] == 40 and set(turns["us_per_turn"]) == {"bare", "default"}
    for row in turns["us_per_turn"].values():
        assert {"first_us", "last_us", "last_to_first"} == set(row)
        assert all(_number(v) and v > 0 for v in row.values())
    calls = turns["calls_per_turn"]
    assert calls["bare"]["first"] == calls["bare"]["last"]  # the bare loop's turn: constant
    assert calls["default"]["first"] > calls["bare"]["first"]
    assert calls["default"]["last_to_first"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_concurrency_bench_prints_the_promised_json() -> None:
    data = _bench("concurrency.py")
    assert {"runs", "wall_s", "ideal_s", "cpu_us_per_step", "peak_kb_per_run"} <= set(data)
    assert data["runs"] == 20 and isinstance(data["runs"], int)
    for key in ("wall_s", "ideal_s", "cpu_us_per_step", "peak_kb_per_run", "history_kb_per_run"):
        assert _number(data[key]), key
    assert data["ideal_s"] == pytest.approx(data["steps"] * data["latency_ms"] / 1000)
    assert data["wall_s"] >= data["ideal_s"]  # every run waits steps x latency at least


def _serving_shape(data: dict[str, Any], processes: int) -> None:
    """The serving bench's JSON: every batch of every round, pooled figures present, the
    store's counters and the ledger exact (behaviour, not time: no figure is compared)."""
    sizes = {processes, 1}
    assert set(data["batches"]) == {f"{v}@{n}" for v in ("bare", "loopwarden") for n in sizes}
    for name, rows in data["batches"].items():
        variant, n = name.split("@")
        assert len(rows) == data["pairs"] == 2
        for row in rows:
            assert row["processes"] == int(n)
            assert row["runs"] == int(n) * data["conversations"] * data["turns"] == int(n) * 20
            # every turn is a notification and an answer: two model calls
            assert row["model_calls"] == 2 * row["runs"]
            for key in ("wall_s", "cpu_s", "runs_per_s", "runs_per_s_per_core", "cpu_us_per_step"):
                assert _number(row[key]) and row[key] > 0, (name, key)
            # a step waits for the model's latency at least
            assert row["step_ms"]["p50"] >= data["latency_ms"]
            assert row["step_ms"]["p99"] >= row["step_ms"]["p50"]
            for key in ("loop_lag_ms", "callback_ms", "callback_cpu_ms"):
                assert set(row[key]) == {"p50", "p99", "max"}
                assert all(_number(v) for v in row[key].values())
            assert row["callbacks"] > 0 and row["longest_callbacks"]
            if variant == "loopwarden":
                assert set(row["ended"]) == {"final_answer"}  # no guard fired
                # every step reserves and settles a budget: every step waited for the store
                assert row["store_steps"] == row["model_calls"]
                assert _number(row["store_wait_ms"]["p50"]) and row["store_calls_per_step"] >= 2
                assert 0 <= row["store_calls_on_loop_thread"] <= 1
                if data["framework"] == "openai":  # the machine's steps, timed in the driver
                    assert _number(row["machine_step_ms"]["p50"])
                    assert row["machine_steps_per_step"] >= 1
            else:
                assert "store_wait_ms" not in row
    a = data["analysis"]
    for key in ("p50", "p99"):
        assert set(a["added_step_ms"][key]) == {"median", "min", "max", "q1", "q3", "n"}
        assert a["added_step_ms"][key]["n"] == 2  # one paired difference per round
    assert _number(a["runs_per_core_ratio"]["median"])
    assert a["budgets_exact"] is True and a["ledger_exact"] is True
    for check in data["checks"]:
        assert check["counted"] == check["expected"] and check["reserved_left"] == 0
        fx = check["side_effects"]
        assert fx["executed"] == fx["keys"]  # every side effect once, across the processes
        # every process plays the same conversations: each key claimed once per process
        assert fx["tool_calls"] == check["processes"] * fx["keys"]


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_serving_bench_prints_the_promised_json(redis_server: str) -> None:
    data = _bench("serving.py", "--redis-url", redis_server)
    assert data["framework"] == "openai" and data["streamed"] is True
    _serving_shape(data, 1)
    assert "scaling" not in data["analysis"]


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_serving_bench_scales_two_processes_on_one_redis(redis_server: str) -> None:
    data = _bench("serving.py", "--processes", "2", "--redis-url", redis_server)
    _serving_shape(data, 2)
    scaling = data["analysis"]["scaling"]
    assert _number(scaling["runs_per_s_1"]) and _number(scaling["runs_per_s_2"])
    assert _number(scaling["ratio"]["median"]) and _number(scaling["bare_ratio"]["median"])
    line = data["scaling_line"]
    assert line.startswith("2 processes: ") and "budgets exact: yes" in line
    assert "ledger exact: yes" in line


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_serving_bench_measures_the_langchain_middleware(redis_server: str) -> None:
    data = _bench("serving.py", "--langchain", "--redis-url", redis_server)
    assert data["framework"] == "langchain" and data["server_processes"] == 0
    _serving_shape(data, 1)


# -- guard state per run does not grow with the run ----------------------------------------------


def _load_common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_common", BENCH / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load_common()


class _Instant:
    """N tool-call turns (distinct arguments), then the final answer."""

    name = "instant"

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        i, self.i = self.i, self.i + 1
        if i >= self.n or request.tool_choice == "none":
            return ModelResponse(content=W.FINAL, usage=Usage(request.estimated_tokens, 8))
        return ModelResponse(
            content=W.content(i),
            usage=Usage(request.estimated_tokens, 16),
            tool_calls=[ProposedCall("lookup", W.arguments(i), f"c{i}")],
        )


_SHARED = (Tool, ToolRegistry, Run, Deployment, type, ModuleType, FunctionType, MethodType)


def _walk(obj: Any, seen: set[int]) -> Iterator[Any]:
    """Every object reachable from ``obj`` through containers and loopwarden objects, once;
    deployment-wide things (tools, the run, plugins' classes, functions) are not followed."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _SHARED):
            continue
        seen.add(id(o))
        yield o
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, deque)):
            stack.extend(o)
        elif type(o).__module__.startswith("loopwarden"):
            if dataclasses.is_dataclass(o):
                stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
            else:
                for cls in type(o).__mro__:
                    stack.extend(
                        getattr(o, n)
                        for n in getattr(cls, "__slots__", ())
                        if isinstance(n, str) and hasattr(o, n)
                    )
                stack.extend(getattr(o, "__dict__", {}).values())


def structure_size(obj: Any) -> tuple[int, int]:
    """(objects and container entries, characters of text) reachable from ``obj``.

    Deterministic (no allocator, no timing): a count that grows if anything keeps one more
    entry per step."""
    items = chars = 0
    for o in _walk(obj, set()):
        items += 1
        if isinstance(o, (dict, list, tuple, set, frozenset, deque)):
            items += len(o)
        elif isinstance(o, (str, bytes)):
            chars += len(o)
    return items, chars


@pytest.fixture(scope="module")
def shipped_stack() -> Iterator[Callable[[int], Run]]:
    path = default_config_path()
    config = parse_config(W.bench_config_data(load_toml(path)), path=str(path))
    dep = Deployment(
        config,
        tools=ToolRegistry([tool(read_only=True, deterministic=True)(W.lookup)]),
        clock=FakeClock(),
    )

    def play(n: int) -> Run:
        run = dep.run(W.USER, model=_Instant(n))
        assert run.record()["termination"] == "final_answer"
        assert run.step == n + 1  # every guard ran every step, none stopped the run
        return run

    yield play
    dep.close()


def test_guard_state_per_run_does_not_grow_with_the_run(
    shipped_stack: Callable[[int], Run],
) -> None:
    # 300 steps fill every bounded structure of the shipped stack (the largest cap is
    # repeat_call's 256 fingerprints); 2,000 steps must not add a single entry.
    small, cap, large = (structure_size(shipped_stack(n).state) for n in (50, 300, 2000))
    assert large[0] == cap[0]
    assert large[1] <= cap[1] * 1.05  # the same entries; longer ids ("k1999" vs "k299")
    assert small[0] <= cap[0]
    assert len(shipped_stack(50).state) >= 8  # the plugins' slots are really there


def test_structure_size_sees_growth() -> None:
    # the helper itself: one more entry anywhere is one more item
    base = {"a": deque([1, 2], maxlen=5)}
    grown = {"a": deque([1, 2, 3], maxlen=5)}
    assert structure_size(grown)[0] > structure_size(base)[0]


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_adapters_bench_prints_the_promised_json() -> None:
    data = _bench("adapters.py")
    assert set(data["frameworks"]) == {"langchain", "openai_agents", "pydantic_ai"}
    for name, row in data["frameworks"].items():
        variants = {"bare", "loopwarden"} | ({"limits"} if name == "langchain" else set())
        variants |= {"hooks"} if name in ("langchain", "pydantic_ai") else set()
        for key in ("ms_per_step", "ms_per_step_wall"):
            assert set(row[key]) == variants
            assert all(_number(v) and v > 0 for v in row[key].values())
        for key in ("added_ms_per_step", "added_ratio", "added_ms_per_step_wall"):
            assert set(row[key]) == variants - {"bare"}
            assert all(isinstance(v, float) for v in row[key].values())  # may be < 0: noise
    assert _number(data["driver_ms_per_step"]) and data["driver_ms_per_step"] > 0
    assert data["steps"] == 3 and "max_steps" in data["plugins"]
    assert set(data["versions"]) == {"langchain", "openai-agents", "pydantic-ai-slim"}
    ratio = data["loopwarden_vs_langchain_limits"]
    assert ratio is None or isinstance(ratio, float)


@pytest.mark.slow  # a bench script in a subprocess: seconds to tens of seconds
def test_fuzz_bench_prints_the_promised_json_and_finds_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "fuzz.py"), "16", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert (data["n"], data["seed"], data["ok"]) == (16, 3, True)
    assert set(data["paths"]) == {"scripted", "http"}
    for path in data["paths"].values():
        assert path["cases"] == 16
        assert sum(path["terminations"].values()) == 16  # every run ended with a record
    assert data["totals"] == {
        "crashes": 0,
        "hangs": 0,
        "missing_records": 0,
        "double_effects": 0,
        "bad_requests": 0,
        "blamed_model": 0,
    }


# -- gateway replay: recorded runs through the gateway, judged as `loopwarden replay` does ------


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _tiny_trajectories(path: Path) -> Path:
    """Three recorded conversations: one healthy (two user turns), one runaway (the same
    lookup with the same answer eight times), and one whose failures only the recording's
    ``observation_is_error`` flags (their text says nothing of an error)."""
    healthy = [
        {
            "content": None,
            "tool_calls": [_call("get_order", order_id="A1")],
            "observations": ['{"status": "shipped"}'],
            "usage": {"prompt_tokens": 900, "completion_tokens": 20},
        },
        {
            "content": "Your order A1 has shipped.",
            "user_reply": "And B2?",
            "usage": {"prompt_tokens": 950, "completion_tokens": 12},
        },
        {
            "content": None,
            "tool_calls": [_call("get_order", order_id="B2")],
            "observations": ['{"status": "packed"}'],
        },
        {"content": "Order B2 is packed."},
    ]
    runaway = [
        {
            "content": "Checking.",
            "tool_calls": [_call("get_order", order_id="C3")],
            "observations": ['{"status": "unknown"}'],
            "usage": {"prompt_tokens": 900 + 50 * i, "completion_tokens": 20},
        }
        for i in range(8)
    ]
    flagged = [
        {
            "content": None,
            "tool_calls": [_call("find_user", email=f"u{i}@example.org")],
            "observations": ["no such user"],
            "observation_is_error": [True],
        }
        for i in range(4)
    ] + [{"content": "I could not find your account."}]
    with path.open("w", encoding="utf-8") as fh:
        for tid, steps in (("healthy", healthy), ("runaway", runaway), ("flagged", flagged)):
            line = {"source": "tiny", "id": tid, "success": None, "steps": steps}
            fh.write(json.dumps(line) + "\n")
    return path


def _gateway_replay(path: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gateway_replay.py"), str(path), "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _terminations(data: dict[str, Any]) -> dict[str, Any]:
    def key(stop: dict[str, Any] | None) -> tuple[int, str] | None:
        return None if stop is None else (stop["step"], stop["reason"])

    return {r["id"]: (key(r["replay"]), key(r["gateway"])) for r in data["rows"]}


def test_gateway_replay_bench_agrees_with_replay_and_says_why_not(tmp_path: Path) -> None:
    data = _gateway_replay(_tiny_trajectories(tmp_path / "tiny.jsonl"))
    o = data["overall"]
    assert (o["trajectories"], o["agree"], o["replay_stops"], o["gateway_stops"]) == (3, 2, 2, 1)
    assert data["meta"]["via"] == "app" and data["target_met"] is False
    assert "logging" not in data["meta"]["plugins"]  # replay_config's adjustments, both sides
    ends = _terminations(data)
    assert ends["healthy"] == (None, None)
    replayed, played = ends["runaway"]
    assert replayed is not None and replayed == played  # both stop the loop, at one step
    # every request reached the recorded upstream but a hard stop's; both user turns played
    assert o["requests"] >= 4 + 1 and o["upstream_calls"] <= o["requests"]
    # the one difference, with its cause: replay without the recorded flags does what the
    # gateway did (the chat-completions wire carries no error flag on a tool message)
    (diff,) = data["differences"]
    assert diff["id"] == "flagged" and diff["why"] == "error_flag"
    assert diff["replay"]["reason"] == "failure_streak" and diff["gateway"] is None
    assert o["differences_by_why"] == {"error_flag": 1}


def test_gateway_replay_bench_plays_every_wire_and_messages_carries_the_error_flag(
    tmp_path: Path,
) -> None:
    """--wire all: one table per shape; Responses continues by previous_response_id and
    judges as chat does (no error flag on a function_call_output), Messages carries
    ``is_error`` so the flagged run agrees too."""
    data = _gateway_replay(_tiny_trajectories(tmp_path / "tiny.jsonl"), "--wire", "all")
    by = data["by_wire"]
    assert set(by) == {"chat", "responses", "messages"}
    assert data["meta"]["wire"] == "chat" and data["overall"] == by["chat"]["overall"]
    for wire, result in by.items():
        assert result["meta"]["wire"] == wire
        assert result["overall"]["trajectories"] == 3, wire
        assert _terminations(result)["healthy"] == (None, None), wire
        replayed, played = _terminations(result)["runaway"]
        assert replayed is not None and replayed == played, wire
    assert by["responses"]["overall"]["differences_by_why"] == {"error_flag": 1}
    assert by["messages"]["overall"]["agree"] == 3
    assert by["messages"]["differences"] == []


@pytest.mark.slow  # three bench subprocesses
def test_gateway_replay_bench_judges_alike_streamed_and_through_the_gate(tmp_path: Path) -> None:
    path = _tiny_trajectories(tmp_path / "tiny.jsonl")
    app = _terminations(_gateway_replay(path))
    streamed = _gateway_replay(path, "--stream")
    assert streamed["meta"]["stream"] is True
    assert _terminations(streamed) == app
    assert _terminations(_gateway_replay(path, "--via", "gate")) == app


def _pcts_shape(row: dict[str, Any], key: str) -> None:
    assert set(row[key]) == {"p50", "p99", "max"}, key
    assert all(_number(v) for v in row[key].values()), key


@pytest.mark.slow  # a bench script in a subprocess, with servers of its own: tens of seconds
def test_gateway_bench_prints_the_promised_json(redis_server: str) -> None:
    """bench/gateway.py --quick: every batch of the one round, the paired analysis, scaling,
    the wrapper -- the shape only (speed is never asserted)."""
    data = _bench("gateway.py", "--redis-url", redis_server)
    assert data["python"] == platform.python_version() and data["machine"]
    assert len(data["load_before"]) == len(data["load_after"]) == 3
    assert data["settings"]["quick"] is True and data["redis"] is True
    assert data["litellm"] == {"skipped": "--quick or --no-litellm"}
    assert data["long_history_tokens"] >= 50_000 > data["agent_history_tokens"]
    gateways = {"gateway_memory", "gateway_redis"}
    rounds = data["rounds"]
    assert all(len(rounds[k]) == 1 for k in ("agent_like", "light", "long", "stream"))
    assert set(rounds["agent_like"][0]) == {"direct"} | gateways
    for kind in ("light", "long", "stream"):
        assert set(rounds[kind][0]) == {"direct", "gateway_redis"}, kind
    for kind, batches in rounds.items():
        for name, row in batches[0].items():
            assert row["requests"] > 0 and row["errors"] == {}, (kind, name)
            _pcts_shape(row, "latency_ms" if kind != "stream" else "chunk_delay_ms")
            assert _number(row["server_cpu_us_per_request"]), (kind, name)
            assert _number(row["loadgen_cpu_us_per_request"]), (kind, name)
            if name.startswith("gateway"):
                if kind != "stream":  # a streamed answer's header comes before its chunks
                    _pcts_shape(row, "overhead_header_ms")
                if kind in ("agent_like", "light"):  # the run found again by the ids it handed out
                    assert 0 <= row["run_continuity"] <= 1
            if kind == "stream":
                for key in ("last_chunk_delay_ms", "ttfb_ms"):
                    _pcts_shape(row, key)
                # every text chunk the mock wrote, and the last one with the finish
                assert row["chunks_per_answer"] == data["settings"]["chunks"] + 1
    a = data["analysis"]
    assert set(a["agent_like_added_ms"]) == gateways
    assert set(a["agent_like_header_ms"]) == gateways
    for key in (
        "light_added_ms",
        "long_added_ms",
        "stream_added_per_chunk_ms",
        "stream_added_last_chunk_ms",
    ):
        assert set(a[key]) == {"gateway_redis"}, key
    for row in a["agent_like_added_ms"].values():
        for p in ("p50", "p99"):
            assert set(row[p]) == {"median", "min", "max", "q1", "q3", "n"} and row[p]["n"] == 1
    scaling = data["scaling"]
    assert len(scaling) == 1 and set(scaling[0]) == {"direct", "gateway_1", "gateway_2"}
    assert all(row["requests"] > 0 and _number(row["rps"]) for row in scaling[0].values())
    assert _number(a["scaling"]["ratio_2_to_1"]["median"])
    wrapper = data["wrapper"]
    if "skipped" not in wrapper:
        for key in ("bare_cpu_us_per_call", "wrapped_cpu_us_per_call"):
            assert _number(wrapper[key]["median"]), key
        assert isinstance(wrapper["added_cpu_us_per_call"]["median"], float)


@pytest.mark.slow  # a bench script in a subprocess, with servers of its own: tens of seconds
def test_gateway_bench_plays_every_wire(redis_server: str) -> None:
    """bench/gateway.py --quick --wire all --only rounds: every shape's batches (Responses in
    both styles: continued by previous_response_id, and resending its history), each with
    its analysis -- the shape only."""
    data = _bench(
        "gateway.py",
        "--redis-url",
        redis_server,
        "--wire",
        "all",
        "--only",
        "rounds",
        "--no-memory",
    )
    by = data["by_wire"]
    assert list(by) == ["chat", "responses", "responses_full", "messages"]
    assert data["rounds"] == by["chat"]["rounds"]
    for wire, d in by.items():
        assert len(d["load_after"]) == 3
        for kind in ("agent_like", "stream"):
            for name, row in d["rounds"][kind][0].items():
                assert row["requests"] > 0 and row["errors"] == {}, (wire, kind, name)
                assert _number(row["server_cpu_us_per_request"]), (wire, kind, name)
                if kind == "agent_like" and name == "gateway_redis":
                    _pcts_shape(row, "overhead_header_ms")
                    assert 0 <= row["run_continuity"] <= 1
                if kind == "stream":
                    assert row["chunks_per_answer"] == data["settings"]["chunks"] + 1
        a = d["analysis"]
        assert set(a["agent_like_added_ms"]) == {"gateway_redis"}, wire
        assert set(a["stream_added_per_chunk_ms"]) == {"gateway_redis"}, wire
