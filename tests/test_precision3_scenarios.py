"""The behaviour scenarios of issue 45, played with the shipped config through the scripted
model and the demo shop: healthy twins finish by themselves, loops are stopped.

On the code before this round the clock, progress, balance, queue and relisted-directory
scenarios were stopped by repeat_call, and the rephrased searches ran 13 steps; the count,
DDL and migration scenarios finished then too (healthy twins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_config
from loopwarden.demo import shop_tools
from loopwarden.models.scenario import load_scenario

CORPUS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"

HEALTHY = [
    "ok-clock-polled-en",
    "ok-clock-json-zh",
    "ok-progress-bar-en",
    "ok-balance-checks-en",
    "ok-queue-drain-en",
    "ok-result-count-en",
    "ok-ddl-acks-same-text-en",
    "ok-directory-relisted-en",
    "ok-migration-fixed-en",
]
#: loop -> the most model turns it may run (the soft stop's wrap-up turn included)
LOOPS = {"rep-rephrased-same-document-en": 6, "rep-listing-five-times-en": 6}
LOOP_GUARDS = {"repeat_call", "no_progress", "stall", "oscillation", "failure_streak"}


@pytest.fixture(scope="module")
def shipped() -> Deployment:
    return Deployment(load_config(default_config_path()), tools=shop_tools())


def _play(dep: Deployment, name: str) -> dict[str, Any]:
    return dep.run(scenario=str(CORPUS / f"{name}.toml")).record()


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_twins_finish_by_themselves(shipped: Deployment, name: str) -> None:
    assert load_scenario(CORPUS / f"{name}.toml").expect.healthy is True
    rec = _play(shipped, name)
    assert rec["termination"] == "final_answer", (rec["stopped_by"], rec["evidence"])


def test_the_clock_is_not_warned_about(shipped: Deployment) -> None:
    rec = _play(shipped, "ok-clock-polled-en")
    assert rec["warnings"] == []


def test_a_missing_compiler_called_four_times_is_not_stopped_by_repeat_call(
    shipped: Deployment,
) -> None:
    """repeat_call warns (saying what repeated) and does not stop at the 3rd or 4th call."""
    rec = _play(shipped, "ok-missing-compiler-en")
    assert rec["stopped_by"] != "repeat_call", rec["evidence"]
    assert any(w["plugin"] == "repeat_call" for w in rec["warnings"])


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_loops_are_stopped(shipped: Deployment, name: str) -> None:
    assert load_scenario(CORPUS / f"{name}.toml").expect.healthy is False
    rec = _play(shipped, name)
    assert rec["stopped_by"] in LOOP_GUARDS, rec["termination"]
    assert rec["steps"] <= LOOPS[name], rec["steps"]
