"""cost_budget: what a run may spend, priced per model, in Decimal.

Prices are per million tokens -- ``input``, ``cached_input`` (default: ``input``) and
``output`` -- in ``currency``, keyed by model name (``[plugins.cost_budget.prices]``).  Every
response is priced with the price of the run's model (``run.model_name``: the configured one),
never by the name the server returns in ``response.model`` -- a server must not pick its own
price, and that field may hold anything.  Arithmetic is Decimal throughout: no float rounding
in money.

A run's spend is this plugin's per-run state, under the public stash key ``RUN_COST``; read
it with ``run_cost(run)`` (both in ``loopwarden.plugins.cost_budget``; ``Decimal(0)`` when
the plugin is not enabled or nothing was priced yet) -- plugins placed after ``cost_budget``
see a response's price in their ``after_response``.  The plugin fills the run record's
``cost`` (a float) and ``cost_currency`` through ``record_fields``; without it they are 0.0
and null.

Fails closed: a run whose model has no price is refused in ``on_start`` -- before any model
call, so nothing is spent -- with a hard ``max_cost`` stop (evidence ``rule =
"unpriced_model"``), unless ``unknown_model = "free"``.  The check is per run because the
model is a property of the run: a deployment serves scenario runs (the scripted model) and
live runs, and a caller may pass any model to ``Deployment.run``.  The deployment's own
configured model is checked earlier still, when it is built and by ``loopwarden config check``
(:meth:`CostBudget.check_model`): an unpriced ``[model] name`` is a config error, exit 2.

The ladder is the token budget's (see :mod:`loopwarden.plugins._budgets`): before each call the
cost of this call (its prompt estimate, uncached, plus the reserved output) and of the next one
are projected; this call not fitting stops hard, the next one not fitting makes this call the
final turn (soft), the next one passing ``warn_at`` warns once.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loopwarden import (
    ModelRequest,
    ModelResponse,
    Plugin,
    Run,
    Usage,
    Verdict,
    hookimpl,
)
from loopwarden.exceptions import ConfigError
from loopwarden.plugins._budgets import BudgetSettings, ladder, percent, warn_at_field
from loopwarden.stash import StashKey

__all__ = ["RUN_COST", "CostBudget", "CostBudgetSettings", "ModelPrice", "run_cost"]

MILLION = Decimal(1_000_000)
_ZERO = Decimal(0)

#: what a run has spent so far, in the budget's currency (``run.stash[RUN_COST]``): kept by
#: ``cost_budget``; set it only to stage a run in tests (``make_run(cost=...)`` does)
RUN_COST = StashKey[Decimal]()


def run_cost(run: Run) -> Decimal:
    """What ``run`` has spent so far as ``cost_budget`` priced it (0 without the plugin)."""
    return run.stash.get(RUN_COST, _ZERO)


class ModelPrice(BaseModel):
    """One model's prices, per million tokens, in the budget's currency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Decimal = Field(ge=0, description="price per million prompt tokens")
    cached_input: Decimal | None = Field(
        default=None,
        ge=0,
        description="price per million cached prompt tokens (default: the input price)",
    )
    output: Decimal = Field(ge=0, description="price per million completion tokens")

    def cost(self, prompt: int, completion: int, cached: int = 0) -> Decimal:
        """The price of one call's usage."""
        cached = max(0, min(cached, prompt))
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            Decimal(prompt - cached) * self.input
            + Decimal(cached) * cached_price
            + Decimal(completion) * self.output
        ) / MILLION


def _default_prices() -> dict[str, ModelPrice]:
    # USD list prices per million tokens.  "scripted" (the offline scenario player) is priced
    # like gpt-4o-mini, so demo runs show a realistic cost.
    mini = ModelPrice(input=Decimal("0.15"), cached_input=Decimal("0.075"), output=Decimal("0.60"))
    return {
        "scripted": mini,
        "gpt-4o-mini": mini,
        "gpt-4o": ModelPrice(
            input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal("10.00")
        ),
    }


_TEMPLATE_FIELDS = {
    "spent": "0.35",
    "limit": "0.50",
    "percent": 70,
    "currency": "USD",
    "model": "gpt-4o-mini",
}


class CostBudgetSettings(BudgetSettings):
    """``[plugins.cost_budget]``."""

    warn_at: float | None = warn_at_field(
        "warn once when the next call would pass this fraction of max_cost; unset it to never warn"
    )

    templates = ("warning", "stop_message", "unpriced_message")
    template_sample = _TEMPLATE_FIELDS

    max_cost: Decimal = Field(
        default=Decimal("1.00"), gt=0, description="most a run may spend, in `currency`"
    )
    currency: str = Field(
        default="USD", min_length=1, description="the currency of max_cost and of every price"
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=_default_prices,
        description="prices per model name, per million tokens: input, cached_input, output",
    )
    unknown_model: Literal["error", "free"] = Field(
        default="error",
        description='a run whose model has no price: "error" refuses it before the first '
        'call (fail closed); "free" counts its tokens at no cost',
    )
    reserve_output_tokens: int = Field(
        default=1000,
        ge=0,
        description="output tokens priced in before each call (the request's "
        "max_output_tokens when it sets one)",
    )
    warning: str = Field(
        default="This run has spent {percent}% of its cost budget ({spent} of {limit} "
        "{currency}). Plan the remaining work within it.",
        description="the warning ({spent}, {limit}, {percent}, {currency}, {model})",
    )
    stop_message: str = Field(
        default="The cost budget ({limit} {currency}) is almost used up.",
        description="why the run stops, put before the final turn's wrap-up instruction "
        "({spent}, {limit}, {percent}, {currency}, {model})",
    )

    unpriced_message: str = Field(
        default="No price is configured for model {model!r}: the run was refused because its "
        "cost could not be bounded.",
        description="why a run of an unpriced model is refused (the run's message; {model}, "
        "{currency})",
    )


