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
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from loopwarden.commands import add_config_argument, whole_number
from loopwarden.sanitize import escape_controls, raw_stream

if TYPE_CHECKING:
    from collections.abc import Iterator

    from loopwarden.config import Config
    from loopwarden.demo import Pair, Progress, Totals
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


# -- formatting ----------------------------------------------------------------------------


def _int(n: int) -> str:
    return f"{n:,}"


def _cost(value: float | Decimal | None) -> str:
    if value is None:
        return "-"
    return f"{Decimal(str(value)):.4f}"


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}x"


def _expect(sc: Scenario) -> str:
    h = sc.expect.healthy
    return "?" if h is None else ("healthy" if h else "runaway")


def _result(p: Pair) -> str:
    if p.ok is None:
        return "? unlabelled"
    return f"ok: {p.why}" if p.ok else "FAILED"


def _side(rec: dict[str, Any]) -> list[str]:
    term = rec["termination"] + (" (soft)" if rec["soft"] else "")
    return [
        term,
        _int(rec["steps"]),
        _int(rec["tool_calls"]),
        _int(rec["tokens"]["total"]),
        _cost(rec.get("priced_cost")),
        "yes" if rec["final_answer_present"] else "no",
    ]


HEADERS = [
    "scenario",
    "provokes",
    "run",
    "termination",
    "turns",
    "calls",
    "tokens",
    "cost",
    "answer",
    "result",
]
RIGHT = {4, 5, 6, 7}
GUARDED, UNGUARDED = "guarded", "unguarded"


def rows(pairs: list[Pair], totals: Totals) -> list[list[str]]:
    """Two rows per scenario (guarded, then unguarded) and two totals rows."""
    out: list[list[str]] = []
    for p in pairs:
        out.append([p.name, _expect(p.scenario), GUARDED, *_side(p.guarded), _result(p)])
        out.append(["", "", UNGUARDED, *_side(p.unguarded), ""])
    for i, label in enumerate((GUARDED, UNGUARDED)):
        out.append(
            [
                "total" if i == 0 else "",
                "",
                label,
                "",
                _int(totals.steps[i]),
                _int(totals.tool_calls[i]),
                _int(totals.tokens[i]),
                _cost(totals.cost[i]),
                f"{totals.answers[i]}/{totals.runs}",
                "",
            ]
        )
    return out


def _headers(currency: str | None) -> list[str]:
    return [f"cost {currency}" if h == "cost" and currency else h for h in HEADERS]


#: the legend's width (its lines wrap here, with a hanging indent)
LEGEND_WIDTH = 100


#: phrases a legend line never breaks inside
_UNBROKEN = ("ok: stopped", "ok: finished", "max_steps (soft)")


def _wrap(text: str, first: str, rest: str) -> list[str]:
    for phrase in _UNBROKEN:
        text = text.replace(phrase, phrase.replace(" ", "\u00a0"))
    lines = textwrap.wrap(
        text,
        LEGEND_WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
    )
    return [line.replace("\u00a0", " ") for line in lines]


def _entry(key: str, text: str, width: int = 14) -> list[str]:
    return _wrap(text, f"  {key:<{width}}", " " * (width + 2))


def legend(pairs: list[Pair], cap: int) -> list[str]:
    """What each column shows, and why an unguarded row can surprise: printed under the table
    (plain and rich) and explained in docs/real-traffic.md."""
    lines = ["What the columns show:"]
    for key, text in (
        (
            "provokes",
            "what the scenario's scripted model is written to do: runaway = a loop the guards "
            "must stop; healthy = work they must leave alone",
        ),
        (
            "run",
            "guarded = with the deployment's plugins; unguarded = no guard at all, only a cap "
            f"of {cap} model calls",
        ),
        (
            "termination",
            "how the run ended (a stop reason, docs/contracts.md); (soft) = the model got one "
            "last turn without tools, to answer from what it knew",
        ),
        ("turns, calls", "model calls, tool calls"),
        ("tokens, cost", "what the run spent (both sides priced alike)"),
        ("answer", "whether the user got a final answer (a soft stop's last turn gives one)"),
        (
            "result",
            "judged on the guarded run only: ok: stopped = a guard stopped the runaway; "
            "ok: finished = the healthy run ended as expected; FAILED = neither",
        ),
    ):
        lines += _entry(key, text)

    def names(ps: list[Pair]) -> str:
        return ", ".join(escape_controls(p.name) for p in ps)

    runaway = [p for p in pairs if p.scenario.expect.healthy is False]
    gave_up = [p for p in runaway if p.unguarded["termination"] == "final_answer"]
    capped = [p for p in runaway if p.unguarded["termination"] == "max_steps"]
    astray = [
        p
        for p in pairs
        if p.scenario.expect.healthy is True and p.unguarded["termination"] == "max_steps"
    ]
    notes = []
    if capped:
        notes.append(
            f"{names(capped)}: runaways the cap cut -- max_steps (soft) after {cap} model "
            "calls; their answer came from the cap's last, tool-less turn."
        )
    if gave_up:
        notes.append(
            f"{names(gave_up)}: runaways that end with an answer unguarded -- the model gave "
            "up by itself, but only after the turns and tokens the guarded row saves."
        )
    if astray:
        notes.append(
            f"{names(astray)}: healthy, yet it runs away unguarded -- its model recovers only "
            "when a guard's note (this call was already made) tells it to."
        )
    if notes:
        lines.append("Why an unguarded row can surprise:")
        for note in notes:
            lines += _wrap(note, "  ", "    ")
    return lines


