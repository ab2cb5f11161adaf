"""``loopwarden calibrate FILE... > calibrated.toml``: limits proposed from healthy real traffic.

Reads trajectories or run records (see :mod:`loopwarden.traffic.calibrate`; several files, plain or
gzip-compressed), proposes the limits of the successful runs (p99 with a margin) and prints a
complete config file: the base config (``--config``) with those limits set from all runs
together, one ``[profiles.<slug>]`` per source (or domain, ``--by``) with enough runs, and, as
comments at its top, how the limits were derived and what they would do on that very file --
successful runs stopped with tool work left, successful runs warned, runaways stopped (a replay
for trajectories; a count of the runs over a limit for run records).  The figures go to stderr as
well.

It never proposes worse than what it replaces: each proposed limit is tried alone against the
current config's value on the same runs, and where it would stop or warn more successful runs
(then: stop fewer runaways, save less) the current value is written instead and both figures
are printed (see :func:`_compare`).

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


def _figures(s: dict[str, Any]) -> str:
    """One config's figures on the replayed runs, on one line."""
    return (
        f"successful stopped with work left "
        f"{_pct(s['successful_stopped_with_work_left'], s['successful'])}, "
        f"warned {_pct(s['successful_warned'], s['successful'])}; "
        f"runaways stopped {_pct(s['runaway_runs_stopped'], s['runaway_runs'])}; "
        f"saved {s['steps_saved']:,} steps, {s['recorded_tokens_saved']:,} recorded tokens"
    )


