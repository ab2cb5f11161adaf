"""Shared by the budget and cap plugins: their settings base (``warn_at`` and the check of
their configurable texts), and the warn -> soft stop -> hard stop ladder.

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

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, model_validator

# check_templates is re-exported: the budget plugins import it from here
from loopwarden.plugin import PluginSettings, check_templates

__all__ = ["BudgetSettings", "Rung", "check_templates", "ladder", "percent", "warn_at_field"]

Rung = Literal["hard", "soft", "warn"] | None


def warn_at_field(description: str) -> Any:
    """The ``warn_at`` field -- default 0.8, a fraction in (0, 1], None never warns -- with a
    plugin's own description of which limit it watches and how often it warns."""
    return Field(default=0.8, gt=0, le=1, description=description)


class BudgetSettings(PluginSettings):
    """The settings every budget and cap plugin shares (cost_budget, token_budget,
    spend_limits, conversation_limits, tool_calls, timeout), defined once.

    ``warn_at`` has the same bounds and default everywhere (:func:`warn_at_field`); each
    plugin re-declares it with its own description of which limit and how often it warns.
    A subclass names its configurable texts in ``templates`` and the fields they may use in
    ``template_sample``: a text using an unknown field fails when the config loads, naming
    the key.  (The texts themselves -- ``warning``, ``stop_message`` ... -- stay in each
    plugin: their defaults and fields differ.)
    """

    #: the ``str.format`` texts to check, and a sample of every field they may use
    templates: ClassVar[tuple[str, ...]] = ()
    template_sample: ClassVar[Mapping[str, Any]] = {}

    warn_at: float | None = warn_at_field(
        "warn once when usage reaches this fraction of a limit; unset it to never warn"
    )

    @model_validator(mode="after")
    def _check_templates(self) -> BudgetSettings:
        check_templates(self, self.templates, self.template_sample)
        return self


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
