"""``loopwarden paths`` (where each file is, how big, what it holds -- read-only) and the
change log of ``breakers reset``, with real files and the real redis-server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import stores
from support.stores import make_store

from loopwarden.commands.cli import main as cli_main
from loopwarden.store import operated
from loopwarden.store.breakers import BreakerRule


def _paths(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert cli_main(["paths", "--json", *argv]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_paths_shows_every_file_and_creates_none(capsys: pytest.CaptureFixture[str]) -> None:
    data = Path(os.environ["LOOPWARDEN_DATA_DIR"])  # the suite's isolated data directory
    before = _paths(capsys)
    assert before["data_dir"] == {"path": str(data), "from": "LOOPWARDEN_DATA_DIR"}
    store, shop, records = before["store"], before["shop"], before["records"]
    assert isinstance(store, dict) and isinstance(shop, dict) and isinstance(records, dict)
    assert store["path"] == str(data / "store.sqlite3") and store["exists"] is False
    assert shop["path"] == str(data / "shop.sqlite3") and shop["exists"] is False
    assert records["path"] == str(data / "runs.jsonl")
    assert not (data / "store.sqlite3").exists()  # reporting never creates the store

    assert cli_main(["run", "--scenario", "refund", "--json"]) == 0
    assert cli_main(["run", "--scenario", "refund", "--json"]) == 0
    second = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert second["ledger_answers"], "the second refund is answered from the ledger"
    after = _paths(capsys)
    store, shop = after["store"], after["shop"]
    assert isinstance(store, dict) and isinstance(shop, dict)
    assert store["exists"] is True and store["bytes"] == (data / "store.sqlite3").stat().st_size
    assert store["ledger_entries"] == 1 and store["counters"] == 0
    assert shop["exists"] is True and shop["refunds"] == 1

    assert cli_main(["paths"]) == 0
    text = capsys.readouterr().out
    assert f"data directory {data}" in text
    assert "1 ledger entries" in text and "1 refunds" in text
    assert "loopwarden ledger" in text  # says how to see and forget what it holds


def test_paths_counts_what_a_configured_store_holds(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, ns = stores.split_url(store_url)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[store]\nurl = "{base}"\nnamespace = "{ns}"\n', encoding="utf-8")
    store = operated(make_store(store_url))
    store.claim("pay:{}", "r/1", 600)
    store.set_limits("tenant", "acme", "day", {"runs": 5}, by="ops")
    store.close()
    info = _paths(capsys, "--config", str(cfg))["store"]
    assert isinstance(info, dict)
    assert (info["ledger_entries"], info["overrides"], info["changes"]) == (1, 1, 1)


def test_a_breaker_reset_is_recorded_with_the_state_it_ended(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, ns = stores.split_url(store_url)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[store]\nurl = "{base}"\nnamespace = "{ns}"\n', encoding="utf-8")
    store = make_store(store_url)
    ident = ("deployment", "*", "tool", "search_flights")
    rule = BreakerRule(failures=1, window_s=60, open_s=600)
    store.breaker_record(ident, rule, "r/1", failed=True, source="r", error="503")
    store.close()
    argv = ["breakers", "reset", "search_flights", "--by", "ops-jane", "--config", str(cfg)]
    assert cli_main(argv) == 0
    capsys.readouterr()
    assert cli_main(["breakers", "log", "--json", "--config", str(cfg)]) == 0
    (change,) = json.loads(capsys.readouterr().out)["changes"]
    assert (change["by"], change["action"], change["old"]["state"]) == (
        "ops-jane",
        "reset_breaker",
        "open",
    )
    assert change["target"]["name"] == "search_flights"
