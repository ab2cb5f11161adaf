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

from loopwarden.commands.cli import main
from loopwarden.config import default_config_path, load_config
from loopwarden.exceptions import ConfigError
from loopwarden.traffic.calibrate import (
    Limit,
    dump_toml,
    load_stats,
    percentile,
    propose,
)

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
    source: str | None = None,
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
        "source": source or f"test/{domain}",
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


def healthy_corpus(n: int = 100, source: str | None = None) -> list[dict[str, Any]]:
    """``n`` successful conversations whose busiest turns make 1..n lookups, and a runaway."""
    convs = [conversation(f"ok{i}", [1, i, 2], source=source) for i in range(1, n + 1)]
    loop = conversation("loop", [0], success=False)
    loop["steps"] = [step(None, 1, key="same") for _ in range(60)]  # one call, 60 times
    loop["meta"]["termination_reason"] = "max_steps"
    return [*convs, loop]


def p99_x(values: list[float], margin: float = 1.25) -> int:
    """What a calibration proposes from these values: p99 x margin, rounded up."""
    p99 = percentile(values, 99)
    assert p99 is not None
    return math.ceil(p99 * margin)


def test_calibrate_writes_a_config_that_config_check_accepts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, err, target = _calibrate(tmp_path, healthy_corpus(), capsys)
    assert main(["config", "check", str(target)]) == 0
    assert "OK" in capsys.readouterr().out
    config = load_config(target)
    tables = config.plugins.tables()
    # busiest turns: i lookups + the answer, i = 1..100 -> p99 of 2..101 is 100
    busiest = [float(i + 1) for i in range(1, 101)]
    assert tables["max_steps"]["max_steps"] == p99_x(busiest) == 125
    # proposed from the runs, and written only where it does no worse than the current value
    # (each limit is replayed against it: see the tests below); the header shows both
    tool_calls = p99_x([max(2.0, i) for i in range(1, 101)])
    written = tables["tool_calls"].get("max_tool_calls")
    assert f"plugins.tool_calls.max_tool_calls: current unset, proposed {tool_calls} -> " in out
    assert written in (tool_calls, None)
    largest = 2000 + 100 * (1 + 99 + 2 + 3)  # the last request of ok99: p99 of 100 values
    reserve = tables["token_budget"]["reserve_output_tokens"]
    # what token_budget projects: before the call ahead of that last request (prompt 12,400)
    # it expects the next one to grow by the upper median of (reserve, 100) = the reserve,
    # and to reserve its output: 12,400 + 2 x 1,000 -- more than the last request + reserve
    assert f"(p99 {largest - 100 + 2 * reserve} of largest request token_budget projects" in out
    context = math.ceil(math.ceil((largest - 100 + 2 * reserve) * 1.25) / 1000) * 1000
    assert f"plugins.token_budget.max_context: current unset, proposed {context} -> " in out
    assert tables["token_budget"].get("max_context") in (context, None)
    # one profile for the source (enough runs; a TOML bare key), the shipped profiles kept
    shop = config.profiles["test-shop"]
    assert shop.max_steps == tables["max_steps"]["max_steps"]
    assert f"max_context = {context} -> " in out
    assert shop.max_context in (context, None)
    assert shop.description is not None and "100 successful test/shop" in shop.description
    assert {"simple", "standard", "complex", "quick"} <= set(config.profiles)
    assert "\n[profiles.test-shop]\n" in out
    # the base config's plugins and their order are kept
    assert config.plugins.enabled == load_config(default_config_path()).plugins.enabled
    # what the config does to this file: comments at the top, and on stderr
    assert out.startswith("# What this config does to runs.jsonl")
    assert "successful runs stopped with tool work left  0/100 (0.0%)" in out
    assert "runaway runs stopped                         1/1 (100.0%)" in out
    assert "runaway runs stopped" in err
    # the derivation is stated
    assert "plugins.max_steps.max_steps = 125  (p99 100 of most model calls in one turn" in out


