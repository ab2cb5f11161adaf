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
import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO

from loopwarden.commands import add_config_argument
from loopwarden.sanitize import escape_controls, raw_stream

if TYPE_CHECKING:
    from collections.abc import Iterator

    from loopwarden.demo import Pair, Progress, Totals
    from loopwarden.scenario import Scenario


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
    return f"ok {p.why}" if p.ok else "FAILED"


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
    "expect",
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


def render_rich(
    pairs: list[Pair], totals: Totals, currency: str | None, cap: int, out: TextIO
) -> None:
    """The same table with rich (only called when rich is importable)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

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


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.demo import UNGUARDED_CAP, Totals, find_scenarios, observer_names, play_all
    from loopwarden.exceptions import ScenarioError

    config = load_config(args.config)
    paths = find_scenarios(args.scenarios, args.only)
    left_out = [] if args.observers else observer_names(config)
    if not paths:
        raise ScenarioError("no scenario matched", key="--only" if args.only else None)
    with _progress(args, 2 * len(paths)) as report:
        pairs = play_all(
            config, paths, progress=report, db_dir=args.db_dir, observers=args.observers
        )
    totals = Totals.of(pairs)
    currency = next(
        (r.get("cost_currency") for r in _records(pairs) if r.get("cost_currency")), None
    )
    failed = [p for p in pairs if p.ok is False]
    if args.json:
        for rec in _records(pairs):
            print(json.dumps(rec, ensure_ascii=False))
        print(
            json.dumps(
                {"totals": totals.as_dict(), "failed": [p.name for p in failed]}, ensure_ascii=False
            )
        )
    else:
        if sys.stdout.isatty() and _has_rich():
            render_rich(pairs, totals, currency, UNGUARDED_CAP, sys.stdout)
        else:
            print(render_plain(pairs, totals, currency, UNGUARDED_CAP))
        print()
        print("\n".join(summary_lines(pairs, totals, currency)))
        if left_out:
            print(f"observers left out: {', '.join(left_out)} (--observers keeps them)")
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
