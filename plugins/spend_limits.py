"""spend_limits: budgets shared across runs, processes and hosts -- per tenant, user, day...

Each budget names a **scope** -- ``deployment`` (every run), ``conversation``, or any key a
run carries in its ``meta`` (``tenant``, ``user``, ...: ``dep.run(..., meta={"tenant":
"acme"})``, ``loopwarden run --meta tenant=acme``) -- a **window** -- ``run``,
``conversation``, ``hour``, ``day``, ``month`` (calendar windows in ``timezone``) or
``total`` -- and limits: ``max_tokens``, ``max_cost``, ``max_runs``, ``max_model_calls``,
``max_tool_calls`` (at least one), and optionally its own ``warn_at``.  The counters live in
the deployment's store (``[store] url``: SQLite by default, Redis for many hosts), so every
process of the deployment shares them.

**Reserve before, reconcile after.**  A run counts when it starts (``on_start``: past
``max_runs`` it is refused before its first model call, and its evidence says so).  Before
each model call the projected tokens and cost of the call (prompt estimate plus the request's
``max_output_tokens`` -- ``[model] max_output_tokens``, which every request carries -- else
``reserve_output_tokens``) are *reserved* in the store atomically for every budget of the run;
after the response the reservation is replaced by the real usage.  Calls are charged through
cost_budget's own pricing (:meth:`CostBudget.run_price`, :func:`charged_usage`): the run's
configured model, never the name the server reports.  So N concurrent workers overspend a
budget by at most one reserved request each, and a reservation of a process that died (or
whose settle was lost) stops counting after ``[store] reservation_ttl_s``.  With
``max_tool_calls`` each proposed tool call is counted before it runs.  The hooks wait on the
store (and on nothing else), so the plugin declares ``blocking_io = "store"``: async runs
await those calls on the event loop, which serves other runs meanwhile.

The ladder is the budget plugins' (:mod:`loopwarden.plugins._budgets`): this call not fitting
refuses it (hard stop), the next one not fitting makes this call the final tool-less turn
(soft), the next one passing ``warn_at`` warns once per run and budget (the warning verdict
is also an alert: the alerting plugin routes ``warn`` severities to sinks that ask for them).
Stop reasons are the budget reasons (``max_runs``, ``max_model_calls``, ``max_tool_calls``,
``max_tokens``, ``max_cost``) with ``scope``, ``key``, ``window``, ``limit`` and ``spent`` in
the evidence (and ``before_first_call = true`` when the run never reached the model).  A
store that cannot be reached stops the run with ``store_unavailable``
(``on_store_error = "fail_closed"``, the default) or lets it go on unmetered
(``"fail_open"``); either way the failure is logged and noted in the run record's ``errors``.

Messages and evidence tell what was ``spent`` (committed) from what calls in progress hold
``reserved``: a budget can refuse a call at half spent when others' reservations fill the rest.

Replays (``loopwarden replay``) never charge shared budgets.  Operations: ``loopwarden
budgets [--json]`` shows what each scope spent and holds reserved per window against its
limit, ``loopwarden budgets reset SCOPE KEY`` forgets it, ``loopwarden budgets set SCOPE KEY
--max-cost N`` overrides a limit at run time for every process on the store (the store
applies it in every reserve; the evidence's ``limit_source`` says ``override``) until
``loopwarden budgets clear SCOPE KEY``; ``loopwarden budgets log`` lists who changed what.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo

from pydantic import ValidationError

from loopwarden import (
    ModelRequest,
    ModelResponse,
    Plugin,
    Run,
    RunOutcome,
    ToolCall,
    Verdict,
    hookimpl,
)
from loopwarden.config import validation_error
from loopwarden.exceptions import StoreError
from loopwarden.notes import render_note, runtime
from loopwarden.plugins._budgets import ladder, percent
from loopwarden.plugins._spend import (
    _QUANTITY,
    COST,
    RUNS,
    TOOL_CALLS,
    Budget,
    SpendLimitsSettings,
    _Applied,
    _bucket,
    _State,
    budget_reason,
)
from loopwarden.plugins.cost_budget import CostBudget, CostBudgetSettings, _money, charged_usage
from loopwarden.store import COST_UNIT, QUANTITIES, Counter, Reserved, cost_units

if TYPE_CHECKING:
    from loopwarden.run import DeploymentView

__all__ = ["Budget", "SpendLimits", "SpendLimitsSettings", "budget_reason", "configured_limits"]

log = logging.getLogger("loopwarden.plugins.spend_limits")


def _apply(applied: list[_Applied], new: _Applied) -> None:
    """Add ``new`` to the run's ``applied`` budgets -- merged into the one that counts the
    same counter (scope, key, window, bucket), so a run is counted once however many entries
    share it: each quantity's limit is the lowest the entries set, and so is ``warn_at``."""
    c = new.counter
    for i, a in enumerate(applied):
        o = a.counter
        if (o.scope, o.key, o.window, o.bucket) != (c.scope, c.key, c.window, c.bucket):
            continue
        limits = tuple(
            x if y is None else y if x is None else min(x, y)
            for x, y in zip(o.limits, c.limits, strict=True)
        )
        levels = [w for w in (a.warn_level, new.warn_level) if w is not None]
        applied[i] = _Applied(
            a.budget, dataclasses.replace(o, limits=limits), min(levels) if levels else None
        )
        return
    applied.append(new)


