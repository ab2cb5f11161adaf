"""``loopwarden demo --trajectories FILE``: a trajectory file a fresh clone can produce, and
``replay`` / ``calibrate`` on it.

The generated traffic is synthetic (a seeded generator over the demo shop); these tests check
what it must be -- deterministic, varied, labelled, readable by replay and calibrate -- and
what the commands do with it: the guards stop the runaways and leave the healthy conversations
alone, calibrate proposes limits from 100+ successful conversations and refuses fewer.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loopwarden.commands.cli import main
from loopwarden.config import Config, parse_config
from loopwarden.demo import UNGUARDED_CAP
from loopwarden.demo.traffic import (
    DEFAULT_CONVERSATIONS,
    DEFAULT_SEED,
    HEALTHY,
    RUNAWAY_SHARE,
    RUNAWAYS,
    SOURCE,
    plan_traffic,
    play_traffic,
)
from loopwarden.traffic.trajectory import _segments, iter_trajectories

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def write_file(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> tuple[int, str, str]:
    code = main(["demo", "-q", "--trajectories", str(path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def read(path: Path) -> list[dict[str, Any]]:
    trajs = [t for _, t in iter_trajectories(path)]
    assert all(t is not None for t in trajs), "every line is a readable trajectory"
    return [t for t in trajs if t is not None]


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file ``loopwarden demo --trajectories`` writes with its defaults (built once)."""
    path = tmp_path_factory.mktemp("traffic") / "demo-traffic.jsonl.gz"
    # the CLI configures the "loopwarden" logger; conftest's per-test fixture undoes that for
    # tests, not for a module fixture: undo it here
    logger = logging.getLogger("loopwarden")
    level, handlers = logger.level, list(logger.handlers)
    try:
        assert main(["demo", "-q", "--trajectories", str(path)]) == 0
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers
    return path


def replay_summary(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["replay", str(path), "--summary", "--json"]) == 0
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    return summary


# -- the file ----------------------------------------------------------------------------------


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b, c = (tmp_path / f"{x}.jsonl.gz" for x in "abc")
    for path, seed in ((a, "7"), (b, "7"), (c, "8")):
        code, _, _ = write_file(
            capsys, path, "--only", "refund", "--conversations", "25", "--seed", seed
        )
        assert code == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    with gzip.open(a, "rt", encoding="utf-8") as fh:
        assert len(fh.read().splitlines()) == 1 + 25


def test_a_plain_name_writes_plain_jsonl(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    code, _, _ = write_file(capsys, path, "--only", "refund", "--conversations", "3")
    assert code == 0
    lines = path.read_text(encoding="utf-8").splitlines()
    assert next(json.loads(x)["id"] for x in lines) == "refund"
    assert len(lines) == 4


def test_the_file_holds_the_scenarios_unguarded_runs_and_labelled_synthetic_traffic(
    demo_file: Path,
) -> None:
    trajs = read(demo_file)
    by_source = Counter(t["source"] for t in trajs)
    assert by_source[SOURCE] == DEFAULT_CONVERSATIONS
    scenarios = {t["id"]: t for t in trajs if t["source"] != SOURCE}
    assert len(scenarios) == by_source.total() - DEFAULT_CONVERSATIONS > 5
    # unguarded: a runaway scenario runs to the cap and is no success; a healthy one that
    # ran to the cap unguarded is none either
    assert scenarios["always-not-found"]["success"] is False
    assert scenarios["always-not-found"]["meta"]["termination_reason"] == "max_steps"
    assert len(scenarios["always-not-found"]["steps"]) == UNGUARDED_CAP
    assert scenarios["refund"]["success"] is True
    assert scenarios["repeat-then-recover"]["success"] is False
    for t in trajs:
        assert "not a statistic of real agents" in t["meta"]["note"]
        for step in t["steps"]:
            assert set(step) >= {"content", "tool_calls", "observations", "usage"}
            assert len(step["observations"]) == len(step["tool_calls"])
            assert step["usage"]["prompt_tokens"] > 0
            for call in step["tool_calls"]:
                assert isinstance(call["arguments"], dict)


def test_every_conversation_starts_from_the_shop_as_seeded(demo_file: Path) -> None:
    """The generated conversations share one shop, reset between them: every refund is the
    first of its order, never the duplicate an earlier conversation's refund would make."""
    refunds = [
        json.loads(obs)
        for t in read(demo_file)
        if t["source"] == SOURCE
        for step in t["steps"]
        for call, obs in zip(step["tool_calls"], step["observations"], strict=True)
        if call["name"] == "apply_refund"
    ]
    assert len(refunds) > 1
    assert all("duplicate" not in r and r["refund_id"] == "RF88231001" for r in refunds)


def test_a_multi_turn_conversation_is_recorded_with_the_users_replies(demo_file: Path) -> None:
    synthetic = [t for t in read(demo_file) if t["source"] == SOURCE]
    multi = [t for t in synthetic if any(s.get("user_reply") for s in t["steps"])]
    assert multi
    for t in multi:
        runs = _segments(t["steps"])
        assert len(runs) >= 2
        # every run but the last ends with a text answer, then the user's next message
        for _, seg, _ in runs[:-1]:
            assert seg[-1]["tool_calls"] == [] and seg[-1]["user_reply"]


# -- the generator -----------------------------------------------------------------------------


def test_the_generator_varies_intents_turns_lookups_and_runaways() -> None:
    plans = plan_traffic(DEFAULT_CONVERSATIONS, DEFAULT_SEED)
    assert len(plans) == DEFAULT_CONVERSATIONS
    runaways = [p for p in plans if p.runaway]
    assert len(runaways) == round(DEFAULT_CONVERSATIONS * RUNAWAY_SHARE)
    assert {p.intent for p in plans if not p.runaway} == set(HEALTHY)
    assert {p.intent.split(":")[1] for p in runaways} == set(RUNAWAYS)
    assert {len(p.turns) for p in plans} >= {1, 2, 3}
    lookups = {len(t.model.turns) for p in plans for t in p.turns}
    assert {0, 1, 2, 3, 4} <= lookups

    def redundant(p: Any) -> bool:  # the same call in two steps in a row
        calls = [
            json.dumps(c.model_dump(), sort_keys=True)
            for t in p.turns
            for s in t.model.turns
            for c in s.tool_calls
        ]
        return any(a == b for a, b in itertools.pairwise(calls))

    assert any(redundant(p) for p in plans if not p.runaway)
    assert plan_traffic(40, 3) == plan_traffic(40, 3)
    assert plan_traffic(40, 3) != plan_traffic(40, 4)


def test_played_unguarded_healthy_conversations_finish_and_runaways_reach_the_cap(
    shipped_config: Config,
) -> None:
    trajs = play_traffic(shipped_config, 40, 5)
    assert len(trajs) == 40
    for t in trajs:
        term = t["meta"]["termination_reason"]
        if t["success"]:
            assert term in ("final_answer", "terminal_tool"), t["id"]
        else:
            assert t["meta"]["intent"].startswith("runaway:")
            assert term == "max_steps"
            assert len(_segments(t["steps"])[-1][1]) == UNGUARDED_CAP
    assert any(not t["success"] for t in trajs) and any(t["success"] for t in trajs)


# -- the command line --------------------------------------------------------------------------


def test_the_output_says_what_was_written_and_that_it_is_synthetic(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl.gz"
    code, out, _ = write_file(capsys, path, "--only", "refund", "--conversations", "5")
    assert code == 0
    assert f"trajectories: 6 written to {path}" in out
    assert "synthetic demo traffic" in out and "not a statistic of real agents" in out
    assert f"loopwarden replay {path} --summary" in out
    code, out, _ = write_file(capsys, path, "--only", "refund", "--conversations", "5", "--json")
    last = json.loads(out.splitlines()[-1])
    assert set(last) == {"totals", "failed", "trajectories"}  # keys only added
    assert last["trajectories"]["trajectories"] == 6 and last["trajectories"]["synthetic"]


def test_generator_options_need_a_trajectory_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "-q", "--only", "refund", "--conversations", "5"]) == 2
    assert "--conversations" in capsys.readouterr().err