def render_plain(pairs: list[Pair], totals: Totals, currency: str | None, cap: int) -> str:
    """The table as aligned plain text: a guarded and an unguarded line per scenario."""
    head = _headers(currency)
    body = rows(pairs, totals)
    widths = [max(len(r[c]) for r in [head, *body]) for c in range(len(head))]

    def line(r: list[str]) -> str:
        return "  ".join(
            text.rjust(widths[c]) if c in RIGHT else text.ljust(widths[c])
            for c, text in enumerate(r)
        ).rstrip()

    rule = "-" * len(line(head))
    out = [
        f"loopwarden demo: every scenario with the deployment's guards, and unguarded "
        f"(a cap of {cap} model calls)",
        "",
        line(head),
        rule,
    ]
    out += [line(r) for r in body[:-2]]
    out.append(rule)
    out += [line(r) for r in body[-2:]]
    return "\n".join(out)


def render_legend_plain(pairs: list[Pair], cap: int) -> str:
    """The legend under the plain table."""
    return "\n".join(legend(pairs, cap))


def render_rich(
    pairs: list[Pair], totals: Totals, currency: str | None, cap: int, out: TextIO
) -> None:
    """The same table with rich (only called when rich is importable)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    body = rows(pairs, totals)
    table = Table(
        title=f"loopwarden demo: with the deployment's guards, and unguarded "
        f"(a cap of {cap} model calls)",
        box=box.SIMPLE_HEAD,
        header_style="bold",
        pad_edge=False,
    )
    for i, h in enumerate(_headers(currency)):
        table.add_column(h, justify="right" if i in RIGHT else "left", no_wrap=True)
    n = len(pairs)
    for k, r in enumerate(body):
        guarded = r[2] == GUARDED
        style = "" if guarded else "dim"
        cells = [escape(escape_controls(c)) for c in r]  # data: shown, never run or styled
        if k < 2 * n and guarded:
            p = pairs[k // 2]
            cells[-1] = f"[bold red]{cells[-1]}[/]" if p.ok is False else f"[green]{cells[-1]}[/]"
        if k == 2 * n:
            table.add_section()
            style = "bold"
        table.add_row(*cells, style=style, end_section=k < 2 * n and not guarded)
    # never truncate a number: widen past a narrow terminal instead (its lines then wrap)
    needed = max(len(line) for line in render_plain(pairs, totals, currency, cap).splitlines()[2:])
    console = Console(file=raw_stream(out))  # rich's own styling passes; the cells are escaped
    console.width = max(console.width, needed + 2 * len(HEADERS))
    console.print(table)
    console.print(Text("\n".join(legend(pairs, cap)), style="dim"))  # Text: never markup


def summary_lines(pairs: list[Pair], totals: Totals, currency: str | None) -> list[str]:
    """The totals in words: the token and cost saving, refunds, what passed."""
    g, u = totals.tokens
    lines = [
        f"tokens: {_int(g)} guarded vs {_int(u)} unguarded: a {_ratio(totals.token_ratio)} "
        f"saving ({_int(u - g)} tokens not spent)",
    ]
    cg, cu = totals.cost
    if cg is not None and cu is not None:
        cur = f" {currency}" if currency else ""
        ratio = f"{cu / cg:.1f}x" if cg else "-"
        lines.append(
            f"cost:   {_cost(cg)}{cur} guarded vs {_cost(cu)}{cur} unguarded: a {ratio} saving"
        )
    lines.append(
        f"turns:  {_int(totals.steps[0])} guarded vs {_int(totals.steps[1])} "
        f"unguarded; refund rows written: {totals.refund_rows[0]} guarded, "
        f"{totals.refund_rows[1]} unguarded"
    )
    runaways = [p for p in pairs if p.scenario.expect.healthy is False]
    healthy = [p for p in pairs if p.scenario.expect.healthy is True]
    lines.append(
        f"runaway scenarios stopped by a guard: {sum(bool(p.ok) for p in runaways)}"
        f"/{len(runaways)}; healthy scenarios finished as expected: "
        f"{sum(bool(p.ok) for p in healthy)}/{len(healthy)}"
    )
    return lines


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
