"""Limits from real traffic: the distributions of healthy runs, and a config calibrated on them.

Input is JSONL -- one file or several, plain or gzip-compressed -- of recorded trajectories (the
format of docs/contracts.md: one conversation per line) or of run records (``--json`` / the
``run_record`` plugin: one run per line).  Only *successful* runs count as healthy: a trajectory
with ``success = true``; a run record that ended with ``final_answer`` or ``terminal_tool`` and
gave an answer.

A *turn* is one run: the model calls that serve one user message (a trajectory step without
tool calls ends it).  Measured per turn: model calls, tool calls, the largest parallel batch,
the prompt tokens of each request and the billed tokens (both from recorded ``usage`` only --
estimates would understate what trajectories leave out); per conversation: user turns, model
calls, tool calls, billed tokens, its largest request and its wall time (``meta.duration_s``).

A proposed limit is the p99 of the healthy values times a margin (:data:`MARGIN`), rounded up
(token limits to a whole thousand) -- and only from at least :data:`MIN_RUNS` values: the
nearest-rank p99 of fewer than 100 values is simply their maximum, so a "p99" from two runs
would be a limit set by the busiest of two.  Below the minimum nothing is proposed (the
command refuses a corpus that small, exit 2; a limit or a profile whose data is that thin is
left out and says so).  Per-run limits are set from each conversation's busiest
turn, not from all turns: a conversation is cut when any one of its turns passes a limit, so
the p99 of all turns would cut far more than 1% of conversations.  The plugin-level limits come
from all healthy runs together (the default must serve every kind of run); a
``[profiles.<slug>]`` per group (by default per ``source``) from that group's runs alone.
:data:`LIMITS` maps config
keys to the statistic they are set from -- one line per key; :func:`calibrated_config` writes
only the keys the installed config model knows, and the rest as comments.

Reading the file into healthy turns and conversations lives in
:mod:`loopwarden.traffic.corpus`, measuring them and proposing values in
:mod:`loopwarden.traffic.metrics` (the public names of both are re-exported here); this module
maps the proposals to config keys and writes the TOML.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loopwarden.traffic.corpus import (
    GROUPINGS,
    Conversation,
    Stats,
    Turn,
    load_stats,
    profile_names,
    profile_slug,
)
from loopwarden.traffic.corpus import SUCCESS_TERMINATIONS as SUCCESS_TERMINATIONS
from loopwarden.traffic.metrics import (
    MARGIN,
    METRICS,
    MIN_RUNS,
    PERCENTILE,
    _default_of,
    _lookup,
    distribution,
    percentile,
    propose,
)
from loopwarden.traffic.metrics import Metric as Metric
from loopwarden.traffic.metrics import context_peak as context_peak
from loopwarden.traffic.metrics import conversation_tokens_peak as conversation_tokens_peak
from loopwarden.traffic.metrics import reserve_of as reserve_of
from loopwarden.traffic.metrics import token_budget_peak as token_budget_peak

__all__ = [
    "GROUPINGS",
    "LIMITS",
    "MARGIN",
    "METRICS",
    "MIN_RUNS",
    "Conversation",
    "Limit",
    "Stats",
    "Turn",
    "calibrated_config",
    "distribution",
    "dump_toml",
    "load_stats",
    "percentile",
    "profile_names",
    "profile_slug",
    "propose",
    "propose_all",
    "propose_limit",
]

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
    Limit("plugins.token_budget.max_total_tokens", "busiest_turn_projection"),
    Limit("plugins.token_budget.max_context", "context_projection"),
    Limit("plugins.conversation_limits.max_turns", "conversation_turns"),
    Limit("plugins.conversation_limits.max_model_calls", "conversation_model_calls"),
    Limit("plugins.conversation_limits.max_tool_calls", "conversation_tool_calls"),
    Limit("plugins.conversation_limits.max_tokens", "conversation_projection"),
    Limit("max_steps", "busiest_turn_model_calls", profile=True),
    Limit("max_tokens", "busiest_turn_projection", profile=True),
    Limit("max_seconds", "run_seconds", profile=True),
    Limit("max_context", "context_projection", profile=True),
)


def known_key(key: str, *, profile: bool = False) -> bool:
    """Whether the installed config model has ``key`` (a profile key when ``profile``)."""
    from loopwarden.config import Config, ProfileConfig
    from loopwarden.host import builtin_settings

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


def _plus(lim: Limit, base: Mapping[str, Any]) -> int:
    """What ``lim.plus_key`` adds after the margin: the base config's value, else the
    setting's default."""
    if not lim.plus_key:
        return 0
    extra = _lookup(base, lim.plus_key)
    return int(extra if extra is not None else _default_of(lim.plus_key) or 0)


