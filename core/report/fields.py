"""How :mod:`loopwarden.report` reads one run record: numbers and repeated calls.

Run records come from many versions and plugins, so every field is read tolerantly: a number
that is missing or not a number counts as 0, and call signatures are found wherever the
standard evidence keys (docs/contracts.md) name them, or in a recorded ``trajectory``.  Kept
apart from the analysis so that what a record *says* is defined in one place, and the
aggregation and advice in :mod:`loopwarden.report` read as plain counting.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

QUANTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in QUANTILES}
    out["max"] = max(values) if values else None
    out["mean"] = sum(values) / len(values) if values else None
    return out


def _num(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _unpriced(record: Mapping[str, Any]) -> bool:
    """The run's model had no price (``cost_known: false``, cost_budget 0.3): its ``cost`` is
    not what it cost.  Records without the field (older, or no cost_budget) count as priced."""
    return record.get("cost_known") is False


#: which built-in measures a run-record field that stays at its default without it
MEASURED_BY: dict[str, str] = {
    "cost": "cost_budget",
    "duplicate_calls": "repeat_call",
    "oscillation_hits": "oscillation",
    "stall_rounds": "stall",
}


def _unmeasured(record: Mapping[str, Any], name: str) -> bool:
    """The record says no plugin measured ``name`` (its ``unmeasured`` list): its value is a
    default, not a count.  Records without the list (older ones) count as measured."""
    listed = record.get("unmeasured")
    return isinstance(listed, list) and name in listed


def _tokens(record: Mapping[str, Any]) -> float:
    t = record.get("tokens")
    if isinstance(t, Mapping):
        if "total" in t:
            return _num(t.get("total"))
        return _num(t.get("prompt")) + _num(t.get("completion"))
    return _num(t)


# ---------------------------------------------------------------------------------------------
# Repeated signatures
# ---------------------------------------------------------------------------------------------

# The standard evidence keys (docs/contracts.md) are the only ones read: ``count`` (how many
# times), ``fingerprint`` / ``signature`` / ``tool`` (the call involved) and ``signatures``
# (several calls, e.g. an oscillation's cycle).

Found = tuple[str, str, str | None, int]  # key, label, tool, count


def _tool_of(signature: str) -> str | None:
    for sep in (":", "("):
        if sep in signature:
            return signature.split(sep, 1)[0] or None
    return None


def _count_of(value: Mapping[str, Any]) -> int:
    raw = value.get("count")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw >= 1:
        return int(raw)
    return 1


def _evidence_signatures(value: Any, depth: int = 0) -> Iterator[Found]:
    """(key, label, tool, count) for every call signature named in ``value``.

    A mapping with ``fingerprint`` (the stable key) and/or ``signature`` (readable) names one
    call; a ``signatures`` list names several.
    """
    if depth > 4:
        return
    if isinstance(value, Mapping):
        fp, sg = value.get("fingerprint"), value.get("signature")
        key = fp if isinstance(fp, str) and fp else sg if isinstance(sg, str) and sg else None
        if key is not None:
            label = sg if isinstance(sg, str) and sg else key
            tool = value.get("tool")
            yield key, label, tool if isinstance(tool, str) else _tool_of(key), _count_of(value)
            return
        items = value.get("signatures")
        if isinstance(items, list) and items and all(isinstance(i, str) for i in items):
            count = _count_of(value)
            for item in dict.fromkeys(items):
                yield item, item, _tool_of(item), count
            return
        for v in value.values():
            yield from _evidence_signatures(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _evidence_signatures(v, depth + 1)


def _evidence_tools(value: Any, depth: int = 0) -> Iterator[str]:
    """Every ``tool`` named anywhere in ``value`` (e.g. a failure streak's failures)."""
    if depth > 4:
        return
    if isinstance(value, Mapping):
        tool = value.get("tool")
        if isinstance(tool, str) and tool:
            yield tool
        for v in value.values():
            yield from _evidence_tools(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _evidence_tools(v, depth + 1)


def _trajectory_signatures(trajectory: Any) -> Iterator[Found]:
    """Calls repeated with the same arguments within one recorded trajectory."""
    if not isinstance(trajectory, list):
        return
    seen: Counter[tuple[str, str]] = Counter()
    for step in trajectory:
        if not isinstance(step, Mapping):
            continue
        for call in step.get("tool_calls") or ():
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                continue
            args = call.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(ValueError):
                    args = json.loads(args)
            canon = json.dumps(args, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            seen[(call["name"], canon)] += 1
    for (name, canon), n in seen.items():
        if n > 1:
            sig = f"{name}({canon})"
            yield sig, sig, name, n
