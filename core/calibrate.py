"""Limits from real traffic: the distributions of healthy runs, and a config calibrated on them.

Input is a JSONL file of recorded trajectories (DESIGN's trajectory format: one conversation
per line) or of run records (``--json`` / the ``run_record`` plugin: one run per line).  Only
*successful* runs count as healthy: a trajectory with ``success = true``; a run record that
ended with ``final_answer`` or ``terminal_tool`` and gave an answer.

A *turn* is one run: the model calls that serve one user message (a trajectory step without
tool calls ends it).  Measured per turn: model calls, tool calls, the largest parallel batch,
the prompt tokens of each request and the billed tokens (both from recorded ``usage`` only --
estimates would understate what trajectories leave out); per conversation: user turns, model
calls, tool calls, billed tokens, its largest request and its wall time (``meta.duration_s``).

A proposed limit is the p99 of the healthy values times a margin (:data:`MARGIN`), rounded up
(token limits to a whole thousand).  Per-run limits are set from each conversation's busiest
turn, not from all turns: a conversation is cut when any one of its turns passes a limit, so
the p99 of all turns would cut far more than 1% of conversations.  :data:`LIMITS` maps config
keys to the statistic they are set from -- one line per key; :func:`calibrated_config` writes
only the keys the installed config model knows, and the rest as comments.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.exceptions import ConfigError

__all__ = [
    "LIMITS",
    "MARGIN",
    "METRICS",
    "Conversation",
    "Limit",
    "Stats",
    "Turn",
    "calibrated_config",
    "distribution",
    "dump_toml",
    "load_stats",
    "percentile",
    "propose",
    "propose_all",
]

#: proposed limit = p99 of the healthy values x MARGIN, rounded up
MARGIN = 1.25
PERCENTILE = 99.0
#: a profile is proposed for a group only with at least this many successful conversations
MIN_RUNS = 20
#: run-record terminations of a run that finished by itself
SUCCESS_TERMINATIONS = ("final_answer", "terminal_tool")


@dataclass(slots=True)
class Turn:
    """One healthy run (one user turn)."""

    group: str
    model_calls: int
    tool_calls: int
    max_batch: int
    prompts: list[int] = field(default_factory=list)  # recorded prompt tokens per request
    tokens: int | None = None  # billed tokens (prompt + completion), when all are recorded


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


def _trajectory(obj: dict[str, Any], by: str = "domain") -> tuple[Conversation, list[Turn]]:
    from loopwarden._trajectory import _calls, _segments

    group = str(obj.get("source") or "default") if by == "source" else _group(obj)
    steps = obj["steps"]
    turns = []
    for _, seg, _user in _segments(steps):
        prompts, billed, complete = [], 0, True
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
        batches = [len(_calls(s)) for s in seg]
        turns.append(
            Turn(
                group,
                len(seg),
                sum(batches),
                max(batches, default=0),
                prompts,
                billed if complete and seg else None,
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
    )
    return conv, turns


def _record(obj: dict[str, Any], by: str = "domain") -> tuple[Conversation, list[Turn]]:
    group = _group(obj)
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


def load_stats(path: str | Path, *, by: str = "domain") -> Stats:
    """Read a trajectory or run-record JSONL file into the statistics of its healthy runs,
    grouped by domain (a run record: by profile), or by ``source`` when ``by="source"``.

    The kind is taken from the first readable line; a line of the other kind, or one that is
    not readable, is counted in ``unreadable``.  A file with no readable line is a
    :class:`ConfigError`.
    """
    from loopwarden._trajectory import _well_formed
    from loopwarden.sanitize import loads_strict

    p = Path(path)
    if not p.is_file():
        raise ConfigError("file not found", path=p)
    stats = Stats(kind="")
    # read as replay and report do: an undecodable byte, NaN, 1e999, a huge integer, deep
    # nesting or a lone surrogate makes one line unreadable, never the whole file
    with p.open(encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
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
            conv, turns = (_record if kind == "records" else _trajectory)(obj, by)
            stats.conversations.append(conv)
            stats.turns.extend(turns)
    if not stats.kind:
        raise ConfigError(
            "no readable trajectory or run record",
            path=p,
            expected="JSONL: DESIGN's trajectories or run records",
        )
    return stats


# -- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """n, p50, p90, p99 and max."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


@dataclass(frozen=True, slots=True)
class Metric:
    """One statistic of healthy traffic."""

    label: str
    values: Callable[[Stats], list[float]]
    tokens: bool = False


def _turns(f: Callable[[Turn], float | None]) -> Callable[[Stats], list[float]]:
    return lambda s: [v for t in s.turns if (v := f(t)) is not None]


def _convs(f: Callable[[Conversation], float | None]) -> Callable[[Stats], list[float]]:
    return lambda s: [v for c in s.conversations if (v := f(c)) is not None]


