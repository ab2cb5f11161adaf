"""Reading recorded trajectories (the JSONL format of docs/contracts.md) for
:mod:`loopwarden.traffic.replay` and :mod:`loopwarden.traffic.calibrate`.

A file may be gzip-compressed (``.jsonl.gz``, recognised by its magic bytes or its suffix):
it is read as the same lines, and a corrupt or truncated archive is a :class:`ConfigError`
naming the file (exit 2), never a traceback.  One line is one conversation; an unreadable
line (not strict JSON, or not the trajectory shape) is reported as such and counted by the
caller, never a crash that loses the file.  The
helpers read one recorded step defensively (its tool calls, its usage) and split a
conversation into its runs.  Kept apart from the replay engine so that the calibration reads
recordings exactly as replay does without importing the step machine.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from loopwarden.events import Usage
from loopwarden.exceptions import ConfigError
from loopwarden.fingerprint import canonical_arguments
from loopwarden.sanitize import depth_exceeds, loads_arguments, loads_strict

#: the first two bytes of every gzip member (RFC 1952)
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str | Path) -> bool:
    """Whether ``path`` is gzip-compressed: its magic bytes, else a ``.gz`` suffix (so a
    ``.gz`` that is no gzip file is reported as corrupt rather than read as text)."""
    p = Path(path)
    with p.open("rb") as fh:
        head = fh.read(2)
    return head == GZIP_MAGIC or p.suffix.lower() == ".gz"


def read_lines(path: str | Path) -> Iterator[str]:
    """The text lines of a JSONL file, plain or gzip-compressed.

    Decoded as UTF-8 with ``surrogateescape``: an undecodable byte spoils one line (the
    caller's strict parser rejects it), never the file.  A corrupt or truncated gzip archive
    raises :class:`ConfigError` once the lines before the damage have been yielded."""
    p = Path(path)
    if not is_gzip(p):
        with p.open(encoding="utf-8", errors="surrogateescape") as fh:
            yield from fh
        return
    try:
        with (
            gzip.open(p, "rb") as raw,
            io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape") as fh,
        ):
            yield from fh
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise ConfigError(
            f"corrupt or truncated gzip file ({exc})", path=p, expected="a readable .jsonl.gz"
        ) from None


def file_label(path: str | Path) -> str:
    """A file's name without its ``.gz`` and ``.jsonl`` suffixes (a group label)."""
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name or "file"


def iter_trajectories(
    path: str | Path, *, without_trajectory: list[int] | None = None
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, trajectory or None for an unreadable line) for each non-blank line of a
    plain or gzip-compressed JSONL file (:func:`read_lines`).  A run record written without
    its trajectory is None too, and its line number is added to ``without_trajectory`` when
    given (so a caller can say how to record trajectories instead of "unreadable").

    Unreadable: not strict JSON (see :func:`loopwarden.sanitize.loads_strict` -- ``NaN``,
    ``1e999``, huge integers, deep nesting), or not the trajectory shape.  A lone surrogate or
    an undecodable byte (half an emoji in a tool's arguments) is replaced by U+FFFD: the text
    is cleaned, the run kept."""
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            obj = loads_strict(line, clean=True)
        except ValueError:
            yield lineno, None
            continue
        obj = from_run_record(obj)
        if not _well_formed(obj):
            if without_trajectory is not None and is_run_record(obj):
                without_trajectory.append(lineno)
            yield lineno, None
            continue
        yield lineno, obj


def is_run_record(obj: Any) -> bool:
    """A line of ``runs.jsonl`` (the run_record plugin's file), not a trajectory."""
    return isinstance(obj, dict) and "run_id" in obj and "termination" in obj


def from_run_record(obj: Any) -> Any:
    """A run record written with ``[plugins.run_record] trajectory = true`` as a trajectory
    (``source`` ``run_record``, its run id, success unknown); anything else as it is.  A
    record without its trajectory stays unreadable: it holds no steps to replay."""
    if not is_run_record(obj) or not isinstance(obj.get("trajectory"), list):
        return obj
    return {
        "source": "run_record",
        "id": str(obj["run_id"]),
        "success": None,
        "steps": obj["trajectory"],
        "final_answer_present": bool(obj.get("final_answer_present")),
    }


def _well_formed(obj: Any) -> bool:
    """The shape replay relies on: steps are objects whose lists are lists (a bad line is
    counted as unreadable, never a crash that loses the whole file)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("steps"), list):
        return False
    for step in obj["steps"]:
        if not isinstance(step, dict):
            return False
        for key in ("tool_calls", "observations", "observation_is_error"):
            value = step.get(key)
            if value is not None and not isinstance(value, list):
                return False
        if not all(isinstance(tc, dict) for tc in step.get("tool_calls") or ()):
            return False
        usage = step.get("usage")
        if usage is not None and not isinstance(usage, dict):
            return False
    return True


def _usage(step: dict[str, Any]) -> Usage | None:
    u = step.get("usage")
    if not isinstance(u, dict):
        return None
    try:  # negative counts are recording errors: clamped, never subtracted from a total
        return Usage(
            prompt=max(0, int(u.get("prompt_tokens") or 0)),
            completion=max(0, int(u.get("completion_tokens") or 0)),
        )
    except (TypeError, ValueError):
        return None


def _recorded_prompt(step: dict[str, Any]) -> int | None:
    """The step's recorded ``usage.prompt_tokens``; None when absent or not a positive count."""
    u = step.get("usage")
    if not isinstance(u, dict):
        return None
    try:
        n = int(u.get("prompt_tokens") or 0)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _calls(step: dict[str, Any]) -> list[dict[str, Any]]:
    tcs = step.get("tool_calls")
    return [tc for tc in tcs if isinstance(tc, dict)] if isinstance(tcs, list) else []


def _signature(tc: dict[str, Any]) -> str:
    """A recorded call's name and canonical arguments (volatile keys left out)."""
    args = tc.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = loads_arguments(args)  # depth-bounded: a hostile line cannot recurse
    if depth_exceeds(args):
        return f"{tc.get('name')}:<too deep>"
    return f"{tc.get('name')}:{canonical_arguments(args)}"


_DIGITS = re.compile(r"\d+")


def repeat_streak(steps: Iterable[dict[str, Any]]) -> int:
    """The most times one call (tool name and canonical arguments) was made in a row in a
    recording: consecutive tool calls, parallel ones included; text turns in between do not
    break the streak (a conversation that repeats one lookup turn after turn), a different
    call does."""
    best = streak = 0
    last: str | None = None
    for step in steps:
        for tc in _calls(step):
            sig = _signature(tc)
            streak = streak + 1 if sig == last else 1
            last = sig
            best = max(best, streak)
    return best


def identical_repeat_streak(steps: Iterable[dict[str, Any]]) -> int:
    """The most times one identical call (tool name and canonical arguments) got an identical
    recorded observation in a row: consecutive tool calls, parallel ones included, as
    :func:`repeat_streak` -- but a call whose observation differs from the last one's (digits
    masked: the same error with a new line number is the same error) breaks the streak
    (polling that sees progress is no loop), and so does a user message: the streak
    stays within one run (the user may have acted on the world in between, as a telecom
    customer who toggles a setting before the agent checks the line again)."""
    best = streak = 0
    last: tuple[str, str] | None = None
    for step in steps:
        if not _calls(step):
            last, streak = None, 0
            continue
        obs = step.get("observations")
        observations = obs if isinstance(obs, list) else []
        for i, tc in enumerate(_calls(step)):
            said = str(observations[i]) if i < len(observations) else ""
            key = (_signature(tc), _DIGITS.sub("#", said))
            streak = streak + 1 if key == last else 1
            last = key
            best = max(best, streak)
    return best


def _segments(steps: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, Any]], str | None]]:
    """Split a conversation into runs: (index of first step, steps, user message)."""
    out: list[tuple[int, list[dict[str, Any]], str | None]] = []
    start, current, user = 0, [], None
    for i, step in enumerate(steps):
        current.append(step)
        if not _calls(step):
            out.append((start, current, user))
            reply = step.get("user_reply")
            user = reply if isinstance(reply, str) else None
            start, current = i + 1, []
    if current:
        out.append((start, current, user))
    return out


def _model_name(traj: dict[str, Any]) -> str:
    meta = traj.get("meta")
    name = traj.get("model") or (meta.get("model") if isinstance(meta, dict) else None)
    return str(name) if name else "replay"