def _rank(s: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """Lower is better: successful runs stopped with tool work left first, then successful
    runs warned, then runaways stopped (more is better), then the saving."""
    return (
        s["successful_stopped_with_work_left"],
        s["successful_warned"],
        -s["runaway_runs_stopped"],
        -s["recorded_tokens_saved"],
        -s["steps_saved"],
    )


def _worse(proposed: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why ``proposed`` does worse than ``current`` on the same runs (None: it does not)."""
    if _rank(proposed) <= _rank(current):
        return None
    for key, what, more in (
        ("successful_stopped_with_work_left", "stops more successful runs with work left", 1),
        ("successful_warned", "warns more successful runs", 1),
        ("runaway_runs_stopped", "stops fewer runaways", -1),
        ("recorded_tokens_saved", "saves fewer tokens", -1),
    ):
        if (proposed[key] - current[key]) * more > 0:
            return what
    return "saves fewer steps"


class _Replayer:
    """Replays one set of trajectories under configs that differ only in limits.

    A limit is a counter checked against a value: a run that neither warned nor stopped
    under the current limits (which saw all of it) nor under the proposed ones is quiet
    under any mix of the two.  So the runs with no verdict in either replay keep their
    current result, and only the others are replayed again for each mix -- the same figures
    as replaying every run, in a fraction of the time."""

    def __init__(
        self,
        trajs: list[dict[str, Any]],
        system_prompt_tokens: int | None,
        current: tuple[Config, str | None],
        proposed: tuple[Config, str | None],
    ) -> None:
        self.trajs = trajs
        self.spt = system_prompt_tokens
        self.current = self.replay(*current)
        self.proposed = self.replay(*proposed)
        self.moving = [
            i
            for i, (a, b) in enumerate(zip(self.current, self.proposed, strict=True))
            if not (_quiet(a) and _quiet(b))
        ]

    def replay(
        self, config: Config, profile: str | None, only: list[int] | None = None
    ) -> list[Any]:
        from loopwarden.deployment import Deployment
        from loopwarden.traffic.replay import replay_config, replay_trajectory

        c = replay_config(config)
        c = c.model_copy(update={"run": c.run.model_copy(update={"profile": profile})})
        picked = range(len(self.trajs)) if only is None else only
        with Deployment(c) as dep:
            return [
                replay_trajectory(dep, self.trajs[i], system_prompt_tokens=self.spt) for i in picked
            ]

    def mix(self, config: Config, profile: str | None) -> list[Any]:
        """The results of a config whose every limit is either the current or the proposed."""
        results = list(self.current)
        for i, r in zip(self.moving, self.replay(config, profile, self.moving), strict=True):
            results[i] = r
        return results


def _quiet(result: Any) -> bool:
    """A replayed run no plugin had anything to say about."""
    return result.stop is None and not any(rec.get("verdicts") for rec in result.records)


def _summary_lines(label: str, s: dict[str, Any]) -> list[str]:
    return [
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


def _set(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of TOML ``data`` with dotted ``key`` set (None: removed)."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    node = out
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def _lookup(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _current_value(config: Config, key: str) -> int | None:
    """The value ``config`` gives a plugin-level limit (its plugin's default when unset)."""
    from loopwarden.host import load_plugins

    _, plugin, name = key.split(".")
    for lp in load_plugins(config):
        if lp.name == plugin:
            value = getattr(getattr(lp.obj, "settings", None), name, None)
            return value if isinstance(value, int) else None
    return None


def _compare(
    base: dict[str, Any],
    proposal: dict[str, Any],
    stats: Stats,
    trajs: list[dict[str, Any]],
    args: argparse.Namespace,
    names: dict[str, str],
) -> tuple[dict[str, tuple[int | None, str]], list[str], dict[str | None, _Replayer]]:
    """Each proposed limit against the current one on the same trajectories: the keys to
    keep at their current value (the proposal does worse), the lines that say so, and the
    replays (None: all runs; a profile's name: its group's) the written config is a mix of.

    Plugin-level limits are tried one at a time on all runs (the current config with that
    one limit changed); a profile's limits one at a time on its group's runs, against
    running them without the profile under the plugin-level limits that are kept."""
    from loopwarden.config import parse_config
    from loopwarden.traffic.calibrate import LIMITS, known_key
    from loopwarden.traffic.corpus import group_of
    from loopwarden.traffic.replay import summarize

    current_cfg = parse_config(base, path="<current>")
    replayer = _Replayer(
        trajs,
        args.system_prompt_tokens,
        (current_cfg, None),
        (parse_config(proposal, path="<calibrated>"), None),
    )
    now = summarize(replayer.current)
    lines = [
        f"  {'current config':<44} {_figures(now)}",
        f"  {'proposal, every limit':<44} {_figures(summarize(replayer.proposed))}",
        "  each proposed limit alone, against the current value:",
    ]
    keep: dict[str, tuple[int | None, str]] = {}
    replayers: dict[str | None, _Replayer] = {None: replayer}
    merged = base
    for lim in LIMITS:
        if lim.profile or not known_key(lim.key):
            continue
        proposed = _lookup(proposal, lim.key)
        current = _current_value(current_cfg, lim.key)
        if not isinstance(proposed, int) or proposed == current:
            continue
        alone = summarize(
            replayer.mix(parse_config(_set(base, lim.key, proposed), path="<>"), None)
        )
        why = _worse(alone, now)
        shown = "unset" if current is None else current
        if why is None:
            merged = _set(merged, lim.key, proposed)
            verdict = f"proposed {proposed} kept"
        else:
            keep[lim.key] = (current, f"the proposal {why} than the current value ({shown})")
            verdict = f"current {shown} kept: the proposal {why}"
        lines += [
            f"    {lim.key}: current {shown}, proposed {proposed} -> {verdict}",
            f"      current   {_figures(now)}",
            f"      proposed  {_figures(alone)}",
        ]
    taken = [lim.key for lim in LIMITS if not lim.profile and lim.key not in keep]
    changed = [k for k in taken if _lookup(merged, k) != _lookup(base, k)]
    if len(changed) > 1:  # each does no worse alone; together they must not either
        together = summarize(replayer.mix(parse_config(merged, path="<>"), None))
        why = _worse(together, now)
        lines.append(f"  the {len(changed)} proposed limits kept, together: {_figures(together)}")
        if why is not None:
            current_cfg_values = {k: _current_value(current_cfg, k) for k in changed}
            for key, value in current_cfg_values.items():
                keep[key] = (value, f"together with the other proposals it {why}")
            merged = base
            lines.append(f"    -> current values kept: together they {why}")
    final_cfg = parse_config(merged, path="<calibrated>")
    for group in stats.groups():
        name = names.get(group)
        prof = (proposal.get("profiles") or {}).get(name or "")
        if not name or not isinstance(prof, dict):
            continue
        picked = [t for t in trajs if group_of(t, args.by) == group]
        limits = {k: v for k, v in prof.items() if k != "description"}
        if not picked or not limits:
            continue
        with_profile = _set(merged, f"profiles.{name}", prof)
        sub = _Replayer(
            picked,
            args.system_prompt_tokens,
            (final_cfg, None),
            (parse_config(with_profile, path="<calibrated>"), name),
        )
        replayers[name] = sub
        without = summarize(sub.current)
        lines.append(f"  profile {name}, its {len(picked)} runs, against no profile:")
        lines.append(f"      no profile  {_figures(without)}")
        for key, value in limits.items():
            alone_data = _set(merged, f"profiles.{name}", {key: value})
            alone = summarize(sub.mix(parse_config(alone_data, path="<>"), name))
            why = _worse(alone, without)
            if why is not None:
                keep[f"profiles.{name}.{key}"] = (None, f"left out: it {why} than no profile")
            verdict = f"left out: it {why}" if why else "kept"
            lines += [
                f"    {key} = {value} -> {verdict}",
                f"      with it     {_figures(alone)}",
            ]
    return keep, lines, replayers


#: what a run record can be checked against: a per-run limit, and the run's figure it caps.  A
#: record is one run and does not say which conversation it belongs to, so conversation-wide
#: limits (and the largest request, which it does not record) cannot be checked on records
_RECORD_LIMITS: dict[str, str] = {
    "plugins.max_steps.max_steps": "model_calls",
    "plugins.tool_calls.max_tool_calls": "tool_calls",
    "plugins.token_budget.max_total_tokens": "tokens",
}
#: a profile's limits: the plugin-level key it stands in for, and the figure it caps
_RECORD_PROFILE_LIMITS: dict[str, tuple[str | None, str]] = {
    "max_steps": ("plugins.max_steps.max_steps", "model_calls"),
    "max_tokens": ("plugins.token_budget.max_total_tokens", "tokens"),
    "max_seconds": (None, "seconds"),
}


def _over(value: float | None, stats: Stats, figure: str) -> int:
    """How many of the successful runs are past ``value`` (None: no limit)."""
    if value is None:
        return 0
    runs: list[Any] = stats.conversations if figure == "seconds" else stats.turns
    return sum(1 for r in runs if (n := getattr(r, figure)) is not None and n > value)


def _record_compare(
    base: dict[str, Any], proposal: dict[str, Any], stats: Stats, names: dict[str, str]
) -> tuple[dict[str, tuple[int | None, str]], list[str]]:
    """For run records (no steps to replay): each proposed limit against the current one by
    the successful runs over it; the current value is kept where the proposal has more, and
    where records cannot show what a limit does (conversation-wide limits, the largest
    request)."""
    from loopwarden.config import parse_config
    from loopwarden.traffic.calibrate import LIMITS

    current_cfg = parse_config(base, path="<current>")
    keep: dict[str, tuple[int | None, str]] = {}
    written: dict[str, int | None] = {}
    n = len(stats.turns)
    lines = ["  each proposed limit against the current value, successful runs over it:"]
    for lim in LIMITS:
        proposed = _lookup(proposal, lim.key)
        current = _current_value(current_cfg, lim.key) if not lim.profile else None
        written[lim.key] = current
        if lim.profile or not isinstance(proposed, int) or proposed == current:
            continue
        shown = "unset" if current is None else current
        figure = _RECORD_LIMITS.get(lim.key)
        if figure is None:
            keep[lim.key] = (current, "run records cannot show what it would do")
            lines.append(
                f"    {lim.key}: current {shown} kept, not the proposed {proposed}: "
                "run records cannot show what it would do"
            )
            continue
        now, then = _over(current, stats, figure), _over(proposed, stats, figure)
        if then > now:
            keep[lim.key] = (current, f"more successful runs are over it than the current {shown}")
            verdict = f"current {shown} kept"
        else:
            written[lim.key] = proposed
            verdict = f"proposed {proposed} kept"
        lines.append(
            f"    {lim.key}: current {shown} {_pct(now, n)}, proposed {proposed} "
            f"{_pct(then, n)} -> {verdict}"
        )
    for group in stats.groups():
        name = names.get(group, "")
        prof = (proposal.get("profiles") or {}).get(name)
        if not isinstance(prof, dict):
            continue
        part = stats.only(group)
        for key, value in prof.items():
            if key == "description":
                continue
            plugin_key, figure = _RECORD_PROFILE_LIMITS.get(key, (None, ""))
            where = f"profiles.{name}.{key}"
            if not figure:
                keep[where] = (None, "left out: run records cannot show what it would do")
                lines.append(f"    {where} = {value} left out: run records cannot show it")
                continue
            instead = written.get(plugin_key) if plugin_key else None
            now, then = _over(instead, part, figure), _over(value, part, figure)
            m = len(part.conversations if figure == "seconds" else part.turns)
            verdict = "kept" if then <= now else "left out"
            if then > now:
                keep[where] = (None, "left out: more of its runs are over it than without it")
            lines.append(
                f"    {where}: without it {_pct(now, m)}, {value} {_pct(then, m)} -> {verdict}"
            )
    return keep, lines


def _record_figures(config: Config, stats: Stats) -> list[str]:
    """For run records: the successful runs at least one written limit would have cut."""
    values = {key: _current_value(config, key) for key in _RECORD_LIMITS}
    over = [
        t
        for t in stats.turns
        if any(
            (v := values[key]) is not None and (n := getattr(t, f)) is not None and n > v
            for key, f in _RECORD_LIMITS.items()
        )
    ]
    return [
        f"  successful runs over a limit  {_pct(len(over), len(stats.turns))}",
        "  (runaways caught need trajectories: run records hold no steps to replay)",
    ]


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from loopwarden import __version__
    from loopwarden.config import find_config, layered_config, load_toml, parse_config
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
    # the effective config, whole: a calibrated file must not depend on where the base's
    # parents (extends) were found
    base = layered_config(load_toml(base_path), path=str(base_path)).data
    base.pop("extends", None)
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
    names = profile_names(stats.groups(), taken=sorted(base.get("profiles") or {}))
    proposal, text = calibrated_config(
        stats, base, margin=args.margin, min_runs=args.min_runs, header=header
    )
    # a proposal must be valid: what `loopwarden config check` does (every table, a
    # switched-off built-in's too)
    load_plugins(parse_config(tomllib.loads(text), path="<calibrated>"))
    if stats.kind == "trajectories":
        from loopwarden.traffic.replay import iter_trajectories, summarize

        how = "replayed" + (
            f" with --system-prompt-tokens {args.system_prompt_tokens}"
            if args.system_prompt_tokens is not None
            else ""
        )
        trajs = [t for p in paths for _, t in iter_trajectories(p) if t is not None]
        keep, compared, replayers = _compare(base, proposal, stats, trajs, args, names)
        _, text = calibrated_config(
            stats, base, margin=args.margin, min_runs=args.min_runs, header=header, keep=keep
        )
        config = parse_config(tomllib.loads(text), path="<calibrated>")
        load_plugins(config)
        figures = [
            f"What this config does to {names_shown} ({how}):",
            *_summary_lines("no profile", summarize(replayers[None].mix(config, None))),
        ]
        for name, sub in replayers.items():
            if name is not None and name in config.profiles:
                label = f"profile {name}, {name} runs only"
                figures += _summary_lines(label, summarize(sub.mix(config, name)))
        figures += [
            "",
            f"Compared with the current config ({base_path.name}) on the same runs ({how}): "
            f"{len(keep)} proposed limit(s) that would do worse are not written",
            *compared,
        ]
    else:
        keep, compared = _record_compare(base, proposal, stats, names)
        _, text = calibrated_config(
            stats, base, margin=args.margin, min_runs=args.min_runs, header=header, keep=keep
        )
        config = parse_config(tomllib.loads(text), path="<calibrated>")
        figures = [
            f"What this config does to {names_shown}:",
            *_record_figures(config, stats),
            "",
            f"Compared with the current config ({base_path.name}) on the same runs: "
            f"{len(keep)} proposed limit(s) that would do worse are not written",
            *compared,
        ]
    comment = "".join(f"# {x}\n" if x else "#\n" for x in figures)
    sys.stdout.write(comment + "#\n" + text)
    sys.stderr.write("".join(f"{x}\n" for x in figures))
    return 0