@dataclass(slots=True)
class _State:
    model: str | None = None
    price: ModelPrice | None = None  # None: an unpriced model counted as free
    last_prompt: int | None = None
    in_flight: int = 0
    warned: bool = False
    currency: str | None = None  # the record's cost_currency, once the run started


def _money(value: Decimal) -> str:
    """A readable amount: at least two decimals, at most six significant places."""
    if value == 0:
        return "0.00"
    q = Decimal("0.01") if abs(value) >= 1 else Decimal("0.000001")
    text = format(value.quantize(q), "f")
    if "." in text:
        text = text.rstrip("0")
        if len(text.split(".")[1]) < 2:
            text = text + "0" * (2 - len(text.split(".")[1]))
    return text


class CostBudget(Plugin[CostBudgetSettings]):
    """Prices every call and stops a run before it passes ``max_cost`` (see the module doc)."""

    name = "cost_budget"
    Settings = CostBudgetSettings

    def new_state(self) -> _State:
        return _State()

    def price_of(self, model: str | None) -> ModelPrice | None:
        """The configured price of ``model`` (exact name, then case-insensitive), or None."""
        if model is None:
            return None
        prices = self.settings.prices
        found = prices.get(model)
        if found is None:
            folded = model.casefold()
            found = next((p for name, p in prices.items() if name.casefold() == folded), None)
        return found

    def check_model(self, model: str, *, path: str | None = None) -> None:
        """Raise ConfigError when ``model`` has no price and unpriced models are refused."""
        s = self.settings
        if s.unknown_model == "error" and self.price_of(model) is None:
            raise ConfigError(
                f"no price for model {model!r} (priced: {', '.join(sorted(s.prices))}); add "
                f'[plugins.cost_budget.prices] "{model}" = {{ input = ..., output = ... }} per '
                'million tokens, or set unknown_model = "free"',
                path=path,
                key="plugins.cost_budget.prices",
            )

    @hookimpl
    def validate_model(self, model: str, path: str | None) -> None:
        self.check_model(model, path=path)

    @hookimpl
    def on_start(self, run: Run) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        st.model = run.model_name
        st.price = self.price_of(run.model_name)
        st.currency = s.currency
        if st.price is None and s.unknown_model == "error":
            return self.stop(
                "max_cost",
                message=s.unpriced_message.format(model=run.model_name, currency=s.currency),
                rule="unpriced_model",
                model=run.model_name,
                priced_models=sorted(s.prices),
                setting="plugins.cost_budget.prices",
            )
        return None

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        prompt = request.estimated_tokens
        growth = 0 if st.last_prompt is None else max(0, prompt - st.last_prompt)
        st.last_prompt = st.in_flight = prompt
        if st.price is None:
            return None  # free (unknown_model = "free")
        reserve = request.max_output_tokens or s.reserve_output_tokens
        this_call = st.price.cost(prompt, reserve)
        next_call = st.price.cost(prompt + max(growth, reserve), reserve)
        spent = run_cost(run)
        now, after = spent + this_call, spent + this_call + next_call
        warn_level = (
            None if s.warn_at is None or st.warned else s.max_cost * Decimal(str(s.warn_at))
        )
        rung = ladder(now, after, s.max_cost, warn_level=warn_level, final=request.final)
        if rung is None:
            return None
        evidence: dict[str, Any] = dict(
            spent=spent,
            limit=s.max_cost,
            currency=s.currency,
            model=st.model,
            projected=now,
            projected_with_next=after,
            estimate=prompt,
            reserved_output=reserve,
            price=st.price.model_dump(),
        )
        if rung == "warn":
            st.warned = True
            return self.warn(self._text(s.warning, after, st), threshold=s.warn_at, **evidence)
        used = now if rung == "hard" else after
        return self.stop(
            "max_cost",
            soft=rung == "soft",
            message=self._text(s.stop_message, used, st),
            **evidence,
        )

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        price = st.price  # the configured model's, whatever the server calls itself
        usage = response.usage
        if usage is None:  # unreported: count the estimates
            completion = run.estimator(response.content or "") + sum(
                run.estimator(c.name) + run.estimator(c.arguments) for c in response.tool_calls
            )
            usage = Usage(prompt=st.in_flight, completion=completion)
        st.in_flight = 0
        if price is None:
            return None
        spent = run.stash[RUN_COST] = run_cost(run) + price.cost(
            usage.prompt, usage.completion, usage.cached
        )
        if spent >= s.max_cost and response.tool_calls:
            # Real usage passed what was priced in: no further call can be paid for.
            return self.stop(
                "max_cost",
                message=self._text(s.stop_message, spent, st),
                spent=spent,
                limit=s.max_cost,
                currency=s.currency,
                model=st.model,
                reconciled=True,
            )
        return None

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, Any]:
        st: _State = self.state(run)
        return {"cost": float(run_cost(run)), "cost_currency": st.currency}

    def _text(self, template: str, spent: Decimal, st: _State) -> str:
        s = self.settings
        return template.format(
            spent=_money(spent),
            limit=_money(s.max_cost),
            percent=percent(spent, s.max_cost),
            currency=s.currency,
            model=st.model,
        )