def test_calibrate_refuses_fewer_runs_than_a_p99_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs (or 99) are no basis for a p99: exit 2 and a reason, no config on stdout."""
    for n in (2, 99):
        path = write_jsonl(tmp_path / "few.jsonl", healthy_corpus(n))
        assert main(["calibrate", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert f"only {n} successful conversation(s)" in err and "at least 100" in err
        assert "Traceback" not in err
    # an operator may lower the minimum knowingly: a loud warning, in the file and on stderr
    out, err, target = _calibrate(tmp_path, healthy_corpus(25), capsys, "--min-runs", "20")
    assert "warning: --min-runs 20 < 100" in err
    assert "# WARNING: --min-runs 20 < 100" in out
    assert load_config(target).plugins.tables()["max_steps"]["max_steps"] == math.ceil(26 * 1.25)


def test_calibrate_proposes_a_profile_per_source_with_enough_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plugin limits from all runs together; a [profiles.<slug>] per source from its own runs,
    only for sources with 100+ successful conversations."""
    shop = healthy_corpus(100, source="test/shop")[:-1]
    desk = [
        conversation(f"d{i}", [1, 1 + i % 4], source="Tau2/GPT-4.1 Desk", domain="desk")
        for i in range(100)
    ]
    few = [conversation(f"f{i}", [60], source="test/rare") for i in range(30)]
    out, _, target = _calibrate(tmp_path, [*shop, *desk, *few], capsys)
    assert main(["config", "check", str(target)]) == 0
    capsys.readouterr()
    config = load_config(target)
    profiles = config.profiles
    assert profiles["tau2-gpt-4-1-desk"].max_steps == p99_x([float(2 + i % 4) for i in range(100)])
    assert profiles["test-shop"].max_steps == p99_x([float(i + 1) for i in range(1, 101)])
    assert "test-rare" not in profiles
    assert "no profile for 'test/rare': 30 successful conversation(s), fewer than 100" in out
    # the plugin-level limit serves every source: from all 230 conversations
    everyone = [float(i + 1) for i in range(1, 101)] + [2.0 + i % 4 for i in range(100)]
    assert config.plugins.tables()["max_steps"]["max_steps"] == p99_x(everyone + [61.0] * 30)
    # each profile is replayed on its own source's runs
    assert "profile tau2-gpt-4-1-desk, tau2-gpt-4-1-desk runs only: 100 trajectories" in out
    # --by domain: one profile per meta.domain instead
    out, _, target = _calibrate(tmp_path, [*shop, *desk, *few], capsys, "--by", "domain")
    assert {"shop", "desk"} <= set(load_config(target).profiles)


def test_calibrate_margin_and_minimum_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = healthy_corpus(100)
    _, _, target = _calibrate(tmp_path, corpus, capsys, "--margin", "2")
    assert load_config(target).plugins.tables()["max_steps"]["max_steps"] == 200
    path = tmp_path / "runs.jsonl"
    assert main(["calibrate", str(path), "--min-runs", "101"]) == 2
    assert "only 100 successful conversation(s)" in capsys.readouterr().err
    assert main(["calibrate", str(path), "--margin", "0.5"]) == 2
    assert "--margin" in capsys.readouterr().err


