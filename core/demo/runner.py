"""Play scenarios with and without guards: the logic behind ``loopwarden demo`` and the
detection-quality benchmark (``bench/quality.py``).

Every scenario is played twice through the scripted model and the real demo shop:

* **guarded** -- with the deployment's plugins, as configured;
* **unguarded** -- with nothing but a safety cap of :data:`UNGUARDED_CAP` model calls (the
  essential ``max_steps`` plugin alone, no warning, profiles ignored), as in the incident where
  an unguarded agent ran 50 rounds overnight.

Each run gets a fresh shop database (seeded the same way), a shared store of its own (the
side-effect ledger, budgets) and a :class:`~loopwarden.FakeClock`, so runs never influence each
other, the user's own shop data is never touched, refunds are
still real rows (counted per run), and a scenario's simulated slowness (``delay_s``) costs no
real time.  The shop's clock starts at :data:`DEMO_NOW`, inside the 7-day return window of
the seed order 88231, and moves on 20 seconds per reading, so the results do not depend on
the day the demo runs.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from loopwarden.clock import FakeClock
from loopwarden.config import Config, ProfileConfig
from loopwarden.demo.shop import Shop, with_shop_prompt
from loopwarden.demo.trajectories import run_steps, usage_tape
from loopwarden.deployment import Deployment
from loopwarden.engine.drivers import drive
from loopwarden.events import Usage
from loopwarden.exceptions import ConfigError, ScenarioError
from loopwarden.models.scenario import Scenario, builtin_scenarios, load_scenario
from loopwarden.run import Run
from loopwarden.store import Shared
from loopwarden.traffic.offline import observer_names, without_observers

__all__ = [
    "DEMO_NOW",
    "SCENARIO_SOURCE",
    "SYNTHETIC_NOTE",
    "UNGUARDED_CAP",
    "Pair",
    "Pricer",
    "TickingNow",
    "Totals",
    "find_scenarios",
    "fresh_store",
    "judge",
    "observer_names",
    "play",
    "play_all",
    "scenario_trajectory",
    "shop_world",
    "stop_step",
    "unguarded_config",
    "unguarded_deployment",
    "without_observers",
]

#: the model-call cap of an unguarded run
UNGUARDED_CAP = 50
#: the demo shop's "now": three days after order 88231 was signed for
DEMO_NOW = datetime(2026, 6, 25, 10, 30, tzinfo=timezone(timedelta(hours=8)))

#: terminations that mean "the run ended by itself" for a healthy scenario without
#: ``expect.termination``
NATURAL_ENDS = ("final_answer",)


# -- selecting scenarios -------------------------------------------------------------------


def find_scenarios(sources: Sequence[str | Path] = (), only: Sequence[str] = ()) -> list[Path]:
    """The scenario files to play: ``sources`` (files or directories of ``*.toml``; default
    the built-in scenarios), kept when their file stem matches one of the ``only`` patterns
    (exact names or shell globs; default: all)."""
    paths: list[Path] = []
    if not sources:
        paths = builtin_scenarios()
    for src in sources:
        p = Path(src)
        if p.is_dir():
            paths.extend(sorted(p.glob("*.toml")))
        elif p.is_file():
            paths.append(p)
        else:
            raise ScenarioError("no such scenario file or directory", path=str(p))
    if only:
        paths = [p for p in paths if any(fnmatch.fnmatchcase(p.stem, pat) for pat in only)]
    return paths


# -- the unguarded deployment --------------------------------------------------------------


def unguarded_config(config: Config, cap: int = UNGUARDED_CAP) -> Config:
    """``config`` with every plugin removed but the essential step cap, set to ``cap``.

    The cap does not warn, and profiles keep their names (a scenario may name one) but lose
    their limits, so the cap is the only thing that ends a runaway.
    """
    plugins = config.plugins.model_validate(
        {
            "enabled": ["max_steps"],
            "blocked": [],
            "max_steps": {"max_steps": cap, "warn_remaining": 0},
        }
    )
    profiles = {
        name: ProfileConfig(description=p.description) for name, p in config.profiles.items()
    }
    return config.model_copy(update={"plugins": plugins, "profiles": profiles})


# -- pricing -------------------------------------------------------------------------------


class Pricer:
    """Prices token usage the way the guarded deployment's ``cost_budget`` plugin does.

    An unguarded run has no cost plugin, so its cost would read 0; pricing both sides with the
    same prices keeps the comparison honest.  Without a ``cost_budget`` plugin, costs are None.
    """

    def __init__(self, deployment: Deployment) -> None:
        self._plugin: Any = None
        self.currency: str | None = None
        for lp in deployment.plugins:
            if lp.name == "cost_budget" and callable(getattr(lp.obj, "price_of", None)):
                self._plugin = lp.obj
                self.currency = getattr(getattr(lp.obj, "settings", None), "currency", None)

    def cost(self, model: str | None, prompt: int, completion: int) -> Decimal | None:
        if self._plugin is None:
            return None
        price = self._plugin.price_of(model)
        if price is None:
            return None
        value: Decimal = price.cost(prompt, completion)
        return value


# -- playing -------------------------------------------------------------------------------


def stop_step(run: Run) -> tuple[int | None, str | None]:
    """The model turn at which a guard stopped ``run`` and the hook it stopped in.

    A stop in ``before_model`` (or ``on_start``) concerns the call about to be made, so its
    turn is ``run.step + 1`` at the time -- the turn the stop replaced with the wrap-up (or
    refused); a stop in any other hook concerns the turn it happened in.  ``(None, None)``
    when no guard stopped the run.
    """
    o = run.outcome
    if o is None or o.stopped_by is None:
        return None, None
    for entry in run.verdicts:
        if (
            entry["kind"] == "stop"
            and entry["plugin"] == o.stopped_by
            and entry.get("reason") == o.termination
        ):
            hook = str(entry["hook"])
            step = int(entry["step"]) + (1 if hook in ("before_model", "on_start") else 0)
            return step, hook
    return run.step, None


def judge(scenario: Scenario, record: dict[str, Any]) -> tuple[bool | None, str]:
    """Did the guarded run end as the scenario's ``[expect]`` says?

    Returns (ok, why): ok is None for a scenario without ``expect.healthy``.  A runaway must
    be stopped by a guard (any plugin; with ``expect.termination``, for that reason); a healthy
    run must end with ``expect.termination`` (default: the model's own final answer).
    """
    exp = scenario.expect
    term = record["termination"]
    wanted = exp.termination
    wanted_list = [wanted] if isinstance(wanted, str) else list(wanted or [])
    if exp.healthy is None:
        return None, "unlabelled"
    if exp.healthy:
        allowed = wanted_list or list(NATURAL_ENDS)
        if term in allowed:
            return True, "finished"
        return False, f"healthy run ended with {term} (expected {' or '.join(allowed)})"
    if record["stopped_by"] is None or term == "final_answer":
        return False, f"runaway not stopped by a guard (ended with {term})"
    if wanted_list and term not in wanted_list:
        return False, f"stopped by {term} (expected {' or '.join(wanted_list)})"
    return True, "stopped"


@dataclass
class Pair:
    """One scenario played guarded and unguarded."""

    scenario: Scenario
    guarded: dict[str, Any]
    unguarded: dict[str, Any]
    ok: bool | None
    why: str
    #: the unguarded run as a recorded trajectory (``play_all(..., trajectories=True)``)
    trajectory: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.scenario.name


@dataclass
class Totals:
    """Sums over both sides and the saving ratios."""

    runs: int = 0
    steps: list[int] = field(default_factory=lambda: [0, 0])
    tool_calls: list[int] = field(default_factory=lambda: [0, 0])
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    cost: list[Decimal | None] = field(default_factory=lambda: [Decimal(0), Decimal(0)])
    answers: list[int] = field(default_factory=lambda: [0, 0])
    refund_rows: list[int] = field(default_factory=lambda: [0, 0])

    @classmethod
    def of(cls, pairs: Iterable[Pair]) -> Totals:
        t = cls()
        for p in pairs:
            t.runs += 1
            for i, rec in enumerate((p.guarded, p.unguarded)):
                t.steps[i] += rec["steps"]
                t.tool_calls[i] += rec["tool_calls"]
                t.tokens[i] += rec["tokens"]["total"]
                t.answers[i] += bool(rec["final_answer_present"])
                t.refund_rows[i] += int(rec.get("refund_rows") or 0)
                c = t.cost[i]
                cost = rec.get("priced_cost")
                t.cost[i] = None if c is None or cost is None else c + Decimal(str(cost))
        return t

    @property
    def token_ratio(self) -> float | None:
        """Unguarded tokens per guarded token (the saving as a ratio)."""
        g, u = self.tokens
        return u / g if g else None

    def as_dict(self) -> dict[str, Any]:
        def side(i: int) -> dict[str, Any]:
            c = self.cost[i]
            return {
                "steps": self.steps[i],
                "tool_calls": self.tool_calls[i],
                "tokens": self.tokens[i],
                "cost": None if c is None else float(c),
                "final_answers": self.answers[i],
                "refund_rows": self.refund_rows[i],
            }

        ratio = self.token_ratio
        return {
            "scenarios": self.runs,
            "guarded": side(0),
            "unguarded": side(1),
            "tokens_saved": self.tokens[1] - self.tokens[0],
            "token_ratio": None if ratio is None else round(ratio, 2),
        }


Progress = Callable[[str, Scenario, bool, "dict[str, Any] | None"], None]


@contextmanager
def _without_env_plugins() -> Iterator[None]:
    """Keep ``LOOPWARDEN_PLUGINS`` from adding plugins to the unguarded baseline."""
    from loopwarden.engine.pluginmanager import ENV_EXTRA

    saved = os.environ.pop(ENV_EXTRA, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[ENV_EXTRA] = saved


def unguarded_deployment(config: Config, cap: int = UNGUARDED_CAP) -> Deployment:
    """The baseline: :func:`unguarded_config`, and nothing added from the environment."""
    with _without_env_plugins():
        return Deployment(unguarded_config(config, cap))


@contextmanager
def _db_dir(keep: str | Path | None) -> Iterator[Path]:
    if keep is not None:
        d = Path(keep)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the directory: {exc.strerror or exc}", path=d, key="--db-dir"
            ) from None
        if not os.access(d, os.W_OK | os.X_OK):
            raise ConfigError("cannot write in this directory", path=d, key="--db-dir")
        yield d
        return
    with tempfile.TemporaryDirectory(prefix="loopwarden-demo-") as tmp:
        yield Path(tmp)


class TickingNow:
    """The demo shop's clock: :data:`DEMO_NOW`, moving on a little every time it is read, as
    a real clock would between two tool calls (a clock that never moves would make every
    repeated time check look like a loop)."""

    def __init__(self, step_s: float = 20.0) -> None:
        self._step = timedelta(seconds=step_s)
        self.reset()

    def reset(self) -> None:
        """Back to :data:`DEMO_NOW`."""
        self._now = DEMO_NOW

    def __call__(self) -> datetime:
        now = self._now
        self._now += self._step
        return now


@contextmanager
def fresh_store(deployment: Deployment, path: Path) -> Iterator[Shared]:
    """A shared store (ledger, budgets) of its own at ``path`` (opened on first use)."""
    if path.exists():
        path.unlink()
    shared = Shared(deployment.config.store.model_copy(update={"url": f"sqlite:///{path}"}))
    try:
        yield shared
    finally:
        shared.close()


@contextmanager
def shop_world(deployment: Deployment, db: Path) -> Iterator[tuple[Shop, Shared]]:
    """A world of its own for one run: a fresh shop at ``db`` (seeded, its clock at
    :data:`DEMO_NOW`) and the shared store (ledger, budgets) beside it."""
    if db.exists():
        db.unlink()
    with fresh_store(deployment, db.with_suffix(".store")) as shared:
        yield Shop(db, now=TickingNow(), durable=False), shared


def play(
    deployment: Deployment,
    scenario: Scenario,
    db: Path,
    *,
    pricer: Pricer | None = None,
    guarded: bool = True,
) -> tuple[Run, dict[str, Any]]:
    """Play one scenario on a fresh shop at ``db``; returns the run and its extended record.

    Extensions to the run record: ``guarded``, ``refund_rows`` (rows in this run's shop),
    ``stop_step`` / ``stop_hook`` (see :func:`stop_step`), ``first_warning_step``,
    ``priced_cost`` (usage priced by ``pricer``), ``expect``.
    """
    with shop_world(deployment, db) as (shop, shared):
        run, model = deployment.prepare(scenario=scenario, tools=shop.tools(), clock=FakeClock())
        run.shared = shared
        drive(deployment.engine, run, model)
    rec = run.record()
    step, hook = stop_step(run)
    rec["guarded"] = guarded
    rec["refund_rows"] = len(shop.refunds())
    rec["stop_step"] = step
    rec["stop_hook"] = hook
    rec["first_warning_step"] = rec["warnings"][0]["step"] if rec["warnings"] else None
    priced = pricer.cost(run.model_name, run.usage.prompt, run.usage.completion) if pricer else None
    rec["priced_cost"] = None if priced is None else float(priced)
    if not guarded and priced is not None and pricer is not None:
        # no cost plugin ran: report the same prices the guarded side pays
        rec["cost"] = float(priced)
        rec["cost_currency"] = pricer.currency
    rec["expect"] = scenario.expect.model_dump(exclude_none=True)
    return run, rec


def play_all(
    config: Config,
    paths: Sequence[Path],
    *,
    progress: Progress | None = None,
    db_dir: str | Path | None = None,
    cap: int = UNGUARDED_CAP,
    observers: bool = False,
    trajectories: bool = False,
) -> list[Pair]:
    """Play every scenario in ``paths`` guarded (``config``) and unguarded (a cap of ``cap``).

    ``progress(phase, scenario, guarded, record)`` is called before (``"start"``, record
    None) and after (``"done"``) each run.  ``db_dir`` keeps the per-run shop databases there
    (default: a temporary directory, removed afterwards).  Pure observers are left out unless
    ``observers`` (see :func:`without_observers`).  With ``trajectories``, each pair keeps its
    unguarded run as a recorded trajectory (:func:`scenario_trajectory`).
    """
    scenarios = [load_scenario(p) for p in paths]
    config = with_shop_prompt(config)
    if not observers:
        config, _ = without_observers(config)
    pairs: list[Pair] = []
    with (
        Deployment(config) as guarded_dep,
        unguarded_deployment(config, cap) as unguarded_dep,
        _db_dir(db_dir) as dbs,
        usage_tape() as tape,
    ):
        pricer = Pricer(guarded_dep)
        for i, sc in enumerate(scenarios):
            recs: list[dict[str, Any]] = []
            for guarded, dep in ((True, guarded_dep), (False, unguarded_dep)):
                if progress is not None:
                    progress("start", sc, guarded, None)
                db = dbs / f"{i:03d}-{sc.name}-{'guarded' if guarded else 'unguarded'}.sqlite3"
                run, rec = play(dep, sc, db, pricer=pricer, guarded=guarded)
                usages = tape.pop(run.run_id, [])  # the unguarded run's, after the loop
                recs.append(rec)
                if progress is not None:
                    progress("done", sc, guarded, rec)
            ok, why = judge(sc, recs[0])
            recs[0]["ok"] = ok
            traj = scenario_trajectory(sc, run, recs[1], usages) if trajectories else None
            pairs.append(Pair(sc, recs[0], recs[1], ok, why, traj))
    return pairs


#: the ``source`` of the built-in scenarios' trajectories (``loopwarden demo --trajectories``)
SCENARIO_SOURCE = "loopwarden-demo/scenarios"
#: what every trajectory the demo writes says of itself (``meta.note``)
SYNTHETIC_NOTE = "synthetic demo traffic over the demo shop, not a statistic of real agents"


def scenario_trajectory(
    scenario: Scenario, run: Run, record: dict[str, Any], usages: list[Usage | None]
) -> dict[str, Any]:
    """A scenario's unguarded run as a recorded trajectory.

    ``success`` is true only for a healthy scenario whose run ended by itself, false for a
    runaway scenario and for a healthy one that ran to the cap, null for an unlabelled one;
    ``meta.termination_reason`` is the run's termination (``max_steps`` at the cap: what
    replay counts as a run that hit its step cap).
    """
    healthy = scenario.expect.healthy
    success = None if healthy is None else healthy and record["termination"] in NATURAL_ENDS
    return {
        "source": SCENARIO_SOURCE,
        "id": scenario.name,
        "success": success,
        "user": scenario.user,
        "steps": run_steps(run, usages),
        "final_answer_present": bool(record["final_answer_present"]),
        "meta": {
            "domain": "demo-shop",
            "scenario": scenario.name,
            "provokes": "?" if healthy is None else "healthy" if healthy else "runaway",
            "termination_reason": record["termination"],
            "note": SYNTHETIC_NOTE,
        },
    }
