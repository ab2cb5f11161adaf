"""cost_budget: what a run may spend, priced per model, in Decimal.

A model's price comes from ``[plugins.cost_budget.prices]`` -- per million tokens, ``input``,
``cached_input`` (default: ``input``) and ``output``, in ``currency``, keyed by model name --
and otherwise from the maintained ``genai-prices`` package (:mod:`loopwarden.models.catalog`:
offline, imported only when a model is not in the table; USD, so only when ``currency`` is
``"USD"``; ``[model] base_url`` helps it pick the provider).  The table wins: it is where an
operator overrides a price, and where the offline ``scripted`` model gets one.  Every response
is priced with the price of the run's model (``run.model_name``: the configured one), never by
the name the server returns in ``response.model`` -- a server must not pick its own price, and
that field may hold anything.  Arithmetic is Decimal throughout: no float rounding in money.

A run's spend is this plugin's per-run state, under the public stash key ``RUN_COST``; read
it with ``run_cost(run)`` (both in ``loopwarden.plugins.cost_budget``; ``Decimal(0)`` when
the plugin is not enabled or nothing was priced yet) -- plugins placed after ``cost_budget``
see a response's price in their ``after_response``.  The plugin fills the run record's
``cost`` (a float) and ``cost_currency`` through ``record_fields``; without it they are 0.0
and null.  It also adds ``cost_known`` (false: the model had no price, so ``cost`` is not what
the run cost) and ``cost_source`` (``"prices"``, ``"genai-prices"``, ``"free"`` or null).

A model nobody prices (a local vLLM model, a new release) follows ``unknown_model``:

* ``"warn"`` (default) -- the run goes on unpriced: a WARNING is logged once per model (at
  start-up through the ``validate_model`` hook, else at its first run) naming ``[model]`` and
  ``[plugins.cost_budget.prices]``; its record says ``cost_known: false``.  ``max_cost``
  cannot be enforced for it, so it never stops it; token budgets still apply.
* ``"error"`` -- fail closed: the deployment's model is a config error at start-up
  (:meth:`CostBudget.check_model`: ``loopwarden run``, ``config check`` and the framework
  adapters, exit 2), and a run of any other unpriced model is refused in ``on_start`` -- before
  any model call -- with a hard ``max_cost`` stop (evidence ``rule = "unpriced_model"``).
* ``"free"`` -- the operator declares such models free (self-hosted): counted at no cost,
  ``cost_known: true``, no note.

The ladder is the token budget's (see :mod:`loopwarden.plugins._budgets`): before each call the
cost of this call (its prompt estimate, uncached, plus the reserved output) and of the next one
are projected; this call not fitting stops hard, the next one not fitting makes this call the
final turn (soft), the next one passing ``warn_at`` warns once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, Protocol

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
from loopwarden.notes import render_note, runtime
from loopwarden.plugins._budgets import BudgetSettings, ladder, percent, warn_at_field

# what a run has spent so far, in the budget's currency (``run.stash[RUN_COST]``): kept by
# ``cost_budget``; set it only to stage a run in tests (``make_run(cost=...)`` does).  The key
# is defined beside the run, whose deprecated ``Run.cost`` alias reads it.
from loopwarden.run import RUN_COST

if TYPE_CHECKING:
    from loopwarden.run import DeploymentView

__all__ = [
    "RUN_COST",
    "CostBudget",
    "CostBudgetSettings",
    "ModelPrice",
    "Price",
    "charged_usage",
    "run_cost",
    "unpriced_note",
]

log = logging.getLogger("loopwarden.plugins.cost_budget")

MILLION = Decimal(1_000_000)
_ZERO = Decimal(0)


def run_cost(run: Run) -> Decimal:
    """What ``run`` has spent so far as ``cost_budget`` priced it (0 without the plugin)."""
    return run.stash.get(RUN_COST, _ZERO)


def charged_usage(run: Run, response: ModelResponse, prompt: int) -> Usage:
    """The usage a response is charged for: what the server reported, else estimates (the
    request's prompt estimate ``prompt``, the answer and proposed calls as text) -- shared by
    cost_budget and spend_limits, so a run and its tenant are charged alike."""
    if response.usage is not None:
        return response.usage
    completion = run.estimator(response.content or "") + sum(
        run.estimator(c.name) + run.estimator(c.arguments) for c in response.tool_calls
    )
    return Usage(prompt=prompt, completion=completion)


def unpriced_note(deployment: DeploymentView, model: str) -> str | None:
    """The start-up note for ``model`` when ``deployment``'s cost_budget will run it
    unpriced (``unknown_model = "warn"``), else None: what the command line prints."""
    plugin = deployment.plugins.get("cost_budget")
    if not isinstance(plugin, CostBudget) or plugin.settings.unknown_model != "warn":
        return None
    if plugin.price_of(model) is not None:
        return None
    return plugin.unpriced_note(model, deployment.config.path)


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
        # max(0, min(cached, prompt)) as conditions: priced up to three times a step
        if cached > prompt:
            cached = prompt
        if cached < 0:
            cached = 0
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            Decimal(prompt - cached) * self.input
            + Decimal(cached) * cached_price
            + Decimal(completion) * self.output
        ) / MILLION

    def describe(self) -> dict[str, Any]:
        """What a verdict's evidence says about this price."""
        return self.model_dump()


class Price(Protocol):
    """A model's price: a configured :class:`ModelPrice`, or the genai-prices package's
    (:class:`loopwarden.models.catalog.PackagePrice`)."""

    def cost(self, prompt: int, completion: int, cached: int = 0) -> Decimal:
        """The price of one call's usage."""

    def describe(self) -> dict[str, Any]:
        """What a verdict's evidence says about this price."""


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

    # p99 of healthy coding-agent runs at list prices is 5.68 USD (config.toml says more): x1.25
    max_cost: Decimal = Field(
        default=Decimal("7.10"), gt=0, description="most a run may spend, in `currency`"
    )
    currency: str = Field(
        default="USD", min_length=1, description="the currency of max_cost and of every price"
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=_default_prices,
        description="prices per model name, per million tokens: input, cached_input, output",
    )
    unknown_model: Literal["warn", "error", "free"] = Field(
        default="warn",
        description='a model with no price (neither in prices nor in genai-prices): "warn" '
        "runs it unpriced (a start-up warning; the record says cost_known: false; max_cost "
        'cannot stop it); "error" refuses it (a config error at start-up, else a stop before '
        'the first call); "free" counts its tokens at no cost',
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
    price: Price | None = None  # None: unpriced (counted as free)
    source: str | None = None  # the record's cost_source
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

    def __init__(self, settings: CostBudgetSettings | None = None) -> None:
        super().__init__(settings)
        #: ``[model] base_url`` of the deployment: helps genai-prices pick the provider
        self.base_url: str | None = None
        self.config_path: str | None = None
        self._noted: set[str] = set()  # models whose "unpriced" note was logged
        self._noted_lock = threading.Lock()

    def connect(self, deployment: DeploymentView) -> None:
        """Remember the deployment's ``[model] base_url`` (a provider hint for prices)."""
        self.base_url = deployment.config.model.base_url
        self.config_path = deployment.config.path

    def new_state(self) -> _State:
        return _State()

    def configured_price(self, model: str | None) -> ModelPrice | None:
        """The price ``[plugins.cost_budget.prices]`` gives ``model`` (exact name, then
        case-insensitive), or None."""
        if model is None:
            return None
        prices = self.settings.prices
        found = prices.get(model)
        if found is None:
            folded = model.casefold()
            found = next((p for name, p in prices.items() if name.casefold() == folded), None)
        return found

    def priced(self, model: str | None) -> tuple[Price | None, str | None]:
        """``model``'s price and its source: the configured table (``"prices"``), else the
        genai-prices package (``"genai-prices"``, only in USD), else ``(None, None)``."""
        found = self.configured_price(model)
        if found is not None:
            return found, "prices"
        if model is None or self.settings.currency != "USD":
            return None, None
        from loopwarden.models.catalog import package_price

        package = package_price(model, self.base_url)
        return (package, "genai-prices") if package is not None else (None, None)

    def price_of(self, model: str | None) -> Price | None:
        """``model``'s price (see :meth:`priced`), or None when nobody prices it."""
        return self.priced(model)[0]

    def run_price(self, run: Run) -> tuple[Price | None, str | None]:
        """The price every call of ``run`` is charged at, and its source: the price of the
        run's configured model (``run.model_name``) -- never of the name a server returns in
        ``response.model`` (a server must not pick its own price).  ``"free"`` is the source
        of an unpriced model under ``unknown_model = "free"``.  cost_budget and spend_limits
        both charge through it."""
        price, source = self.priced(run.model_name)
        if price is None and self.settings.unknown_model == "free":
            source = "free"
        return price, source

    def check_model(self, model: str, *, path: str | None = None) -> None:
        """At start-up: raise ConfigError for an unpriced model when ``unknown_model =
        "error"``; log the unpriced-model note when it is ``"warn"``."""
        s = self.settings
        if s.unknown_model == "free" or self.price_of(model) is not None:
            return
        if s.unknown_model == "error":
            raise ConfigError(
                f"no price for model {model!r} (not in genai-prices; configured: "
                f"{', '.join(sorted(s.prices))}); add [plugins.cost_budget.prices] "
                f'"{model}" = {{ input = ..., output = ... }} per million tokens in '
                f'{s.currency}, or set unknown_model = "warn" (run unpriced) or "free"',
                path=path,
                key="plugins.cost_budget.prices",
            )
        self.note_unpriced(model, path)

    def unpriced_note(self, model: str | None, path: str | None = None) -> str:
        """The start-up note for a model that runs unpriced (``unknown_model = "warn"``)."""
        where = f" in {path}" if path else ""
        return (
            f"model {model!r} has no known price: its runs are not priced (record cost_known: "
            f"false) and max_cost cannot stop them; declare its price in "
            f"[plugins.cost_budget.prices]{where} (or use a model name genai-prices knows in "
            f'[model]), or set unknown_model = "free" or "error"'
        )

    def note_unpriced(self, model: str | None, path: str | None = None) -> None:
        """Log :meth:`unpriced_note` as a WARNING, once per model and deployment."""
        key = model or ""
        with self._noted_lock:
            if key in self._noted:
                return
            if len(self._noted) >= 1024:  # bounded: many model names, a note each at most
                self._noted.clear()
            self._noted.add(key)
        log.warning("%s", self.unpriced_note(model, path or self.config_path))

    @hookimpl
    def validate_model(self, model: str, path: str | None) -> None:
        self.check_model(model, path=path)

    @hookimpl
    def on_start(self, run: Run) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        st.model = run.model_name
        st.price, st.source = self.run_price(run)
        st.currency = s.currency
        if st.price is None and s.unknown_model == "warn":
            self.note_unpriced(run.model_name)
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
        last = st.last_prompt
        growth = 0 if last is None or prompt <= last else prompt - last
        st.last_prompt = st.in_flight = prompt
        if st.price is None:
            return None  # unpriced: max_cost cannot be enforced (unknown_model warn / free)
        reserve = request.max_output_tokens or s.reserve_output_tokens
        this_call = st.price.cost(prompt, reserve)
        next_call = st.price.cost(prompt + (growth if growth > reserve else reserve), reserve)
        spent = run.stash.get(RUN_COST, _ZERO)  # run_cost(run)
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
            price=st.price.describe(),
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
        usage = charged_usage(run, response, st.in_flight)
        st.in_flight = 0
        if price is None:
            return None
        spent = run.stash[RUN_COST] = run.stash.get(RUN_COST, _ZERO) + price.cost(
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
        return {
            "cost": float(run_cost(run)),
            "cost_currency": st.currency,
            # false: nobody priced the run's model -- its cost (0.0) is unknown, not zero
            "cost_known": st.source is not None,
            "cost_source": st.source,
        }

    def _text(self, template: str, spent: Decimal, st: _State) -> str:
        s = self.settings
        return render_note(
            template,
            spent=runtime(_money(spent)),
            limit=runtime(_money(s.max_cost)),
            percent=percent(spent, s.max_cost),
            currency=runtime(s.currency),
            model=st.model,  # the name a server reported: data
        )
