"""The detection-quality corpus is well-formed, and bench/quality.py computes what it says.

Loading every file is cheap; playing the whole corpus is the benchmark's job, so the tests
play only a handful of scenarios.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from loopwarden.config import parse_config
from loopwarden.demo import Pair
from loopwarden.models.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "bench" / "scenarios"
FILES = sorted(CORPUS.glob("*.toml"))
CJK = re.compile(r"[\u4e00-\u9fff]")


def _load_quality() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "bench" / "quality.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


quality = _load_quality()


@pytest.fixture(scope="module")
def corpus() -> list[Scenario]:
    return [load_scenario(p) for p in FILES]


def _text(sc: Scenario) -> str:
    return sc.user + " ".join(t.content or "" for t in sc.model.turns)


def test_the_corpus_has_at_least_40_scenarios() -> None:
    assert len(FILES) >= 40


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_scenario_loads_and_is_labelled(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.name == path.stem
    assert sc.description
    exp = sc.expect
    assert exp.healthy is not None, "needs [expect] healthy"
    assert exp.kind, "needs [expect] kind"
    assert sc.model.turns, "needs scripted turns"
    if exp.healthy:
        assert exp.onset is None
        assert sc.model.then == "final", "a healthy scenario ends by itself"
    else:
        assert exp.kind in quality.RUNAWAY_KINDS
        assert exp.onset is not None and exp.onset >= 1
        # the loop is established within the first turns, before any default cap
        assert exp.onset <= 6
        assert sc.model.then in ("repeat_last", "cycle"), "a runaway never ends by itself"
    # a comment above the name says what the scenario is, and for runaways why the onset
    head = path.read_text(encoding="utf-8").split("\nname =")[0]
    assert head.startswith("#")
    if not exp.healthy:
        assert f"onset {exp.onset}" in head


def test_every_runaway_form_has_several_variants_in_both_languages(
    corpus: list[Scenario],
) -> None:
    for kind in quality.RUNAWAY_KINDS:
        scs = [s for s in corpus if s.expect.kind == kind]
        assert len(scs) >= 5, kind
        assert any(CJK.search(_text(s)) for s in scs), f"{kind}: no Chinese variant"
        assert any(not CJK.search(_text(s)) for s in scs), f"{kind}: no English variant"
        parallel = [s for s in scs if any(len(t.tool_calls) > 1 for t in s.model.turns)]
        assert parallel, f"{kind}: no variant spread over parallel calls"


def test_runaways_include_variants_interleaved_with_no_op_calls(corpus: list[Scenario]) -> None:
    def interleaved(sc: Scenario) -> bool:
        names = [c.name for t in sc.model.turns for c in t.tool_calls]
        return any(n in ("think", "get_current_time") for n in names) and len(set(names)) > 1

    kinds = {s.expect.kind for s in corpus if not s.expect.healthy and interleaved(s)}
    assert {"repeat", "oscillation", "retry_storm", "exploration"} <= kinds


def test_healthy_scenarios_cover_the_suspicious_looking_tasks(corpus: list[Scenario]) -> None:
    kinds = {s.expect.kind for s in corpus if s.expect.healthy}
    assert {"polling", "paging", "retry_once", "several_items"} <= kinds
    assert sum(1 for s in corpus if s.expect.healthy) >= 12


def test_scripted_tools_the_shop_lacks_declare_their_nature(corpus: list[Scenario]) -> None:
    shop = {
        "query_order",
        "query_logistics",
        "search_knowledge",
        "get_current_time",
        "apply_refund",
        "transfer_to_human",
    }
    for sc in corpus:
        for name, script in sc.tools.items():
            if name in shop:
                continue
            assert script.description, f"{sc.name}: tools.{name} needs a description"
            assert script.results is not None or script.error is not None
            flags = (script.read_only, script.deterministic, script.side_effect)
            assert any(f is not None for f in flags) or script.declared is False, (
                f"{sc.name}: tools.{name} nature (or declared = false)"
            )
    # Both kinds of tools are played: declared natures (a deployment's own tools), and tools
    # nobody declared (a framework's or an MCP server's, as the agents of other kinds use).
    assert any(s.declared is False for sc in corpus for s in sc.tools.values())


# -- the benchmark's arithmetic ------------------------------------------------------------


def _pair(onset: int | None, **guarded: Any) -> Pair:
    sc = Scenario.model_validate(
        {
            "name": "x",
            "user": "u",
            "expect": {"healthy": onset is None, "kind": "repeat", "onset": onset},
        }
    )
    rec = {
        "termination": "repeat_call",
        "stopped_by": "repeat_call",
        "steps": 5,
        "stop_step": 3,
        "stop_hook": "before_tool",
        "warnings": [],
        "tokens": {"total": 100},
        "tool_calls": 3,
        "final_answer_present": True,
    }
    rec.update(guarded)
    return Pair(sc, rec, dict(rec, tokens={"total": 1000}), True, "stopped")


def test_steps_wasted_after_onset() -> None:
    # a stop in the turn it names
    assert quality.wasted_after_onset(_pair(2)) == 1
    assert quality.wasted_after_onset(_pair(3)) == 0
    # a stop at the onset turn itself, or before it, wastes nothing
    assert quality.wasted_after_onset(_pair(5)) == 0
    # before_model: the call it precedes became the wrap-up, so the last working turn is
    # the one before
    assert quality.wasted_after_onset(_pair(2, stop_hook="before_model", stop_step=4)) == 1
    # a runaway that no guard stopped wasted everything from its onset on
    missed = _pair(
        2, termination="final_answer", stopped_by=None, stop_step=None, stop_hook=None, steps=9
    )
    assert quality.wasted_after_onset(missed) == 7
    assert quality.wasted_after_onset(_pair(None)) is None


def test_targets_say_met_or_missed() -> None:
    checks = quality.check_targets(
        {
            "recall_pct": 100.0,
            "healthy_stopped": 1,
            "wasted_median": 1.0,
            "replay_runaway_runs_stopped_pct": 75.0,
            "replay_successful_warned_pct": 5.0,
        }
    )
    met = {c["target"]: c["met"] for c in checks}
    assert met == {
        "recall_pct": True,
        "healthy_stopped": False,
        "wasted_median": True,
        "replay_runaway_runs_stopped_pct": False,
        "replay_successful_warned_pct": True,
    }
    text = quality.report(
        quality.scenario_metrics(
            [_pair(2), _pair(None, termination="final_answer", stopped_by=None)]
        ),
        None,
        checks,
    )
    assert "MISSED healthy scenarios stopped: 1 (target <= 0)" in text
    assert "MISSED real runaway runs stopped (%): 75 (target >= 90)" in text
    assert "met    recall: 100 (target >= 100)" in text


def test_quality_runs_end_to_end_on_a_few_scenarios_and_a_small_replay(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("[plugins.max_steps]\nmax_steps = 6\nwarn_remaining = 0\n", encoding="utf-8")
    trajs = tmp_path / "t.jsonl"
    loop = {
        "id": "loop",
        "success": False,
        "final_answer_present": False,
        "meta": {"termination_reason": "max_steps"},
        "steps": [
            {
                "content": None,
                "tool_calls": [{"name": "get_x", "arguments": {}}],
                "observations": ["x"],
                "usage": None,
            }
            for _ in range(12)
        ],
    }
    ok = {
        "id": "ok",
        "success": True,
        "final_answer_present": True,
        "steps": [{"content": "fine", "tool_calls": [], "observations": []}],
    }
    trajs.write_text(json.dumps(loop) + "\n" + json.dumps(ok) + "\n", encoding="utf-8")
    code = quality.main(
        [
            "--config",
            str(conf),
            "--only",
            "rep-not-found-zh",
            "--only",
            "ok-refund-en",
            "--trajectories",
            str(trajs),
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    sc = out["scenarios"]
    assert (sc["runaways"], sc["healthy"], sc["recall"], sc["healthy_stopped"]) == (1, 1, 1, 0)
    # only the step cap (6) guards this config: the lookup from onset 2 runs to turn 5
    assert sc["wasted_by_scenario"] == {"rep-not-found-zh": 3}
    assert sc["tokens"]["runaways"]["ratio"] > 5
    assert out["replay"]["step_cap_runs_stopped"] == 1
    assert out["replay"]["successful_stopped_with_work_left"] == 0
    met = {t["target"]: t["met"] for t in out["targets"]}
    assert met["wasted_median"] is False and met["recall_pct"] is True
    assert met["replay_runaway_runs_stopped_pct"] is True
    assert met["replay_successful_stopped_with_work_left_pct"] is True


def test_profiles_named_by_the_corpus_exist() -> None:
    """The long-task scenario names a profile the shipped config defines."""
    from loopwarden.config import default_config_path, load_toml

    cfg = parse_config(load_toml(default_config_path()), path="shipped")
    for path in FILES:
        sc = load_scenario(path)
        if sc.profile is not None:
            assert cfg.profile(sc.profile) is not None
