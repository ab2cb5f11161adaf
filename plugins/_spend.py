"""The spend_limits plugin's tables and window arithmetic: budgets, settings, per-run state.

Split from :mod:`loopwarden.plugins.spend_limits` (which re-exports :class:`Budget`,
:class:`SpendLimitsSettings` and :func:`budget_reason`): that module holds the plugin -- what
it reserves, settles and refuses at each hook; this one holds what it is configured with and
counts in -- the ``budgets`` table, the quantities and their stop reasons, the run's applied
budgets, and which bucket of a calendar window a moment falls in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ConfigDict, Field, PositiveInt, field_validator, model_validator

from loopwarden.plugin import PositiveSeconds, TypedTable
from loopwarden.plugins._budgets import BudgetSettings, check_templates, warn_at_field
from loopwarden.store import QUANTITIES, Counter, cost_units

if TYPE_CHECKING:
    from loopwarden import Run
    from loopwarden.plugins.cost_budget import Price
    from loopwarden.store import Shared

__all__ = [
    "COST",
    "MODEL_CALLS",
    "RUNS",
    "TOKENS",
    "TOOL_CALLS",
    "Budget",
    "SpendLimitsSettings",
    "Window",
    "budget_reason",
]

Window = Literal["run", "conversation", "hour", "day", "month", "total"]

#: quantity -> (stop reason, the Budget field that limits it, how messages name it)
_QUANTITY = {
    "runs": ("max_runs", "runs"),
    "model_calls": ("max_model_calls", "model calls"),
    "tool_calls": ("max_tool_calls", "tool calls"),
    "tokens": ("max_tokens", "tokens"),
    "cost": ("max_cost", "cost"),
}
RUNS, MODEL_CALLS, TOOL_CALLS, TOKENS, COST = range(len(QUANTITIES))


def budget_reason(quantity: str) -> str:
    """The stop reason for a budget of ``quantity`` (``"cost"`` -> ``"max_cost"``)."""
    return _QUANTITY[quantity][0]


class Budget(TypedTable):
    """One shared budget: a scope, a window and at least one limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: str = Field(
        min_length=1,
        description='"deployment", "conversation", or a meta key ("tenant", "user", ...)',
    )
    window: Window = Field(description='"run", "conversation", "hour", "day", "month" or "total"')
    max_tokens: PositiveInt | None = Field(default=None, description="tokens (prompt + completion)")
    max_cost: Decimal | None = Field(
        default=None, gt=0, description="cost, in the cost_budget plugin's currency"
    )
    max_runs: PositiveInt | None = Field(default=None, description="runs started")
    max_model_calls: PositiveInt | None = Field(default=None, description="model calls")
    max_tool_calls: PositiveInt | None = Field(default=None, description="tool calls proposed")
    warn_at: float | None = Field(
        default=None, gt=0, le=1, description="overrides the plugin's warn_at for this budget"
    )

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if all(getattr(self, budget_reason(q)) is None for q in QUANTITIES):
            raise ValueError(
                "a budget needs at least one of " + ", ".join(budget_reason(q) for q in QUANTITIES)
            )
        return self

    def limits(self) -> tuple[int | None, ...]:
        """The limits in the store's units, in :data:`loopwarden.store.QUANTITIES` order."""
        out: list[int | None] = []
        for q in QUANTITIES:
            value = getattr(self, budget_reason(q))
            out.append(
                None if value is None else (cost_units(value) if q == "cost" else int(value))
            )
        return tuple(out)


_TEMPLATE_FIELDS = {
    "scope": "tenant",
    "key": "acme",
    "window": "day",
    "quantity": "cost",
    "spent": "35.00",
    "reserved": "2.00",
    "limit": "50.00",
    "percent": 74,
}


