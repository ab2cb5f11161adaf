"""Shared by the benchmarks: the trivial workload, the config overrides, machine facts.

The workload is N steps, each one tool call to a trivial tool with distinct arguments and a
distinct result (so no guard ever fires), then a final answer.  The model is instant and
in-process.  Nothing here is part of the installed package.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
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
