"""``loopwarden paths``: where loopwarden keeps its data, how big it is, how to reset it.

Everything a deployment writes lives in one data directory unless its config says otherwise
(``LOOPWARDEN_DATA_DIR`` overrides the directory): the run records (``runs.jsonl``, the
``run_record`` plugin's ``path``), the shared store (``store.sqlite3``, or ``[store] url``:
spend counters, limit overrides, the side-effect ledger, circuit breakers, the change log) and
the demo shop's database (``shop.sqlite3``: its orders, refunds and hand-offs).  Because the
ledger and the shop outlive a run, a second ``loopwarden run --scenario refund`` is answered
from the ledger: this command says so, with the command that lists or forgets each part.

It only reads: a store or a file that does not exist yet is reported, never created.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopwarden.commands import add_config_argument

if TYPE_CHECKING:
    from loopwarden.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_config_argument(parser)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover - the loop returns


def _file(path: Path) -> dict[str, Any]:
    try:
        return {"path": str(path), "exists": True, "bytes": path.stat().st_size}
    except FileNotFoundError:
        return {"path": str(path), "exists": False, "bytes": 0}


def _data_dir_source() -> str:
    if os.environ.get("LOOPWARDEN_DATA_DIR"):
        return "LOOPWARDEN_DATA_DIR"
    if os.environ.get("XDG_DATA_HOME"):
        return "XDG_DATA_HOME"
    return "the platform's default"


def _records(config: Config) -> dict[str, Any]:
    from loopwarden.paths import records_path

    given = config.plugins.tables().get("run_record", {}).get("path")
    path = Path(given).expanduser() if isinstance(given, str) and given else records_path()
    out = _file(path)
    out["enabled"] = "run_record" in config.plugins.enabled
    if out["exists"]:
        with path.open("rb") as f:
            out["records"] = sum(1 for line in f if line.strip())
    return out


def _store(config: Config) -> dict[str, Any]:
    """The store's location and what it holds; never creates a SQLite file."""
    from loopwarden.exceptions import StoreError
    from loopwarden.store import Shared, operated, redact_url

    shared = Shared(config.store)
    out: dict[str, Any] = {"url": redact_url(shared.url)}
    if shared.url.startswith("sqlite:///"):
        path = Path(shared.url[len("sqlite:///") :]).expanduser()
        out.update(_file(path))
        if not out["exists"]:
            return out
    try:
        store = operated(shared.store)
        out.update(
            counters=len(store.rows()),
            overrides=len(store.overrides()),
            ledger_entries=len(store.ledger_rows()),
            breakers=len(store.breakers()),
            changes=len(store.changes(1_000_000)),
        )
    except StoreError as exc:
        out["error"] = str(exc)
    finally:
        shared.close()
    return out


def _shop() -> dict[str, Any]:
    from loopwarden.paths import data_dir  # where the demo shop keeps its database

    path = data_dir() / "shop.sqlite3"
    out = _file(path)
    if out["exists"]:
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                out["refunds"] = conn.execute("SELECT COUNT(*) FROM refunds").fetchone()[0]
        except sqlite3.Error as exc:
            out["error"] = str(exc)
    return out


def _line(label: str, f: dict[str, Any], detail: str, note: str = "") -> str:
    where = f.get("path") or f.get("url")
    if "exists" in f and not f["exists"]:
        return f"{label:<13} {where}  (not created yet{note})"
    size = f"{_size(f['bytes'])}, " if f.get("bytes") else ""
    if f.get("error"):
        return f"{label:<13} {where}  ({size}cannot be read: {f['error']})"
    return f"{label:<13} {where}  ({size}{detail}{note})"


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.paths import data_dir

    config = load_config(args.config)
    info: dict[str, Any] = {
        "data_dir": {"path": str(data_dir()), "from": _data_dir_source()},
        "config": str(config.path) if config.path else None,
        "records": _records(config),
        "store": _store(config),
        "shop": _shop(),
    }
    if args.json:
        print(json.dumps(info, ensure_ascii=False))
        return 0
    d, r, s, shop = info["data_dir"], info["records"], info["store"], info["shop"]
    hint = "" if d["from"] == "LOOPWARDEN_DATA_DIR" else "; LOOPWARDEN_DATA_DIR overrides it"
    print(f"data directory {d['path']}  (from {d['from']}{hint})")
    enabled = "" if r["enabled"] else "; run_record is not enabled"
    print(_line("run records", r, f"{r.get('records', 0)} records", enabled))
    print(
        _line(
            "store",
            s,
            f"{s.get('counters', 0)} budget counters, {s.get('overrides', 0)} limit overrides, "
            f"{s.get('ledger_entries', 0)} ledger entries, {s.get('breakers', 0)} breakers, "
            f"{s.get('changes', 0)} recorded changes",
        )
    )
    print(_line("demo shop", shop, f"{shop.get('refunds', 0)} refunds"))
    print(
        "\nA side effect recorded in the ledger is answered from it, not run again, until "
        "[store] ledger_ttl_s passes.\n"
        "  loopwarden ledger            list ledger entries (ledger forget ... to remove)\n"
        "  loopwarden budgets           spend, reservations and limits (budgets reset / set)\n"
        "  loopwarden breakers          circuit breakers (breakers reset NAME)\n"
        "  loopwarden report            summarise the run records\n"
        "Deleting a file above starts that part afresh (the demo shop is seeded again)."
    )
    return 0
