"""``loopwarden demo``: every built-in scenario, with the deployment's guards and without.

Plays each scenario twice through the scripted model and the real demo shop (a fresh
temporary database per run, see :mod:`loopwarden.demo`), prints a table -- rich when it is
installed and the output is a terminal, plain text otherwise -- and the totals with the saving
as a ratio.  Exit code 0 when every runaway scenario was stopped by a guard and every healthy
one finished as expected, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from loopwarden.commands import add_config_argument, whole_number
from loopwarden.commands.demotable import GUARDED as GUARDED
from loopwarden.commands.demotable import HEADERS as HEADERS
from loopwarden.commands.demotable import LEGEND_WIDTH as LEGEND_WIDTH
from loopwarden.commands.demotable import RIGHT as RIGHT
from loopwarden.commands.demotable import UNGUARDED as UNGUARDED
from loopwarden.commands.demotable import legend as legend
from loopwarden.commands.demotable import (
    render_legend_plain,
    render_plain,
    render_rich,
    summary_lines,
)
from loopwarden.commands.demotable import rows as rows
from loopwarden.sanitize import escape_controls, raw_stream

if TYPE_CHECKING:
    from collections.abc import Iterator

    from loopwarden.config import Config
    from loopwarden.demo import Pair, Progress
    from loopwarden.models.scenario import Scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one run record per line (with a `guarded` field), then the totals",
    )
    parser.add_argument(
        "--scenarios",
        metavar="PATH",
        action="append",
        default=[],
        help="play these scenario files or directories instead of the built-in ones (repeatable)",
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        default=[],
        help="play only scenarios whose file name matches (a name or a shell glob; repeatable)",
    )
    parser.add_argument(
        "--db-dir",
        metavar="DIR",
        default=None,
        help="keep each run's shop database in DIR (default: a temporary "
        "directory, removed afterwards)",
    )
    parser.add_argument(
        "--observers",
        action="store_true",
        help="keep the observer plugins (logging, metrics, alerting, records) "
        "in the guarded runs; by default the demo leaves them out: they cannot "
        "change a run, and their output would bury the table",
    )
    parser.add_argument(
        "--no-records",
        action="store_true",
        help="do not keep the console sample: by default, after the measured runs, the "
        "scenarios are played once more, guarded, and their records appended to the records "
        "file (on the shared store: a tenant 'demo' with a budget that never binds, a "
        "breaker the outage opens, oscillation in shadow mode) for `loopwarden console`",
    )
    parser.add_argument(
        "--trajectories",
        metavar="FILE",
        default=None,
        help="also write the runs played UNGUARDED as recorded trajectories (the format "
        "`loopwarden replay` and `calibrate` read; gzip-compressed when FILE ends .gz): the "
        "scenarios' and --conversations generated ones -- synthetic demo traffic, not a "
        "statistic of real agents",
    )
    parser.add_argument(
        "--conversations",
        metavar="N",
        type=whole_number,
        default=None,
        help="with --trajectories: how many synthetic conversations to generate over the demo "
        "shop (default: 150, enough for calibrate's minimum of 100 successful ones; "
        "0: only the scenarios)",
    )
    parser.add_argument(
        "--seed",
        metavar="N",
        type=int,
        default=None,
        help="with --trajectories: the generator's seed (default: 21; the same seed "
        "writes the same file)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    add_config_argument(parser)


# -- progress ------------------------------------------------------------------------------


def _plain_progress(total: int, err: TextIO) -> Progress:
    done = [0]

    def report(phase: str, sc: Scenario, guarded: bool, rec: dict[str, Any] | None) -> None:
        if phase != "done" or rec is None:
            return
        done[0] += 1
        side = "guarded" if guarded else "unguarded"
        print(
            f"[{done[0]}/{total}] {sc.name} ({side}): {rec['termination']}, "
            f"{rec['steps']} turns, {rec['tokens']['total']:,} tokens",
            file=err,
            flush=True,
        )

    return report


class _RichProgress:
    """A rich progress bar on stderr (a context manager yielding the callback)."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=Console(file=raw_stream(sys.stderr)),  # its cursor codes pass unescaped
            transient=True,
        )
        self.task = self.bar.add_task("playing", total=total)

    def __enter__(self) -> Progress:
        from rich.markup import escape

        self.bar.start()

        def report(phase: str, sc: Scenario, guarded: bool, rec: dict[str, Any] | None) -> None:
            side = "guarded" if guarded else "unguarded"
            if phase == "start":
                name = escape(escape_controls(sc.name))
                self.bar.update(self.task, description=f"{name} ({side})")
            else:
                self.bar.advance(self.task)

        return report

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