def test_a_limit_with_too_few_values_keeps_the_base_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Token limits rest on recorded usage: 100 conversations, 40 with usage -> no token
    limit proposed (the base value stays), and the header says why."""
    corpus = healthy_corpus(100)[:-1]
    for c in corpus[40:]:
        for s in c["steps"]:
            s["usage"] = None
    out, _, target = _calibrate(tmp_path, corpus, capsys)
    base = load_config(default_config_path()).plugins.tables()["token_budget"]
    got = load_config(target).plugins.tables()["token_budget"]
    assert got["max_total_tokens"] == base["max_total_tokens"]
    assert (
        "plugins.token_budget.max_total_tokens: not proposed, 40 value(s) of most tokens "
        "token_budget projects in one turn, per conversation" in out
    )
    assert load_config(target).profiles["test-shop"].max_tokens is None


def test_calibrate_reads_gzip_and_several_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    corpus = healthy_corpus(100)
    plain = write_jsonl(tmp_path / "a.jsonl", corpus[:50])
    packed = tmp_path / "b.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(x) + "\n" for x in corpus[50:])
    assert main(["calibrate", str(plain), str(packed)]) == 0
    out, _ = capsys.readouterr()
    assert "calibrate a.jsonl b.jsonl.gz`" in out
    assert "100 successful conversation(s)" in out
    assert "plugins.max_steps.max_steps = 125 " in out
    # a corrupt archive: a clear error naming the file, exit 2, no traceback
    broken = tmp_path / "c.jsonl.gz"
    broken.write_bytes(packed.read_bytes()[:200])
    assert main(["calibrate", str(plain), str(broken)]) == 2
    err = capsys.readouterr().err
    assert "c.jsonl.gz" in err and "gzip" in err and "Traceback" not in err


def test_keys_the_config_model_lacks_are_written_as_comments(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import loopwarden.traffic.calibrate as cal

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
    assert "# no_such_setting = 125   # p99 100" in out
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
            "elapsed_s": 1.0 + i % 10,
        }
        for i in range(100)
    ]
    out, _, target = _calibrate(tmp_path, records, capsys)
    assert main(["config", "check", str(target)]) == 0
    capsys.readouterr()
    config = load_config(target)
    assert config.plugins.tables()["max_steps"]["max_steps"] == math.ceil(6 * 1.25)
    # a run record is one run: its wall time sets the profile's max_seconds
    assert config.profiles["default"].max_seconds == math.ceil(10 * 1.25)
    assert "successful runs over a limit  0/100 (0.0%)" in out
    assert "records hold no steps to replay" in out


def test_calibrate_refuses_a_file_without_successful_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [conversation("f", [2], success=False)])
    assert main(["calibrate", str(path)]) == 2
    assert "no successful runs" in capsys.readouterr().err


def test_profile_slugs_are_toml_bare_keys() -> None:
    from loopwarden.traffic.calibrate import profile_names, profile_slug

    assert profile_slug("tau2/gpt-4.1/telecom-solo") == "tau2-gpt-4-1-telecom-solo"
    assert profile_slug("Ünïcode / only") == "n-code-only"
    assert profile_slug("///") == "default"
    names = profile_names(["a.b", "a/b", "simple"], taken=["simple"])
    assert names == {"a.b": "a-b", "a/b": "a-b-2", "simple": "simple-2"}


def test_the_derivation_script_prints_the_distributions_and_the_proposals(
    tmp_path: Path,
) -> None:
    import gzip
    import subprocess

    path = write_jsonl(tmp_path / "runs.jsonl", healthy_corpus())
    other = tmp_path / "coding.jsonl.gz"
    with gzip.open(other, "wt", encoding="utf-8") as fh:
        fh.writelines(
            json.dumps(conversation(f"c{i}", [3 + i % 7], source="bench/coding")) + "\n"
            for i in range(100)
        )
    script = Path(__file__).resolve().parent.parent / "bench" / "derive_defaults.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    proc = run(str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["successful_conversations"] == 100 and result["unsuccessful"] == 1
    busiest = result["table"]["busiest_turn_model_calls"]["all"]
    assert (busiest["n"], busiest["p50"], busiest["max"]) == (100, 51, 101)
    assert result["table"]["conversation_turns"]["shop"]["max"] == 3
    # the same numbers calibrate writes
    assert result["limits"]["all"]["plugins.max_steps.max_steps"]["proposed"] == 125
    assert result["limits"]["shop"]["plugins.max_steps.max_steps"]["proposed"] == 125
    proc = run(str(path), "--by", "source")
    assert proc.returncode == 0 and "| test/shop |" in proc.stdout
    # both files at once, grouped by file (one kind of agent each): limits from all runs
    # together and per kind; a group below the minimum gets no proposal
    proc = run(str(path), str(other), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["by"] == "file" and set(result["limits"]) == {"all", "runs", "coding"}
    assert result["successful_conversations"] == 200
    coding = result["limits"]["coding"]["plugins.max_steps.max_steps"]
    assert coding["proposed"] == p99_x([4.0 + i % 7 for i in range(100)])
    everyone = [float(i + 1) for i in range(1, 101)] + [4.0 + i % 7 for i in range(100)]
    assert result["limits"]["all"]["plugins.max_steps.max_steps"]["proposed"] == p99_x(everyone)
    proc = run(str(path), str(other))
    assert proc.returncode == 0 and "| coding |" in proc.stdout
    small = write_jsonl(tmp_path / "small.jsonl", healthy_corpus(10))
    proc = run(str(small), "--json")
    assert json.loads(proc.stdout)["limits"]["all"]["plugins.max_steps.max_steps"] == {
        "metric": "busiest_turn_model_calls",
        "plus": None,
        "n": 10,
        "p99": 11,
        "proposed": None,
    }


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


# -- token limits follow what the guards project, not only what was billed -------------------


def test_token_budget_peak_counts_the_reserved_output_the_guard_projects() -> None:
    from loopwarden.traffic.calibrate import (
        context_peak,
        conversation_tokens_peak,
        token_budget_peak,
    )

    # three calls: prompts 1,000 / 1,500 / 2,000, 100 output tokens each; reserve 1,000
    calls = [(1000, 100), (1500, 100), (2000, 100)]
    # before call 2 (spent 1,100): this call 2,500 and the next 1,500 + median(1,000, 500)
    # + 1,000 = 3,500 -> 7,100; before call 3 (spent 2,700): this call only (the last) 3,000
    assert token_budget_peak(calls, 1000) == 7100
    assert sum(p + c for p, c in calls) == 4800  # what billed tokens alone would have said
    # the largest request: call 2's next call, 3,500
    assert context_peak(calls, 1000) == 3500
    # conversation_limits: before call 2, spent 1,100 + 2 x 2,500; the last call 2,700 + 3,000
    assert conversation_tokens_peak([calls], 1000) == 6100
    assert conversation_tokens_peak([calls, [(2500, 50)]], 1000) == 8300  # 4,800 + 3,500


def test_the_calibrated_token_limits_stop_none_of_the_runs_they_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Small requests and a 1,000-token reserve: billed tokens are about half of what the
    token guards project, so limits set from billed tokens stopped successful runs."""
    corpus = []
    for i in range(1, 121):
        conv = conversation(f"ok{i}", [1, 1 + i % 4], source="small/shop")
        for k, s in enumerate(conv["steps"]):
            s["usage"] = {"prompt_tokens": 300 + 40 * k + i, "completion_tokens": 20}
        corpus.append(conv)
    out, _, _ = _calibrate(tmp_path, corpus, capsys)
    assert "successful runs stopped with tool work left  0/120 (0.0%)" in out
    assert "of most tokens token_budget projects in one turn" in out
    assert "of most tokens conversation_limits projects per conversation" in out


