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

import logging
import multiprocessing
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loopwarden.console.index import RecordIndex
from loopwarden.plugins.max_steps import MaxStepsSettings
from loopwarden.report import analyse

__all__ = ["DEFAULT_STEP_CAP", "Figures", "compute", "savings"]

log = logging.getLogger("loopwarden.console")

#: the step cap assumed when the config names none (max_steps' own default)
DEFAULT_STEP_CAP: int = MaxStepsSettings.model_fields["max_steps"].default

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
    """The overview's data for one index, recomputed only when records were added.

    Over a small file the figures are computed when asked.  Over a large one (more than
    ``sync_limit`` runs: parsing 100,000 records takes seconds) they are computed on a
    background thread; until the first result is ready :meth:`overview` returns None, and
    afterwards the last result while a newer one is computed -- a page never waits on it.
    """

    def __init__(
        self, index: RecordIndex, step_cap: int = DEFAULT_STEP_CAP, sync_limit: int = 5000
    ) -> None:
        self.index = index
        self.step_cap = step_cap
        self.sync_limit = sync_limit
        self._lock = threading.Lock()
        self._cached: _Cached | None = None
        self._worker: threading.Thread | None = None
        self._finished = -float("inf")
        #: the least time between two background computations (seconds)
        self.min_interval_s = 30.0

    def overview(self) -> dict[str, Any] | None:
        """``report`` (analyse's dict), ``total_tokens`` (from it), ``savings``,
        ``over_time``, ``step_cap`` and ``runs_indexed`` -- or None while the first
        computation over a large file runs."""
        key = (self.index.cursor(), self.index.skipped)
        cached = self._cached
        if cached is not None and cached.key == key:
            return cached.value
        if self.index.count() <= self.sync_limit:
            with self._lock:
                if self._cached is None or self._cached.key != key:
                    self._cached = _Cached(key, self._compute())
                return self._cached.value
        self.start()
        return cached.value if cached is not None else None

    def start(self) -> None:
        """Compute the figures on a background thread (unless one is at it already, or the
        last one finished less than ``min_interval_s`` ago: a busy fleet's appends never keep
        a core parsing)."""
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                return
            if time.monotonic() - self._finished < self.min_interval_s:
                return
            self._worker = threading.Thread(
                target=self._background, name="loopwarden-console-figures", daemon=True
            )
            self._worker.start()

    def _background(self) -> None:
        key = (self.index.cursor(), self.index.skipped)
        try:
            # in a process of its own: parsing holds no lock the pages' threads need (the GIL)
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(1) as pool:
                value = pool.apply(
                    _compute_file, (str(self.index.records), str(self.index.path), self.step_cap)
                )
        except Exception:  # no processes here (a sandbox): compute on this thread
            log.warning("console: figures computed in-process", exc_info=True)
            value = self._compute()
        with self._lock:
            self._cached = _Cached(key, value)
            self._finished = time.monotonic()

    def _compute(self) -> dict[str, Any]:
        return compute(self.index, self.step_cap)


def _compute_file(records: str, index_file: str, step_cap: int) -> dict[str, Any]:
    """:func:`compute` in a worker process, over the index the console keeps."""
    from pathlib import Path

    index = RecordIndex(Path(records), Path(index_file))
    try:
        return compute(index, step_cap)
    finally:
        index.close()


def compute(index: RecordIndex, step_cap: int) -> dict[str, Any]:
    """The overview's figures over what ``index`` holds (see :meth:`Figures.overview`)."""
    records = [{k: v for k, v in r.items() if k not in _UNUSED} for r in index.records_iter()]
    axis, starts, series = index.over_time()
    report = analyse(records, skipped=index.skipped)
    mean = report["tokens"].get("mean")
    return {
        "report": report,
        "total_tokens": round(mean * report["runs"]) if mean is not None else 0,
        "savings": savings(records, step_cap),
        "step_cap": step_cap,
        "over_time": {"axis": axis, "starts": starts, "series": series},
    }