#: the statistics, by name (the table's rows, in order)
METRICS: dict[str, Metric] = {
    "turn_model_calls": Metric("model calls per user turn", _turns(lambda t: t.model_calls)),
    "turn_tool_calls": Metric("tool calls per user turn", _turns(lambda t: t.tool_calls)),
    "turn_max_batch": Metric("largest parallel batch per turn", _turns(lambda t: t.max_batch)),
    "busiest_turn_model_calls": Metric(
        "most model calls in one turn, per conversation", _convs(lambda c: c.turn_model_calls)
    ),
    "busiest_turn_tool_calls": Metric(
        "most tool calls in one turn, per conversation", _convs(lambda c: c.turn_tool_calls)
    ),
    "busiest_turn_tokens": Metric(
        "most billed tokens in one turn, per conversation (recorded)",
        _convs(lambda c: c.turn_tokens),
        tokens=True,
    ),
    "first_prompt_tokens": Metric(
        "first request per conversation (recorded)", _convs(lambda c: c.first_prompt), tokens=True
    ),
    "request_prompt_tokens": Metric(
        "prompt tokens per request (recorded)",
        lambda s: [float(p) for t in s.turns for p in t.prompts],
        tokens=True,
    ),
    "turn_tokens": Metric(
        "billed tokens per user turn (recorded)", _turns(lambda t: t.tokens), tokens=True
    ),
    "conversation_max_prompt": Metric(
        "largest request per conversation (recorded)", _convs(lambda c: c.max_prompt), tokens=True
    ),
    "conversation_tokens": Metric(
        "billed tokens per conversation (recorded)", _convs(lambda c: c.tokens), tokens=True
    ),
    "conversation_turns": Metric("user turns per conversation", _convs(lambda c: c.turns)),
    "conversation_model_calls": Metric(
        "model calls per conversation", _convs(lambda c: c.model_calls)
    ),
    "conversation_tool_calls": Metric(
        "tool calls per conversation", _convs(lambda c: c.tool_calls)
    ),
    "conversation_seconds": Metric("wall time per conversation, s", _convs(lambda c: c.seconds)),
}


def propose(
    values: Sequence[float], *, tokens: bool = False, margin: float = MARGIN, plus: int = 0
) -> int | None:
    """p99 x ``margin`` (+ ``plus``), rounded up -- token counts to a whole thousand."""
    p99 = percentile(values, PERCENTILE)
    if p99 is None:
        return None
    n = math.ceil(p99 * margin) + plus
    return math.ceil(n / 1000) * 1000 if tokens else max(1, n)


# -- the config keys a calibration sets ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limit:
    """A config key set from a statistic: ``key`` is dotted; in a profile's table it is the
    part after ``profiles.<name>.``.  ``plus_key`` names a setting whose value is added after
    the margin (the output reserved on top of a context limit)."""

    key: str
    metric: str
    profile: bool = False
    plus_key: str | None = None


#: what a calibration proposes -- add one line per new key.  Keys the installed config model
#: does not know are written as comments (see :func:`calibrated_config`).
LIMITS: tuple[Limit, ...] = (
    Limit("plugins.max_steps.max_steps", "busiest_turn_model_calls"),
    Limit("plugins.tool_calls.max_tool_calls", "busiest_turn_tool_calls"),
    Limit("plugins.token_budget.max_total_tokens", "busiest_turn_tokens"),
    Limit(
        "plugins.token_budget.max_context",
        "conversation_max_prompt",
        plus_key="plugins.token_budget.reserve_output_tokens",
    ),
    Limit("plugins.conversation_limits.max_turns", "conversation_turns"),
    Limit("plugins.conversation_limits.max_model_calls", "conversation_model_calls"),
    Limit("plugins.conversation_limits.max_tool_calls", "conversation_tool_calls"),
    Limit("plugins.conversation_limits.max_tokens", "conversation_tokens"),
    Limit("max_steps", "busiest_turn_model_calls", profile=True),
    Limit("max_tokens", "busiest_turn_tokens", profile=True),
)