def _with_outlier() -> list[dict[str, Any]]:
    """100 small successful conversations (busiest turn 2..9 lookups), one successful
    conversation that makes 40 lookups in one turn, and a runaway: the p99 x 1.25 of the
    busiest turns (13 model calls) would stop the big successful run with work left."""
    convs = [conversation(f"ok{i}", [1, 2 + i % 8]) for i in range(100)]
    big = conversation("big", [40])
    loop = conversation("loop", [0], success=False)
    loop["steps"] = [step(None, 1, key="same") for _ in range(60)]
    return [*convs, big, loop]


def test_calibrate_keeps_the_current_limit_where_the_proposal_would_do_worse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each proposed limit is replayed alone against the current value on the same runs;
    where it would stop a successful run the current config lets finish, the current
    value is written and both figures are printed."""
    corpus = _with_outlier()
    busiest = [float(3 + i % 8) for i in range(100)] + [41.0]
    proposed = p99_x(busiest)
    assert proposed < 41  # the proposal would cut the big run
    current = load_config(default_config_path()).plugins.tables()["max_steps"]["max_steps"]
    assert current > 41
    out, err, target = _calibrate(tmp_path, corpus, capsys)
    assert main(["config", "check", str(target)]) == 0
    capsys.readouterr()
    config = load_config(target)
    # the current value is written, and the header says why
    assert config.plugins.tables()["max_steps"]["max_steps"] == current
    assert f"# plugins.max_steps.max_steps = {current}, not the proposed {proposed} (p99 " in out
    assert "stops more successful runs with work left than the current value" in out
    # both figures, per limit: the current value lets all 101 successful runs finish, the
    # proposal stops the big one
    line = f"plugins.max_steps.max_steps: current {current}, proposed {proposed} -> current"
    assert line in err
    block = err[err.index(line) :].splitlines()
    assert "successful stopped with work left 0/101 (0.0%)" in block[1]
    assert block[1].lstrip().startswith("current")
    assert "successful stopped with work left 1/101 (1.0%)" in block[2]
    assert block[2].lstrip().startswith("proposed")
    # overall: the proposal with every limit, and what the written config does -- never worse
    assert "proposal, every limit" in err
    assert "successful runs stopped with tool work left  0/101 (0.0%)" in out
    # the profile proposed for the source leaves out the step limit for the same reason
    profile = config.profiles["test-shop"]
    assert profile.max_steps is None
    assert "max_steps = " in err and "left out: it stops more successful runs" in err
    assert (
        f"#   not written: max_steps = {proposed}, left out: it stops more successful runs "
        "with work left than no profile" in out
    )


def test_the_written_limits_do_no_worse_than_the_current_config_on_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the written config does, replayed in full here (not the command's shortcut),
    against the current config on the same runs: no more successful runs stopped or warned."""
    from loopwarden.deployment import Deployment
    from loopwarden.traffic.replay import replay_config, replay_trajectory, summarize

    corpus = _with_outlier()
    _, _, target = _calibrate(tmp_path, corpus, capsys)

    def figures(path: Path) -> dict[str, Any]:
        with Deployment(replay_config(load_config(path))) as dep:
            return summarize(replay_trajectory(dep, t) for t in corpus)

    written, now = figures(target), figures(default_config_path())
    key = "successful_stopped_with_work_left"
    assert written[key] <= now[key] and written["successful_warned"] <= now["successful_warned"]
    assert written["runaway_runs_stopped"] >= now["runaway_runs_stopped"] == 1


