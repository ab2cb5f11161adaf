"""Budget limits changed at run time, and budget stops that tell spent from reserved -- on a
real SQLite file and a real redis-server, across store instances and processes.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from support import stores
from support.cli import loopwarden
from support.stores import deployment_for, make_store

from loopwarden.commands.cli import main as cli_main
from loopwarden.store import Counter, cost_units, operated

TOKENS = 3  # QUANTITIES index


def _counter(limit: int) -> Counter:
    return Counter("tenant", "acme", "total", "total", (None, None, None, limit, None), None)


def test_an_override_set_through_one_store_binds_the_next_reserve_of_another(
    store_url: str,
) -> None:
    here, there = operated(make_store(store_url)), operated(make_store(store_url))
    c = _counter(1000)
    assert here.reserve([c], (0, 1, 0, 600, 0), token="a", ttl_s=60).ok
    refused = there.reserve([c], (0, 1, 0, 600, 0), token="b", ttl_s=60)
    assert refused.refused == (0, TOKENS) and refused.limits == ((None, None, None, 1000, None),)
    assert refused.reserved == ((0, 1, 0, 600, 0),)  # what "a" holds, not spent

    old, new = here.set_limits("tenant", "acme", "total", {"tokens": 5000}, by="ops-jane")
    assert old is None and new is not None and new.limits[TOKENS] == 5000
    granted = there.reserve([c], (0, 1, 0, 600, 0), token="b", ttl_s=60)
    assert granted.ok and granted.limits == ((None, None, None, 5000, None),)
    (listed,) = there.overrides()
    assert (listed.scope, listed.key, listed.window, listed.set_by) == (
        "tenant",
        "acme",
        "total",
        "ops-jane",
    )
    # a second quantity joins the first; None hands one back to the config
    here.set_limits("tenant", "acme", "total", {"cost": cost_units(Decimal("2.5"))})
    old, new = here.set_limits("tenant", "acme", "total", {"tokens": None}, by="ops-jane")
    assert old is not None and old.limits[TOKENS] == 5000
    assert new is not None and new.limits[TOKENS] is None and new.limits[4] == 2_500_000_000
    assert not there.reserve([c], (0, 1, 0, 600, 0), token="c", ttl_s=60).ok  # config: 1000

    assert here.clear_limits("tenant", "acme", "total", by="ops-jane") is not None
    assert there.overrides() == [] and here.clear_limits("tenant", "acme", "total") is None
    log = there.changes()
    assert [c.action for c in log] == ["clear_limits", "set_limits", "set_limits", "set_limits"]
    assert log[-1].old is None and log[-1].new == {"tokens": 5000}
    assert log[0].old == {"cost": 2.5} and log[0].new is None
    assert all(c.target == {"scope": "tenant", "key": "acme", "window": "total"} for c in log)
    with pytest.raises(ValueError, match="positive whole number"):
        here.set_limits("tenant", "acme", "total", {"tokens": 0})
    with pytest.raises(ValueError, match="unknown quantity"):
        here.set_limits("tenant", "acme", "total", {"dollars": 5})
    here.close()
    there.close()


def _config(tmp_path: Path, url: str, budgets: str) -> Path:
    base, ns = stores.split_url(url)
    path = tmp_path / "config.toml"
    path.write_text(
        f'[store]\nurl = "{base}"\nnamespace = "{ns}"\n'
        '[plugins]\nenabled = ["cost_budget", "spend_limits"]\n'
        f"[plugins.spend_limits]\nbudgets = {budgets}\n",
        encoding="utf-8",
    )
    return path


def _deployment(cfg: Path) -> Any:
    from loopwarden import Deployment
    from loopwarden.config import load_config
    from loopwarden.demo import shop_tools

    return Deployment(load_config(str(cfg)), tools=shop_tools())


def test_an_operator_raises_and_clears_a_tenant_budget_from_another_process(
    store_url: str, tmp_path: Path
) -> None:
    cfg = _config(
        tmp_path,
        store_url,
        '[{ scope = "tenant", window = "day", max_runs = 1 }, '
        '{ scope = "user", window = "day", max_runs = 50 }]',
    )
    with _deployment(cfg) as dep:  # one long-lived worker: it never reloads its config

        def run() -> dict[str, Any]:
            rec: dict[str, Any] = dep.run(scenario="refund", meta={"tenant": "acme"}).record()
            return rec

        assert run()["termination"] == "final_answer"
        assert run()["termination"] == "max_runs"
        # the operator's command: another process, on the same store
        done = loopwarden(
            *("budgets", "set", "tenant", "acme", "--max-runs", "3"),
            *("--by", "ops-jane", "--config", str(cfg), "--json"),
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["new"] == {"runs": 3}
        assert json.loads(done.stdout)["config"] == {"runs": 1}
        assert run()["termination"] == "final_answer"  # the 2nd of 3: the override binds
        third = run()
        assert third["termination"] == "final_answer"
        fourth = run()
        assert fourth["termination"] == "max_runs"
        ev = fourth["evidence"]
        assert (ev["limit"], ev["spent"], ev["limit_source"]) == (3, 3, "override")
        done = loopwarden("budgets", "clear", "tenant", "acme", "--config", str(cfg))
        assert done.returncode == 0 and "was runs 3" in done.stdout, done.stderr
        ev = run()["evidence"]
        assert (ev["limit"], ev["limit_source"]) == (1, "config")

    log = loopwarden("budgets", "log", "--json", "--config", str(cfg))
    changes = json.loads(log.stdout)["changes"]
    assert [(c["action"], c["old"], c["new"]) for c in changes] == [
        ("clear_limits", {"runs": 3}, None),
        ("set_limits", None, {"runs": 3}),
    ]
    assert changes[1]["by"] == "ops-jane" and "@" in changes[0]["by"]  # default: user@host


def test_budgets_set_names_what_is_wrong_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    cfg = _config(
        tmp_path,
        url,
        '[{ scope = "tenant", window = "day", max_cost = 5 }, '
        '{ scope = "tenant", window = "month", max_cost = 50 }]',
    )
    cases = [
        (["set", "tenant", "acme", "--max-cost", "9"], "name one (--window)"),
        (["set", "tenant", "acme", "--window", "hour", "--max-cost", "9"], "its windows: day"),
        (["set", "team", "t1", "--max-cost", "9"], "no spend_limits budget for scope 'team'"),
        (["set", "tenant", "acme", "--window", "day", "--max-cost", "-1"], "more than 0"),
        (["set", "tenant", "acme", "--window", "day", "--max-runs", "1.5"], "whole number"),
        (["set", "tenant", "acme", "--window", "day"], "at least one limit"),
        (["set", "tenant", "--max-cost", "9"], "needs SCOPE and KEY"),
        (["reset", "tenant", "acme", "--max-cost", "9"], "go with set"),
    ]
    for argv, message in cases:
        assert cli_main(["budgets", *argv, "--config", str(cfg)]) == 2, argv
        assert message in capsys.readouterr().err, argv
    store = operated(make_store(url))
    assert store.overrides() == [] and store.changes() == []
    store.close()
    argv = ["budgets", "set", "tenant", "acme", "--window", "month", "--max-cost", "80.5"]
    assert cli_main([*argv, "--config", str(cfg)]) == 0
    assert "cost 80.5" in capsys.readouterr().out
    assert cli_main(["budgets", "--config", str(cfg)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("tenant")]
    assert line.split()[:5] == ["tenant", "acme", "month", "cost", "80.5"]


def test_a_stop_caused_by_reservations_says_spent_reserved_and_limit(
    store_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """48% spent and the rest held by calls in progress: the run stops, and says so -- not
    that the budget is used up."""
    limit = 20_000
    other = make_store(store_url)
    c = _counter(limit)
    assert other.reserve([c], (0, 1, 0, 9_600, 0), token="done", ttl_s=60, commit=True).ok
    assert other.reserve([c], (0, 1, 0, 9_500, 0), token="in-flight", ttl_s=600).ok
    budgets = [{"scope": "tenant", "window": "total", "max_tokens": limit}]
    with deployment_for(store_url, plugins={"spend_limits": {"budgets": budgets}}) as dep:
        run = dep.run(scenario="refund", meta={"tenant": "acme"})
    rec = run.record()
    assert (rec["termination"], rec["steps"]) == ("max_tokens", 0)
    ev = rec["evidence"]
    assert (ev["spent"], ev["reserved"], ev["limit"], ev["limit_source"]) == (
        9_600,
        9_500,
        limit,
        "config",
    )
    message = run.outcome.message
    assert "9600 spent, 9500 reserved by calls in progress, limit 20000" in message
    assert "used up" not in message

    cfg = _config(
        tmp_path, store_url, '[{ scope = "tenant", window = "total", max_tokens = 20000 }]'
    )
    assert cli_main(["budgets", "--json", "--config", str(cfg)]) == 0
    (row,) = json.loads(capsys.readouterr().out)["counters"]
    assert (row["spent"]["tokens"], row["reserved"]["tokens"], row["limits"]["tokens"]) == (
        9_600,
        9_500,
        limit,
    )
    assert cli_main(["budgets", "--config", str(cfg)]) == 0
    assert "9600 +9500 reserved / 20000" in capsys.readouterr().out
    other.close()


def test_an_override_may_limit_a_quantity_the_config_leaves_open(store_url: str) -> None:
    budgets = [{"scope": "tenant", "window": "day", "max_tokens": 1_000_000}]
    store = operated(make_store(store_url))
    with deployment_for(store_url, plugins={"spend_limits": {"budgets": budgets}}) as dep:
        day = dep.run(scenario="refund", meta={"tenant": "acme"}).record()
        assert day["termination"] == "final_answer" and day["tool_calls"] > 2
        bucket = store.rows()[0].bucket
        store.set_limits("tenant", "acme", "day", {"tool_calls": day["tool_calls"] + 2})
        rec = dep.run(scenario="refund", meta={"tenant": "acme"}).record()
    assert rec["termination"] == "max_tool_calls"
    ev = rec["evidence"]
    assert (ev["limit"], ev["limit_source"], ev["bucket"]) == (
        day["tool_calls"] + 2,
        "override",
        bucket,
    )
    store.close()
