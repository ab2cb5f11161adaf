"""bench/console.py runs and prints the promised JSON (its output shape; no timing asserted).

The facts it reports that are not timings are checked: the console never wrote the records
file, and it saw every run the bench appended while it served.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "console.py"


def _ms(figures: Any) -> bool:
    return (
        isinstance(figures, dict)
        and figures["n"] >= 1
        and 0 < figures["p50"] <= figures["p95"] <= figures["max"]
    )


@pytest.mark.slow  # the demo, 2,000 records, the console as a command: tens of seconds
def test_the_console_bench_prints_the_promised_json() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["records"] == 2_000
    assert {"final_answer", "repeat_call", "oscillation", "max_steps"} <= set(data["templates"])
    assert _ms(data["runs_page"]) and _ms(data["one_run"]) and _ms(data["overview"]["cached"])
    assert data["overview"]["first_ms"] > 0
    assert set(data["run_path"]["append_ms_per_run"]) == {"console_stopped", "console_serving"}
    assert set(data["filter"]) == {
        "guard",
        "termination",
        "tenant",
        "model",
        "time",
        "guard_and_tenant",
        "search",
    }
    assert all(_ms(f) for f in data["filter"].values())
    assert _ms(data["api"]["runs"]) and _ms(data["api"]["one_run"])
    path = data["run_path"]
    assert path["file_unchanged_before_the_appends"] is True
    assert path["console_total_equals_lines"] is True
    assert path["lines_appended"] == path["runs_per_side"] * 2 + path["warmup_runs"]
    assert path["console_descriptors_read_only"] in (True, None)
    assert set(data["targets"]) == {
        "runs_page_p50_le_300ms",
        "filters_p50_le_300ms",
        "one_run_p50_le_100ms",
    }
