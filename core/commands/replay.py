"""``loopwarden replay FILE.jsonl [FILE.jsonl.gz ...]``: what the guards would have done to
recorded real runs, overall and per recorded ``source``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from loopwarden.commands import add_config_argument, whole_number
from loopwarden.sanitize import escape_controls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="+",
        help="trajectory JSONL (the format of docs/contracts.md), plain or gzip-compressed "
        "(.jsonl.gz), or run_record's runs.jsonl written with [plugins.run_record] "
        "trajectory = true; several files are replayed as one corpus",
    )
    parser.add_argument("--profile", help="a profile from [profiles] for every replayed run")
    parser.add_argument(
        "--tools",
        metavar="FILE",
        help="declared tool natures: a TOML file of [tools.NAME] tables "
        "(read_only / deterministic / side_effect / terminal / retryable / "
        "idempotency_keys), e.g. the deployment's config.toml, over the config's own "
        "[tools] tables (default: an undeclared tool asserts no nature)",
    )
    parser.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the size of the system prompt (policy text, tool schemas) the "
        "recordings leave out: requests without recorded usage.prompt_tokens "
        "are sized with N tokens in place of the configured system prompt "
        "(default: the configured system prompt, estimated)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one result per trajectory, then the summary, as JSON lines "
        "(with --summary: only the summary, one JSON object); the summary's by_source "
        "maps each recorded source to its own figures",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print only the summary, not one line per trajectory (with several sources: "
        "also a table of the figures per source)",
    )
    parser.add_argument(
        "--limit",
        type=whole_number,
        default=None,
        metavar="N",
        help="replay only the first N (over all files)",
    )
    parser.add_argument(
        "--carry-state",
        metavar="PLUGINS",
        default="",
        help="experimental: comma-separated plugins whose state carries over "
        "from one run of a conversation to the next (conversation-scoped "
        "detection; by default every run starts afresh)",
    )
    parser.add_argument(
        "--observers",
        action="store_true",
        help="keep the observer plugins (logging, metrics, alerting, records); "
        "by default a replay leaves them out: they cannot change a verdict, "
        "and recorded runs should not page anyone",
    )
    add_config_argument(parser)


def _counts(value: Any) -> str:
    """``{"repeat_call": 6, "failure_streak": 3}`` as ``repeat_call 6, failure_streak 3``."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


#: the summary for people: (section, [(label, how the figure reads from the summary)]); the
#: JSON (``--json``) keeps every key as it is
_SUMMARY_SECTIONS: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    (
        "Successful runs -- the guards should leave these alone",
        (
            ("runs", lambda s: str(s["successful"])),
            (
                "stopped with work left",
                lambda s: (
                    _ratio(s["successful_stopped_with_work_left"], s["successful"])
                    + f"   by {_counts(s['successful_stopped_with_work_left_by_reason'])}"
                ),
            ),
            (
                "stopped early, any reason",
                lambda s: (
                    _ratio(s["successful_stopped_early"], s["successful"])
                    + f"   by {_counts(s['early_stops_of_successful_by_reason'])}"
                ),
            ),
            (
                "  of them by loop detectors",
                lambda s: str(s["successful_stopped_early_by_detectors"]),
            ),
            (
                "  only the closing text left",
                lambda s: str(s["successful_stopped_closing_text_only"]),
            ),
            ("  at a hand-off", lambda s: str(s["successful_stopped_at_hand_off"])),
            ("stopped at their end", lambda s: str(s["successful_stopped_at_end"])),
            (
                "warned",
                lambda s: (
                    _ratio(s["successful_warned"], s["successful"])
                    + f"   by {_counts(s['successful_warned_by_plugin'])}"
                ),
            ),
        ),
    ),
    (
        "Runaway runs -- the guards should stop these",
        (
            (
                "stopped",
                lambda s: (
                    _ratio(s["runaway_runs_stopped"], s["runaway_runs"])
                    + f"   by {_counts(s['runaway_stops_by_reason'])}"
                ),
            ),
            ("  of them successful anyway", lambda s: str(s["runaway_runs_successful"])),
            ("step cap reached", lambda s: _ratio(s["step_cap_runs_stopped"], s["step_cap_runs"])),
            ("repeating a call", lambda s: _ratio(s["repeat_runs_stopped"], s["repeat_runs"])),
            (
                "identical call 5+ times",
                lambda s: _ratio(s["identical_repeat_runs_stopped"], s["identical_repeat_runs"]),
            ),
            ("missed", lambda s: ", ".join(s["runaway_runs_missed"]) or "-"),
        ),
    ),
    (
        "All runs",
        (
            (
                "runs without an answer stopped",
                lambda s: _ratio(s["runs_without_answer_stopped"], s["runs_without_answer"]),
            ),
            ("stops", lambda s: _counts(s["stops_by_reason"])),
            ("steps saved", lambda s: f"{s['steps_saved']:,}"),
            ("recorded tokens saved", lambda s: f"{s['recorded_tokens_saved']:,}"),
        ),
    ),
)