def test_the_replay_shortcut_gives_the_figures_of_a_full_replay(tmp_path: Path) -> None:
    """The comparison replays again only the runs some limit had a verdict on; any mix of
    current and proposed limits must give what replaying every run gives."""
    from loopwarden.commands.calibrate import _Replayer, _set
    from loopwarden.config import parse_config
    from loopwarden.deployment import Deployment
    from loopwarden.traffic.replay import replay_config, replay_trajectory, summarize

    corpus = _with_outlier()
    base = tomllib.loads(default_config_path().read_text(encoding="utf-8"))
    tight = _set(base, "plugins.max_steps.max_steps", 13)
    tight = _set(tight, "plugins.conversation_limits.max_model_calls", 12)
    tight = _set(tight, "plugins.tool_calls.max_tool_calls", 12)
    replayer = _Replayer(
        corpus,
        None,
        (parse_config(base, path="<base>"), None),
        (parse_config(tight, path="<tight>"), None),
    )
    assert 0 < len(replayer.moving) < len(corpus)  # some runs are quiet under both
    mixed = _set(base, "plugins.max_steps.max_steps", 13)
    mixed = parse_config(_set(mixed, "plugins.tool_calls.max_tool_calls", 12), path="<mix>")
    with Deployment(replay_config(mixed)) as dep:
        full = summarize(replay_trajectory(dep, t) for t in corpus)
    shortcut = summarize(replayer.mix(mixed, None))
    full.pop("seconds", None), shortcut.pop("seconds", None)
    assert shortcut == full
    # the mix does change the figures: max_steps stops the big run, tool_calls warns it
    assert full["successful_stopped_with_work_left"] == 1 and full["successful_warned"] >= 1


def test_calibrate_on_run_records_keeps_the_current_limit_that_fewer_runs_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run records hold no steps to replay: a proposed limit is compared with the current
    one by the successful runs over each; one long successful run keeps the current cap."""
    records = [
        {
            "run_id": str(i),
            "termination": "final_answer",
            "steps": 50 if i == 100 else 2 + i % 5,
            "tool_calls": 1 + i % 5,
            "tokens": {"prompt": 3000, "completion": 100, "total": 3100},
            "final_answer_present": True,
        }
        for i in range(101)
    ]
    current = load_config(default_config_path()).plugins.tables()["max_steps"]["max_steps"]
    proposed = p99_x([float(2 + i % 5) for i in range(100)] + [50.0])
    out, err, target = _calibrate(tmp_path, records, capsys)
    assert load_config(target).plugins.tables()["max_steps"]["max_steps"] == current
    assert (
        f"plugins.max_steps.max_steps: current {current} 0/101 (0.0%), proposed {proposed} "
        f"1/101 (1.0%) -> current {current} kept" in err
    )
    assert "successful runs over a limit  0/101 (0.0%)" in out
    # a record is one run: conversation-wide limits cannot be checked on records and keep
    # their current values; the profile's step limit would cut the long run: left out
    config = load_config(target)
    shipped = load_config(default_config_path()).plugins.tables()["conversation_limits"]
    assert config.plugins.tables()["conversation_limits"]["max_turns"] == shipped["max_turns"]
    assert "max_turns = " in out and "run records cannot show what it would do" in out
    assert config.profiles["default"].max_steps is None


def test_calibrating_over_a_short_file_writes_a_whole_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base that extends a parent by a relative path: the calibrated file is complete (it
    does not say ``extends``, which would resolve from wherever the file is read)."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "parent.toml").write_text(
        'extends = "defaults"\n[plugins.max_steps]\nmax_steps = 77\n', encoding="utf-8"
    )
    base = tmp_path / "base" / "config.toml"
    base.write_text('extends = "parent.toml"\n[plugins]\ndisable = ["stall"]\n', encoding="utf-8")
    path = write_jsonl(tmp_path / "runs.jsonl", healthy_corpus())
    assert main(["calibrate", str(path), "--config", str(base)]) == 0
    written = tomllib.loads(capsys.readouterr().out)
    assert "extends" not in written
    assert "stall" not in written["plugins"]["enabled"]
    assert "repeat_call" in written["plugins"]["enabled"]
    target = tmp_path / "calibrated.toml"
    target.write_text(dump_toml(written), encoding="utf-8")
    load_config(target)  # a complete, valid config on its own, wherever it is read
