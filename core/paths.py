"""Where loopwarden keeps its files: one data directory for the run records, the shared store
and the demo shop (``LOOPWARDEN_DATA_DIR`` overrides it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["data_dir", "records_path"]


def data_dir() -> Path:
    """The user's data directory for loopwarden (``LOOPWARDEN_DATA_DIR`` overrides it)."""
    env = os.environ.get("LOOPWARDEN_DATA_DIR")
    if env:
        return Path(env)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "loopwarden"


def records_path() -> Path:
    """``runs.jsonl`` in the data directory: where the ``run_record`` plugin appends by
    default, and what ``loopwarden report`` reads by default."""
    return data_dir() / "runs.jsonl"
