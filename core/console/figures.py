"""The overview's figures: :func:`loopwarden.report.analyse` over the indexed records, plus
what the stops spent and saved per guard.

One source of truth: the termination counts, stop reasons, shadow mode's would-be stops and
the percentiles are ``loopwarden report``'s own (the same function over the same records); the
console only adds the per-guard view of spend and an estimate of what each stop saved.

**Saved (an estimate, labelled as one on the page):** a run a guard stopped would otherwise
have gone on, at best until the step cap (``[plugins.max_steps] max_steps``).  For each such
run the estimate is its average tokens (and cost) per model call times the calls left to the
cap -- a lower bound when the context grows with every call, as it does in an agent loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loopwarden.console.index import RecordIndex
from loopwarden.report import analyse

__all__ = ["DEFAULT_STEP_CAP", "Figures", "savings"]

#: the step cap assumed when the config names none (max_steps' own default)
DEFAULT_STEP_CAP = 115

#: record fields analyse never reads: left out of the copy kept for the figures (memory)
_UNUSED = ("final_answer", "warnings", "verdicts", "errors", "tool_retries", "steps_detail")


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value)


def savings(records: Iterable[Mapping[str, Any]], step_cap: int) -> list[dict[str, Any]]:
    """Per guard that stopped runs: how many, the tokens and cost they spent, and the
    estimated tokens and cost the stops saved (see the module docstring), most saved first."""
    by: dict[str, dict[str, Any]] = {}
    for r in records:
        guard = r.get("stopped_by")
        if not isinstance(guard, str) or not guard:
            continue
        tokens = r.get("tokens")
        total = _num(tokens.get("total")) if isinstance(tokens, Mapping) else 0.0
        cost = _num(r.get("cost"))
        steps = max(int(_num(r.get("steps"))), 1)
        left = max(step_cap - steps, 0)
        row = by.setdefault(
            guard,
            {
                "guard": guard,
                "runs": 0,
                "tokens": 0,
                "cost": 0.0,
                "saved_tokens": 0,
                "saved_cost": 0.0,
            },
        )
        row["runs"] += 1
        row["tokens"] += int(total)
        row["cost"] += cost
        row["saved_tokens"] += int(total / steps * left)
        row["saved_cost"] += cost / steps * left
    return sorted(by.values(), key=lambda g: (-g["saved_tokens"], g["guard"]))


@dataclass
class _Cached:
    key: tuple[int, int]
    value: dict[str, Any]


class Figures:
    """The overview's data for one index, recomputed only when records were added."""

    def __init__(self, index: RecordIndex, step_cap: int = DEFAULT_STEP_CAP) -> None:
        self.index = index
        self.step_cap = step_cap
        self._lock = threading.Lock()
        self._cached: _Cached | None = None

    def overview(self) -> dict[str, Any]:
        """``report`` (analyse's dict), ``total_tokens`` (from it), ``savings``,
        ``over_time`` and ``step_cap``."""
        key = (self.index.cursor(), self.index.skipped)
        with self._lock:
            if self._cached is not None and self._cached.key == key:
                return self._cached.value
            records = [
                {k: v for k, v in r.items() if k not in _UNUSED} for r in self.index.records_iter()
            ]
            axis, starts, series = self.index.over_time()
            report = analyse(records, skipped=self.index.skipped)
            mean = report["tokens"].get("mean")
            value = {
                "report": report,
                "total_tokens": round(mean * report["runs"]) if mean is not None else 0,
                "savings": savings(records, self.step_cap),
                "step_cap": self.step_cap,
                "over_time": {"axis": axis, "starts": starts, "series": series},
            }
            self._cached = _Cached(key, value)
            return value