def _lookup(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _default_of(key: str) -> Any:
    """A plugin setting's default, from the installed settings model (None if unknown)."""
    from loopwarden.pluginmanager import builtin_settings

    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "plugins":
        return None
    model = builtin_settings().get(parts[1])
    f = model.model_fields.get(parts[2]) if model is not None else None
    return f.default if f is not None else None


def known_key(key: str, *, profile: bool = False) -> bool:
    """Whether the installed config model has ``key`` (a profile key when ``profile``)."""
    from loopwarden.config import Config, ProfileConfig
    from loopwarden.pluginmanager import builtin_settings

    if profile:
        return key in ProfileConfig.model_fields
    parts = key.split(".")
    if parts[0] == "plugins":
        if len(parts) != 3:
            return False
        model = builtin_settings().get(parts[1])
        return model is not None and parts[2] in model.model_fields
    node: Any = Config
    for part in parts:
        fields = getattr(node, "model_fields", None)
        if not fields or part not in fields:
            return False
        node = fields[part].annotation
    return True


def propose_all(
    stats: Stats, base: Mapping[str, Any], *, margin: float = MARGIN
) -> list[tuple[Limit, int]]:
    """The proposed value of every plugin-level limit that has data (``base``: the raw
    config it goes into, for ``plus_key``)."""
    out = []
    for lim in LIMITS:
        if lim.profile:
            continue
        metric = METRICS[lim.metric]
        plus = 0
        if lim.plus_key:
            extra = _lookup(base, lim.plus_key)
            plus = int(extra if extra is not None else _default_of(lim.plus_key) or 0)
        value = propose(metric.values(stats), tokens=metric.tokens, margin=margin, plus=plus)
        if value is not None:
            out.append((lim, value))
    return out


# -- writing TOML ----------------------------------------------------------------------------


def _toml_key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return (
            "{ "
            + ", ".join(
                f"{_toml_key(str(k))} = {_toml_value(x)}" for k, x in v.items() if x is not None
            )
            + " }"
        )
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump_toml(data: Mapping[str, Any], comments: Mapping[str, list[str]] | None = None) -> str:
    """``data`` as TOML: non-empty tables as ``[headers]``, tables inside arrays inline.
    ``comments`` maps a table's dotted name to comment lines written at its end (a table not
    in ``data`` is written as a commented-out block at the end of the file)."""
    notes = comments or {}
    lines: list[str] = []
    seen: set[str] = set()

    def table(prefix: str, node: Mapping[str, Any]) -> None:
        seen.add(prefix)
        subs = {
            k: v for k, v in node.items() if isinstance(v, Mapping) and (v or not prefix)
        }  # [shop] even when empty
        plain = {k: v for k, v in node.items() if k not in subs and v is not None}
        if prefix and (plain or not subs or prefix in notes):
            lines.append(f"[{prefix}]")
        lines.extend(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in plain.items())
        lines.extend(f"# {c}" for c in notes.get(prefix, ()))
        if prefix and (plain or not subs or prefix in notes):
            lines.append("")
        for k, v in subs.items():
            table(f"{prefix}.{_toml_key(str(k))}" if prefix else _toml_key(str(k)), v)

    table("", data)
    for prefix, extra in notes.items():
        if prefix not in seen:
            lines += [f"# [{prefix}]", *(f"# {c}" for c in extra), ""]
    return "\n".join(lines).rstrip() + "\n"


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def calibrated_config(
    stats: Stats,
    base: Mapping[str, Any],
    *,
    margin: float = MARGIN,
    min_runs: int = MIN_RUNS,
    header: Iterable[str] = (),
) -> tuple[dict[str, Any], str]:
    """The base config's data with the proposed limits, and its TOML text.

    Plugin-level limits come from all healthy runs; a ``[profiles.<group>]`` is proposed for
    every group with at least ``min_runs`` successful conversations.  A key the installed
    config model does not know is written as a comment, never as a setting.
    """
    data: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy of plain TOML data
    pending: dict[str, list[str]] = {}
    lines = [*header]
    for lim, value in propose_all(stats, data, margin=margin):
        metric = METRICS[lim.metric]
        p99 = percentile(metric.values(stats), PERCENTILE)
        why = f"p99 {p99:g} of {metric.label} x {margin:g}"
        if lim.plus_key:
            why += f" + {lim.plus_key.rsplit('.', 1)[-1]}"
        if known_key(lim.key):
            _set(data, lim.key, value)
            lines.append(f"{lim.key} = {value}  ({why})")
        else:
            table, _, name = lim.key.rpartition(".")
            pending.setdefault(table, []).append(
                f"{name} = {value}   # {why}; not a setting of this version"
            )
    profile_limits = [lim for lim in LIMITS if lim.profile and known_key(lim.key, profile=True)]
    for group in stats.groups():
        part = stats.only(group)
        if len(part.conversations) < min_runs:
            lines.append(
                f"no profile for {group!r}: {len(part.conversations)} successful "
                f"conversation(s), fewer than {min_runs}"
            )
            continue
        prof: dict[str, Any] = {
            "description": (
                f"calibrated on {len(part.conversations)} successful {group} conversations "
                f"({len(part.turns)} turns)"
            )
        }
        for lim in profile_limits:
            metric = METRICS[lim.metric]
            proposed = propose(metric.values(part), tokens=metric.tokens, margin=margin)
            if proposed is not None:
                prof[lim.key] = proposed
        data.setdefault("profiles", {})[group] = prof
    text = "\n".join(f"# {x}" if x else "#" for x in lines) + "\n\n" + dump_toml(data, pending)
    return data, text
