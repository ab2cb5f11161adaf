"""What a calibration measures in healthy traffic: the statistics per turn and per
conversation (:data:`METRICS`: model and tool calls, the largest batch, tokens billed and per
request, user turns, wall time), their nearest-rank percentiles, and a proposed value -- the
p99 times :data:`MARGIN`, from at least :data:`MIN_RUNS` values.

:mod:`loopwarden.traffic.calibrate` (which re-exports these names) maps them to config keys
and writes the calibrated config.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loopwarden.traffic.corpus import SUCCESS_TERMINATIONS as SUCCESS_TERMINATIONS
from loopwarden.traffic.corpus import (
    Conversation,
    Stats,
    Turn,
)

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


def _lookup(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _default_of(key: str) -> Any:
    """A plugin setting's default, from the installed settings model (None if unknown)."""
    from loopwarden.engine.pluginmanager import builtin_settings

    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "plugins":
        return None
    model = builtin_settings().get(parts[1])
    f = model.model_fields.get(parts[2]) if model is not None else None
    return f.default if f is not None else None


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
