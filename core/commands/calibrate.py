"""``loopwarden calibrate FILE > calibrated.toml``: limits proposed from healthy real traffic.

Reads trajectories or run records (see :mod:`loopwarden.calibrate`), proposes the limits of
the successful runs (p99 with a margin) and prints a complete config file: the base config
(``--config``) with those limits set, one ``[profiles.<group>]`` per domain with enough runs,
and, as comments at its top, how the limits were derived and what they would do on that very
file -- successful runs stopped with tool work left, successful runs warned, runaways stopped
(a replay for trajectories; a count of the runs over a limit for run records).  The figures
go to stderr as well.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from loopwarden.commands import add_config_argument

if TYPE_CHECKING:
    from pathlib import Path

    from loopwarden.calibrate import Stats
    from loopwarden.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from loopwarden.calibrate import MARGIN, MIN_RUNS

    parser.add_argument("file", help="trajectory JSONL (docs/contracts.md) or run-record JSONL")
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
        help="propose a profile for a domain only with at least N successful "
        f"conversations (default {MIN_RUNS})",
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
    config: Config, path: Path, stats: Stats, system_prompt_tokens: int | None
) -> list[str]:
    """What the calibrated config does to the file's trajectories: all of them with no
    profile, then each calibrated profile on its own domain's trajectories."""
    from loopwarden._calibrate_corpus import _group
    from loopwarden.deployment import Deployment
    from loopwarden.replay import iter_trajectories, replay_config, replay_trajectory, summarize

    trajs = [t for _, t in iter_trajectories(path) if t is not None]
    lines = []
    runs: list[tuple[str | None, list[dict[str, Any]]]] = [(None, trajs)]
    runs += [
        (g, [t for t in trajs if _group(t) == g]) for g in stats.groups() if g in config.profiles
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
    from loopwarden.pluginmanager import load_plugins

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
    from loopwarden.calibrate import calibrated_config, load_stats
    from loopwarden.config import find_config, load_toml, parse_config
    from loopwarden.exceptions import ConfigError
    from loopwarden.pluginmanager import check_tables, load_plugins

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
    path = Path(args.file)
    stats = load_stats(path)
    if not stats.turns:
        raise ConfigError(
            f"no successful runs among {stats.lines} line(s): nothing to calibrate on", path=path
        )
    base_path = find_config(args.config)
    base = load_toml(base_path)
    left_out = f"{stats.unsuccessful} unsuccessful"
    if stats.unreadable:
        left_out += f", {stats.unreadable} unreadable line(s)"
    header = [
        f"loopwarden {__version__} config calibrated by `loopwarden calibrate {path.name}`",
        f"on the {stats.kind} of {len(stats.conversations)} successful conversation(s), "
        f"{len(stats.turns)} user turn(s) ({left_out} left out),",
        f"from the settings of {base_path.name}, with these limits set from the healthy "
        f"runs (p99 x {args.margin:g}, rounded up):",
        "",
    ]
    _, text = calibrated_config(
        stats, base, margin=args.margin, min_runs=args.min_runs, header=header
    )
    config = parse_config(tomllib.loads(text), path="<calibrated>")
    load_plugins(config)  # what `loopwarden config check` does: a proposal must be valid
    check_tables(config)
    if stats.kind == "trajectories":
        where = "replayed" + (
            f" with --system-prompt-tokens {args.system_prompt_tokens}"
            if args.system_prompt_tokens is not None
            else ""
        )
        figures = [
            f"What this config does to {path.name} ({where}):",
            *_replay_figures(config, path, stats, args.system_prompt_tokens),
        ]
    else:
        figures = [f"What this config does to {path.name}:", *_record_figures(config, stats)]
    comment = "".join(f"# {x}\n" for x in figures)
    sys.stdout.write(comment + "#\n" + text)
    sys.stderr.write("".join(f"{x}\n" for x in figures))
    return 0
