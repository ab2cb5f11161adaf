"""token_budget: two token limits, reserved before each model call and reconciled after it.

``max_context``
    the size of one request: its estimated prompt (``request.estimated_tokens``) plus the
    output reserved for the answer (``request.max_output_tokens`` when set, else
    ``reserve_output_tokens``).  Stop reason ``max_context``.  Unset (the default), it is
    ``context_fraction`` of the model's context window (``[model] context_window``, else the
    table of known models, else a conservative 32,768 -- see :mod:`loopwarden.models.windows`).
``max_total_tokens``
    the run's billed tokens (``run.usage``: prompt + completion, summed over calls).  A run's
    profile (``[profiles.*] max_tokens``) overrides it.  Stop reason ``max_tokens``.

Reserve, then reconcile.  Before a call (``before_model``) the plugin projects the usage once
this call is made, and once the next one is made too -- assuming the next prompt grows by the
median of the recent growths (the reserved output counting as the first), so one large
parallel batch of results is not assumed to repeat at every step:

* this call does not fit -> **hard stop** (the best-effort answer, at once);
* this call fits, the next would not -> **soft stop**: this call becomes the final tool-less
  turn, because one final turn still fits;
* the next call would pass ``warn_at`` of a limit -> **warn** once (the note reaches the
  model in that next request).  The context carries on through a conversation, so its
  warning is given once per conversation; the per-run total's once per run.

After a call (``after_response``) the real ``usage`` is accounted; a response that reported no
usage is counted with the estimates.  If the real usage already reached ``max_total_tokens``,
the run stops at once (hard), before any proposed tool runs.

Estimates come from the deployment's estimator (``[run] token_estimator``, see
:mod:`loopwarden.models.tokens`): by default one token per CJK character and about four other
characters per token, plus a small overhead per message -- on the safe side for Chinese and
English alike.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field

from loopwarden import ModelRequest, ModelResponse, Plugin, Run, Verdict, hookimpl
from loopwarden.plugins._budgets import BudgetSettings, Rung, ladder, percent, warn_at_field

if TYPE_CHECKING:
    from loopwarden.run import DeploymentView

__all__ = ["TokenBudget", "TokenBudgetSettings"]

log = logging.getLogger("loopwarden.plugins.token_budget")
_GROWTH_WINDOW = 5

_TEMPLATE_FIELDS = {"used": 5600, "limit": 8000, "percent": 70}


class TokenBudgetSettings(BudgetSettings):
    """``[plugins.token_budget]``."""

    warn_at: float | None = warn_at_field(
        "warn once per limit when the next call would pass this fraction of it; unset it "
        "to never warn"
    )

    templates = ("context_warning", "total_warning", "context_stop_message", "total_stop_message")
    template_sample = _TEMPLATE_FIELDS

    max_context: int | None = Field(
        default=None,
        ge=1,
        description="largest request allowed, in tokens: the estimated prompt plus the output "
        "reserved for its answer; unset: context_fraction of the model's context window",
    )
    context_fraction: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="with max_context unset: the share of the model's context window "
        "([model] context_window, else the table of known models) a request may fill",
    )
    max_total_tokens: int = Field(
        default=3_398_000,
        ge=1,
        description="billed tokens (prompt + completion, all calls) allowed per run; a run "
        "profile's max_tokens overrides it",
    )
    reserve_output_tokens: int = Field(
        default=1000,
        ge=0,
        description="output tokens reserved for each answer before the call is made (the "
        "request's max_output_tokens when it sets one)",
    )
    context_warning: str = Field(
        default="The conversation is at {percent}% of its context budget ({used} of {limit} "
        "tokens). Keep tool results short and plan to finish within it.",
        description="the warning for max_context ({used}, {limit}, {percent})",
    )
    total_warning: str = Field(
        default="This run has used {percent}% of its token budget ({used} of {limit} tokens). "
        "Plan the remaining work within it.",
        description="the warning for max_total_tokens ({used}, {limit}, {percent})",
    )
    context_stop_message: str = Field(
        default="The context budget ({limit} tokens) is almost used up.",
        description="why the run stops on max_context, put before the final turn's wrap-up "
        "instruction ({used}, {limit}, {percent})",
    )
    total_stop_message: str = Field(
        default="The token budget ({limit} tokens) is almost used up.",
        description="why the run stops on max_tokens, put before the final turn's wrap-up "
        "instruction ({used}, {limit}, {percent})",
    )


@dataclass(slots=True)
class _State:
    last_prompt: int | None = None  # the previous call's estimated prompt
    growths: deque[int] = field(default_factory=lambda: deque(maxlen=_GROWTH_WINDOW))
    in_flight: int = 0  # the estimated prompt of the call being made
    unbilled: int = 0  # estimated tokens of responses that reported no usage
    warned_total: bool = False


@dataclass(slots=True)
class _ConversationState:
    warned_context: bool = False  # the context carries on: one warning per conversation


@dataclass(frozen=True, slots=True)
class _Check:
    reason: str  # "max_context" | "max_tokens"
    rung: Rung
    now: int
    after: int
    limit: int


_SEVERITY = {"hard": 0, "soft": 1, "warn": 2, None: 3}


class TokenBudget(Plugin[TokenBudgetSettings]):
    """Stops a run before it passes its context or total token budget (see the module doc)."""

    name = "token_budget"
    Settings = TokenBudgetSettings

    def __init__(self, settings: TokenBudgetSettings | None = None) -> None:
        super().__init__(settings)
        self.max_context, self.context_source = self._context_limit(None)

    def _context_limit(self, deployment: DeploymentView | None) -> tuple[int, str]:
        s = self.settings
        if s.max_context is not None:
            return s.max_context, "plugins.token_budget.max_context"
        from loopwarden.models.windows import context_window

        model = deployment.config.model if deployment is not None else None
        window, source = model.window() if model is not None else context_window(None)
        return max(1, int(window * s.context_fraction)), (
            f"{s.context_fraction:g} of the context window {window} ({source})"
        )

    def connect(self, deployment: DeploymentView) -> None:
        """Size ``max_context`` from the deployment's model (when not set explicitly)."""
        self.max_context, self.context_source = self._context_limit(deployment)
        model = deployment.config.model
        if self.settings.max_context is None and model.window()[1] == "default":
            log.warning(
                "model %r: context window unknown, assuming %d tokens (max_context %d); set "
                "[model] context_window in %s",
                model.name,
                model.window()[0],
                self.max_context,
                deployment.config.path or "the config",
            )

    def new_state(self) -> _State:
        return _State()

    def new_conversation_state(self) -> _ConversationState:
        return _ConversationState()

    @hookimpl
    def budget_limits(self, run: Run) -> dict[str, float]:
        """The ``tokens`` budget this plugin enforces for ``run`` (for the metrics)."""
        return {"tokens": self.total_limit(run)}

    def total_limit(self, run: Run) -> int:
        """The run's total-token limit: its profile's, else ``max_total_tokens``."""
        return run.limits.max_tokens or self.settings.max_total_tokens

    def spent(self, run: Run) -> int:
        """Tokens spent so far: billed usage plus estimates for unreported calls."""
        st: _State = self.state(run)
        return run.usage.total + st.unbilled

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        prompt = request.estimated_tokens
        reserve = request.max_output_tokens or s.reserve_output_tokens
        growth = 0 if st.last_prompt is None else max(0, prompt - st.last_prompt)
        growths = st.growths
        if st.last_prompt is not None:
            growths.append(growth)
        expected = _median(reserve, growths)
        this_call = prompt + reserve
        next_call = prompt + expected + reserve
        st.last_prompt = st.in_flight = prompt
        conv: _ConversationState = self.conversation_state(run)
        max_context = run.limits.max_context or self.max_context
        spent = run.usage.total + st.unbilled  # self.spent(run), with the state at hand
        total = self.total_limit(run)
        final = request.final
        warn_at = s.warn_at
        context_rung = ladder(
            this_call,
            next_call,
            max_context,
            final=final,
            warn_level=None if warn_at is None or conv.warned_context else max_context * warn_at,
        )
        total_rung = ladder(
            spent + this_call,
            spent + this_call + next_call,
            total,
            final=final,
            warn_level=None if warn_at is None or st.warned_total else total * warn_at,
        )
        if context_rung is None and total_rung is None:
            return None  # the common case: no verdict, so no evidence to build
        checks = [
            _Check("max_context", context_rung, this_call, next_call, max_context),
            _Check(
                "max_tokens",
                total_rung,
                spent + this_call,
                spent + this_call + next_call,
                total,
            ),
        ]
        worst = min(checks, key=lambda c: _SEVERITY[c.rung])  # ties: max_context first
        evidence: dict[str, Any] = dict(
            estimate=prompt,
            reserved_output=reserve,
            spent=spent,
            growth=growth,
            expected_growth=expected,
            max_context=max_context,
            context_source=f"profile {run.limits.name}"
            if run.limits.max_context
            else self.context_source,
            max_total_tokens=total,
            total_source=f"profile {run.limits.name}"
            if run.limits.max_tokens
            else "plugins.token_budget",
        )
        if worst.rung in ("hard", "soft"):
            template = (
                s.context_stop_message if worst.reason == "max_context" else s.total_stop_message
            )
            used = worst.now if worst.rung == "hard" else worst.after
            return self.stop(
                worst.reason,
                soft=worst.rung == "soft",
                message=template.format(
                    used=used, limit=worst.limit, percent=percent(used, worst.limit)
                ),
                limit=worst.limit,
                projected=worst.now,
                projected_with_next=worst.after,
                **evidence,
            )
        notes = []
        for c in checks:
            if c.rung != "warn":
                continue
            used = c.after
            if c.reason == "max_context":
                conv.warned_context = True
                template = s.context_warning
            else:
                st.warned_total = True
                template = s.total_warning
            notes.append(template.format(used=used, limit=c.limit, percent=percent(used, c.limit)))
        if notes:
            return self.warn(" ".join(notes), threshold=warn_at, **evidence)
        return None

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        st: _State = self.state(run)
        if response.usage is None:
            completion = run.estimator(response.content or "") + sum(
                run.estimator(c.name) + run.estimator(c.arguments) for c in response.tool_calls
            )
            st.unbilled += st.in_flight + completion
        st.in_flight = 0
        spent = run.usage.total + st.unbilled  # self.spent(run), with the state at hand
        total = self.total_limit(run)
        if spent >= total and response.tool_calls:
            # The real usage passed what was reserved: no further call can fit, so the
            # proposed tools are not run for a turn that could never read their results.
            return self.stop(
                "max_tokens",
                message=self.settings.total_stop_message.format(
                    used=spent, limit=total, percent=percent(spent, total)
                ),
                limit=total,
                used=spent,
                spent=spent,
                max_total_tokens=total,
                reconciled=True,
                usage_reported=response.usage is not None,
            )
        return None


def _median(prior: int, growths: deque[int]) -> int:
    """The median of ``prior`` and the recent ``growths`` (the upper one of an even count)."""
    values = sorted((prior, *growths))
    return values[len(values) // 2]
