"""The figures the docs quote from ``loopwarden demo`` and ``python bench/quality.py`` are
what those programs print (issue 46, item 6).

The demo is run once, in-process, on the shipped config (the docs say so), as plain text --
the summary lines and the table a reader sees.  Every figure the prose quotes (runaways
stopped, healthy runs finished, the tokens of both sides, the saving, the saving without
``token-flood``) is read from the pages and compared with that output.  A sweep over README.md
and every page under docs/ then finds any figure of the same kind ("N/N runaways", "a 12.3x
saving", "N tokens guarded") that no check here covers, so a new one cannot drift unseen.
The detection-quality corpus (``bench/quality.py --json``, deterministic: scripted model,
fake clock) is checked the same way where the docs quote it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopwarden.commands import cli
from loopwarden.config import default_config_path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = str(default_config_path())
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Demo:
    """What ``loopwarden demo`` printed, as numbers."""

    runaways: tuple[int, int]  # stopped, of
    healthy: tuple[int, int]  # finished as expected, of
    tokens: tuple[int, int]  # guarded, unguarded
    ratio: str  # the saving as printed, e.g. "95.6x"
    per_scenario: dict[str, tuple[int, int]]  # name -> tokens guarded, unguarded

    def ratio_without(self, name: str) -> str:
        """The token saving without scenario ``name``, formatted as the demo formats one."""
        g, u = self.tokens
        sg, su = self.per_scenario[name]
        return f"{(u - su) / (g - sg):.1f}x"


def _int(text: str) -> int:
    return int(text.replace(",", ""))


_ROW = re.compile(
    r"^(?P<name>[a-z][\w-]*)?\s+(?:runaway|healthy|\?)?\s*(?P<side>guarded|unguarded)\s+"
    r".*?\s(?P<tokens>\d[\d,]*)\s+(?:[\d.]+|-)\s+(?:yes|no)\b"
)


def parse(out: str) -> Demo:
    """The figures of the demo's plain output."""
    tokens = re.search(
        r"^tokens: ([\d,]+) guarded vs ([\d,]+) unguarded: a ([\d.]+x) saving", out, re.M
    )
    counts = re.search(
        r"^runaway scenarios stopped by a guard: (\d+)/(\d+); "
        r"healthy scenarios finished as expected: (\d+)/(\d+)",
        out,
        re.M,
    )
    assert tokens is not None and counts is not None, out
    per: dict[str, list[int]] = {}
    name = None
    for line in out.splitlines():
        m = _ROW.match(line)
        if m is None or line.startswith("total"):
            continue
        name = m["name"] or name
        assert name is not None
        per.setdefault(name, []).append(_int(m["tokens"]))
    c = [int(x) for x in counts.groups()]
    return Demo(
        runaways=(c[0], c[1]),
        healthy=(c[2], c[3]),
        tokens=(_int(tokens[1]), _int(tokens[2])),
        ratio=tokens[3],
        per_scenario={k: (v[0], v[1]) for k, v in per.items() if len(v) == 2},
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """``loopwarden demo --config <the shipped config>``, in-process, plain text."""
    import contextlib
    import io
    import os

    data = tmp_path_factory.mktemp("demo-data")
    out = io.StringIO()
    before = os.environ.get("LOOPWARDEN_DATA_DIR")
    os.environ["LOOPWARDEN_DATA_DIR"] = str(data)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = cli.main(["demo", "--config", str(default_config_path())])
    finally:
        if before is None:
            os.environ.pop("LOOPWARDEN_DATA_DIR", None)
        else:
            os.environ["LOOPWARDEN_DATA_DIR"] = before
    assert code == 0, out.getvalue()
    return parse(out.getvalue())


def _text(page: str) -> str:
    return " ".join((ROOT / page).read_text(encoding="utf-8").split())  # lines joined


def _one(page: str, pattern: str) -> re.Match[str]:
    found = list(re.finditer(pattern, _text(page)))
    assert len(found) == 1, f"{page}: expected one match of {pattern!r}, found {len(found)}"
    return found[0]


#: every demo figure the docs quote: (page, pattern); the checks below read each group
QUOTED = {
    "overview": (
        "docs/overview.md",
        r"The demo: (\d+)/(\d+) runaways stopped, (\d+)/(\d+) healthy scenarios finished",
    ),
    "real-traffic counts": (
        "docs/real-traffic.md",
        r"The whole demo stops (\d+)/(\d+) runaways and finishes (\d+)/(\d+) healthy scenarios",
    ),
    "real-traffic quality": (
        "docs/real-traffic.md",
        r"\| recall \(runaways stopped by a guard\) \| (\d+)/(\d+) \| 100% \| "
        r"\| healthy scenarios stopped \| (\d+)/(\d+) \(warned: (\d+)/(\d+)\) \| 0 \| "
        r"\| steps wasted after onset \| median (\d+), max (\d+) \| median ≤ 1 \| "
        r"\| tokens, runaway scenarios \| ([\d,]+) guarded vs ([\d,]+) unguarded "
        r"\(([\d.]+x)\) \|",
    ),
    "real-traffic corpus": ("docs/real-traffic.md", r"\(`bench/scenarios/`, (\d+) scenarios\)"),
    "overview quality": (
        "docs/overview.md",
        r"\(`python bench/quality.py`, (\d+) scenarios, .*?\): every runaway stopped, no "
        r"healthy scenario stopped, median (\d+) steps? past onset",
    ),
    "real-traffic tokens": (
        "docs/real-traffic.md",
        r"([\d,]+) tokens guarded against ([\d,]+) unguarded, a ([\d.]+x) saving "
        r"\(([\d.]+x) without `token-flood`\)",
    ),
}


@pytest.mark.parametrize("key", ["overview", "real-traffic counts"])
def test_runaway_and_healthy_counts_match_the_demo(demo: Demo, key: str) -> None:
    m = _one(*QUOTED[key])
    quoted = tuple(int(x) for x in m.groups())
    assert quoted == (*demo.runaways, *demo.healthy), f"{QUOTED[key][0]}: {m[0]!r}"


def test_tokens_and_saving_match_the_demo(demo: Demo) -> None:
    m = _one(*QUOTED["real-traffic tokens"])
    assert (_int(m[1]), _int(m[2])) == demo.tokens, m[0]
    assert m[3] == demo.ratio, m[0]
    assert m[4] == demo.ratio_without("token-flood"), m[0]


def test_the_demo_output_is_parsed_as_printed(demo: Demo) -> None:
    # the parser read the table as well as the summary: the rows add up to the totals
    assert len(demo.per_scenario) == sum(demo.runaways[1:] + demo.healthy[1:])
    guarded = sum(g for g, _ in demo.per_scenario.values())
    unguarded = sum(u for _, u in demo.per_scenario.values())
    assert (guarded, unguarded) == demo.tokens


#: figures of the demo's kind anywhere in the docs: each must be one that QUOTED checks
SWEEP = [
    r"\d+/\d+ runaways",
    r"\d+/\d+ healthy scenarios",
    r"[\d.]+x saving",
    r"[\d,]+ tokens guarded",
]


#: figures of that kind that another program prints, with the program (not the demo's)
OTHER_PROGRAMS = {
    ("docs/defaults.md", "8/13 runaways"): "loopwarden replay of recorded real runs",
}


def test_every_demo_figure_in_the_docs_is_checked() -> None:
    checked = {
        (page, m.start(), m.end())
        for page, pattern in QUOTED.values()
        for m in re.finditer(pattern, _text(page))
    }
    unchecked = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        text = _text(page)
        for pattern in SWEEP:
            for m in re.finditer(pattern, text):
                if (page, m[0]) in OTHER_PROGRAMS:
                    continue
                if not any(p == page and s <= m.start() < e for p, s, e in checked):
                    unchecked.append(f"{page}: ...{text[max(0, m.start() - 60) : m.end()]}")
    assert unchecked == [], "figures no test checks (add them to QUOTED):\n" + "\n".join(unchecked)


@pytest.fixture(scope="module")
def quality() -> dict[str, object]:
    """``python bench/quality.py --json`` on the shipped config: the corpus figures."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "quality.py"), "--json", "--config", SHIPPED],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    sc: dict[str, object] = json.loads(proc.stdout)["scenarios"]
    return sc


def test_the_quality_corpus_figures_match_the_bench(quality: dict[str, object]) -> None:
    q: dict[str, object] = quality
    tokens = q["tokens"]
    assert isinstance(tokens, dict)
    g, u = tokens["runaways"]["guarded"], tokens["runaways"]["unguarded"]
    m = _one(*QUOTED["real-traffic quality"])
    assert (int(m[1]), int(m[2])) == (q["recall"], q["runaways"]), m[0]
    assert (int(m[3]), int(m[4])) == (q["healthy_stopped"], q["healthy"]), m[0]
    assert (int(m[5]), int(m[6])) == (q["healthy_warned"], q["healthy"]), m[0]
    assert (float(m[7]), int(m[8])) == (q["wasted_median"], q["wasted_max"]), m[0]
    assert (_int(m[9]), _int(m[10])) == (g, u), m[0]
    assert m[11] == f"{u / g:.1f}x", m[0]
    assert int(_one(*QUOTED["real-traffic corpus"])[1]) == q["scenarios"]


def test_the_overview_quotes_the_quality_bench(quality: dict[str, object]) -> None:
    m = _one(*QUOTED["overview quality"])
    assert int(m[1]) == quality["scenarios"], m[0]
    # "every runaway stopped, no healthy scenario stopped": the words are figures too
    assert quality["recall"] == quality["runaways"] and quality["healthy_stopped"] == 0, m[0]
    assert float(m[2]) == quality["wasted_median"], m[0]