class _NoProgress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(args: argparse.Namespace, total: int) -> Any:
    if args.quiet:
        return _NoProgress()
    if sys.stderr.isatty() and _has_rich():
        return _RichProgress(total)

    class _Plain:
        def __enter__(self) -> Progress:
            return _plain_progress(total, sys.stderr)

        def __exit__(self, *exc: object) -> None:
            return None

    return _Plain()


# -- main ----------------------------------------------------------------------------------


def _records(pairs: list[Pair]) -> Iterator[dict[str, Any]]:
    for p in pairs:
        yield p.guarded
        yield p.unguarded


def _check_writable(path: Path) -> None:
    """The trajectory file's directory exists and can be written (else exit 2 at once)."""
    from loopwarden.exceptions import ConfigError

    parent = path.parent
    if not parent.is_dir():
        raise ConfigError("no such directory", path=path, key="--trajectories")
    if path.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError("cannot write this file", path=path, key="--trajectories")


def _write_trajectories(
    args: argparse.Namespace, config: Config, pairs: list[Pair]
) -> dict[str, Any]:
    """Generate the synthetic conversations, write them after the scenarios' unguarded runs,
    and say what was written (the ``trajectories`` key of ``--json``'s last line)."""
    from loopwarden.demo.runner import SYNTHETIC_NOTE
    from loopwarden.demo.traffic import DEFAULT_CONVERSATIONS, DEFAULT_SEED, play_traffic
    from loopwarden.demo.trajectories import write_trajectories

    n = DEFAULT_CONVERSATIONS if args.conversations is None else args.conversations
    seed = DEFAULT_SEED if args.seed is None else args.seed
    if not args.quiet:
        print(f"generating {n} synthetic conversation(s), seed {seed} ...", file=sys.stderr)
    synthetic = play_traffic(config, n, seed, db_dir=args.db_dir)
    scenarios = [p.trajectory for p in pairs if p.trajectory is not None]
    count = write_trajectories(args.trajectories, [*scenarios, *synthetic])
    every = [*scenarios, *synthetic]
    return {
        "path": args.trajectories,
        "trajectories": count,
        "scenarios": len(scenarios),
        "conversations": n,
        "seed": seed,
        "successful": sum(1 for t in every if t.get("success") is True),
        "synthetic": True,
        "note": SYNTHETIC_NOTE,
    }


def trajectory_lines(written: dict[str, Any]) -> list[str]:
    """What ``--trajectories`` wrote, that it is synthetic, and what to try with it."""
    path = escape_controls(str(written["path"]))
    n = written["trajectories"]
    return [
        f"trajectories: {n} written to {path} -- the unguarded runs of {written['scenarios']} "
        f"scenario(s) and {written['conversations']} generated conversation(s) "
        f"(seed {written['seed']}); {written['successful']} successful, "
        f"{n - written['successful']} not (runaways, runs the cap cut)",
        f"  {written['note']}: for trying the commands, not for setting your limits",
        f"  try: loopwarden replay {path} --summary",
        f"       loopwarden calibrate {path} > calibrated.toml",
    ]


