"""bench/shared_budget.py runs on both stores and prints its promised figures (tiny numbers).

No timing is asserted (the machine is shared and noisy): the shape of the output, and the
invariants the bench exists to show -- spend within budget + one reservation per worker, one
refund execution however many workers ask for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "shared_budget.py"


def test_the_shared_budget_bench_smoke(redis_server: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", "--redis-url", redis_server],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert set(data["stores"]) == {"sqlite", "redis"}
    for result in data["stores"].values():
        assert result["within_bound"] is True
        assert result["spent_cost"] <= result["bound"]
        assert result["runs_counted"] == result["workers"] * result["runs_per_worker"] == 6
        assert result["refund_executions"] == 1 and result["refund_rows"] == 1
        assert result["model_calls"] > 0
        for key in ("store_us_per_model_call", "other_guards_us_per_model_call"):
            for figures in (result[key], result["single_worker"][key]):
                assert set(figures) == {"p50", "p99"}
                assert 0 < figures["p50"] <= figures["p99"]
