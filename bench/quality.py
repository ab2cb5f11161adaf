"""Detection quality: how early the guards stop runaway loops, and how rarely healthy runs.

Usage::

    python bench/quality.py [--config FILE] [--json]
                            [--trajectories real-trajectories.jsonl [--profile NAME]]

**The corpus** (``bench/scenarios/*.toml``, the scenario format of docs/contracts.md) holds the
five runaway forms -- identical repeats, oscillation, retry storms, divergent exploration with
empty results, context degradation -- in several variants each (interleaved with no-op calls,
spread over parallel calls, Chinese and English), and healthy tasks that look suspicious but are
not loops (polling a changing status, paging, one retry after a 429, several orders one by one,
a clock or a progress bar whose numbers are the answer, acknowledgements to different
statements, a call repeated beside new reads and then left).
Each carries ``[expect] healthy`` and ``kind``; each runaway its ``onset``: the model turn that
holds the first call a well-behaved agent would not have made:

* identical repeats -- the first identical repeat (a call duplicating another call of the same
  turn is wasted on its face);
* oscillation -- the first return to an earlier call;
* retry storms -- the second retry (one retry of a retryable failure is legitimate);
* divergent exploration -- the first turn, issued after an empty result, that again brings
  nothing;
* context degradation -- the second call to a missing tool or with broken arguments (after the
  first was answered with what exists).

Every scenario is played guarded (the config's plugins) and unguarded (a cap of 50 model
calls and nothing else), through the scripted model and the real demo shop
(:mod:`loopwarden.demo`).  Reported: recall (runaways stopped by a guard), false positives
(healthy runs stopped; healthy runs warned), steps wasted after onset (median, max) and the
tokens saved against the unguarded runs.

*Steps wasted after onset* of a stopped runaway = the last model turn that still ran with
tools, minus its onset (0 when the stop came at the onset turn itself): a stop in
``before_model`` turns the call it precedes into the wrap-up, so the last working turn is the
one before; a stop in any other hook happens in the turn it names.  A runaway that no guard
stopped wastes every turn from its onset to the end.

**Real runs** (``--trajectories``, ``--system-prompt-tokens N``): the same numbers
``loopwarden replay`` reports -- successful runs stopped with tool work left (a stop that cut
recorded tool calls of its own run; closing-text stops and hand-offs counted apart),
successful runs warned, runaway runs (a step or error cap, or one call 5+ times in a row)
stopped, and the steps and recorded tokens saved.

Targets (issues 6 and 10): recall 100%; no healthy scenario stopped; median steps wasted after
onset <= 1; on real runs at most 1% of successful runs stopped with tool work left, at most 5%
warned, and at least 90% of runaway runs stopped.  A missed target is printed as a
``MISSED`` line: the defaults are never tuned to this corpus or to one file of recordings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopwarden.config import Config, load_config
from loopwarden.demo import Pair, Totals, find_scenarios, play_all

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "scenarios"

#: the runaway forms of the corpus, in report order
RUNAWAY_KINDS = ("repeat", "oscillation", "retry_storm", "exploration", "degradation")

TARGETS = {
    "recall_pct": ("recall", ">=", 100.0),
    "healthy_stopped": ("healthy scenarios stopped", "<=", 0),
    "wasted_median": ("median steps wasted after onset", "<=", 1),
    "replay_successful_stopped_with_work_left_pct": (
        "real successful runs stopped with tool work left (%)",
        "<=",
        1.0,
    ),
    "replay_successful_warned_pct": ("real successful runs warned (%)", "<=", 5.0),
    "replay_runaway_runs_stopped_pct": ("real runaway runs stopped (%)", ">=", 90.0),
}


# -- scenario metrics ----------------------------------------------------------------------


def last_working_turn(rec: dict[str, Any]) -> int | None:
    """The last model turn that still ran with tools before the guard's stop (None when no
    guard stopped the run)."""
    step = rec.get("stop_step")
    if step is None or rec.get("stopped_by") is None:
        return None
    return int(step) - 1 if rec.get("stop_hook") in ("before_model", "on_start") else int(step)


def wasted_after_onset(pair: Pair) -> int | None:
    """Steps a runaway ran past its onset before a guard stopped it (see the module doc)."""
    onset = pair.scenario.expect.onset
    if onset is None:
        return None
    rec = pair.guarded
    last = last_working_turn(rec)
    if last is None or rec["termination"] == "final_answer":
        last = rec["steps"]
    return max(0, last - onset)


def _median(values: Sequence[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def scenario_metrics(pairs: list[Pair]) -> dict[str, Any]:
    """Recall, false positives, wasted steps and token savings over a played corpus."""
    runaways = [p for p in pairs if p.scenario.expect.healthy is False]
    healthy = [p for p in pairs if p.scenario.expect.healthy is True]
    stopped = [p for p in runaways if p.ok]
    missed = [p for p in runaways if not p.ok]
    cap_only = [p for p in stopped if p.guarded["termination"] == "max_steps"]
    healthy_stopped = [p for p in healthy if not p.ok]
    healthy_warned = [p for p in healthy if p.guarded["warnings"]]
    wasted = {p.name: w for p in runaways if (w := wasted_after_onset(p)) is not None}
    no_onset = [p.name for p in runaways if p.scenario.expect.onset is None]
    run_tot = Totals.of(runaways)
    all_tot = Totals.of(pairs)
    by_kind: dict[str, Any] = {}
    kinds = [
        *RUNAWAY_KINDS,
        *sorted({str(p.scenario.expect.kind) for p in runaways} - set(RUNAWAY_KINDS)),
    ]
    for kind in kinds:
        ps = [p for p in runaways if (p.scenario.expect.kind or "") == kind]
        if not ps:
            continue
        ws = [wasted[p.name] for p in ps if p.name in wasted]
        guards: dict[str, int] = {}
        for p in ps:
            if p.ok:
                g = str(p.guarded["stopped_by"])
                guards[g] = guards.get(g, 0) + 1
        by_kind[kind] = {
            "scenarios": len(ps),
            "stopped": sum(bool(p.ok) for p in ps),
            "wasted_median": _median(ws),
            "wasted_max": max(ws) if ws else None,
            "stopped_by": dict(sorted(guards.items(), key=lambda kv: (-kv[1], kv[0]))),
        }
    values = list(wasted.values())
    per_scenario = [
        {
            "name": p.name,
            "healthy": p.scenario.expect.healthy,
            "kind": p.scenario.expect.kind,
            "onset": p.scenario.expect.onset,
            "ok": p.ok,
            "termination": p.guarded["termination"],
            "stopped_by": p.guarded["stopped_by"],
            "stop_step": p.guarded.get("stop_step"),
            "first_warning_step": p.guarded.get("first_warning_step"),
            "wasted": wasted.get(p.name),
            "tokens": p.guarded["tokens"]["total"],
            "unguarded_tokens": p.unguarded["tokens"]["total"],
        }
        for p in pairs
    ]
    return {
        "scenarios": len(pairs),
        "runaways": len(runaways),
        "healthy": len(healthy),
        "recall": len(stopped),
        "recall_pct": round(100.0 * len(stopped) / len(runaways), 1) if runaways else None,
        "missed": [p.name for p in missed],
        "stopped_by_step_cap_only": [p.name for p in cap_only],
        "healthy_stopped": len(healthy_stopped),
        "healthy_stopped_names": [p.name for p in healthy_stopped],
        "healthy_warned": len(healthy_warned),
        "healthy_warned_names": [p.name for p in healthy_warned],
        "wasted_median": _median(values),
        "wasted_max": max(values) if values else None,
        "wasted_by_scenario": wasted,
        "runaways_without_onset": no_onset,
        "by_kind": by_kind,
        "per_scenario": per_scenario,
        "tokens": {
            "runaways": {
                "guarded": run_tot.tokens[0],
                "unguarded": run_tot.tokens[1],
                "saved": run_tot.tokens[1] - run_tot.tokens[0],
                "ratio": _round(run_tot.token_ratio),
            },
            "all": {
                "guarded": all_tot.tokens[0],
                "unguarded": all_tot.tokens[1],
                "saved": all_tot.tokens[1] - all_tot.tokens[0],
                "ratio": _round(all_tot.token_ratio),
            },
        },
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# -- replay metrics ------------------------------------------------------------------------


def replay_metrics(
    config: Config,
    path: Path,
    *,
    profile: str | None = None,
    tools: Path | None = None,
    carry: Sequence[str] = (),
    system_prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """``loopwarden replay``'s summary for the trajectories in ``path``."""
    from loopwarden.deployment import Deployment
    from loopwarden.traffic.replay import load_tool_flags, replay_config, replay_file, summarize

    config = replay_config(config)
    if profile:
        config.profile(profile)  # validates the name
        config = config.model_copy(
            update={"run": config.run.model_copy(update={"profile": profile})}
        )
    flags = load_tool_flags(tools) if tools else None
    started = time.perf_counter()
    with Deployment(config) as dep:
        results, bad = replay_file(
            dep, path, flags, carry, system_prompt_tokens=system_prompt_tokens
        )
    summary = summarize(results)
    summary["profile"] = profile
    summary["system_prompt_tokens"] = system_prompt_tokens
    if carry:
        summary["carry_state"] = list(carry)
    summary["unreadable_lines"] = bad
    summary["seconds"] = round(time.perf_counter() - started, 2)
    return summary