def test_an_unwritable_trajectory_file_fails_before_anything_is_played(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = write_file(capsys, tmp_path / "missing" / "t.jsonl")
    assert code == 2 and out == ""
    assert "--trajectories" in err and "no such directory" in err


def test_demo_help_states_the_generators_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"default: {DEFAULT_CONVERSATIONS}" in text and f"default: {DEFAULT_SEED}" in text


# -- replay and calibrate on it ----------------------------------------------------------------


def test_replay_stops_the_runaways_and_leaves_the_healthy_conversations_alone(
    capsys: pytest.CaptureFixture[str], demo_file: Path
) -> None:
    s = replay_summary(capsys, demo_file)
    assert s["unreadable_lines"] == 0 and s["trajectories"] == len(read(demo_file))
    assert s["runaway_runs"] >= round(DEFAULT_CONVERSATIONS * RUNAWAY_SHARE)
    assert s["runaway_runs_missed"] == []
    assert s["successful"] >= 100
    assert s["successful_stopped_with_work_left"] == 0
    synthetic = s["by_source"][SOURCE]
    assert synthetic["runaway_runs_stopped"] == synthetic["runaway_runs"] > 0


def test_replay_text_summary_runs_on_the_file(
    capsys: pytest.CaptureFixture[str], demo_file: Path
) -> None:
    assert main(["replay", str(demo_file), "--summary"]) == 0
    out = capsys.readouterr().out
    assert "Runaway runs -- the guards should stop these" in out
    assert SOURCE in out  # two sources: the per-source table


def test_calibrate_proposes_a_valid_config_from_the_default_file(
    capsys: pytest.CaptureFixture[str], demo_file: Path
) -> None:
    capsys.readouterr()
    assert main(["calibrate", str(demo_file)]) == 0
    out = capsys.readouterr().out
    assert "plugins.max_steps.max_steps = " in out  # a proposal, with its statistic
    config = parse_config(tomllib.loads(out), path="<calibrated>")
    assert config.plugins.tables()["max_steps"]["max_steps"] < UNGUARDED_CAP


def test_calibrate_refuses_a_file_with_too_few_conversations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "few.jsonl.gz"
    code, _, _ = write_file(capsys, path, "--only", "refund", "--conversations", "40")
    assert code == 0
    assert main(["calibrate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "too few to calibrate on" in err


def test_the_docs_state_the_default_files_figures(demo_file: Path) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "real-traffic.md").read_text(
        encoding="utf-8"
    )
    flat = " ".join(doc.split())
    trajs = read(demo_file)
    ok = sum(1 for t in trajs if t["success"] is True)
    assert f"# {len(trajs)} trajectories, a few seconds" in flat
    assert f"proposes limits from its {ok} successful conversations" in flat
    assert "synthetic demo traffic, not a statistic of real agents" in flat
