"""Where loopwarden keeps its files: one data directory for the run records, the shared store
and the demo shop (``LOOPWARDEN_DATA_DIR`` overrides it).

Run records hold whole conversations and tool results, and the store (``store.sqlite3``)
holds tool results and ledger entries, so what loopwarden creates there is owner-only:
directories 0700, files 0600 (further narrowed by the umask, never widened).  A directory or a
file that already exists keeps its mode -- the user made it, or chose it.  (On Windows the
modes are ignored; the user's profile directories are private already.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "configured_records_path",
    "data_dir",
    "ensure_private_dir",
    "open_private",
    "private_file",
    "records_path",
]

#: the mode of a directory loopwarden creates (the XDG base-directory spec's 0700)
PRIVATE_DIR_MODE = 0o700
#: the mode of a file loopwarden creates (records, the store)
PRIVATE_FILE_MODE = 0o600


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


def configured_records_path(run_record: object) -> Path:
    """Where a ``run_record`` plugin with this settings table appends: its ``path`` (relative
    to the current directory, as the plugin takes it), else :func:`records_path`."""
    given = run_record.get("path") if isinstance(run_record, dict) else None
    return Path(given).expanduser() if isinstance(given, str) and given else records_path()


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` and every missing parent with mode 0700; leave existing directories as
    they are (never chmod a directory the user made).  Returns ``path``."""
    missing: list[Path] = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, PRIVATE_DIR_MODE)
        except FileExistsError:
            if not d.is_dir():  # a file in the way (or a dangling symlink)
                raise
            # else: made meanwhile by another thread or process -- with its own mode
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags)``; a file it creates (``O_CREAT`` in ``flags``) is 0600.  The
    directory must exist (see :func:`ensure_private_dir`); an existing file keeps its mode."""
    return os.open(path, flags, PRIVATE_FILE_MODE)


def private_file(path: Path) -> bool:
    """Create ``path`` empty and owner-only (0600) if it does not exist, in an owner-only
    directory (:func:`ensure_private_dir`) -- before a library that would create it 0644
    (SQLite) opens it.  True when it was created here."""
    ensure_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    return True
