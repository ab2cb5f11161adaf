"""``loopwarden calibrate FILE... > calibrated.toml``: limits proposed from healthy real traffic.

Reads trajectories or run records (see :mod:`loopwarden.traffic.calibrate`; several files, plain or
gzip-compressed), proposes the limits of the successful runs (p99 with a margin) and prints a
complete config file: the base config (``--config``) with those limits set from all runs
together, one ``[profiles.<slug>]`` per source (or domain, ``--by``) with enough runs, and, as
comments at its top, how the limits were derived and what they would do on that very file --
successful runs stopped with tool work left, successful runs warned, runaways stopped (a replay
for trajectories; a count of the runs over a limit for run records).  The figures go to stderr as
well.

It refuses (exit 2) a corpus of fewer than ``--min-runs`` (default 100) successful
conversations: the nearest-rank p99 of fewer than 100 values is their maximum, and a limit
set from the busiest of a handful of runs is a guess, not a calibration.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from loopwarden.commands import add_config_argument

if TYPE_CHECKING:
    from pathlib import Path

    from loopwarden.config import Config
    from loopwarden.traffic.calibrate import Stats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from loopwarden.traffic.calibrate import MARGIN, MIN_RUNS

    parser.add_argument(
        "file",
        nargs="+",
        help="trajectory JSONL (docs/contracts.md) or run-record JSONL, plain or "
        "gzip-compressed (.jsonl.gz); several files are one corpus",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help=f"proposed limit = p99 x MARGIN, rounded up (default {MARGIN:g})",
    )
    parser.add_argument(
        "--min-runs",
        type=int,
        default=MIN_RUNS,
        metavar="N",
        help="the fewest successful conversations a p99 is taken from (default "
        f"{MIN_RUNS}: a nearest-rank p99 of fewer is just the maximum): fewer in the "
        "corpus is refused (exit 2); a limit or profile with fewer values is not "
        "proposed.  Lower it only knowing that the limits are then the busiest run x "
        "MARGIN",
    )
    parser.add_argument(
        "--by",
        choices=("source", "domain"),
        default="source",
        help="one [profiles.<slug>] per recorded source (default) or per domain "
        "(meta.domain, else the last part of the source; run records: their profile)",
    )
    parser.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="for the figures' replay: the system prompt the recordings leave "
        "out (see loopwarden replay)",
    )
    add_config_argument(parser)


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100.0 * part / whole:.1f}%)" if whole else "0/0"


def _replay_figures(
    config: Config,
    paths: list[Path],
    stats: Stats,
    system_prompt_tokens: int | None,
    names: dict[str, str],
    by: str,
) -> list[str]:
    """What the calibrated config does to the files' trajectories: all of them with no
    profile, then each calibrated profile on its own group's trajectories (``names``: the
    profile name of each group)."""
    from loopwarden.deployment import Deployment
    from loopwarden.traffic.corpus import group_of
    from loopwarden.traffic.replay import (
        iter_trajectories,
        replay_config,
        replay_trajectory,
        summarize,
    )

    trajs = [t for p in paths for _, t in iter_trajectories(p) if t is not None]
    lines = []
    runs: list[tuple[str | None, list[dict[str, Any]]]] = [(None, trajs)]
    runs += [
        (names[g], [t for t in trajs if group_of(t, by) == g])
        for g in stats.groups()
        if names.get(g) in config.profiles
    ]
    for profile, group in runs:
        c = replay_config(config)
        c = c.model_copy(update={"run": c.run.model_copy(update={"profile": profile})})
        with Deployment(c) as dep:
            s = summarize(
                replay_trajectory(dep, t, system_prompt_tokens=system_prompt_tokens) for t in group
            )
        label = "no profile" if profile is None else f"profile {profile}, {profile} runs only"
        lines += [
            f"  {label}: {s['trajectories']} trajectories",
            f"    successful runs stopped with tool work left  "
            f"{_pct(s['successful_stopped_with_work_left'], s['successful'])}"
            + (
                f" by {json.dumps(s['successful_stopped_with_work_left_by_reason'])}"
                if s["successful_stopped_with_work_left"]
                else ""
            ),
            f"    successful runs warned                       "
            f"{_pct(s['successful_warned'], s['successful'])}",
            f"    runaway runs stopped                         "
            f"{_pct(s['runaway_runs_stopped'], s['runaway_runs'])}",
        ]
    return lines


def _record_figures(config: Config, stats: Stats) -> list[str]:
    """For run records: the successful runs at least one proposed limit would have cut."""
    from loopwarden.host import load_plugins

    settings = {lp.name: getattr(lp.obj, "settings", None) for lp in load_plugins(config)}

    def limit(plugin: str, key: str) -> int | None:
        s = settings.get(plugin)
        value = getattr(s, key, None) if s is not None else None
        return value if isinstance(value, int) else None

    steps, calls = limit("max_steps", "max_steps"), limit("tool_calls", "max_tool_calls")
    tokens = limit("token_budget", "max_total_tokens")
    over = [
        t
        for t in stats.turns
        if (steps is not None and t.model_calls > steps)
        or (calls is not None and t.tool_calls > calls)
        or (tokens is not None and t.tokens is not None and t.tokens > tokens)
    ]
    return [
        f"  successful runs over a proposed limit  {_pct(len(over), len(stats.turns))}",
        "  (runaways caught need trajectories: run records hold no steps to replay)",
    ]


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from loopwarden import __version__
    from loopwarden.config import find_config, load_toml, parse_config
    from loopwarden.exceptions import ConfigError
    from loopwarden.host import load_plugins
    from loopwarden.traffic.calibrate import MIN_RUNS, calibrated_config, load_stats, profile_names

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    if not args.margin >= 1.0:
        raise ConfigError(f"must be >= 1, got {args.margin}", key="--margin")
    if args.min_runs < 1:
        raise ConfigError(f"must be >= 1, got {args.min_runs}", key="--min-runs")
    if args.system_prompt_tokens is not None and args.system_prompt_tokens < 0:
        raise ConfigError("must be a token count >= 0", key="--system-prompt-tokens")
    paths = [Path(f) for f in args.file]
    where = ", ".join(str(p) for p in paths)
    stats = load_stats(paths, by=args.by)
    if not stats.turns:
        raise ConfigError(
            f"no successful runs among {stats.lines} line(s): nothing to calibrate on", path=where
        )
    if len(stats.conversations) < args.min_runs:
        raise ConfigError(
            f"only {len(stats.conversations)} successful conversation(s): too few to "
            f"calibrate on -- a p99 needs at least {args.min_runs} (with fewer, the "
            "nearest-rank p99 is just the busiest run); record more runs, or lower "
            "--min-runs knowing the limits are then the busiest run x MARGIN",
            path=where,
        )
    if args.min_runs < MIN_RUNS:
        sys.stderr.write(
            f"loopwarden calibrate: warning: --min-runs {args.min_runs} < {MIN_RUNS}: "
            "limits proposed from fewer than 100 values are the busiest run x margin, "
            "not a p99\n"
        )
    base_path = find_config(args.config)
    base = load_toml(base_path)
    left_out = f"{stats.unsuccessful} unsuccessful"
    if stats.unreadable:
        left_out += f", {stats.unreadable} unreadable line(s)"
    names_shown = " ".join(p.name for p in paths)
    header = [
        f"loopwarden {__version__} config calibrated by `loopwarden calibrate {names_shown}`",
        f"on the {stats.kind} of {len(stats.conversations)} successful conversation(s), "
        f"{len(stats.turns)} user turn(s) ({left_out} left out),",
        f"from the settings of {base_path.name}, with these limits set from the healthy "
        f"runs (p99 x {args.margin:g}, rounded up; only from {args.min_runs}+ values), "
        f"and a profile per {args.by} with {args.min_runs}+ successful conversations:",
        *(
            [
                f"WARNING: --min-runs {args.min_runs} < {MIN_RUNS}: a limit from fewer than "
                f"{MIN_RUNS} values is the busiest run x {args.margin:g}, not a p99",
            ]
            if args.min_runs < MIN_RUNS
            else []
        ),
        "",
    ]
    _, text = calibrated_config(
        stats, base, margin=args.margin, min_runs=args.min_runs, header=header
    )
    names = profile_names(stats.groups(), taken=sorted(base.get("profiles") or {}))
    config = parse_config(tomllib.loads(text), path="<calibrated>")
    # what `loopwarden config check` does (every table, a switched-off built-in's too): a
    # proposal must be valid
    load_plugins(config)
    if stats.kind == "trajectories":
        how = "replayed" + (
            f" with --system-prompt-tokens {args.system_prompt_tokens}"
            if args.system_prompt_tokens is not None
            else ""
        )
        figures = [
            f"What this config does to {names_shown} ({how}):",
            *_replay_figures(config, paths, stats, args.system_prompt_tokens, names, args.by),
        ]
    else:
        figures = [f"What this config does to {names_shown}:", *_record_figures(config, stats)]
    comment = "".join(f"# {x}\n" for x in figures)
    sys.stdout.write(comment + "#\n" + text)
    sys.stderr.write("".join(f"{x}\n" for x in figures))
    return 0
