"""Long cycles: a sequence of calls that comes back to the same state with the same answers,
at any period up to oscillation's ``max_long_period`` -- far beyond ``max_period``.

Tests marked *loop* fail on a build that follows calls as answered only up to period 4;
tests marked *healthy twin* hold there too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.detectors import Feed, kinds

from loopwarden.config import Config
from loopwarden.plugins.oscillation import CycleDetector, Oscillation, OscillationSettings
from loopwarden.testing import make_tool_result
from loopwarden.tools import ToolRegistry
from loopwarden.tools.recorded import recorded_tool
from loopwarden.verdicts import Stop

SCENARIOS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"
TEXT_TOOLS = ToolRegistry([recorded_tool("act")])

#: a text-action agent's lap: search, the wrong item, two invalid actions, back, the same
#: item, its description, back, back, a new search -- ten calls, the issue's shape
LAP = [
    ("search[red running shoes size 9]", "[Back to Search] Page 1 [B07ABC1234] Nike $59.99"),
    ("click[B07ABC1234]", "[< Prev] Nike Revolution 6 size [8] [10] [Buy Now]"),
    ("click[size 9]", "Invalid action!"),
    ("click[red]", "Invalid action!"),
    ("click[< Prev]", "[Back to Search] Page 1 [B07ABC1234] Nike $59.99"),
    ("click[B07ABC1234]", "[< Prev] Nike Revolution 6 size [8] [10] [Buy Now]"),
    ("click[Description]", "[< Prev] A lightweight running shoe."),
    ("click[< Prev]", "[< Prev] Nike Revolution 6 size [8] [10] [Buy Now]"),
    ("click[< Prev]", "[Back to Search] Page 1 [B07ABC1234] Nike $59.99"),
    ("click[Back to Search]", "WebShop [SEP] Instruction: red running shoes [SEP] Search"),
]


def play(plugin: Oscillation, steps: list[tuple[str, str]]) -> list[str | None]:
    """One ``act`` call per turn; the verdict kind of each turn (response or result)."""
    f = Feed(plugin, tools=TEXT_TOOLS)
    out: list[str | None] = []
    for action, answer in steps:
        c = f.call("act", {"action": action})
        v = f.respond("next", [c])
        if v is None:
            v = f.after(c, make_tool_result(answer))
        out.append(kinds([v])[0])
    return out


def test_loop_a_ten_call_lap_with_the_same_answers_warns_then_stops() -> None:
    got = play(Oscillation(), LAP * 3)
    # the second lap completes at call 20: a hit (warn); the next call is the second hit
    assert got[:19] == [None] * 19
    assert got[19] == "warn"
    assert got[20] == "stop:oscillation"


def test_loop_stop_evidence_names_the_period_and_the_lap() -> None:
    o = Oscillation()
    f = Feed(o, tools=TEXT_TOOLS)
    stop = None
    for action, answer in LAP * 3:
        c = f.call("act", {"action": action})
        f.respond("next", [c])
        v = f.after(c, make_tool_result(answer))
        if isinstance(v, Stop):
            stop = v
            break
    assert stop is not None
    assert stop.evidence["period"] == 10
    assert "click[B07ABC1234]" in stop.evidence["calls"]


@pytest.mark.parametrize("period", [5, 7, 12, 20, 28])
def test_loop_any_period_up_to_the_bound_is_seen(period: int) -> None:
    lap = [(f"click[item {i}]", f"page {i}") for i in range(period)]
    got = play(Oscillation(), lap * 3)
    assert got[2 * period - 1] == "warn"
    assert got[2 * period] == "stop:oscillation"


def test_a_period_beyond_the_bound_is_not_seen() -> None:
    lap = [(f"click[item {i}]", f"page {i}") for i in range(29)]
    assert "stop:oscillation" not in play(Oscillation(), lap * 3)
    # ... unless the bound is raised
    got = play(Oscillation(OscillationSettings(max_long_period=29)), lap * 3)
    assert got[58] == "stop:oscillation"


def test_healthy_twin_the_same_lap_with_answers_that_changed() -> None:
    """The same ten calls again, but the shop's answers moved on (new results, the size now
    offered): the agent is not back in the same state -- no cycle."""
    second = [(a, r + " (updated)") for a, r in LAP]
    got = play(Oscillation(), LAP + second + [LAP[0]])
    assert "stop:oscillation" not in got
    assert "warn" not in got


def test_healthy_twin_a_paging_cursor() -> None:
    """A cursor moves on every call: nothing repeats however long the run."""
    steps = [(f"click[Next >] page {i}", f"Page {i + 1} [B0{i:08d}]") for i in range(60)]
    assert set(play(Oscillation(), steps)) == {None}


def test_the_proposal_check_stays_short() -> None:
    """Only calls *as answered* are followed to the long bound: the proposals check keeps
    max_period, so a long lap of proposals alone is not a cycle."""
    det = CycleDetector(2, 4, 2, 8)
    for sym in [f"s{i}" for i in range(10)] * 2:
        det.push(sym)
    assert det.period() is None


def test_long_period_is_validated() -> None:
    with pytest.raises(ValidationError, match="max_long_period"):
        OscillationSettings(max_long_period=3, max_period=4)


@pytest.mark.parametrize(
    ("name", "period"), [("cycle-webshop-period-10-en", 10), ("cycle-qa-period-7-en", 7)]
)
def test_loop_long_cycle_scenarios_are_stopped(
    name: str, period: int, shipped_config: Config, deployment_factory: Any
) -> None:
    """loop (without the long bound both run to the step cap, 165 turns)."""
    rec = deployment_factory(shipped_config).run(scenario=SCENARIOS / f"{name}.toml").record()
    assert rec["termination"] == "oscillation"
    assert rec["evidence"]["period"] == period
    assert rec["tool_calls"] == 2 * period + 1  # the second hit, one call after the lap
