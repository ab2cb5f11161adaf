"""What the adapter tests share: one deployment recipe, scripted model turns, the tools' effects.

Each framework's test plays the same scripts through that framework's own fake model, so the
scenarios (a repeat loop, a side effect proposed twice, a token budget, the example allowlist
plugin) are checked identically in LangChain, the OpenAI Agents SDK and pydantic-ai.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config

FINAL = "Order 99999 was not found; please check the number."
LOOKUP = ("query_order", {"order_id": "99999"})
REFUND_A = ("apply_refund", {"order_id": "88231", "reason": "damaged"})
REFUND_B = ("apply_refund", {"order_id": "88231", "reason": "damaged on arrival"})
FORBIDDEN = ("delete_account", {"user": "u-1"})


@dataclass
class Effects:
    """How often each framework tool really ran (a refund is a real, countable effect)."""

    counts: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


@dataclass
class Script:
    """Model turns: ``turns`` of tool calls, then ``final`` (or the last turn again, with
    ``repeat``).  A call made without tools (the soft stop's wrap-up) answers ``final``."""

    turns: list[list[tuple[str, dict[str, Any]]]]
    final: str = FINAL
    repeat: bool = False
    usage: tuple[int, int] = (40, 10)
    calls: int = 0  # model calls made
    toolless: int = 0  # of which without tools
    _turn: int = 0

    def next(self, tools_available: bool) -> tuple[str | None, list[tuple[str, dict[str, Any], str]]]:
        self.calls += 1
        if not tools_available:
            self.toolless += 1
            return self.final, []
        i = self._turn
        self._turn += 1
        if i >= len(self.turns):
            if not self.repeat:
                return self.final, []
            i = len(self.turns) - 1
        return None, [(n, dict(a), f"call_{self.calls}_{k}") for k, (n, a) in
                      enumerate(self.turns[i])]


def deployment(tmp_path: Path, *, allowlist: bool = False,
               max_total_tokens: int | None = None) -> Deployment:
    """The shipped config, plus: run records to ``tmp_path/runs.jsonl``, ``apply_refund``
    declared a side effect keyed by order, optionally the example allowlist plugin and a
    token limit."""
    data = load_toml(default_config_path())
    plugins = data["plugins"]
    plugins["enabled"] = [*plugins["enabled"], "run_record"]
    plugins["run_record"] = {"path": str(tmp_path / "runs.jsonl")}
    data["tools"] = {"apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]}}
    if allowlist:
        plugins["enabled"].append("allowlist")
        plugins["allowlist"] = {"allowed": ["query_*", "apply_refund"], "allow_read_only": False,
                                "max_refusals": 1}
    if max_total_tokens is not None:
        plugins["token_budget"] = {**plugins["token_budget"], "max_total_tokens": max_total_tokens}
    return Deployment(parse_config(data, path="<adapter-test>"), tools=[])


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def only_record(tmp_path: Path) -> dict[str, Any]:
    recs = records(tmp_path)
    assert len(recs) == 1, recs
    return recs[0]
