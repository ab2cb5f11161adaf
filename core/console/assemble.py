"""A :class:`~loopwarden.console.app.Console` from a deployment's config: its records file,
its shared store, its redaction -- what ``loopwarden console`` and the gateway's
``/console/`` both serve."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from loopwarden.console.app import Console, StoreView
from loopwarden.console.figures import DEFAULT_STEP_CAP
from loopwarden.console.index import RecordIndex
from loopwarden.redaction import DEFAULT_REDACT_KEYS, Redactor, model_api_key

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.store import Shared

__all__ = ["BACKGROUND_INDEX_BYTES", "console_from_config", "records_file", "store_view"]

#: more new bytes than this to index (seconds of work), and ``loopwarden console`` serves at
#: once while the index is built in the background
BACKGROUND_INDEX_BYTES = 32 * 2**20


def records_file(config: Config) -> Path:
    """Where the config's ``run_record`` plugin appends (``loopwarden report``'s default)."""
    from loopwarden.paths import configured_records_path

    return configured_records_path(config.plugins.tables().get("run_record"))


def _redactor(config: Config) -> Redactor:
    """The run_record plugin's redaction (its ``redact_keys``), plus the model's API key."""
    table = config.plugins.tables().get("run_record") or {}
    keys = table.get("redact_keys")
    red = Redactor(keys if isinstance(keys, list) else DEFAULT_REDACT_KEYS)
    red.add_literal(model_api_key(SimpleNamespace(config=config)))
    return red


def _ident(key: str) -> tuple[str, str, str, str] | None:
    """A breaker's identity from its store key (see ``loopwarden.store.breakers``)."""
    parts = key.split("|")
    if len(parts) != 4:
        return None
    a, b, c, d = (p.replace("%7C", "|").replace("%25", "%") for p in parts)
    return a, b, c, d


def store_view(config: Config, shared: Shared) -> StoreView:
    """Budgets and breakers of ``shared``, as ``loopwarden budgets`` / ``breakers`` show
    them; a reset is ``loopwarden breakers reset``'s."""
    from loopwarden.plugins.spend_limits import configured_limits

    lock = threading.Lock()
    limits = configured_limits(config.plugins.tables().get("spend_limits"))

    def budgets() -> list[dict[str, Any]]:
        with lock:
            rows = [r.as_dict() for r in shared.store.rows()]
        for r in rows:
            r["limits"] = limits.get((r["scope"], r["window"]), {})
        return rows

    def breakers() -> list[dict[str, Any]]:
        with lock:
            return [v.as_dict() for v in shared.store.breakers()]

    def reset(key: str) -> bool:
        ident = _ident(key)
        if ident is None:
            return False
        with lock:
            return shared.store.breaker_reset(ident)

    enabled = set(config.plugins.enabled)
    return StoreView(
        budgets,
        breakers,
        reset,
        budgets_note=""
        if "spend_limits" in enabled
        else "spend_limits is not enabled in this config: its runs count no spend and no limit "
        "is shown; any rows here were counted by runs of another config (such as `loopwarden "
        "demo`'s console sample).",
        breakers_note=""
        if "circuit_breaker" in enabled
        else "circuit_breaker is not enabled in this config: its runs ask no breaker; any "
        "breakers here were kept by runs of another config (such as `loopwarden demo`'s "
        "console sample).",
    )


def _step_cap(config: Config) -> int:
    table = config.plugins.tables().get("max_steps") or {}
    cap = table.get("max_steps")
    return cap if isinstance(cap, int) and cap > 0 else DEFAULT_STEP_CAP


def console_from_config(
    config: Config,
    shared: Shared,
    *,
    records: Path | None = None,
    token: str | None = None,
    allow_resets: bool = False,
    base: str = "/",
    loopback_only: bool = True,
    index_file: Path | None = None,
    background_over: int | None = None,
) -> Console:
    """The console over ``records`` (default: the run_record plugin's file) and ``shared``.

    The index catches up with the file before this returns -- unless more than
    ``background_over`` bytes are new to it: then it is built in the background
    (:meth:`Console.index_in_background`) and the pages say how far it is."""
    path = records if records is not None else records_file(config)
    index = RecordIndex(path, index_file)
    done, size = index.progress()
    background = background_over is not None and size - done > background_over
    if not background:
        index.refresh()
    console = Console(
        index,
        store_view(config, shared),
        token=token,
        allow_resets=allow_resets,
        redactor=_redactor(config),
        base=base,
        step_cap=_step_cap(config),
        loopback_only=loopback_only,
    )
    if background:
        console.index_in_background()  # starts the figures when done
    elif index.count() > console.figures.sync_limit:
        console.figures.start()  # ready, or nearly, by the time someone opens the overview
    return console
