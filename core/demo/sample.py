"""The demo's console sample: the scenarios played once more, guarded, with their records kept.

``loopwarden demo`` measures with the observers left out and every run in a world of its own
(:mod:`loopwarden.demo.runner`), so nothing it prints depends on what it keeps.  This pass,
played after the measured one, gives ``loopwarden console`` something to show: each guarded
run is appended to the records file (with its trajectory and per-step tokens) and charges
the deployment's shared store (``[store] url``), under a tenant of its own
(:data:`SAMPLE_TENANT`) with

* a ``spend_limits`` budget per tenant and day far above what the demo spends (it never
  binds): the budgets view;
* a ``circuit_breaker`` per tenant, which the outage scenario opens: the breakers view (the
  outage is played twice, so the second run meets the open breaker);
* ``oscillation`` in shadow mode (when it is enabled): its verdicts are recorded, not
  enforced -- the overview's "would have stopped".

The sample's runs are not the measured ones: their terminations may differ (a shadowed
detector, an open breaker), which is what they are for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopwarden.clock import FakeClock
from loopwarden.config import Config
from loopwarden.demo.runner import TickingNow, _db_dir
from loopwarden.demo.shop import Shop, with_shop_prompt
from loopwarden.deployment import Deployment
from loopwarden.engine.drivers import drive
from loopwarden.models.scenario import load_scenario
from loopwarden.store import Shared

__all__ = ["SAMPLE_TENANT", "Sample", "record_sample", "sample_config"]

#: the tenant the sample's runs carry (``meta``): its budget and breakers are the demo's
SAMPLE_TENANT = "demo"
#: the sample's daily token budget per tenant: far above the demo's few hundred thousand
SAMPLE_DAILY_TOKENS = 100_000_000
#: the scenario played twice, so that its second run finds the breaker open
OUTAGE = "outage"
#: the detector the sample runs in shadow mode
SHADOWED = "oscillation"


@dataclass
class Sample:
    """What the sample pass wrote."""

    path: Path
    runs: int
    terminations: dict[str, int]


def sample_config(config: Config, records: Path) -> Config:
    """``config`` (with the demo shop's prompt) plus what the console shows: ``run_record``
    appending to ``records``, a generous ``spend_limits`` budget, a per-tenant
    ``circuit_breaker`` and :data:`SHADOWED` in shadow mode."""
    config = with_shop_prompt(config)
    data = config.plugins.model_dump()
    tables = config.plugins.tables()
    enabled = list(config.plugins.enabled)
    for name in ("spend_limits", "circuit_breaker", "run_record"):
        if name not in enabled:
            enabled.append(name)
    data["enabled"] = enabled
    data["blocked"] = [n for n in config.plugins.blocked if n not in enabled]
    data["run_record"] = {
        **(tables.get("run_record") or {}),
        "path": str(records),
        "trajectory": True,
        "steps_detail": True,
    }
    data["spend_limits"] = {
        **(tables.get("spend_limits") or {}),
        "budgets": [{"scope": "tenant", "window": "day", "max_tokens": SAMPLE_DAILY_TOKENS}],
    }
    data["circuit_breaker"] = {
        **(tables.get("circuit_breaker") or {}),
        "scope": ["tenant"],
    }
    if SHADOWED in enabled:
        data[SHADOWED] = {**(tables.get(SHADOWED) or {}), "shadow": True}
    return config.model_copy(update={"plugins": config.plugins.model_validate(data)})


def record_sample(
    config: Config,
    paths: Sequence[Path],
    records: Path,
    *,
    db_dir: str | Path | None = None,
) -> Sample:
    """Play every scenario in ``paths`` guarded by :func:`sample_config`, on the config's
    shared store, appending each record to ``records``; the outage scenario twice."""
    scenarios = [load_scenario(p) for p in paths]
    order = [s for sc in scenarios for s in ([sc, sc] if sc.name == OUTAGE else [sc])]
    cfg = sample_config(config, records)
    terminations: dict[str, int] = {}
    shared = Shared(cfg.store)
    try:
        with Deployment(cfg) as dep, _db_dir(db_dir) as dbs:
            for i, sc in enumerate(order):
                db = dbs / f"sample-{i:03d}-{sc.name}.sqlite3"
                if db.exists():
                    db.unlink()
                shop = Shop(db, now=TickingNow(), durable=False)
                meta: dict[str, Any] = {"tenant": SAMPLE_TENANT}
                run, model = dep.prepare(
                    scenario=sc, tools=shop.tools(), clock=FakeClock(), meta=meta
                )
                run.shared = shared
                drive(dep.engine, run, model)
                term = run.outcome.termination if run.outcome is not None else "running"
                terminations[term] = terminations.get(term, 0) + 1
    finally:
        shared.close()
    return Sample(records, len(order), terminations)