class SpendLimits(Plugin[SpendLimitsSettings]):
    """Budgets per scope and window, shared through the store (see the module doc)."""

    name = "spend_limits"
    Settings = SpendLimitsSettings

    def __init__(self, settings: SpendLimitsSettings | None = None) -> None:
        super().__init__(settings)
        self.zone = ZoneInfo(self.settings.timezone)
        self.wall = time.time  #: the wall clock of calendar windows (tests may replace it)
        self.pricing: CostBudget | None = None
        self.currency = "USD"

    @property
    def blocking_io(self) -> bool | Literal["store"]:
        """``"store"`` with budgets: the hooks wait on the shared store, and on nothing else,
        so async runs await those calls on the event loop
        (:func:`loopwarden.engine.drivers.blocking_io`)."""
        return "store" if self.settings.budgets else False

    def new_state(self) -> _State:
        return _State()

    def connect(self, deployment: DeploymentView) -> None:
        """Borrow the cost_budget plugin's prices (or its config table, when not enabled)."""
        pricing = deployment.plugins.get("cost_budget")
        if not isinstance(pricing, CostBudget):
            table = deployment.config.plugins.tables().get("cost_budget", {})
            try:
                pricing = CostBudget(CostBudgetSettings.model_validate(table))
            except ValidationError as exc:
                raise validation_error(
                    exc, path=deployment.config.path, prefix="plugins.cost_budget"
                ) from None
            pricing.connect(deployment)  # the same provider hint as an enabled cost_budget
        self.pricing = pricing
        self.currency = pricing.settings.currency

    # -- helpers ---------------------------------------------------------------------------

    def _key(self, scope: str, run: Run) -> str | None:
        if scope == "deployment":
            return "*"
        if scope == "conversation":
            return run.conversation.id
        value = run.meta.get(scope)
        return None if value is None or value == "" else str(value)

    def _evidence(self, a: _Applied, q: int, used: int, held: int, **extra: Any) -> dict[str, Any]:
        """The standard evidence of budget ``a``'s quantity ``q``: ``spent`` (committed),
        ``reserved`` (held by calls in progress, this one included where it was reserved),
        the ``limit`` checked and where it came from (``limit_source``: the config, or an
        operator's ``override``)."""
        quantity = QUANTITIES[q]
        limit = a.limits[q]
        ev: dict[str, Any] = dict(
            scope=a.counter.scope,
            key=a.counter.key,
            window=a.counter.window,
            bucket=a.counter.bucket,
            limit=self._value(q, limit or 0),
            spent=self._value(q, used - held),
            reserved=self._value(q, held),
            limit_source="override" if limit != a.counter.limits[q] else "config",
            quantity=quantity,
        )
        if quantity == "cost":
            ev["currency"] = self.currency
        ev.update(extra)
        return ev

    @staticmethod
    def _value(q: int, units: int) -> Any:
        return Decimal(units) * COST_UNIT if q == COST else units

    def _text(
        self, template: str, a: _Applied, q: int, used: int, held: int, level: int | None = None
    ) -> str:
        """``template`` for budget ``a``'s quantity ``q``: ``{spent}`` is what was committed,
        ``{reserved}`` what calls in progress hold, ``{percent}`` the share of the limit that
        ``level`` (default: spent plus reserved) reaches."""
        limit = a.limits[q] or 0
        show = (lambda u: _money(Decimal(u) * COST_UNIT)) if q == COST else str
        # the scope key is the caller's meta value (a tenant or user id): data, quoted
        return render_note(
            template,
            scope=runtime(a.counter.scope),
            key=a.counter.key,
            window=runtime(a.counter.window),
            quantity=runtime(_QUANTITY[QUANTITIES[q]][1]),
            spent=runtime(show(used - held)),
            reserved=runtime(show(held)),
            limit=runtime(show(limit)),
            percent=percent(used if level is None else level, limit),
        )

    @staticmethod
    def _seen(st: _State, res: Reserved) -> tuple[tuple[int, ...], ...]:
        """Note the limits the store checked (an operator's override, or the config's) on
        the run's budgets; returns the reserved part of ``res.used`` per budget."""
        for i, a in enumerate(st.applied):
            a.limits = res.limits[i] if res.limits is not None else a.counter.limits
        if res.reserved is not None:
            return res.reserved
        return tuple((0,) * len(QUANTITIES) for _ in st.applied)

    def _store_failed(self, st: _State, run: Run, exc: StoreError, what: str) -> Verdict | None:
        shared = st.shared
        if shared is not None and shared.failed(exc, what, run, self.name):
            st.shared = None  # fail open: the rest of the run is unmetered
            return None
        st.shared = None
        return self.stop(
            "store_unavailable",
            message=self.settings.unavailable_message,
            store=exc.url,
            error=str(exc),
            on_store_error="fail_closed",
        )

    def _release(self, st: _State, run: Run) -> None:
        pending, st.pending = st.pending, None
        if pending is None or st.shared is None:
            return
        try:
            st.shared.store.settle([a.counter for a in st.applied], pending[0], None)
        except StoreError as exc:
            st.shared.failed(exc, "releasing a reservation", run, self.name)

    # -- hooks -----------------------------------------------------------------------------

    @hookimpl
    def on_start(self, run: Run) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        if run.shared is None or not s.budgets:
            return None
        now = self.wall()
        for b in s.budgets:
            key = self._key(b.scope, run)
            if key is None:
                if s.missing_key == "refuse":
                    return self.stop(
                        "missing_scope_key",
                        message=render_note(
                            s.missing_message, scope=runtime(b.scope), window=runtime(b.window)
                        ),
                        rule="missing_scope_key",
                        scope=b.scope,
                        window=b.window,
                        before_first_call=True,
                    )
                continue
            bucket, ends = _bucket(b.window, now, self.zone, run)
            expires = (
                ends + s.keep_windows_s
                if ends is not None
                else (None if b.window == "total" else now + s.keep_runs_s)
            )
            warn_at = b.warn_at if b.warn_at is not None else s.warn_at
            _apply(
                st.applied,
                _Applied(b, Counter(b.scope, key, b.window, bucket, b.limits(), expires), warn_at),
            )
        if not st.applied:
            return None
        st.shared = run.shared
        st.count_tools = any(a.counter.limits[TOOL_CALLS] is not None for a in st.applied)
        pricing = self.pricing
        st.price = pricing.run_price(run)[0] if pricing is not None else None
        costed = any(a.counter.limits[COST] is not None for a in st.applied)
        if (
            st.price is None
            and costed
            and pricing is not None
            and pricing.settings.unknown_model == "warn"
        ):  # runs unpriced: its max_cost budgets cannot bind
            pricing.note_unpriced(run.model_name)
        if (
            st.price is None
            and costed
            and (pricing is None or pricing.settings.unknown_model == "error")
        ):
            return self.stop(
                "max_cost",
                message=render_note(
                    pricing.settings.unpriced_message,
                    model=run.model_name,  # the deployment's model; data all the same
                    currency=runtime(self.currency),
                )
                if pricing
                else None,
                rule="unpriced_model",
                model=run.model_name,
                before_first_call=True,
            )
        amount = (1, 0, 0, 0, 0)
        try:
            res = st.shared.store.reserve(
                [a.counter for a in st.applied], amount, token=run.run_id, ttl_s=1.0, commit=True
            )
        except StoreError as exc:
            return self._store_failed(st, run, exc, "counting a run")
        held = self._seen(st, res)
        # an operator's override may limit tool calls where the config does not
        st.count_tools = any(a.limits[TOOL_CALLS] is not None for a in st.applied)
        if res.refused is not None:
            verdict = self._refused(
                st, res.used, held, res.refused, s.refused_message, before_first_call=True
            )
            st.shared = None  # nothing more to charge: the run never calls the model
            return verdict
        st.charged[RUNS] += 1
        return self._ladder(st, res.used, held, amount, None, final=False)

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        st: _State = self.state(run)
        if st.shared is None:
            return None
        self._release(st, run)  # a reservation left by a call that never happened
        prompt = request.estimated_tokens
        growth = 0 if st.last_prompt is None else max(0, prompt - st.last_prompt)
        st.last_prompt = prompt
        out = request.max_output_tokens or self.settings.reserve_output_tokens
        next_prompt = prompt + max(growth, out)
        this_cost = cost_units(st.price.cost(prompt, out)) if st.price else 0
        next_cost = cost_units(st.price.cost(next_prompt, out)) if st.price else 0
        amount = (0, 1, 0, prompt + out, this_cost)
        following = (0, 1, 0, next_prompt + out, next_cost)
        token = f"{run.run_id}:{run.step + 1}"
        try:
            res = st.shared.store.reserve(
                [a.counter for a in st.applied],
                amount,
                token=token,
                ttl_s=st.shared.config.reservation_ttl_s,
            )
        except StoreError as exc:
            return self._store_failed(st, run, exc, "reserving a model call")
        held = self._seen(st, res)
        if res.refused is not None:
            return self._refused(
                st,
                res.used,
                held,
                res.refused,
                self.settings.stop_message,
                before_first_call=run.step == 0,
            )
        st.pending = (token, amount)
        return self._ladder(st, res.used, held, amount, following, final=request.final)

    def _ladder(
        self,
        st: _State,
        used: tuple[tuple[int, ...], ...],
        held: tuple[tuple[int, ...], ...],
        amount: tuple[int, ...],
        following: tuple[int, ...] | None,
        *,
        final: bool,
    ) -> Verdict | None:
        """The rung of a granted charge over every budget and limit: soft when the next call
        (``following``) would not fit, else warn once per budget past its ``warn_at``.
        Messages and evidence count this charge as reserved when it was (a model call's
        ``following`` is given), as spent when it was committed (a run, a tool call)."""
        s = self.settings
        warning: Verdict | None = None
        for i, a in enumerate(st.applied):
            for q, limit in enumerate(a.limits):
                if limit is None or (amount[q] == 0 and (following is None or following[q] == 0)):
                    continue
                now = used[i][q] + amount[q]
                after = now + (following[q] if following is not None else 0)
                warn_level = (
                    None
                    if a.warn_level is None or i in st.warned or warning
                    else limit * a.warn_level
                )
                if following is None:  # a run or a tool call: nothing comes "next"
                    rung = "warn" if warn_level is not None and now >= warn_level else None
                else:
                    rung = ladder(
                        now, after, limit, warn_level=warn_level, final=final or not s.soft
                    )
                # what the store holds now: this charge reserved (a model call), or committed
                h = held[i][q] + (amount[q] if following is not None else 0)
                if rung in ("soft", "hard"):  # hard: others' usage grew past the limit
                    return self.stop(
                        budget_reason(QUANTITIES[q]),
                        soft=not final,
                        message=self._text(s.stop_message, a, q, now, h),
                        **self._evidence(a, q, now, h, projected=self._value(q, after)),
                    )
                if rung == "warn":
                    st.warned.add(i)
                    warning = self.warn(
                        self._text(s.warning, a, q, now, h, level=after),
                        **self._evidence(
                            a,
                            q,
                            now,
                            h,
                            threshold=a.warn_level,
                            projected=self._value(q, after),
                        ),
                    )
        return warning

    def _refused(
        self,
        st: _State,
        used: tuple[tuple[int, ...], ...],
        held: tuple[tuple[int, ...], ...],
        refused: tuple[int, int],
        template: str,
        *,
        soft: bool = False,
        **extra: Any,
    ) -> Verdict:
        i, q = refused
        a = st.applied[i]
        return self.stop(
            budget_reason(QUANTITIES[q]),
            soft=soft,
            message=self._text(template, a, q, used[i][q], held[i][q]),
            **self._evidence(a, q, used[i][q], held[i][q], **extra),
        )

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        st: _State = self.state(run)
        pending, st.pending = st.pending, None
        if st.shared is None or pending is None:
            return None
        # charged as cost_budget charges the run: the same usage (reported, else estimated
        # from this call's prompt estimate) at the price of the run's configured model --
        # never of the name the server reports in response.model
        usage = charged_usage(run, response, st.last_prompt or 0)
        price = st.price
        cost = cost_units(price.cost(usage.prompt, usage.completion, usage.cached)) if price else 0
        tools = 0 if st.count_tools else len(response.tool_calls)
        actual = (0, 1, tools, usage.total, cost)
        try:
            st.shared.store.settle([a.counter for a in st.applied], pending[0], actual)
        except StoreError as exc:
            verdict = self._store_failed(st, run, exc, "recording a model call")
            # the call is paid for: an answer is never withheld, only further calls refused
            return verdict if response.tool_calls else None
        for q, v in enumerate(actual):
            st.charged[q] += v
        return None

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        st: _State = self.state(run)
        if st.shared is None or not st.count_tools:
            return None
        amount = (0, 0, 1, 0, 0)
        try:
            res = st.shared.store.reserve(
                [a.counter for a in st.applied],
                amount,
                token=f"{run.run_id}:{call.id}",
                ttl_s=1.0,
                commit=True,
            )
        except StoreError as exc:
            return self._store_failed(st, run, exc, "counting a tool call")
        held = self._seen(st, res)
        if res.refused is not None:
            # soft: one last tool-less turn to answer from what is known
            return self._refused(
                st,
                res.used,
                held,
                res.refused,
                self.settings.stop_message,
                soft=self.settings.soft,
                tool=call.name,
            )
        st.charged[TOOL_CALLS] += 1
        return self._ladder(st, res.used, held, amount, None, final=False)

    @hookimpl
    def on_stop(self, run: Run, outcome: RunOutcome) -> None:
        st: _State = self.state(run)
        self._release(st, run)

    # -- for observers -----------------------------------------------------------------------

    def charged(self, run: Run) -> list[dict[str, Any]]:
        """What ``run`` charged to each of its budgets: ``scope``, ``window`` and the amounts
        (``cost`` in the currency) -- the metrics plugin's ``scope_spend_total``."""
        st: _State | None = run.state.get(self.name)
        if st is None or not st.applied:
            return []
        amounts = {
            q: self._value(i, v)
            for i, (q, v) in enumerate(zip(QUANTITIES, st.charged, strict=True))
        }
        return [
            {"scope": a.counter.scope, "window": a.counter.window, **amounts} for a in st.applied
        ]


def configured_limits(table: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """(scope, window) -> the limits a ``[plugins.spend_limits]`` table's budgets set (the
    lowest, where several budgets share a scope and window): what ``loopwarden budgets`` and
    the console show beside the spend.  An absent table sets none."""
    from loopwarden.store import QUANTITIES

    if table is None:
        return {}
    settings = SpendLimitsSettings.model_validate(table)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for b in settings.budgets:
        limits = out.setdefault((b.scope, b.window), {})
        for q in QUANTITIES:
            value = getattr(b, budget_reason(q))
            if value is not None:
                value = float(value) if isinstance(value, Decimal) else value
                limits[q] = min(value, limits.get(q, value))
    return out
