"""bench/shared_budget.py runs on both stores and prints its promised figures (tiny numbers).

No timing is asserted (the machine is shared and noisy): the shape of the output, and the
invariants the bench exists to show -- spend within budget + one reservation per worker (also
with ``max_output_tokens`` set and on a store that times out half of its calls), one refund
execution however many workers ask for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# the bench in a subprocess, on both stores: half a minute (CI runs it; -m "not slow" skips it)
pytestmark = pytest.mark.slow

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
        # one round trip per reserve and per settle, counted in each worker's second run
        for trips in (result["round_trips"], result["single_worker"]["round_trips"]):
            for what in ("reserve", "settle"):
                assert trips[what]["calls"] > 0 and trips[what]["round_trips"] == 1
        assert result["store_cpu_us_per_model_call"]["p50"] > 0
        # a reserve + settle timed with others of the same counter in flight
        assert set(result["in_flight"]) == {"0", "10"}
        for figures in result["in_flight"].values():
            assert 0 < figures["p50"] <= figures["p99"]
        # the overspend bound with [model] max_output_tokens set (a model that answers with
        # its whole cap), and with a store that times out half of its calls
        for key in ("capped_output", "cap_from_config", "flaky_store"):
            worst = result[key]
            assert worst["max_output_tokens"] == 4000
            # every granted reservation covers the cap (with a half-failing store, a short
            # --quick run may have had none granted: its faults are drawn at random)
            granted = worst["largest_reservation_tokens"]
            assert granted > worst["max_output_tokens"] or (key == "flaky_store" and granted == 0)
            assert worst["within_bound"] is True
            assert worst["spent_tokens"] <= worst["bound_tokens"]
        assert result["capped_output"]["spent_tokens"] > 0  # some runs were answered
        flaky = result["flaky_store"]
        assert 0 < flaky["store_timeouts"] < flaky["store_calls"]
        assert any(k.startswith("store_unavailable") for k in flaky["runs"])  # fail_closed
        # a model that does not say its cap: the deployment's [model] max_output_tokens is on
        # its requests, so its reservations cover it too (not reserve_output_tokens' 1,000)
        assert result["cap_from_config"]["spent_tokens"] > 0
