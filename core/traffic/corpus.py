"""The corpus :mod:`loopwarden.traffic.calibrate` measures: the healthy runs of JSONL files.

:func:`load_stats` reads recorded trajectories or run records -- one file or several, plain or
gzip-compressed (the kind is taken from the first readable line) -- into :class:`Turn` and
:class:`Conversation` values, keeping only successful runs and counting what was left out
(unsuccessful, unreadable lines).  Kept apart from the statistics, the proposed limits and the
TOML writing in :mod:`loopwarden.traffic.calibrate` (which re-exports these names): what counts as a
healthy run and how a recording is read change for other reasons than how limits are proposed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.exceptions import ConfigError

#: run-record terminations of a run that finished by itself
SUCCESS_TERMINATIONS = ("final_answer", "terminal_tool")
#: how runs can be grouped: ``domain`` (``meta.domain``, else the last part of ``source``;
#: a run record's profile), ``source`` (the recorded ``source``) or ``file`` (the input file
#: each run came from -- one file per kind of agent, e.g. customer service vs coding)
GROUPINGS = ("domain", "source", "file")


@dataclass(slots=True)
class Turn:
    """One healthy run (one user turn)."""

    group: str
    model_calls: int
    tool_calls: int
    max_batch: int
    prompts: list[int] = field(default_factory=list)  # recorded prompt tokens per request
    tokens: int | None = None  # billed tokens (prompt + completion), when all are recorded
    #: (prompt, completion) tokens of each model call, in order, when every call's usage is
    #: recorded -- what the token guards project before each call is computed from these
    calls: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class Conversation:
    """One healthy conversation (a trajectory; a run record is a conversation of one turn)."""

    group: str
    source: str
    turns: int
    model_calls: int
    tool_calls: int
    tokens: int | None = None
    max_prompt: int | None = None
    seconds: float | None = None
    #: its busiest turn: the most model calls, tool calls and billed tokens in one turn
    turn_model_calls: int = 0
    turn_tool_calls: int = 0
    turn_tokens: int | None = None
    #: its first recorded request: the system prompt and tool schemas, and the first messages
    first_prompt: int | None = None
    #: its turns' model calls (see :attr:`Turn.calls`), None when any usage is missing
    turn_calls: list[list[tuple[int, int]]] | None = None


@dataclass(slots=True)
class Stats:
    """What one file holds: its healthy turns and conversations, and what was left out."""

    kind: str  # "trajectories" | "records"
    turns: list[Turn] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)
    lines: int = 0
    unsuccessful: int = 0
    unreadable: int = 0

    def groups(self) -> list[str]:
        return sorted({c.group for c in self.conversations})

    def only(self, group: str | None) -> Stats:
        """The part of these stats that belongs to ``group`` (all of it for None)."""
        if group is None:
            return self
        return Stats(
            self.kind,
            [t for t in self.turns if t.group == group],
            [c for c in self.conversations if c.group == group],
        )


# -- reading -------------------------------------------------------------------------------


def group_of(obj: Mapping[str, Any], by: str = "domain", file: str = "file") -> str:
    """The group of a trajectory or run record under ``by`` (see :data:`GROUPINGS`);
    ``file`` is the label of the file it came from."""
    if by == "file":
        return file
    if by == "source" and not _is_record(obj):
        return str(obj.get("source") or "default")
    return _group(obj)


def _group(obj: Mapping[str, Any]) -> str:
    """A trajectory's domain (``meta.domain``), else the last part of its ``source``; a run
    record's profile."""
    meta = obj.get("meta")
    if isinstance(meta, dict) and meta.get("domain"):
        return str(meta["domain"])
    if "termination" in obj:
        return str(obj.get("profile") or "default")
    return str(obj.get("source") or "default").rsplit("/", 1)[-1] or "default"