# -- targets and report --------------------------------------------------------------------


def check_targets(values: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per target that has a value: name, value, target, met."""
    out = []
    for key, (label, op, bound) in TARGETS.items():
        value = values.get(key)
        if value is None:
            continue
        met = value >= bound if op == ">=" else value <= bound
        out.append(
            {"target": key, "label": label, "value": value, "op": op, "bound": bound, "met": met}
        )
    return out


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:g}"
    if x is None:
        return "-"
    return str(x)


def report(sc: dict[str, Any], replay: dict[str, Any] | None, targets: list[dict[str, Any]]) -> str:
    """The human-readable report."""
    lines = [
        f"loopwarden detection quality: {sc['scenarios']} scenarios "
        f"({sc['runaways']} runaway, {sc['healthy']} healthy)",
        "",
        f"recall (runaways stopped by a guard)  {sc['recall']}/{sc['runaways']} "
        f"({_fmt(sc['recall_pct'])}%)",
    ]
    if sc["missed"]:
        lines.append(f"  not stopped: {', '.join(sc['missed'])}")
    if sc["stopped_by_step_cap_only"]:
        lines.append(f"  stopped only by the step cap: {', '.join(sc['stopped_by_step_cap_only'])}")
    lines += [
        f"healthy runs stopped (false positives) {sc['healthy_stopped']}/{sc['healthy']}",
    ]
    if sc["healthy_stopped_names"]:
        lines.append(f"  stopped: {', '.join(sc['healthy_stopped_names'])}")
    lines.append(f"healthy runs warned                   {sc['healthy_warned']}/{sc['healthy']}")
    if sc["healthy_warned_names"]:
        lines.append(f"  warned: {', '.join(sc['healthy_warned_names'])}")
    lines.append(
        f"steps wasted after onset              median {_fmt(sc['wasted_median'])}, "
        f"max {_fmt(sc['wasted_max'])}"
    )
    tr, ta = sc["tokens"]["runaways"], sc["tokens"]["all"]
    lines.append(
        f"tokens, runaways                      {tr['guarded']:,} guarded vs "
        f"{tr['unguarded']:,} unguarded: {_fmt(tr['ratio'])}x, {tr['saved']:,} saved"
    )
    lines.append(
        f"tokens, all scenarios                 {ta['guarded']:,} guarded vs "
        f"{ta['unguarded']:,} unguarded: {_fmt(ta['ratio'])}x, {ta['saved']:,} saved"
    )
    lines += ["", f"{'form':<14}{'stopped':>9}{'wasted med':>12}{'max':>5}  stopped by"]
    for kind, k in sc["by_kind"].items():
        by = ", ".join(f"{g} {n}" for g, n in k["stopped_by"].items())
        lines.append(
            f"{kind:<14}{k['stopped']:>5}/{k['scenarios']:<3}"
            f"{_fmt(k['wasted_median']):>12}{_fmt(k['wasted_max']):>5}  {by}"
        )
    worst = sorted(sc["wasted_by_scenario"].items(), key=lambda kv: -kv[1])[:5]
    if worst and worst[0][1] > 1:
        lines.append("most steps wasted: " + ", ".join(f"{n} {w}" for n, w in worst if w > 1))
    if replay is not None:
        r = replay
        lines += [
            "",
            f"real runs: {r['trajectories']} trajectories"
            + (f" (profile {r['profile']})" if r.get("profile") else " (no profile)")
            + f", replayed in {r['seconds']} s",
            f"successful runs stopped, work left     {r['successful_stopped_with_work_left']}"
            f"/{r['successful']} ({r['successful_stopped_with_work_left_pct']}%)"
            f"   by: {json.dumps(r['successful_stopped_with_work_left_by_reason'])}",
            f"  closing text only / at a hand-off    {r['successful_stopped_closing_text_only']}"
            f" / {r['successful_stopped_at_hand_off']}",
            f"successful runs warned                 {r['successful_warned']}/{r['successful']}"
            f" ({r['successful_warned_pct']}%)"
            f"   by: {json.dumps(r['successful_warned_by_plugin'])}",
            f"runaway runs stopped                   {r['runaway_runs_stopped']}"
            f"/{r['runaway_runs']} ({r['runaway_runs_stopped_pct']}%)"
            + (
                f"   missed: {', '.join(r['runaway_runs_missed'])}"
                if r["runaway_runs_missed"]
                else ""
            ),
            f"step-cap runs stopped                  {r['step_cap_runs_stopped']}"
            f"/{r['step_cap_runs']} ({r['step_cap_runs_stopped_pct']}%)",
            f"runs without an answer stopped         {r['runs_without_answer_stopped']}"
            f"/{r['runs_without_answer']} ({r['runs_without_answer_stopped_pct']}%)",
            f"steps saved on runaway runs            {r['steps_saved']:,}",
            f"recorded tokens saved on runaway runs  {r['recorded_tokens_saved']:,}",
            f"stops by reason                        {json.dumps(r['stops_by_reason'])}",
        ]
    lines.append("")
    for t in targets:
        status = "met   " if t["met"] else "MISSED"
        lines.append(
            f"{status} {t['label']}: {_fmt(t['value'])} (target {t['op']} {_fmt(t['bound'])})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/quality.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="deployment config (default: ./config.toml, else the shipped one)",
    )
    parser.add_argument(
        "--scenarios",
        metavar="PATH",
        action="append",
        default=[],
        help=f"scenario files or directories (default: {CORPUS})",
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        default=[],
        help="only scenarios whose file name matches (name or glob)",
    )
    parser.add_argument(
        "trajectories_file",
        metavar="TRAJECTORIES",
        type=Path,
        nargs="?",
        default=None,
        help="also replay these recorded runs (trajectory JSONL, docs/contracts.md); "
        "the same as --trajectories",
    )
    parser.add_argument(
        "--trajectories",
        metavar="FILE",
        type=Path,
        default=None,
        help="also replay these recorded runs (trajectory JSONL, docs/contracts.md)",
    )
    parser.add_argument(
        "--profile", default=None, help="the profile for the replayed trajectories (e.g. complex)"
    )
    parser.add_argument(
        "--tools",
        metavar="FILE",
        type=Path,
        default=None,
        help="declared tool natures for the replay (see loopwarden replay)",
    )
    parser.add_argument(
        "--carry-state",
        metavar="PLUGINS",
        default="",
        help="experimental, replay only: plugins whose state carries over "
        "between the runs of one conversation (see loopwarden replay)",
    )
    parser.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="replay only: the system prompt the recordings leave out, in "
        "tokens (see loopwarden replay)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.trajectories_file is not None:
        if args.trajectories is not None and args.trajectories != args.trajectories_file:
            parser.error("give the trajectories once (positionally or with --trajectories)")
        args.trajectories = args.trajectories_file

    from loopwarden.exceptions import LoopwardenError

    try:
        config = load_config(args.config)
        paths = find_scenarios(args.scenarios or [CORPUS], args.only)
        started = time.perf_counter()
        pairs = play_all(config, paths)
        sc = scenario_metrics(pairs)
        sc["seconds"] = round(time.perf_counter() - started, 2)
        replay = None
        if args.trajectories is not None:
            carry = [n.strip() for n in args.carry_state.split(",") if n.strip()]
            replay = replay_metrics(
                config,
                args.trajectories,
                profile=args.profile,
                tools=args.tools,
                carry=carry,
                system_prompt_tokens=args.system_prompt_tokens,
            )
    except LoopwardenError as exc:
        print(f"bench/quality.py: error: {exc}", file=sys.stderr)
        return 2
    values: dict[str, Any] = {
        k: sc.get(k) for k in ("recall_pct", "healthy_stopped", "wasted_median")
    }
    if replay is not None:
        for key in (
            "successful_stopped_with_work_left_pct",
            "successful_warned_pct",
            "runaway_runs_stopped_pct",
        ):
            values[f"replay_{key}"] = replay[key]
    targets = check_targets(values)
    try:
        if args.json:
            print(
                json.dumps(
                    {"config": config.path, "scenarios": sc, "replay": replay, "targets": targets},
                    ensure_ascii=False,
                )
            )
        else:
            print(report(sc, replay, targets))
    except BrokenPipeError:
        pass
    if not args.json:  # issue 36: the outage scenario with and without circuit_breaker
        print(outage_breaker_saving(config))
    return 0


def outage_breaker_saving(config: Config, runs: int = 20) -> str:
    """The built-in ``outage`` scenario played ``runs`` times in a row on one shared store,
    with the config's guards and with ``circuit_breaker`` added (issue 36): the tokens, tool
    calls and upstream executions the breaker saves once the first run has opened it.

    Runs are sequential on a fresh SQLite store of their own, each on a FakeClock (retry
    backoffs cost no time), so all of them fall within the breaker's window and ``open_s``:
    the picture of a fleet during an outage.  Observer plugins are left out.
    """
    import tempfile

    from loopwarden import Deployment, FakeClock
    from loopwarden.demo import shop_tools, without_observers

    base, _ = without_observers(config)
    enabled = [n for n in base.plugins.enabled if n != "circuit_breaker"]
    at = enabled.index("retry_policy") if "retry_policy" in enabled else len(enabled)
    tables = base.plugins.tables()
    with_breaker = base.plugins.model_validate(
        {
            **(base.plugins.model_extra or {}),
            "enabled": [*enabled[:at], "circuit_breaker", *enabled[at:]],
            "blocked": base.plugins.blocked,
            "circuit_breaker": tables.get("circuit_breaker", {}),
        }
    )
    without = base.plugins.model_validate(
        {**(base.plugins.model_extra or {}), "enabled": enabled, "blocked": base.plugins.blocked}
    )
    totals: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="lw-outage-") as tmp:
        for label, plugins in (("without breaker", without), ("with breaker", with_breaker)):
            store = base.store.model_copy(update={"url": f"sqlite:///{tmp}/{label[:4]}.db"})
            cfg = base.model_copy(update={"plugins": plugins, "store": store})
            t = totals[label] = {"tokens": 0, "tool_calls": 0, "executed": 0, "skipped_runs": 0}
            with Deployment(cfg, tools=shop_tools()) as dep:
                for _ in range(runs):
                    rec = dep.run(scenario="outage", clock=FakeClock()).record()
                    t["tokens"] += rec["tokens"]["total"]
                    t["tool_calls"] += rec["tool_calls"]
                    t["executed"] += rec["tools_executed"]
                    t["skipped_runs"] += rec["tools_executed"] == 0
    off, on = totals["without breaker"], totals["with breaker"]
    lines = [f"outage scenario, {runs} runs on one shared store (issue 36):"]
    for label, t in totals.items():
        lines.append(
            f"  {label:<16} tokens {t['tokens']:>7,}  tool calls {t['tool_calls']:>4}  "
            f"upstream executions {t['executed']:>4}  "
            f"runs that never reached it {t['skipped_runs']:>3}"
        )
    lines.append(
        f"  saved            tokens {off['tokens'] - on['tokens']:>7,}  tool calls "
        f"{off['tool_calls'] - on['tool_calls']:>4}  upstream executions "
        f"{off['executed'] - on['executed']:>4}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
