"""The console's HTML: server-rendered pages, every text escaped, charts drawn as inline SVG.

Every value that comes from a record or the store goes through :func:`h` (``html.escape`` with
quotes) -- a tool answer holding ``<script>`` is shown as text.  Pages load only
``/static/console.css`` and ``/static/console.js`` (the Content-Security-Policy is
``default-src 'self'``: no inline script or style runs), so the SVG charts carry their colours
as attributes, not style.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any
from urllib.parse import urlencode

from loopwarden.console.index import FILTERS, IndexedRun, Page

__all__ = ["h", "layout"]

#: a text shown at most this long in a table cell (the run page shows it whole)
CELL = 160

#: colours per termination kind (the charts and the badges)
_PALETTE = (
    "#2f6fde", "#d9534f", "#e8a33d", "#3aa57a", "#8e5bd1", "#17a2b8", "#c0507a", "#6c757d",
    "#7a9a01", "#b5651d", "#4b6584", "#e056fd",
)  # fmt: skip


def h(value: Any) -> str:
    """``value`` as HTML text: escaped (quotes too), None as an empty string."""
    if value is None:
        return ""
    return escape(str(value), quote=True)


def cut(value: Any, limit: int = CELL) -> str:
    """``value`` as text, at most ``limit`` characters (an ellipsis says it was cut)."""
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def when(ts: float | None, exact: bool = True) -> str:
    if ts is None:
        return "-"
    text = datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return text if exact else f"~{text}"


def colour(name: str, names: Sequence[str]) -> str:
    if name == "final_answer":
        return "#3aa57a"
    return _PALETTE[(list(names).index(name) if name in names else 0) % len(_PALETTE)]


def layout(title: str, main_id: str, body: str, *, base: str, nav: str, extra: str = "") -> str:
    """A whole page: head (CSS, script), the navigation bar, ``<main id=main_id>``."""
    links = "".join(
        f'<a href="{h(base)}{path}"{" aria-current=page" if key == nav else ""}>{label}</a>'
        for key, path, label in (
            ("overview", "", "Overview"),
            ("runs", "runs", "Runs"),
            ("budgets", "budgets", "Budgets"),
            ("breakers", "breakers", "Breakers"),
        )
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)} \u00b7 loopwarden console</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{h(base)}static/console.css">'
        f'<script src="{h(base)}static/console.js" defer></script>'
        f'</head><body data-base="{h(base)}"{extra}>'
        f'<header><a class="brand" href="{h(base)}">loopwarden</a><nav>{links}</nav></header>'
        f'<main id="{h(main_id)}">{body}</main>'
        "<footer>loopwarden console \u00b7 read-only view of run records and the shared "
        "store</footer></body></html>"
    )


def message_page(title: str, message: str, *, base: str, main_id: str = "message-page") -> str:
    body = f'<h1>{h(title)}</h1><p id="message" class="message">{h(message)}</p>'
    return layout(title, main_id, body, base=base, nav="")


# ---------------------------------------------------------------------------------------------
# Charts (SVG, drawn here)
# ---------------------------------------------------------------------------------------------


def stacked_bars(axis: str, starts: Sequence[float], series: Mapping[str, Sequence[int]]) -> str:
    """Runs per slice (of time, or of the order written), stacked by termination, with a
    legend that holds the counts (``ul.counts li[data-termination] b``)."""
    names = sorted(series, key=lambda t: (t != "final_answer", -sum(series[t]), t))
    width, height, pad = 720, 220, 28
    if not starts:
        return '<p class="empty">No runs yet.</p>'
    n = len(starts)
    totals = [sum(series[t][i] for t in names) for i in range(n)]
    top = max(totals) or 1
    bw = (width - pad) / n
    parts = [
        f'<svg viewBox="0 0 {width} {height + 30}" role="img" class="chart" '
        f'aria-label="runs over time by termination">',
        f'<line x1="{pad}" y1="{height}" x2="{width}" y2="{height}" stroke="#c8ccd4"/>',
        f'<text x="0" y="12" class="axis">{top}</text>',
        f'<text x="0" y="{height}" class="axis">0</text>',
    ]
    for i in range(n):
        y = float(height)
        for t in names:
            c = series[t][i]
            if not c:
                continue
            bh = c / top * (height - 10)
            y -= bh
            parts.append(
                f'<rect x="{pad + i * bw + 1:.1f}" y="{y:.1f}" width="{max(bw - 2, 1):.1f}" '
                f'height="{bh:.1f}" fill="{colour(t, names)}" data-termination="{h(t)}">'
                f"<title>{h(t)}: {c}</title></rect>"
            )
    first, last = (
        (when(starts[0]), when(starts[-1]))
        if axis == "time"
        else ("first recorded", "last recorded (records carry no time: in the order written)")
    )
    parts.append(f'<text x="{pad}" y="{height + 16}" class="axis">{h(first)}</text>')
    parts.append(
        f'<text x="{width}" y="{height + 16}" class="axis" text-anchor="end">{h(last)}</text>'
    )
    parts.append("</svg>")
    legend = "".join(
        f'<li data-termination="{h(t)}"><svg width="10" height="10" aria-hidden="true">'
        f'<rect width="10" height="10" fill="{colour(t, names)}"/></svg> {h(t)} '
        f"<b>{sum(series[t])}</b></li>"
        for t in names
    )
    return "".join(parts) + f'<ul class="legend counts">{legend}</ul>'


def hbars(rows: Sequence[tuple[str, float, float]], unit: str) -> str:
    """Per label two bars: spent (dark) and saved (light), scaled to the largest."""
    if not rows:
        return '<p class="empty">No run was stopped by a guard.</p>'
    width, lh, label_w = 720, 34, 150
    top = max(max(a, b) for _, a, b in rows) or 1
    parts = [
        f'<svg viewBox="0 0 {width} {lh * len(rows) + 8}" role="img" class="chart" '
        f'aria-label="{h(unit)} spent and saved per guard">'
    ]
    for i, (label, spent, saved) in enumerate(rows):
        y = i * lh + 4
        span = width - label_w - 90
        parts.append(f'<text x="0" y="{y + 18}" class="label">{h(cut(label, 22))}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y}" width="{max(spent / top * span, 1):.1f}" height="12" '
            f'fill="#2f6fde"><title>spent: {h(_fmt(spent))}</title></rect>'
        )
        parts.append(
            f'<rect x="{label_w}" y="{y + 14}" width="{max(saved / top * span, 1):.1f}" '
            f'height="12" fill="#9fd3b8"><title>saved (estimate): {h(_fmt(saved))}</title></rect>'
        )
        parts.append(
            f'<text x="{width}" y="{y + 18}" class="axis" text-anchor="end">'
            f"{h(_fmt(spent))} / {h(_fmt(saved))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) >= 1:
        return f"{int(x):,}"
    return f"{x:,.4f}"


# ---------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------


def overview(fig: Mapping[str, Any], *, base: str) -> str:
    report = fig["report"]
    stats = (
        f'<section class="cards" id="totals"><div class="card"><b id="total-runs">'
        f"{report['runs']}</b><span>runs</span></div>"
        f'<div class="card"><b>{_fmt(fig["total_tokens"])}</b>'
        f"<span>tokens</span></div>"
        f'<div class="card"><b>{report["loop_stops"]}</b><span>loop stops</span></div>'
        f'<div class="card"><b>{report["shadow"]["would_stop"]}</b>'
        f"<span>shadow would-stops</span></div></section>"
    )
    ot = fig["over_time"]
    chart = stacked_bars(ot["axis"], ot["starts"], ot["series"])
    sav = fig["savings"]
    sav_rows = "".join(
        f'<tr data-guard="{h(g["guard"])}"><td>{h(g["guard"])}</td><td class="num">{g["runs"]}'
        f'</td><td class="num">{_fmt(g["tokens"])}</td><td class="num">'
        f'{_fmt(g["saved_tokens"])}</td><td class="num">{g["cost"]:.4f}</td>'
        f'<td class="num">{g["saved_cost"]:.4f}</td></tr>'
        for g in sav
    )
    savings = (
        '<section id="savings"><h2>Spent and saved, by guard</h2>'
        + hbars([(g["guard"], g["tokens"], g["saved_tokens"]) for g in sav], "tokens")
        + '<table class="data"><thead><tr><th>guard</th><th>runs stopped</th>'
        "<th>tokens spent</th><th>tokens saved (est.)</th><th>cost spent</th>"
        f"<th>cost saved (est.)</th></tr></thead><tbody>{sav_rows}</tbody></table>"
        f'<p class="hint">Saved is an estimate: each stopped run\'s average per model call '
        f"times the calls left to the step cap ({fig['step_cap']}); a lower bound, since the "
        "context grows with every call.</p></section>"
    )
    reasons = "".join(
        f'<tr data-reason="{h(name)}"><td>{h(name)}</td><td class="num">{c}</td></tr>'
        for name, c in report["stopped_by"].items()
    )
    sigs = "".join(
        f"<tr><td><code>{h(cut(s['signature'], 100))}</code></td><td>{h(s['tool'])}</td>"
        f'<td class="num">{s["count"]}</td><td class="num">{s["runs"]}</td></tr>'
        for s in report["top_signatures"]
    )
    top = (
        '<section id="top-reasons"><h2>Top stop reasons</h2><table class="data"><thead><tr>'
        f"<th>guard</th><th>runs</th></tr></thead><tbody>{reasons}</tbody></table>"
        + (
            '<h3>Most repeated calls</h3><table class="data"><thead><tr><th>call</th>'
            "<th>tool</th><th>count</th><th>runs</th></tr></thead>"
            f"<tbody>{sigs}</tbody></table>"
            if sigs
            else ""
        )
        + "</section>"
    )
    sh = report["shadow"]
    shadow_rows = "".join(
        f'<tr><td><a href="{h(base)}runs/{h(s["run_id"])}">{h(cut(s["run_id"], 40))}</a></td>'
        f"<td>{h(s['plugin'])}</td><td>{h(s['reason'])}</td><td>{h(s['step'])}</td>"
        f"<td>{h(s['termination'])}</td></tr>"
        for s in sh["stops"]
    )
    by = "".join(f"<li>{h(k)} <b>{v}</b></li>" for k, v in sh["by"].items())
    shadow = (
        '<section id="shadow"><h2>Shadow mode: would have stopped</h2>'
        f'<p><b class="would-stop">{sh["would_stop"]}</b> of {sh["runs"]} shadowed runs would '
        "have been stopped.</p>"
        + (f'<ul class="by">{by}</ul>' if by else "")
        + (
            '<table class="data"><thead><tr><th>run</th><th>guard</th><th>reason</th>'
            f"<th>step</th><th>ended as</th></tr></thead><tbody>{shadow_rows}</tbody></table>"
            if shadow_rows
            else ""
        )
        + "</section>"
    )
    advice = "".join(f"<li>{h(a['message'])}</li>" for a in report["advice"])
    body = (
        "<h1>Overview</h1>"
        + stats
        + f'<section id="runs-by-termination"><h2>Runs over time, by termination</h2>{chart}'
        "</section>"
        + '<div class="grid">'
        + savings
        + top
        + "</div>"
        + shadow
        + (f'<section id="advice"><h2>Advice</h2><ul>{advice}</ul></section>' if advice else "")
    )
    return layout("Overview", "overview", body, base=base, nav="overview", extra=' data-poll="1"')


def computing(runs: int, *, base: str) -> str:
    """The overview while its first figures over a large file are computed (it reloads)."""
    body = (
        "<h1>Overview</h1>"
        f'<p id="message" class="message">Computing the figures over {runs:,} runs -- this '
        "page reloads in a few seconds. The runs page answers meanwhile.</p>"
    )
    page = layout("Overview", "overview", body, base=base, nav="overview")
    return page.replace("<title>", '<meta http-equiv="refresh" content="3"><title>', 1)


def run_row(run: IndexedRun, base: str, new: bool = False) -> str:
    """One ``tr`` of the runs table (also what ``/api/changes`` hands the page to prepend)."""
    guard = h(run.guard) if run.guard else '<span class="muted">-</span>'
    if run.would_stop:
        guard += f' <span class="badge shadow">shadow: {h(run.would_stop)}</span>'
    return (
        f'<tr data-run-id="{h(run.id)}"{" class=new" if new else ""}>'
        f'<td class="id"><a href="{h(base)}runs/{h(run.id)}" title="{h(run.id)}">'
        f"{h(cut(run.id, 14))}</a></td>"
        f"<td>{h(when(run.ts, run.ts_exact))}</td>"
        f'<td><span class="badge t-{h(run.termination)}">{h(run.termination)}</span></td>'
        f"<td>{guard}</td><td>{h(cut(run.tenant, 40))}</td>"
        f"<td>{h(cut(run.scenario, 40))}</td><td>{h(cut(run.model, 40))}</td>"
        f'<td class="num">{h(run.steps)}</td>'
        f'<td class="num">{h(_fmt(run.tokens) if run.tokens is not None else "")}</td>'
        f'<td class="num">{h(f"{run.cost:.4f}" if run.cost is not None else "")}</td></tr>'
    )


def _select(name: str, values: Iterable[str], chosen: str | None) -> str:
    opts = '<option value="">any</option>' + "".join(
        f'<option value="{h(v)}"{" selected" if v == chosen else ""}>{h(cut(v, 60))}</option>'
        for v in values
    )
    return f'<label>{name} <select name="{name}">{opts}</select></label>'


def runs(
    page: Page,
    query: Mapping[str, str],
    choices: Mapping[str, list[str]],
    cursor: int,
    *,
    base: str,
) -> str:
    inputs = "".join(
        f'<label>{name} <input name="{name}" value="{h(query.get(name, ""))}"'
        f'{" type=search" if name == "q" else ""} placeholder="{placeholder}"></label>'
        for name, placeholder in (
            ("tenant", "any"),
            ("conversation", "any"),
            ("model", "any"),
            ("since", "2026-01-31 or ISO time"),
            ("until", "2026-02-01"),
            ("q", "run id, scenario, call, answer"),
        )
    )
    form = (
        f'<form id="runs-filter" method="get" action="{h(base)}runs">'
        + _select("termination", choices.get("termination", []), query.get("termination"))
        + _select("guard", choices.get("guard", []), query.get("guard"))
        + inputs
        + '<button type="submit">Filter</button>'
        f'<a class="clear" href="{h(base)}runs">clear</a></form>'
    )
    rows = "".join(run_row(r, base) for r in page.runs)
    first = page.page * page.size + (1 if page.runs else 0)
    last = page.page * page.size + len(page.runs)
    kept = {k: v for k, v in query.items() if v and k in (*FILTERS, "since", "until", "q")}
    nav = []
    if page.page > 0:
        nav.append(
            f'<a rel="prev" href="{h(base)}runs?{h(urlencode({**kept, "page": page.page - 1}))}">'
            "\u2190 newer</a>"
        )
    if page.has_next:
        nav.append(
            f'<a rel="next" href="{h(base)}runs?{h(urlencode({**kept, "page": page.page + 1}))}">'
            "older \u2192</a>"
        )
    body = (
        "<h1>Runs</h1>"
        + form
        + f'<p id="runs-count"><b>{page.total:,}</b> run{"s" if page.total != 1 else ""}'
        + (f" \u00b7 showing {first:,}\u2013{last:,}" if page.runs else "")
        + "</p>"
        + '<table id="runs-table" class="data"><thead><tr><th>record id</th><th>time (UTC)</th>'
        "<th>termination</th><th>guard</th><th>tenant</th><th>scenario</th><th>model</th>"
        "<th>steps</th><th>tokens</th><th>cost</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        + ("" if page.runs else '<p class="empty">No run matches.</p>')
        + (
            '<p class="hint">~ time: the record carries no time of its own (ended_at); shown is '
            "when the records file was last written as the console read it.</p>"
            if any(not r.ts_exact for r in page.runs)
            else ""
        )
        + f'<nav class="pages">{"".join(nav)}</nav>'
    )
    live = page.page == 0 and not kept
    extra = f' data-cursor="{cursor}"' + (' data-poll="1"' if live else "")
    return layout("Runs", "runs", body, base=base, nav="runs", extra=extra)


def _json_block(value: Any, cls: str) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
    return f'<pre class="{cls}">{h(text)}</pre>'


def run(indexed: IndexedRun, record: Mapping[str, Any], *, base: str) -> str:
    """The timeline of one run: model calls, tool calls, verdicts, the final answer."""
    items: list[tuple[int, int, str]] = []  # (step, order, html)
    detail = record.get("steps_detail")
    for d in detail if isinstance(detail, list) else ():
        if not isinstance(d, Mapping):
            continue
        step = int(d.get("step") or 0)
        items.append(
            (
                step,
                0,
                f'<li class="step model" data-step="{step}"><span class="kind">model call</span>'
                f' <span class="stepno">step {step}</span> <span class="tokens">'
                f"{h(d.get('prompt'))} prompt + {h(d.get('completion'))} completion = "
                f"<b>{h(d.get('total'))}</b> tokens</span>"
                f"{' <span class=badge>final turn</span>' if d.get('final') else ''}</li>",
            )
        )
    traj = record.get("trajectory")
    for i, st in enumerate(traj if isinstance(traj, list) else (), 1):
        if not isinstance(st, Mapping):
            continue
        if not isinstance(detail, list) or not detail:
            items.append(
                (
                    i,
                    0,
                    f'<li class="step model" data-step="{i}"><span class="kind">model call</span>'
                    f' <span class="stepno">step {i}</span>'
                    f'<span class="tokens">{_usage(st.get("usage"))}</span>'
                    + (
                        f'<div class="content">{h(cut(st.get("content"), 2000))}</div>'
                        if st.get("content")
                        else ""
                    )
                    + "</li>",
                )
            )
        calls = st.get("tool_calls") or []
        obs = st.get("observations") or []
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            if not isinstance(call, Mapping):
                continue
            answer = obs[j] if isinstance(obs, list) and j < len(obs) else None
            items.append(
                (
                    i,
                    1,
                    f'<li class="step tool" data-step="{i}"><span class="kind">tool call</span> '
                    f'<code class="name">{h(call.get("name"))}</code>'
                    f"{_json_block(call.get('arguments'), 'arguments')}"
                    f"{_json_block(answer if answer is not None else '', 'answer')}</li>",
                )
            )
    notes: dict[tuple[int, str], list[str]] = {}
    warns = record.get("warnings")
    for w in warns if isinstance(warns, list) else ():
        if isinstance(w, Mapping):
            notes.setdefault((int(w.get("step") or 0), str(w.get("plugin"))), []).append(
                str(w.get("message"))
            )
    verdicts = record.get("verdicts")
    stopper = record.get("stopped_by")
    for v in verdicts if isinstance(verdicts, list) else ():
        if not isinstance(v, Mapping):
            continue
        step = int(v.get("step") or 0)
        plugin = str(v.get("plugin"))
        kind = str(v.get("kind"))
        # The engine sends a warn's and a skip's message to the model alike; the record's
        # warnings list both, keyed by step and plugin.
        note = "\n".join(notes.get((step, plugin), []))
        evidence = (
            record.get("evidence") if kind == "stop" and plugin == stopper else v.get("evidence")
        )
        items.append(
            (
                step,
                2,
                f'<li class="verdict {h(kind)}" data-step="{step}"><span class="kind">verdict'
                f'</span> <span class="guard">{h(plugin)}</span> <span class="action">{h(kind)}'
                f"{' (soft)' if v.get('soft') else ''}</span>"
                f' <span class="stepno">step {step}, {h(v.get("hook"))}</span>'
                + (f' <span class="reason">{h(v.get("reason"))}</span>' if v.get("reason") else "")
                + (
                    f'<div class="evidence"><span class="k">evidence</span>'
                    f"{_json_block(evidence, 'json')}</div>"
                    if evidence
                    else ""
                )
                + (
                    f'<div class="note"><span class="k">note sent to the model</span>'
                    f"<p>{h(note)}</p></div>"
                    if note
                    else ""
                )
                + "</li>",
            )
        )
    items.sort(key=lambda t: (t[0], t[1]))
    timeline = "".join(html for _, _, html in items) or (
        '<li class="empty">This record holds no steps (the run_record plugin adds them with '
        "trajectory = true and steps_detail = true).</li>"
    )
    tokens = record.get("tokens") if isinstance(record.get("tokens"), Mapping) else {}
    facts = [
        ("record id", indexed.id),
        ("time (UTC)", when(indexed.ts, indexed.ts_exact)),
        ("scenario", record.get("scenario")),
        ("model", record.get("model")),
        ("mode", record.get("mode")),
        ("tenant", indexed.tenant),
        ("conversation", indexed.conversation),
        ("steps", record.get("steps")),
        ("tool calls", record.get("tool_calls")),
        ("tokens", (tokens or {}).get("total")),
        ("cost", record.get("cost")),
        ("elapsed s", record.get("elapsed_s")),
    ]
    dl = "".join(f"<dt>{h(k)}</dt><dd>{h(cut(v, 200))}</dd>" for k, v in facts if v is not None)
    shadow = record.get("shadow_stop")
    body = (
        f"<h1>Run <code>{h(cut(indexed.id, 80))}</code></h1>"
        f'<p id="termination" class="termination"><span class="badge t-{h(indexed.termination)}">'
        f"{h(indexed.termination)}</span>"
        + (f" by <b>{h(stopper)}</b>" if stopper else "")
        + (" (soft: one last turn without tools)" if record.get("soft") else "")
        + "</p>"
        + (
            f'<p class="shadow-stop">Shadow mode: <b>{h(shadow.get("plugin"))}</b> would have '
            f"stopped it at step {h(shadow.get('step'))} ({h(shadow.get('reason'))}).</p>"
            if isinstance(shadow, Mapping)
            else ""
        )
        + f'<dl class="facts">{dl}</dl>'
        + f'<h2>Timeline</h2><ol id="timeline">{timeline}</ol>'
        + '<h2>Final answer</h2><div id="final-answer">'
        + (
            f"<pre>{h(record.get('final_answer'))}</pre>"
            if record.get("final_answer") is not None
            else '<p class="muted">(none)</p>'
        )
        + "</div>"
        + f"<details><summary>Whole record (JSON)</summary>{_json_block(record, 'json')}</details>"
    )
    return layout(f"Run {cut(indexed.id, 40)}", "run", body, base=base, nav="runs")


def _usage(usage: Any) -> str:
    if not isinstance(usage, Mapping):
        return ""
    return (
        f" {h(usage.get('prompt_tokens'))} prompt + {h(usage.get('completion_tokens'))} "
        "completion tokens"
    )


def budgets(rows: Sequence[Mapping[str, Any]], note: str, *, base: str) -> str:
    def cell(r: Mapping[str, Any], part: str) -> str:
        values = r[part] if part != "limit" else r.get("limits", {})
        shown = [
            f"{q} {values[q]:g}" if isinstance(values.get(q), (int, float)) else ""
            for q in ("tokens", "cost", "runs", "model_calls", "tool_calls")
            if q in values and (part == "limit" or values[q])
        ]
        return ", ".join(s for s in shown if s) or "-"

    body_rows = "".join(
        f'<tr data-scope="{h(r["scope"])}" data-key="{h(r["key"])}"><td>{h(r["scope"])}</td>'
        f"<td>{h(cut(r['key'], 60))}</td><td>{h(r['window'])}</td><td>{h(r['bucket'])}</td>"
        f'<td class="spent">{h(cell(r, "spent"))}</td>'
        f'<td class="reserved">{h(cell(r, "reserved"))}</td>'
        f'<td class="limit">{h(cell(r, "limit"))}</td></tr>'
        for r in rows
    )
    body = (
        "<h1>Budgets</h1>"
        + (f'<p class="hint">{h(note)}</p>' if note else "")
        + '<table id="budgets-table" class="data"><thead><tr><th>scope</th><th>key</th>'
        "<th>window</th><th>bucket</th><th>spent</th><th>reserved</th><th>limit</th></tr>"
        f"</thead><tbody>{body_rows}</tbody></table>"
        + ("" if rows else '<p class="empty">No spend recorded in the store.</p>')
    )
    return layout("Budgets", "budgets", body, base=base, nav="budgets")


def breakers(
    rows: Sequence[Mapping[str, Any]],
    *,
    base: str,
    csrf: str,
    allow_resets: bool,
    message: str = "",
    note: str = "",
) -> str:
    def row(r: Mapping[str, Any]) -> str:
        tripped = r.get("tripped") or {}
        why = (
            f"{tripped.get('failures')} failures in {tripped.get('window_s')} s "
            f"({tripped.get('rule')}; {tripped.get('error') or '?'})"
            if tripped
            else "-"
        )
        state = str(r["state"]).replace("_", "-")
        form = (
            f'<form class="reset" method="post" action="{h(base)}breakers/reset">'
            f'<input type="hidden" name="key" value="{h(r["key"])}">'
            f'<input type="hidden" name="csrf" value="{h(csrf)}">'
            '<label class="confirm"><input type="checkbox" name="confirm" value="yes" required>'
            " confirm</label>"
            f'<button class="reset" type="submit">Reset</button></form>'
        )
        return (
            f'<tr data-breaker="{h(r["key"])}"><td>{h(r["target"])}</td>'
            f"<td><code>{h(cut(r['name'], 60))}</code></td><td>{h(r['scope'])}</td>"
            f"<td>{h(cut(r['scope_key'], 40))}</td>"
            f'<td><span class="state {h(state)}">{h(state)}</span></td>'
            f"<td>{h(when(r.get('since')))}</td><td>{h(why)}</td>"
            f'<td class="num">{h(r.get("opens"))}</td><td>{form}</td></tr>'
        )

    listed = [r for r in rows if r.get("state") in ("open", "half_open")]
    body = (
        "<h1>Breakers</h1>"
        + (f'<p class="hint">{h(note)}</p>' if note else "")
        + (f'<p id="message" class="message">{h(message)}</p>' if message else "")
        + (
            ""
            if allow_resets
            else '<p class="hint">Read-only: resets are refused unless the console is started '
            "with --allow-resets.</p>"
        )
        + '<table id="breakers-table" class="data"><thead><tr><th>target</th><th>name</th>'
        "<th>scope</th><th>key</th><th>state</th><th>open since (UTC)</th><th>tripped by</th>"
        f"<th>opens</th><th>reset</th></tr></thead><tbody>{''.join(row(r) for r in listed)}"
        "</tbody></table>"
        + ("" if listed else '<p class="empty">No breaker is open or half-open.</p>')
    )
    return layout("Breakers", "breakers", body, base=base, nav="breakers")