def _console_sample(args: argparse.Namespace, config: Config, paths: list[Path]) -> str | None:
    """Play the console sample (:mod:`loopwarden.demo.sample`) after the measured runs, and
    say where its records went; a failure is reported, it never fails the demo."""
    from loopwarden.console.assemble import records_file
    from loopwarden.demo.sample import SAMPLE_TENANT, record_sample

    path = records_file(config)
    try:
        sample = record_sample(config, paths, path)  # shops in a temporary directory
    except Exception as exc:  # the measured figures stand: say what went wrong, go on
        print(
            f"loopwarden demo: console sample not recorded: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return None
    where = escape_controls(str(sample.path))
    return (
        f"console sample: {sample.runs} more guarded run(s), not counted above, appended to "
        f"{where}\n  (tenant {SAMPLE_TENANT!r} on the shared store: a budget that never binds, "
        "a breaker the outage opens, oscillation in shadow mode; --no-records skips this)\n"
        "  see them: loopwarden console"
    )


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.demo import UNGUARDED_CAP, Totals, find_scenarios, observer_names, play_all
    from loopwarden.exceptions import ConfigError, ScenarioError

    for flag in ("conversations", "seed"):
        if getattr(args, flag) is not None and args.trajectories is None:
            raise ConfigError("needs --trajectories FILE", key=f"--{flag}")
    config = load_config(args.config)
    paths = find_scenarios(args.scenarios, args.only)
    left_out = [] if args.observers else observer_names(config)
    if not paths:
        raise ScenarioError("no scenario matched", key="--only" if args.only else None)
    if args.trajectories is not None:
        _check_writable(Path(args.trajectories))  # before minutes of work, not after
    with _progress(args, 2 * len(paths)) as report:
        pairs = play_all(
            config,
            paths,
            progress=report,
            db_dir=args.db_dir,
            observers=args.observers,
            trajectories=args.trajectories is not None,
        )
    written = None if args.trajectories is None else _write_trajectories(args, config, pairs)
    sample = None if args.no_records else _console_sample(args, config, paths)
    totals = Totals.of(pairs)
    currency = next(
        (r.get("cost_currency") for r in _records(pairs) if r.get("cost_currency")), None
    )
    failed = [p for p in pairs if p.ok is False]
    if args.json:
        for rec in _records(pairs):
            print(json.dumps(rec, ensure_ascii=False))
        last: dict[str, Any] = {"totals": totals.as_dict(), "failed": [p.name for p in failed]}
        if written is not None:
            last["trajectories"] = written
        print(json.dumps(last, ensure_ascii=False))
    else:
        if sys.stdout.isatty() and _has_rich():
            render_rich(pairs, totals, currency, UNGUARDED_CAP, sys.stdout)
        else:
            print(render_plain(pairs, totals, currency, UNGUARDED_CAP))
            print()
            print(render_legend_plain(pairs, UNGUARDED_CAP))
        print()
        print("\n".join(summary_lines(pairs, totals, currency)))
        if left_out:
            print(f"observers left out: {', '.join(left_out)} (--observers keeps them)")
        if written is not None:
            print()
            print("\n".join(trajectory_lines(written)))
    if sample is not None:
        # after the table (stdout); with --json on stderr, so stdout stays JSON lines
        print(file=sys.stderr if args.json else sys.stdout)
        print(sample, file=sys.stderr if args.json else sys.stdout)
    unlabelled = [p.name for p in pairs if p.ok is None]
    if unlabelled:
        print(
            f"loopwarden demo: no [expect] healthy in: {', '.join(unlabelled)} (not judged)",
            file=sys.stderr,
        )
    if failed:
        for p in failed:
            print(f"loopwarden demo: {p.name}: {p.why}", file=sys.stderr)
        print(
            f"loopwarden demo: {len(failed)} of {len(pairs)} scenario(s) did not end as expected",
            file=sys.stderr,
        )
        return 1
    return 0
