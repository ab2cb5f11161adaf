"""What ``loopwarden demo`` prints: the table of guarded and unguarded runs (plain text, or
rich on a terminal), its legend, and the totals with the saving as a ratio.

Used by :mod:`loopwarden.commands.demo`, which plays the scenarios.
"""

from __future__ import annotations

import textwrap
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO

from loopwarden.sanitize import escape_controls, raw_stream

if TYPE_CHECKING:
    from loopwarden.demo import Pair, Totals
    from loopwarden.models.scenario import Scenario


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