def print_summary(summary: dict[str, Any]) -> None:
    """The summary for people: what was replayed, then the successful runs (the guards should
    leave them alone), the runaways (they should stop them) and all runs, as labelled lines
    ("a/b (p%)" = a of b).  Figures this layout does not know are listed at the end as they
    are; ``--json`` prints every key."""
    s = summary
    shown: set[str] = set()
    setup = [
        f"{s.get('trajectories', 0)} trajectories replayed in {s.get('seconds', 0)} s",
        f"unreadable lines {s.get('unreadable_lines', 0)}",
        *(
            [f"run records without a trajectory {s['run_records_without_trajectory']}"]
            if s.get("run_records_without_trajectory")
            else []
        ),
        f"profile {s.get('profile') or '-'}",
        f"system prompt tokens {s.get('system_prompt_tokens') or '-'}",
    ]
    if s.get("carry_state"):
        setup.append(f"carried state {_counts(s['carry_state'])}")
    print(escape_controls(", ".join(setup)))
    shown |= {"trajectories", "seconds", "unreadable_lines", "profile", "system_prompt_tokens"}
    shown.add("run_records_without_trajectory")
    shown.add("carry_state")
    for title, rows in _SUMMARY_SECTIONS:
        lines: list[tuple[str, str]] = []
        for label, figure in rows:
            try:
                lines.append((label, figure(s)))
            except (KeyError, TypeError):  # a figure this summary lacks: left out
                continue
        if not lines:
            continue
        print(f"\n{title}")
        width = max(len(label) for label, _ in lines)
        for label, text in lines:
            print(f"  {label:<{width}}  {escape_controls(text)}")
    known = {
        "successful",
        "successful_stopped_with_work_left",
        "successful_stopped_with_work_left_pct",
        "successful_stopped_with_work_left_by_reason",
        "successful_stopped_early",
        "successful_stopped_early_pct",
        "early_stops_of_successful_by_reason",
        "successful_stopped_early_by_detectors",
        "successful_stopped_early_by_detectors_pct",
        "successful_stopped_closing_text_only",
        "successful_stopped_at_hand_off",
        "successful_stopped_at_end",
        "successful_warned",
        "successful_warned_pct",
        "successful_warned_by_plugin",
        "runaway_runs",
        "runaway_runs_stopped",
        "runaway_runs_stopped_pct",
        "runaway_stops_by_reason",
        "runaway_runs_successful",
        "step_cap_runs",
        "step_cap_runs_stopped",
        "step_cap_runs_stopped_pct",
        "repeat_runs",
        "repeat_runs_stopped",
        "identical_repeat_runs",
        "identical_repeat_runs_stopped",
        "identical_repeat_runs_stopped_pct",
        "runaway_runs_missed",
        "runs_without_answer",
        "runs_without_answer_stopped",
        "runs_without_answer_stopped_pct",
        "stops_by_reason",
        "steps_saved",
        "recorded_tokens_saved",
    }
    rest = {k: v for k, v in s.items() if k not in shown | known}
    if rest:
        print("\nOther figures")
        width = max(len(k) for k in rest)
        for k, v in rest.items():
            text = json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)
            print(f"  {k:<{width}}  {escape_controls(text)}")


def _ratio(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100.0 * part / whole:.1f}%)" if whole else "0/0"


#: the per-source table: column title, and the figure from a source's summary
_SOURCE_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("runs", lambda s: str(s["trajectories"])),
    (
        "ok stopped, work left",
        lambda s: _ratio(s["successful_stopped_with_work_left"], s["successful"]),
    ),
    ("ok warned", lambda s: _ratio(s["successful_warned"], s["successful"])),
    ("runaways stopped", lambda s: _ratio(s["runaway_runs_stopped"], s["runaway_runs"])),
    (
        "identical repeats 5+ stopped",
        lambda s: _ratio(s["identical_repeat_runs_stopped"], s["identical_repeat_runs"]),
    ),
    ("step cap stopped", lambda s: _ratio(s["step_cap_runs_stopped"], s["step_cap_runs"])),
)


