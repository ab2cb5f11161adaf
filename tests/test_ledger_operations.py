"""Seeing and forgetting the side-effect ledger (``loopwarden ledger``), on a real SQLite file
and a real redis-server: what a forgotten entry lets run again, what is kept, what is recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import stores
from support.stores import deployment_for, make_store, pay_tool, write_scenario

from loopwarden.commands.cli import main as cli_main
from loopwarden.store import ledger_key, operated
from loopwarden.store.admin import split_ledger_key

PAY_KEY = 'pay_invoice:{"invoice":"7"}'


def _config(tmp_path: Path, url: str, ledger_scope: str = "") -> Path:
    base, ns = stores.split_url(url)
    path = tmp_path / "config.toml"
    path.write_text(
        f'[store]\nurl = "{base}"\nnamespace = "{ns}"\n{ledger_scope}\n'
        '[plugins]\nenabled = ["max_steps"]\n',
        encoding="utf-8",
    )
    return path


def _ledger(cfg: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli_main(["ledger", *argv, "--config", str(cfg)])
    return code, capsys.readouterr().out


def test_a_forgotten_entry_lets_the_side_effect_run_again_and_is_recorded(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    effects, scenario = tmp_path / "effects.txt", str(write_scenario(tmp_path))
    cfg = _config(tmp_path, store_url)

    def pay() -> None:
        with deployment_for(store_url, enabled=(), tools=[pay_tool(effects)]) as dep:
            dep.run(scenario=scenario)

    pay()
    pay()
    assert effects.read_text().count("\n") == 1  # the second run was answered from the ledger
    code, out = _ledger(cfg, capsys, "--json")
    assert code == 0
    (entry,) = json.loads(out)["entries"]
    assert (entry["key"], entry["tool"], entry["state"], entry["scope"]) == (
        PAY_KEY,
        "pay_invoice",
        "done",
        {},
    )
    assert entry["result"]["content"] == "PAID 7" and entry["expires_at"] > entry["started_at"]
    code, out = _ledger(cfg, capsys)
    assert code == 0 and PAY_KEY in out and "done" in out

    # a bulk forget asks first; without a terminal and without --yes nothing goes
    code, out = _ledger(cfg, capsys, "forget", "--all")
    assert code == 1 and PAY_KEY in out
    assert len(json.loads(_ledger(cfg, capsys, "--json")[1])["entries"]) == 1
    pay()
    assert effects.read_text().count("\n") == 1

    code, out = _ledger(cfg, capsys, "forget", PAY_KEY, "--yes", "--by", "ops-jane", "--json")
    assert code == 0
    done = json.loads(out)
    assert (done["forgotten"], done["kept_running"], done["absent"]) == ([PAY_KEY], [], [])
    assert json.loads(_ledger(cfg, capsys, "--json")[1])["entries"] == []
    code, out = _ledger(cfg, capsys, "log", "--json")
    (change,) = json.loads(out)["changes"]
    assert (change["by"], change["action"], change["target"]) == (
        "ops-jane",
        "forget_ledger",
        {"key": PAY_KEY},
    )
    assert change["old"]["state"] == "done" and change["new"] is None
    pay()
    assert effects.read_text().count("\n") == 2  # forgotten: the same call executed again


def test_a_running_entry_is_kept_unless_asked_and_scopes_filter(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, store_url)
    store = operated(make_store(store_url))
    acme = ledger_key(PAY_KEY, [("tenant", "acme")])
    odd = ledger_key(PAY_KEY, [("tenant", "a|user=b"), ("user", "c")])
    store.claim(acme, "run-1/call-1", 600)  # in progress
    store.claim(odd, "run-2/call-1", 600)
    store.finish(odd, "run-2/call-1", "done", {"content": "PAID 7", "ok": True}, 600)
    store.close()
    assert split_ledger_key(odd) == ([("tenant", "a|user=b"), ("user", "c")], PAY_KEY)

    code, out = _ledger(cfg, capsys, "--json", "--scope", "tenant=a|user=b")
    assert [e["scope"] for e in json.loads(out)["entries"]] == [{"tenant": "a|user=b", "user": "c"}]
    code, out = _ledger(cfg, capsys, "forget", "--scope", "tenant=acme", "--yes", "--json")
    assert code == 1 and json.loads(out)["kept_running"] == [acme]
    assert len(json.loads(_ledger(cfg, capsys, "--json")[1])["entries"]) == 2
    code, out = _ledger(
        cfg, capsys, "forget", "--scope", "tenant=acme", "--running", "--yes", "--json"
    )
    assert code == 0 and json.loads(out)["forgotten"] == [acme]
    (left,) = json.loads(_ledger(cfg, capsys, "--json")[1])["entries"]
    assert left["key"] == odd


def test_ledger_arguments_are_checked_before_the_store_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, f"sqlite:///{tmp_path / 'store.sqlite3'}")
    assert cli_main(["ledger", "forget", "--config", str(cfg)]) == 2
    assert "forget needs KEY" in capsys.readouterr().err
    assert cli_main(["ledger", "--all", "--config", str(cfg)]) == 2
    assert cli_main(["ledger", "--scope", "tenant", "--config", str(cfg)]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "store.sqlite3").exists()
    code, out = _ledger(cfg, capsys, "forget", "nope:{}", "--yes")
    assert code == 1 and "no entry nope:{}" in out
