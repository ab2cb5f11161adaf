"""``loopwarden demo`` then ``loopwarden console``: every view has data from the demo alone,
read through the real HTTP server -- and the demo's measured figures do not depend on the
records it keeps."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden.cli import main
from loopwarden.config import load_config
from loopwarden.console.assemble import console_from_config
from loopwarden.console.server import make_server
from loopwarden.store import Shared


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["demo", "-q", *args]) == 0
    out: str = capsys.readouterr().out
    return out


@pytest.fixture
def served(_isolated_data_dir: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[str]:
    """The demo played in a fresh data directory, then the console over it on a free port."""
    out = _demo(capsys)
    records = _isolated_data_dir / "runs.jsonl"
    assert f"appended to {records}" in out and "loopwarden console" in out
    config = load_config(None)
    shared = Shared(config.store)
    server = make_server(console_from_config(config, shared), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        shared.close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        body: bytes = resp.read()
    return body.decode("utf-8")


def _json(url: str) -> Any:
    return json.loads(_get(url))


def test_every_console_view_has_data_after_the_demo(served: str) -> None:
    overview = _get(served)
    n = int(re.search(r"([\d,]+) runs", overview)[1].replace(",", ""))  # type: ignore[index]
    assert n >= 12  # the built-in scenarios, the outage twice
    assert "shadow would-stops" in overview and "circuit_open" in overview
    runs = _get(served + "runs")
    ids = re.findall(r'href="[^"]*runs/([0-9a-f]{32})"', runs)
    assert len(set(ids)) == n
    # a run stopped by a guard: its timeline has the steps, the verdict and its evidence
    stopped = _get(served + "runs?termination=repeat_call")
    (first, *_) = re.findall(r'href="[^"]*runs/([0-9a-f]{32})"', stopped)
    one = _get(served + "runs/" + first)
    assert 'class="step model"' in one and 'class="step tool"' in one
    assert 'class="verdict stop"' in one and 'class="evidence"' in one
    # budgets: the demo tenant's counters, a limit far from binding
    (row,) = [r for r in _json(served + "api/budgets")["counters"] if r["key"] == "demo"]
    assert row["scope"] == "tenant" and row["window"] == "day"
    assert row["spent"]["runs"] == n and row["spent"]["tokens"] > 0
    # breakers: the outage opened the logistics tool's breaker for the demo tenant
    breakers = _json(served + "api/breakers")["breakers"]
    assert any(
        b["name"] == "query_logistics" and b["state"] == "open" and b["scope_key"] == "demo"
        for b in breakers
    )
    assert "query_logistics" in _get(served + "breakers")
    # the records carry real times: the runs page shows them exactly (no "~")
    assert "~" not in runs.split("<tbody", 1)[-1]


def test_the_records_are_wall_clock_times_and_the_sample_is_skippable(
    _isolated_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _demo(capsys, "--no-records")
    records = _isolated_data_dir / "runs.jsonl"
    assert not records.exists() and "console sample" not in out
    _demo(capsys, "--only", "refund")
    (line,) = records.read_text(encoding="utf-8").splitlines()
    rec = json.loads(line)
    assert rec["scenario"] == "refund" and rec["meta"] == {"tenant": "demo"}
    assert rec["started_at"] <= rec["ended_at"] and rec["ended_at"] > 1.7e9  # not a fake clock


def test_the_measured_figures_do_not_depend_on_the_sample(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kept = _demo(capsys, "--json")
    skipped = _demo(capsys, "--json", "--no-records")

    # per run what the table shows, and the totals (retry jitter makes times vary by run)
    def figures(out: str) -> list[Any]:
        *recs, last = (json.loads(line) for line in out.splitlines())
        shown = [
            (r["scenario"], r["guarded"], r["termination"], r["steps"], r["tokens"], r["cost"])
            for r in recs
        ]
        return [shown, last["totals"], last["failed"]]

    assert figures(kept) == figures(skipped)
    assert len(figures(kept)[0]) == 24