def print_by_source(by_source: dict[str, dict[str, Any]]) -> None:
    """The per-source figures as an aligned table (ok = successful runs; "a/b" = a of b)."""
    rows = [["source", *(title for title, _ in _SOURCE_COLUMNS)]]
    rows += [
        [escape_controls(src), *(f(s) for _, f in _SOURCE_COLUMNS)] for src, s in by_source.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        rest = (c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))
        cells = [r[0].ljust(widths[0]), *rest]
        print("  ".join(cells).rstrip())


def _without_trajectory(path: Any, lines: list[int]) -> str:
    """What to do about run records that hold no steps to replay: which setting records them."""
    shown = ", ".join(str(n) for n in lines[:5]) + (", ..." if len(lines) > 5 else "")
    return escape_controls(
        f"loopwarden replay: {path}: {len(lines)} run record(s) without their trajectory "
        f"(line {shown}) skipped: a run record holds no steps to replay unless it was written "
        'with its trajectory -- add "run_record" to [plugins] enabled and set '
        "[plugins.run_record] trajectory = true in config.toml (off by default: it holds "
        "the conversation and the tool results, secrets masked by redact_keys), then replay "
        "the file it writes (runs.jsonl in the data directory, or [plugins.run_record] path); "
        "or give a trajectory file (docs/contracts.md)"
    )


def main(args: argparse.Namespace) -> int:
    import itertools
    import time
    from pathlib import Path

    from loopwarden.config import load_config
    from loopwarden.deployment import Deployment
    from loopwarden.exceptions import ConfigError
    from loopwarden.traffic.replay import (
        iter_trajectories,
        load_tool_flags,
        replay_config,
        replay_trajectory,
        summarize,
        summarize_by_source,
    )

    paths = [Path(f) for f in args.file]
    for path in paths:
        if not path.is_file():
            raise ConfigError("file not found", path=path)
    if args.system_prompt_tokens is not None and args.system_prompt_tokens < 0:
        raise ConfigError("must be a token count >= 0", key="--system-prompt-tokens")
    config = replay_config(load_config(args.config), observers=args.observers)
    if args.profile:
        config.profile(args.profile)  # validates the name
        config = config.model_copy(
            update={"run": config.run.model_copy(update={"profile": args.profile})}
        )
    flags = load_tool_flags(args.tools) if args.tools else None
    carry = [n.strip() for n in args.carry_state.split(",") if n.strip()]
    started = time.perf_counter()
    results, bad = [], 0
    bare: dict[Path, list[int]] = {p: [] for p in paths}  # run records without a trajectory
    with Deployment(config) as dep:
        lines = itertools.chain.from_iterable(
            iter_trajectories(p, without_trajectory=bare[p]) for p in paths
        )
        for _lineno, traj in itertools.islice(lines, args.limit):
            if traj is None:
                bad += 1
                continue
            r = replay_trajectory(
                dep, traj, flags, carry, system_prompt_tokens=args.system_prompt_tokens
            )
            results.append(r)
            if args.summary:
                continue
            if args.json:
                print(json.dumps(r.as_dict(), ensure_ascii=False))
            else:
                fw, st = r.first_warning, r.stop
                warn = "-" if fw is None else "@{step} {plugin}".format(**fw)
                stop = "-" if st is None else "@{step} {reason} ({plugin})".format(**st)
                line = f"{r.id:<48} steps {r.steps:>3}  warn {warn:<24} stop {stop}"
                print(escape_controls(line))  # one line per trajectory, whatever its id
    summary = summarize(results)
    by_source = summarize_by_source(results)
    summary["profile"] = config.run.profile
    summary["system_prompt_tokens"] = args.system_prompt_tokens
    if carry:
        summary["carry_state"] = carry
    records = sum(len(v) for v in bare.values())
    summary["unreadable_lines"] = bad - records
    if records:
        summary["run_records_without_trajectory"] = records
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["by_source"] = by_source
    if args.json and args.summary:
        print(json.dumps(summary, ensure_ascii=False))
    elif args.json:
        print(json.dumps({"summary": summary}, ensure_ascii=False))
    else:
        if not args.summary:
            print()
        print_summary({k: v for k, v in summary.items() if k != "by_source"})
        if len(by_source) > 1:  # with one source the table would repeat the lines above
            print()
            print_by_source(by_source)
    if bad:
        if bad > records:
            print(f"loopwarden replay: skipped {bad - records} unreadable line(s)", file=sys.stderr)
        for path, numbers in bare.items():
            if numbers:
                print(_without_trajectory(path, numbers), file=sys.stderr)
        if not summary.get("trajectories"):
            return 2  # nothing in the input could be replayed: bad input, not a result
    return 0