def _int(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


def _trajectory(obj: dict[str, Any], group: str) -> tuple[Conversation, list[Turn]]:
    from loopwarden.traffic.trajectory import _calls, _segments

    steps = obj["steps"]
    turns = []
    for _, seg, _user in _segments(steps):
        prompts, billed, complete = [], 0, True
        calls: list[tuple[int, int]] = []
        for s in seg:
            u = s.get("usage")
            p = _int(u.get("prompt_tokens")) if isinstance(u, dict) else None
            c = _int(u.get("completion_tokens")) if isinstance(u, dict) else None
            if p:
                prompts.append(p)
            if p is None or c is None:
                complete = False
            else:
                billed += p + c
                calls.append((p, c))
        batches = [len(_calls(s)) for s in seg]
        turns.append(
            Turn(
                group,
                len(seg),
                sum(batches),
                max(batches, default=0),
                prompts,
                billed if complete and seg else None,
                calls if complete and seg else None,
            )
        )
    meta = obj.get("meta")
    seconds = meta.get("duration_s") if isinstance(meta, dict) else None
    tokens = [t.tokens for t in turns]
    prompts = [p for t in turns for p in t.prompts]
    conv = Conversation(
        group,
        str(obj.get("source") or group),
        len(turns),
        sum(t.model_calls for t in turns),
        sum(t.tool_calls for t in turns),
        sum(x for x in tokens if x is not None) if tokens and None not in tokens else None,
        max(prompts) if prompts else None,
        float(seconds) if isinstance(seconds, (int, float)) else None,
        max((t.model_calls for t in turns), default=0),
        max((t.tool_calls for t in turns), default=0),
        max((x for x in tokens if x is not None), default=None),
        prompts[0] if prompts else None,
        [t.calls for t in turns if t.calls is not None]
        if turns and all(t.calls is not None for t in turns)
        else None,
    )
    return conv, turns


def _record(obj: dict[str, Any], group: str) -> tuple[Conversation, list[Turn]]:
    tokens = obj.get("tokens")
    total = _int(tokens.get("total")) if isinstance(tokens, dict) else None
    steps, calls = _int(obj.get("steps")) or 0, _int(obj.get("tool_calls")) or 0
    detail = obj.get("steps_detail")
    prompts = (
        [n for d in detail if isinstance(d, dict) and (n := _int(d.get("context_tokens")))]
        if isinstance(detail, list)
        else []
    )
    turn = Turn(group, steps, calls, 0, prompts, total)
    elapsed = obj.get("elapsed_s")
    conv = Conversation(
        group,
        str(obj.get("scenario") or group),
        1,
        steps,
        calls,
        total,
        max(prompts) if prompts else None,
        float(elapsed) if isinstance(elapsed, (int, float)) else None,
        steps,
        calls,
        total,
    )
    return conv, [turn]


def _is_record(obj: Mapping[str, Any]) -> bool:
    return "termination" in obj and not isinstance(obj.get("steps"), list)


def _successful(obj: Mapping[str, Any]) -> bool:
    if _is_record(obj):
        return (
            obj.get("termination") in SUCCESS_TERMINATIONS
            and obj.get("final_answer_present") is not False
        )
    return obj.get("success") is True


def load_stats(paths: str | Path | Sequence[str | Path], *, by: str = "domain") -> Stats:
    """Read trajectory or run-record JSONL files (plain or gzip-compressed) into the
    statistics of their healthy runs, grouped ``by`` domain (a run record: by profile),
    ``source`` or input ``file`` (:data:`GROUPINGS`).

    The kind is taken from the first readable line; a line of the other kind, or one that is
    not readable, is counted in ``unreadable``.  A missing file, a corrupt gzip archive or
    files with no readable line are a :class:`ConfigError`.
    """
    from loopwarden.sanitize import loads_strict
    from loopwarden.traffic.trajectory import _well_formed, file_label, read_lines

    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    for p in files:
        if not p.is_file():
            raise ConfigError("file not found", path=p)
    stats = Stats(kind="")
    # read as replay and report do: an undecodable byte, NaN, 1e999, a huge integer, deep
    # nesting or a lone surrogate makes one line unreadable, never the whole file
    for p in files:
        label = file_label(p)
        for line in read_lines(p):
            if not line.strip():
                continue
            stats.lines += 1
            try:
                obj = loads_strict(line)
            except ValueError:
                stats.unreadable += 1
                continue
            if not isinstance(obj, dict):
                stats.unreadable += 1
                continue
            kind = "records" if _is_record(obj) else "trajectories" if _well_formed(obj) else None
            if kind is None or (stats.kind and kind != stats.kind):
                stats.unreadable += 1
                continue
            stats.kind = kind
            if not _successful(obj):
                stats.unsuccessful += 1
                continue
            group = group_of(obj, by, label)
            conv, turns = (_record if kind == "records" else _trajectory)(obj, group)
            stats.conversations.append(conv)
            stats.turns.extend(turns)
    if not stats.kind:
        raise ConfigError(
            "no readable trajectory or run record",
            path=", ".join(str(p) for p in files),
            expected="JSONL: trajectories or run records (docs/contracts.md)",
        )
    return stats


def profile_slug(group: str) -> str:
    """A group's name as a TOML bare key for ``[profiles.<slug>]``: lower case, every run of
    other characters than ``a-z 0-9 _ -`` one hyphen (``tau2/gpt-4.1/airline`` ->
    ``tau2-gpt-4-1-airline``)."""
    return re.sub(r"[^a-z0-9_-]+", "-", group.lower()).strip("-") or "default"


def profile_names(groups: Sequence[str], taken: Sequence[str] = ()) -> dict[str, str]:
    """Each group's profile name (:func:`profile_slug`), made unique: a slug already used by
    another group or among ``taken`` (the base config's own profiles) gets ``-2``, ``-3`` ..."""
    used = set(taken)
    out = {}
    for g in groups:
        base = name = profile_slug(g)
        n = 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        out[g] = name
    return out