class SpendLimitsSettings(BudgetSettings):
    """``[plugins.spend_limits]``."""

    warn_at: float | None = warn_at_field(
        "warn once per run and budget when the next call would pass this fraction of a "
        "limit; unset it to never warn"
    )

    templates = ("warning", "stop_message", "refused_message")
    template_sample = _TEMPLATE_FIELDS

    budgets: list[Budget] = Field(
        default_factory=list,
        description='the budgets: [{ scope = "tenant", window = "day", max_cost = 50.0 }, ...]',
    )
    timezone: str = Field(
        default="UTC",
        description="the time zone of the hour, day and "
        'month windows (an IANA name: "Asia/Shanghai")',
    )
    missing_key: Literal["skip", "refuse"] = Field(
        default="skip",
        description='a run without the scope\'s meta key: "skip" the budget, '
        'or "refuse" the run (stop reason missing_scope_key)',
    )
    reserve_output_tokens: int = Field(
        default=1000,
        ge=0,
        description="output tokens reserved per call when the request sets no "
        "max_output_tokens ([model] max_output_tokens sets it on every request)",
    )
    soft: bool = Field(
        default=True,
        description="a budget that the next call would pass "
        "makes this call the final tool-less turn (false: stop at once)",
    )
    keep_windows_s: PositiveSeconds = Field(
        default=35 * 86400.0,
        description="how long the counters of a past hour / day / month stay listed",
    )
    keep_runs_s: PositiveSeconds = Field(
        default=86400.0,
        description="how long the counters of "
        "run and conversation windows stay after their last use",
    )
    warning: str = Field(
        default="The {window} budget of this {scope} will be at {percent}% after the next call "
        "({quantity}: {spent} spent, {reserved} reserved by calls in progress, limit {limit}). "
        "Plan the remaining work within it.",
        description="the warning ({scope}, {key}, {window}, {quantity}, {spent}: committed, "
        "{reserved}: held by calls in progress, {limit}, {percent}: of the limit after the "
        "next call)",
    )
    stop_message: str = Field(
        default="The {window} budget of this {scope} has no room for another call "
        "({quantity}: {spent} spent, {reserved} reserved by calls in progress, limit {limit}).",
        description="why the run stops (same fields; {percent}: spent and reserved, of the limit)",
    )
    refused_message: str = Field(
        default="This run was refused before its first model call: the {window} budget of this "
        "{scope} has no room ({quantity}: {spent} spent, {reserved} reserved by calls in "
        "progress, limit {limit}).",
        description="why a run is refused at its start (same fields)",
    )
    missing_message: str = Field(
        default="This run was refused: it carries no {scope!r} in its meta, which a budget needs.",
        description='why a run without the scope\'s key is refused ("refuse"; {scope}, {window})',
    )
    unavailable_message: str = Field(
        default="The shared budget store cannot be reached, so this run's spending cannot be "
        "bounded; it was stopped.",
        description="why a run stops when the store fails closed",
    )

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {v!r}: {exc}") from None
        return v

    @model_validator(mode="after")
    def _check(self) -> SpendLimitsSettings:
        check_templates(self, ("missing_message",), {"scope": "tenant", "window": "day"})
        return self


@dataclass(slots=True)
class _Applied:
    """One budget as it applies to this run: its counter in the store."""

    budget: Budget
    counter: Counter
    warn_level: float | None
    #: the limits the store checked last (an operator's override, else the counter's own)
    limits: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.limits:
            self.limits = self.counter.limits


@dataclass(slots=True)
class _State:
    shared: Shared | None = None  # None: inert (a replay, or the store failed open)
    applied: list[_Applied] = field(default_factory=list)
    price: Price | None = None
    count_tools: bool = False  # a budget limits tool calls: count each before it runs
    pending: tuple[str, tuple[int, ...]] | None = None  # reservation token, amount
    last_prompt: int | None = None
    warned: set[int] = field(default_factory=set)
    #: what this run charged (QUANTITIES order), for metrics
    charged: list[int] = field(default_factory=lambda: [0] * len(QUANTITIES))


def _bucket(window: str, now: float, tz: ZoneInfo, run: Run) -> tuple[str, float | None]:
    """The window's bucket label and when it ends (wall-clock seconds; None: never)."""
    if window == "run":
        return run.run_id, None
    if window == "conversation":
        return run.conversation.id, None
    if window == "total":
        return "total", None
    local = datetime.fromtimestamp(now, tz)
    if window == "hour":
        start = local.replace(minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%dT%H%z"), start.timestamp() + 3600
    day = local.date()
    if window == "day":
        end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tz)
        return day.isoformat(), end.timestamp()
    nxt = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
    end = datetime.combine(nxt, datetime.min.time(), tz)
    return day.strftime("%Y-%m"), end.timestamp()
