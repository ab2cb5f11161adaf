"""Run records for the console's tests, made the way a user makes them: the demo's scenarios
played in-process through ``loopwarden demo`` / ``loopwarden run`` with the ``run_record``
plugin on (trajectory and per-step tokens), spend limits per tenant and a circuit breaker in a
real SQLite store, plus two runs in shadow mode."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

from loopwarden.commands.cli import main
from loopwarden.config import default_config_path

#: the scenarios the demo plays for these tests (guards of every kind stop them)
SCENARIOS = ("always-not-found", "explore-divergence", "refund", "outage", "oscillation")


@dataclass(frozen=True)
class Made:
    config: Path
    records: Path
    store: Path


def _config(tmp: Path, records: Path, store: Path, *, shadow: bool) -> str:
    text = default_config_path().read_text(encoding="utf-8")
    for old, new in (
        ('    # "spend_limits",', '    "spend_limits",'),
        ('    # "circuit_breaker",', '    "circuit_breaker",'),
        ('    # "run_record",', '    "run_record",'),
        (
            '    # { scope = "tenant", window = "day", max_cost = 50.0, warn_at = 0.8 },',
            '    { scope = "tenant", window = "day", max_tokens = 500000, warn_at = 0.8 },',
        ),
        ("\ntrajectory = false ", "\ntrajectory = true "),
        ("\nsteps_detail = false ", "\nsteps_detail = true "),
        ("\nmin_sources = 2 ", "\nmin_sources = 1 "),
        ("\nfailures = 5 ", "\nfailures = 2 "),
        ('\n# path = "runs.jsonl" ', f"\npath = {str(records)!r} "),
        ("\n[store]\n", f"\n[store]\nurl = {f'sqlite:///{store}'!r}\n"),
    ):
        if old not in text:
            raise AssertionError(f"the shipped config changed: {old!r} not found")
        text = text.replace(old, new, 1)
    if shadow:
        text = text.replace('\nmode = "enforce"', '\nmode = "shadow"', 1)
    return text


def make_records(tmp: Path) -> Made:
    """Play the scenarios into ``tmp``: the records file, the store and the config."""
    records, store = tmp / "runs.jsonl", tmp / "store.sqlite3"
    config, shadow = tmp / "config.toml", tmp / "shadow.toml"
    config.write_text(_config(tmp, records, store, shadow=False), encoding="utf-8")
    shadow.write_text(_config(tmp, records, store, shadow=True), encoding="utf-8")
    only = [a for name in SCENARIOS for a in ("--only", name)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        # the guarded runs recorded through the config (not the demo's own console sample)
        main(["demo", "-q", "--observers", "--no-records", "--config", str(config), *only])
        for scenario, tenant in (("outage", "acme"), ("refund", "acme")):
            main(
                [
                    "run",
                    "--config",
                    str(config),
                    "--scenario",
                    scenario,
                    "--meta",
                    f"tenant={tenant}",
                ]
            )
        main(
            [
                "run",
                "--config",
                str(shadow),
                "--scenario",
                "always-not-found",
                "--meta",
                "tenant=globex",
            ]
        )
    if not records.is_file():
        raise AssertionError(f"no records were written:\n{out.getvalue()}")
    return Made(config, records, store)


_MADE: list[Made] = []


def shared_records(base: Path) -> Made:
    """:func:`make_records` once per test session (in ``base``, a session temp directory);
    a test that changes the files copies them first (:func:`copy_of`)."""
    if not _MADE:
        _MADE.append(make_records(base))
    return _MADE[0]


def copy_of(made: Made, tmp: Path) -> Made:
    """The records and the store copied into ``tmp``, with a config pointing at the copies."""
    import shutil

    records, store, config = tmp / "runs.jsonl", tmp / "store.sqlite3", tmp / "config.toml"
    shutil.copyfile(made.records, records)
    shutil.copyfile(made.store, store)
    text = made.config.read_text(encoding="utf-8")
    text = text.replace(str(made.records), str(records)).replace(str(made.store), str(store))
    config.write_text(text, encoding="utf-8")
    return Made(config, records, store)
