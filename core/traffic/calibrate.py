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
:mod:`loopwarden.traffic.corpus` (its public names are re-exported here); this module
measures them, proposes the limits and writes the TOML.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
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

#: proposed limit = p99 of the healthy values x MARGIN, rounded up
MARGIN = 1.25
PERCENTILE = 99.0
#: the fewest values a p99-based limit is proposed from: the nearest-rank p99 of n values is
#: their maximum until n >= 100/(100-99) = 100.  Applies to the whole corpus (successful
#: conversations; fewer: ``loopwarden calibrate`` refuses), to each limit (the conversations
#: that have its statistic, e.g. recorded usage) and to each profile's group.
MIN_RUNS = math.ceil(100.0 / (100.0 - PERCENTILE))


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
    """One statistic of healthy traffic.  ``reserved``, when set, computes the values from the
    output tokens each model call reserves (which depends on the config the limit goes into:
    :func:`reserve_of`) and replaces ``values`` there."""

    label: str
    values: Callable[[Stats], list[float]]
    tokens: bool = False
    reserved: Callable[[Stats, Mapping[str, Any], str], list[float]] | None = None
    reserve_plugin: str = "token_budget"

    def of(self, stats: Stats, base: Mapping[str, Any]) -> list[float]:
        """The values on ``stats`` for a limit that goes into the config ``base``."""
        if self.reserved is None:
            return self.values(stats)
        return self.reserved(stats, base, self.reserve_plugin)


def reserve_of(base: Mapping[str, Any], plugin: str) -> int:
    """The output tokens ``plugin`` reserves per model call under the config ``base``: the
    requests' ``[model] max_output_tokens`` when set, else the plugin's
    ``reserve_output_tokens`` (its default when the config leaves it out)."""
    cap = _lookup(base, "model.max_output_tokens")
    if isinstance(cap, int) and cap > 0:
        return cap
    own = _lookup(base, f"plugins.{plugin}.reserve_output_tokens")
    return int(
        own if own is not None else _default_of(f"plugins.{plugin}.reserve_output_tokens") or 0
    )


def token_budget_peak(calls: Sequence[tuple[int, int]], reserve: int) -> int:
    """The most ``token_budget`` projects for one run (one user turn) before any of its model
    calls, replayed from the recorded ``(prompt, completion)`` tokens of each call.

    Before each call it projects this call (spent + prompt + reserve: past the limit, a hard
    stop) and, for a call after which the run still went on, the next one too (prompt +
    expected growth + reserve: past the limit, this call becomes the last -- the work after it
    is lost).  A limit at or above the peak stops none of these calls; a limit set from billed
    tokens alone would, since the projection counts two calls' reserved output ahead."""
    from loopwarden.plugins.token_budget import _GROWTH_WINDOW, _median

    spent, peak, last = 0, 0, None
    growths: deque[int] = deque(maxlen=_GROWTH_WINDOW)
    for k, (prompt, completion) in enumerate(calls):
        if last is not None:
            growths.append(max(0, prompt - last))
        this_call = prompt + reserve
        peak = max(peak, spent + this_call)
        if k < len(calls) - 1:
            peak = max(peak, spent + this_call + prompt + _median(reserve, growths) + reserve)
        spent += prompt + completion
        last = prompt
    return peak


def context_peak(calls: Sequence[tuple[int, int]], reserve: int) -> int:
    """The largest request ``token_budget`` projects against ``max_context`` in one run: this
    call (prompt + reserve: past the limit, a hard stop) and, for a call after which the run
    went on, the next one (prompt + expected growth + reserve: past it, this call is the
    last)."""
    from loopwarden.plugins.token_budget import _GROWTH_WINDOW, _median

    peak, last = 0, None
    growths: deque[int] = deque(maxlen=_GROWTH_WINDOW)
    for k, (prompt, _) in enumerate(calls):
        if last is not None:
            growths.append(max(0, prompt - last))
        peak = max(peak, prompt + reserve)
        if k < len(calls) - 1:
            peak = max(peak, prompt + _median(reserve, growths) + reserve)
        last = prompt
    return peak


