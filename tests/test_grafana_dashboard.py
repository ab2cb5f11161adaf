"""The Grafana dashboard shipped in the package (``loopwarden/grafana/loopwarden.json``).

Every query names only metrics and labels that the ``metrics`` plugin really exports to
Prometheus (read from its exposition, not from a list kept here), and every exported metric is
charted somewhere, so a renamed or added metric fails here instead of leaving an empty panel.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest

from loopwarden.plugins.metrics import Metrics, MetricsSettings

#: labels Prometheus adds at scrape time; ``le`` is a histogram bucket's own label
SCRAPE_LABELS = frozenset({"job", "instance"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"(?<![\w$.])([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?(?!\s*\(|[\w:])")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
#: PromQL words that are neither metrics nor functions called with parentheses
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool"})
_KEYWORDS |= {"and", "or", "unless", "offset", "inf", "nan"}
_HISTOGRAM_PART = re.compile(r"_(?:bucket|sum|count)$")


def load_dashboard() -> dict[str, Any]:
    """The dashboard as the installed package ships it."""
    text = (resources.files("loopwarden") / "grafana" / "loopwarden.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def exported_series() -> dict[str, frozenset[str]]:
    """Each sample name the Prometheus mirror exports -> the labels its samples carry.

    Names and kinds come from the exposition's ``# TYPE`` lines; a family's labels from the
    plugin's metric definition with the same help text (a labelled family shows no sample until
    it is used).
    """
    pytest.importorskip("prometheus_client")
    metrics = Metrics(MetricsSettings.model_validate({"prometheus": True}))
    labels_by_help = {d.help: frozenset(d.labels) for d in metrics.registry.defs.values()}
    helps: dict[str, str] = {}
    series: dict[str, frozenset[str]] = {}
    for line in metrics.exposition().splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[len("# HELP ") :].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            if name.endswith("_created"):  # prometheus-client's creation-time gauges
                continue
            labels = labels_by_help[helps[name]]
            if kind == "histogram":
                series[f"{name}_bucket"] = labels | {"le"}
                series[f"{name}_sum"] = labels
                series[f"{name}_count"] = labels
            else:
                series[name] = labels
    return series


def queries(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(panel title, target) for every query of every panel, rows' panels included."""
    out: list[tuple[str, dict[str, Any]]] = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        out.extend((panel["title"], t) for t in panel.get("targets", []))
    return out


def selectors(target: dict[str, Any]) -> list[tuple[str, str]]:
    """The metric selectors of one query: (metric name, its ``{...}`` matchers or "")."""
    bare = _RANGE.sub("", _GROUPING.sub("", target["expr"]))
    return [
        (m.group(1), _STRING.sub('""', m.group(2) or ""))
        for m in _SELECTOR.finditer(bare)
        if m.group(1).lower() not in _KEYWORDS
    ]


def problems(dashboard: dict[str, Any], series: dict[str, frozenset[str]]) -> list[str]:
    """What in the dashboard's queries the exporter does not provide (empty: all is there)."""
    found: list[str] = []
    for title, target in queries(dashboard):
        expr = target["expr"]
        grouping = {g.strip() for m in _GROUPING.finditer(expr) for g in m.group(1).split(",")}
        grouping.discard("")
        used = selectors(target)
        if not used:
            found.append(f"{title}: no metric in {expr!r}")
        for name, matchers in used:
            if name not in series:
                found.append(f"{title}: {name} is not exported")
                continue
            allowed = series[name] | SCRAPE_LABELS
            for label in _MATCHER.findall(matchers):
                if label not in allowed:
                    found.append(f"{title}: {name} has no label {label}")
            for label in sorted(grouping - allowed):
                found.append(f"{title}: {name} has no label {label} to group by")
        for label in _LEGEND.findall(target.get("legendFormat", "")):
            if label not in grouping:
                found.append(f"{title}: legend names {label}, which the query does not keep")
    return found


def test_the_dashboard_ships_in_the_package_as_valid_json() -> None:
    dashboard = load_dashboard()
    assert dashboard["title"] == "loopwarden"
    assert dashboard["uid"] == "loopwarden"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job"} <= variables


def test_every_metric_and_label_the_dashboard_queries_is_exported() -> None:
    assert problems(load_dashboard(), exported_series()) == []


def test_every_exported_metric_is_charted() -> None:
    series = exported_series()
    used = {name for target in queries(load_dashboard()) for name, _ in selectors(target[1])}
    families = {_HISTOGRAM_PART.sub("", name) for name in series}
    assert (
        sorted(f for f in families if not any(_HISTOGRAM_PART.sub("", n) == f for n in used)) == []
    )


@pytest.mark.parametrize(
    ("expr", "legend", "expected"),
    [
        ("sum(rate(loopwarden_run_total[5m]))", "", "loopwarden_run_total is not exported"),
        (
            'sum by (tool) (rate(loopwarden_runs_total{job=~"$job"}[5m]))',
            "{{tool}}",
            "loopwarden_runs_total has no label tool to group by",
        ),
        (
            'sum(rate(loopwarden_runs_total{reason="x"}[5m]))',
            "",
            "loopwarden_runs_total has no label reason",
        ),
        (
            "sum by (termination) (rate(loopwarden_runs_total[5m]))",
            "{{plugin}}",
            "legend names plugin, which the query does not keep",
        ),
        ("sum(rate(loopwarden_steps_per_run[5m]))", "", "loopwarden_steps_per_run is not exported"),
    ],
)
def test_the_check_finds_a_query_the_exporter_cannot_answer(
    expr: str, legend: str, expected: str
) -> None:
    """The checker itself: a misspelt metric, a wrong label, a stale legend are all caught."""
    dashboard = {"panels": [{"title": "p", "targets": [{"expr": expr, "legendFormat": legend}]}]}
    assert [p.removeprefix("p: ") for p in problems(dashboard, exported_series())] == [expected]