def propose_limit(
    lim: Limit,
    stats: Stats,
    base: Mapping[str, Any],
    *,
    margin: float = MARGIN,
    min_runs: int = MIN_RUNS,
) -> tuple[int | None, int]:
    """``lim``'s proposed value on ``stats`` and the number of values it rests on; the value
    is None when there are fewer than ``min_runs`` of them (no p99 to speak of)."""
    metric = METRICS[lim.metric]
    values = metric.of(stats, base)
    if not values or len(values) < min_runs:
        return None, len(values)
    value = propose(values, tokens=metric.tokens, margin=margin, plus=_plus(lim, base))
    return value, len(values)


def propose_all(
    stats: Stats, base: Mapping[str, Any], *, margin: float = MARGIN, min_runs: int = MIN_RUNS
) -> list[tuple[Limit, int]]:
    """The proposed value of every plugin-level limit that has at least ``min_runs`` values
    (``base``: the raw config it goes into, for ``plus_key``)."""
    out = []
    for lim in LIMITS:
        if lim.profile:
            continue
        value, _ = propose_limit(lim, stats, base, margin=margin, min_runs=min_runs)
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
    keep: Mapping[str, tuple[int | None, str]] | None = None,
) -> tuple[dict[str, Any], str]:
    """The base config's data with the proposed limits, and its TOML text.

    ``keep`` maps a dotted key (``plugins.<plugin>.<key>``, or ``profiles.<name>.<key>`` for
    a calibrated profile) to the value written instead of the proposal and why (a value of
    None: the key is left as the base has it, or out of the profile) -- what
    ``loopwarden calibrate`` keeps where its proposal would do worse than the current config.

    Plugin-level limits come from all healthy runs together; a ``[profiles.<slug>]``
    (:func:`profile_names`) is proposed for every group with at least ``min_runs`` successful
    conversations, each limit in it from that group's runs alone.  A limit with fewer than
    ``min_runs`` values keeps the base value and is named in the header.  A key the
    installed config model does not know is written as a comment, never as a setting.
    """
    data: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy of plain TOML data
    pending: dict[str, list[str]] = {}
    lines = [*header]
    kept = keep or {}

    def why(lim: Limit, part: Stats) -> str:
        metric = METRICS[lim.metric]
        p99 = percentile(metric.of(part, data), PERCENTILE)
        text = f"p99 {p99:g} of {metric.label} x {margin:g}"
        return text + (f" + {lim.plus_key.rsplit('.', 1)[-1]}" if lim.plus_key else "")

    for lim in LIMITS:
        if lim.profile:
            continue
        value, n = propose_limit(lim, stats, data, margin=margin, min_runs=min_runs)
        if value is None:
            if n:
                lines.append(
                    f"{lim.key}: not proposed, {n} value(s) of "
                    f"{METRICS[lim.metric].label}, fewer than {min_runs}"
                )
            continue
        if lim.key in kept:
            instead, note = kept[lim.key]
            if instead is not None:
                _set(data, lim.key, instead)
            shown = "left as it is" if instead is None else f"= {instead}"
            lines.append(f"{lim.key} {shown}, not the proposed {value} ({why(lim, stats)}): {note}")
        elif known_key(lim.key):
            _set(data, lim.key, value)
            lines.append(f"{lim.key} = {value}  ({why(lim, stats)})")
        else:
            table, _, name = lim.key.rpartition(".")
            pending.setdefault(table, []).append(
                f"{name} = {value}   # {why(lim, stats)}; not a setting of this version"
            )
    profile_limits = [lim for lim in LIMITS if lim.profile and known_key(lim.key, profile=True)]
    groups = stats.groups()
    names = profile_names(groups, taken=sorted(data.get("profiles") or {}))
    for group in groups:
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
        left_out = []
        for lim in profile_limits:
            value, _ = propose_limit(lim, part, data, margin=margin, min_runs=min_runs)
            key = f"profiles.{names[group]}.{lim.key}"
            if value is not None and key in kept:
                instead, note = kept[key]
                left_out.append(f"{lim.key} = {value}, {note}")
                if instead is not None:
                    prof[lim.key] = instead
            elif value is not None:
                prof[lim.key] = value
        data.setdefault("profiles", {})[names[group]] = prof
        got = ", ".join(f"{k} = {v}" for k, v in prof.items() if k != "description")
        none = "no limit that does no worse" if left_out else "no limit with enough data"
        lines.append(f"[profiles.{names[group]}] {got or none}")
        lines.extend(f"  not written: {x}" for x in left_out)
    text = "\n".join(f"# {x}" if x else "#" for x in lines) + "\n\n" + dump_toml(data, pending)
    return data, text