def conversation_tokens_peak(turns: Sequence[Sequence[tuple[int, int]]], reserve: int) -> int:
    """The most ``conversation_limits`` projects for ``max_tokens`` in one conversation:
    before each call, the conversation's spent tokens plus this call (hard) and, for a call
    its run went on after, twice this call (soft: the run's last)."""
    spent = peak = 0
    for calls in turns:
        for k, (prompt, completion) in enumerate(calls):
            this_call = prompt + reserve
            peak = max(peak, spent + (2 * this_call if k < len(calls) - 1 else this_call))
            spent += prompt + completion
    return peak


_Peak = Callable[[Stats, Mapping[str, Any], str], list[float]]


def _peaks(of: Callable[[list[list[tuple[int, int]]], int], int]) -> _Peak:
    """Per conversation with recorded usage: ``of(its turns' calls, the reserve)``."""

    def values(stats: Stats, base: Mapping[str, Any], plugin: str) -> list[float]:
        reserve = reserve_of(base, plugin)
        return [float(of(c.turn_calls, reserve)) for c in stats.conversations if c.turn_calls]

    return values


_turn_peaks = _peaks(lambda turns, r: max(token_budget_peak(t, r) for t in turns))
_context_peaks = _peaks(lambda turns, r: max(context_peak(t, r) for t in turns))
_conversation_peaks = _peaks(conversation_tokens_peak)


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
    "busiest_turn_projection": Metric(
        "most tokens token_budget projects in one turn, per conversation (recorded usage "
        "+ the reserved output)",
        lambda s: [],
        tokens=True,
        reserved=_turn_peaks,
    ),
    "context_projection": Metric(
        "largest request token_budget projects per conversation (recorded prompts + the "
        "reserved output)",
        lambda s: [],
        tokens=True,
        reserved=_context_peaks,
    ),
    "conversation_projection": Metric(
        "most tokens conversation_limits projects per conversation (recorded usage + the "
        "reserved output)",
        lambda s: [],
        tokens=True,
        reserved=_conversation_peaks,
        reserve_plugin="conversation_limits",
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
    "run_seconds": Metric(
        "wall time per run (one-turn conversations, run records), s",
        _convs(lambda c: c.seconds if c.turns == 1 else None),
    ),
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


def _lookup(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _default_of(key: str) -> Any:
    """A plugin setting's default, from the installed settings model (None if unknown)."""
    from loopwarden.host import builtin_settings

    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "plugins":
        return None
    model = builtin_settings().get(parts[1])
    f = model.model_fields.get(parts[2]) if model is not None else None
    return f.default if f is not None else None


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
) -> tuple[dict[str, Any], str]:
    """The base config's data with the proposed limits, and its TOML text.

    Plugin-level limits come from all healthy runs together; a ``[profiles.<slug>]``
    (:func:`profile_names`) is proposed for every group with at least ``min_runs`` successful
    conversations, each limit in it from that group's runs alone.  A limit with fewer than
    ``min_runs`` values keeps the base value and is named in the header.  A key the
    installed config model does not know is written as a comment, never as a setting.
    """
    data: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy of plain TOML data
    pending: dict[str, list[str]] = {}
    lines = [*header]

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
        if known_key(lim.key):
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
        for lim in profile_limits:
            value, _ = propose_limit(lim, part, data, margin=margin, min_runs=min_runs)
            if value is not None:
                prof[lim.key] = value
        data.setdefault("profiles", {})[names[group]] = prof
        got = ", ".join(f"{k} = {v}" for k, v in prof.items() if k != "description")
        lines.append(f"[profiles.{names[group]}] {got or 'no limit with enough data'}")
    text = "\n".join(f"# {x}" if x else "#" for x in lines) + "\n\n" + dump_toml(data, pending)
    return data, text
