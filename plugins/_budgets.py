"""Shared by the budget and cap plugins: the warn -> soft stop -> hard stop ladder, and
template checks for their configurable texts.

A budget is checked *before* the spend (reserve), and accounted after it (reconcile).  Before
a model call the plugin knows two projections:

``now``
    the usage once this call is made, with its output reserved;
``after``
    the usage once the *next* call is made as well.

:func:`ladder` turns them into one rung: ``hard`` when even this call does not fit (nothing
more may be spent), ``soft`` when this call fits but the next would not (so this call becomes
the final tool-less turn: one final turn still fits), ``warn`` when the next call would pass
the warning threshold (the warning reaches the model in that next request), else None.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal, TypeVar

__all__ = ["Rung", "check_templates", "ladder", "percent"]

# re-exported: the budget plugins import it from here
from loopwarden.plugin import check_templates

Rung = Literal["hard", "soft", "warn"] | None

N = TypeVar("N", int, float, Decimal)


def ladder(now: N, after: N, limit: N, *, warn_level: N | None, final: bool) -> Rung:
    """The rung for a call whose projected usage is ``now`` (this call) and ``after`` (this
    and the next).  ``final`` is True when the call is already a soft stop's final turn: it
    can then only be refused (hard), never made final again."""
    if now > limit:
        return "hard"
    if not final and after > limit:
        return "soft"
    if warn_level is not None and not final and after >= warn_level:
        return "warn"
    return None


def percent(used: float | Decimal, limit: float | Decimal) -> int:
    """``used`` as a whole percentage of ``limit`` (for messages)."""
    if not limit:
        return 100
    return int(Decimal(str(used)) * 100 / Decimal(str(limit)))
