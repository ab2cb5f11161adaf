"""Owner-only files and directories: what loopwarden creates in its data directory.

Run records hold conversations; the store holds tool results and ledger entries.  Neither is
for the other users of the host, so what loopwarden *creates* is owner-only -- directories
0700, files 0600 -- whatever the umask.  What already exists is left as it is: an operator who
shared a directory or a file on purpose keeps that choice.  (On Windows the modes are ignored;
the user's profile directories are private already.)

One place for it: the store (``store.sqlite3``) and the run records (``runs.jsonl``) use the
same helpers.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "private_file", "private_opener"]

#: the mode of a directory loopwarden creates
DIR_MODE = 0o700
#: the mode of a file loopwarden creates
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents owner-only (0700); existing ones are untouched."""
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process created it meanwhile: fine
            continue
        os.chmod(d, DIR_MODE)  # mkdir's mode passes through the umask; this one does not


def private_opener(path: str | os.PathLike[str], flags: int) -> int:
    """An ``opener`` for :func:`open`: a file it creates is owner-only (0600).

    ``open(path, "a", opener=private_opener)`` -- an existing file keeps its mode.
    """
    return os.open(path, flags, FILE_MODE)


def private_file(path: Path) -> bool:
    """Create ``path`` empty and owner-only (0600) if it does not exist, in an owner-only
    directory (:func:`private_dir`); True when it was created here."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    return True
