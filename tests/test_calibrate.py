"""``loopwarden calibrate``: statistics of healthy runs, proposed limits, the config round trip.

Every input file is written here, small and known; the shared file of real runs is never
needed.  Proposed values are recomputed in the test from the data it wrote.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from loopwarden.calibrate import (
    Limit,
    dump_toml,
    load_stats,
    percentile,
    propose,
)
from loopwarden.cli import main
from loopwarden.config import default_config_path, load_config
from loopwarden.exceptions import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def step(
    content: str | None = None,
    calls: int = 0,
    *,
    key: str = "k",
    usage: tuple[int, int] | None = (1000, 50),
    reply: str | None = None,
) -> dict[str, Any]:
    return {
        "content": content,
        "tool_calls": [
            {"name": "get_record", "arguments": {"key": f"{key}{i}"}} for i in range(calls)
        ],
        "observations": [f"record {key}{i}: ok" for i in range(calls)],
        "user_reply": reply,
        "usage": None
        if usage is None
        else {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
    }


def conversation(
    tid: str,
    turns: list[int],
    *,
    success: bool | None = True,
    domain: str = "shop",
    usage: bool = True,
    **meta: Any,
) -> dict[str, Any]:
    """A conversation whose turn i makes turns[i] single-call lookups, then answers."""
    steps: list[dict[str, Any]] = []
    prompt = 2000
    for t, n in enumerate(turns):
        for j in range(n):
            prompt += 100
            steps.append(step(None, 1, key=f"{t}-{j}-", usage=(prompt, 20) if usage else None))
        prompt += 100
        steps.append(
            step(
                f"Answer {t}.",
                usage=(prompt, 40) if usage else None,
                reply="next" if t < len(turns) - 1 else None,
            )
        )
    return {
        "source": f"test/{domain}",
        "id": tid,
        "success": success,
        "steps": steps,
        "final_answer_present": True,
        "meta": {"domain": domain, **meta},
    }


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
        encoding="utf-8",
    )
    return path


def test_percentiles_and_proposals() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile([7], 99) == 7 and percentile([], 99) is None
    assert propose(values) == math.ceil(99 * 1.25)
    assert propose([10_100.0], tokens=True) == 13_000  # 12,625 rounded up to a thousand
    assert propose([8000.0], tokens=True, plus=1000) == 11_000
    assert propose([]) is None


def test_stats_of_trajectories_count_healthy_turns_and_busiest_turns(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            conversation("a", [2, 0, 5]),
            conversation("b", [1], usage=False, duration_s=12.5),
            conversation("failed", [30], success=False),
            conversation("unknown", [3], success=None),
            "{broken",
        ],
    )
    s = load_stats(path)
    assert s.kind == "trajectories" and s.lines == 5
    assert (s.unsuccessful, s.unreadable) == (2, 1)
    assert [c.turns for c in s.conversations] == [3, 1]
    # model calls per turn: the lookups plus the answer
    assert [t.model_calls for t in s.turns] == [3, 1, 6, 2]
    assert [t.tool_calls for t in s.turns] == [2, 0, 5, 1]
    a, b = s.conversations
    assert (a.turn_model_calls, a.turn_tool_calls, a.model_calls) == (6, 5, 10)
    assert a.max_prompt == 2000 + 10 * 100
    assert a.tokens == sum(2000 + 100 * i for i in range(1, 11)) + 7 * 20 + 3 * 40
    # no recorded usage: no token figures (estimates would understate the real prompt)
    assert b.tokens is None and b.max_prompt is None and b.turn_tokens is None
    assert b.seconds == 12.5
    assert a.first_prompt == 2100 and b.first_prompt is None


def test_stats_of_run_records_use_the_finished_runs(tmp_path: Path) -> None:
    def rec(termination: str, steps: int, answer: bool = True) -> dict[str, Any]:
        return {
            "run_id": "r",
            "termination": termination,
            "steps": steps,
            "tool_calls": steps - 1,
            "tokens": {"prompt": 900 * steps, "completion": 10 * steps, "total": 910 * steps},
            "final_answer_present": answer,
            "profile": "standard",
        }

    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            rec("final_answer", 3),
            rec("terminal_tool", 2),
            rec("max_steps", 10),
            rec("final_answer", 4, answer=False),
            conversation("a trajectory among records", [1]),
        ],
    )
    s = load_stats(path)
    assert s.kind == "records"
    assert [t.model_calls for t in s.turns] == [3, 2]
    assert [c.group for c in s.conversations] == ["standard", "standard"]
    assert s.conversations[0].turn_tokens == 2730
    assert (s.unsuccessful, s.unreadable) == (2, 1)


def test_a_file_without_runs_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no readable trajectory or run record"):
        load_stats(write_jsonl(tmp_path / "x.jsonl", ["[1, 2]", "{nope"]))
    with pytest.raises(ConfigError, match="file not found"):
        load_stats(tmp_path / "missing.jsonl")


def test_toml_writer_round_trips() -> None:
    data = {
        "model": {"name": 'gpt "4o"\nmini', "temperature": 0.5, "extra_body": {}},
        "shop": {},
        "plugins": {
            "enabled": ["a", "b"],
            "blocked": [],
            "x": {
                "n": 3,
                "flag": True,
                "per_tool": {},
                "sinks": [{"type": "log", "min": "soft"}],
                "prices": {"gpt-4o": {"input": 2.5}, "name.with.dots": {"input": 1}},
            },
        },
        "run": {"warning_prefix": "[注意] ", "patterns": ["\\bERROR\\b", "^\\s*$"]},
    }
    assert tomllib.loads(dump_toml(data)) == data


def _calibrate(
    tmp_path: Path, lines: list[Any], capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[str, str, Path]:
    path = write_jsonl(tmp_path / "runs.jsonl", lines)
    code = main(["calibrate", str(path), "--config", str(default_config_path()), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    target = tmp_path / "calibrated.toml"
    target.write_text(out, encoding="utf-8")
    return out, err, target


def healthy_corpus() -> list[dict[str, Any]]:
    """25 successful conversations whose busiest turns make 1..25 lookups, and a runaway."""
    convs = [conversation(f"ok{i}", [1, i, 2]) for i in range(1, 26)]
    loop = conversation("loop", [0], success=False)
    loop["steps"] = [step(None, 1, key="same") for _ in range(60)]  # one call, 60 times
    loop["meta"]["termination_reason"] = "max_steps"
    return [*convs, loop]


def test_calibrate_writes_a_config_that_config_check_accepts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, err, target = _calibrate(tmp_path, healthy_corpus(), capsys)
    assert main(["config", "check", str(target)]) == 0
    assert "OK" in capsys.readouterr().out
    config = load_config(target)
    tables = config.plugins.tables()
    # busiest turns: i lookups + the answer, i = 1..25 -> p99 of 2..26 is 26
    assert tables["max_steps"]["max_steps"] == math.ceil(26 * 1.25)
    assert tables["tool_calls"]["max_tool_calls"] == math.ceil(25 * 1.25)
    largest = 2000 + 100 * (1 + 25 + 2 + 3)  # the last request of ok25: 28 lookups, 3 answers
    assert f"(p99 {largest} of largest request per conversation" in out
    reserve = tables["token_budget"]["reserve_output_tokens"]
    assert (
        tables["token_budget"]["max_context"]
        == math.ceil((math.ceil(largest * 1.25) + reserve) / 1000) * 1000
    )
    # one profile for the domain (enough runs), the shipped profiles kept
    shop = config.profiles["shop"]
    assert shop.max_steps == tables["max_steps"]["max_steps"]
    assert shop.description is not None and "25 successful" in shop.description
    assert {"simple", "standard", "complex", "quick"} <= set(config.profiles)
    # the base config's plugins and their order are kept
    assert config.plugins.enabled == load_config(default_config_path()).plugins.enabled
    # what the config does to this file: comments at the top, and on stderr
    assert out.startswith("# What this config does to runs.jsonl")
    assert "successful runs stopped with tool work left  0/25 (0.0%)" in out
    assert "runaway runs stopped                         1/1 (100.0%)" in out
    assert "runaway runs stopped" in err
    # the derivation is stated
    assert "plugins.max_steps.max_steps = 33  (p99 26 of most model calls in one turn" in out


def test_calibrate_margin_and_minimum_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, target = _calibrate(
        tmp_path, healthy_corpus(), capsys, "--margin", "2", "--min-runs", "30"
    )
    config = load_config(target)
    assert config.plugins.tables()["max_steps"]["max_steps"] == 52
    assert "shop" not in config.profiles
    assert (
        "no profile for 'shop': 25 successful conversation(s), fewer than 30"
        in target.read_text(encoding="utf-8")
    )
    path = tmp_path / "runs.jsonl"
    assert main(["calibrate", str(path), "--margin", "0.5"]) == 2
    assert "--margin" in capsys.readouterr().err


def test_keys_the_config_model_lacks_are_written_as_comments(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import loopwarden.calibrate as cal

    monkeypatch.setattr(
        cal,
        "LIMITS",
        (
            *cal.LIMITS,
            Limit("plugins.max_steps.no_such_setting", "busiest_turn_model_calls"),
            Limit("plugins.no_such_plugin.max_things", "conversation_turns"),
        ),
    )
    out, _, target = _calibrate(tmp_path, healthy_corpus(), capsys)
    assert main(["config", "check", str(target)]) == 0
    capsys.readouterr()
    assert "# no_such_setting = 33   # p99 26" in out
    assert "# [plugins.no_such_plugin]\n# max_things = 4 " in out
    data = tomllib.loads(out)
    assert "no_such_setting" not in data["plugins"]["max_steps"]
    assert "no_such_plugin" not in data["plugins"]


def test_calibrate_on_run_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [
        {
            "run_id": str(i),
            "termination": "final_answer",
            "steps": 2 + i % 5,
            "tool_calls": 1 + i % 5,
            "tokens": {"prompt": 3000, "completion": 100, "total": 3100},
            "final_answer_present": True,
        }
        for i in range(40)
    ]
    out, _, target = _calibrate(tmp_path, records, capsys)
    assert main(["config", "check", str(target)]) == 0
    capsys.readouterr()
    assert load_config(target).plugins.tables()["max_steps"]["max_steps"] == math.ceil(6 * 1.25)
    assert "successful runs over a proposed limit  0/40 (0.0%)" in out
    assert "records hold no steps to replay" in out


def test_calibrate_refuses_a_file_without_successful_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [conversation("f", [2], success=False)])
    assert main(["calibrate", str(path)]) == 2
    assert "no successful runs" in capsys.readouterr().err


def test_the_derivation_script_prints_the_distributions_and_the_proposals(
    tmp_path: Path,
) -> None:
    import subprocess

    path = write_jsonl(tmp_path / "runs.jsonl", healthy_corpus())
    script = Path(__file__).resolve().parent.parent / "bench" / "derive_defaults.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["successful_conversations"] == 25 and result["unsuccessful"] == 1
    busiest = result["table"]["busiest_turn_model_calls"]["all"]
    assert (busiest["n"], busiest["p50"], busiest["max"]) == (25, 14, 26)
    assert result["table"]["conversation_turns"]["shop"]["max"] == 3
    # the same numbers calibrate writes
    assert result["limits"]["plugins.max_steps.max_steps"]["proposed"] == 33
    assert result["limits"]["profiles.shop.max_steps"]["proposed"] == 33
    proc = subprocess.run(
        [sys.executable, str(script), str(path), "--by", "source"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and "| test/shop |" in proc.stdout


@pytest.mark.parametrize(
    "bad",
    [
        "[" * 100_000,
        '{"id": "n", "steps": [], "x": NaN}',
        '{"id": "e", "x": 1e999}',
        '{"id": "s", "steps": [], "x": "\\ud83d"}',
        "9" * 400,
    ],
)
def test_a_bad_line_is_counted_never_fatal(tmp_path: Path, bad: str) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [conversation("a", [2, 1]), bad])
    with path.open("ab") as fh:
        fh.write(b"\xff\xfe not utf-8\n")
    s = load_stats(path)
    assert s.unreadable == 2 and len(s.conversations) == 1
