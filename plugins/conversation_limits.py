"""conversation_limits: limits on a whole conversation, not one run.

Per-run limits start afresh with every user message, so a conversation of many short turns
is never stopped by them: 30 turns can spend 34k tokens against a 3k per-run budget.  This
line counts across the runs of one :class:`~loopwarden.Conversation` (one run per user
message):

``max_turns``
    user turns (runs); the run of the turn past the limit is refused before its first model
    call.  Stop reason ``max_turns``.
``max_idle_turns``
    user turns in a row in which the agent called no tool: a conversation that goes round in
    circles of talk (asking for the same details again and again) while nothing is done.  The
    run past the limit is refused.  Stop reason ``max_turns`` (``rule = "idle_turns"``).
``max_loop_stops``
    runs of the conversation that a loop or failure guard stopped (``repeat_call``, ``stall``,
    ``oscillation``, ``no_progress``, ``failure_streak``): an agent that goes back to the
    same failing approach after every user message is not helped by another turn.  The run
    after the limit is refused (stop reason ``max_turns``, ``rule = "loop_stops"``) -- hand
    the conversation to a person.
``max_model_calls``
    model calls, as ``max_steps`` counts them: the call that reaches the limit is the soft
    stop's final tool-less turn, a call past it is refused.  Stop reason ``max_steps``.
``max_tool_calls``
    tool calls proposed and not skipped; the call past the limit is not run and the run
    stops (soft).  Stop reason ``max_tool_calls``.
``max_tokens``
    billed tokens, reserved before each model call as ``token_budget`` does (this call's
    estimated prompt plus reserved output; a soft stop when the next call would not fit).
    Stop reason ``max_tokens``.
``max_cost``
    the runs' cost (kept by ``cost_budget``, read with
    :func:`loopwarden.plugins.cost_budget.run_cost`; it must be enabled and come earlier);
    checked before each model call.  Stop reason ``max_cost``.

Every stop carries ``scope = "conversation"``, ``window``, ``key`` (the conversation id),
``limit`` and ``spent`` in its evidence.  ``warn_at`` warns once per conversation and limit,
never once per turn.  A limit left unset is not checked.  The defaults are derived from
real recorded conversations (see ``docs/defaults.md``): far above any healthy one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pydantic import Field

from loopwarden import (
    ModelRequest,
    Plugin,
    Run,
    RunOutcome,
    ToolCall,
    Verdict,
    hookimpl,
)
from loopwarden.notes import render_note, runtime
from loopwarden.plugins._budgets import BudgetSettings, ladder, percent, warn_at_field
from loopwarden.plugins.cost_budget import RUN_COST, run_cost
from loopwarden.reasons import FAILURE_REASONS, LOOP_REASONS

__all__ = ["ConversationLimits", "ConversationLimitsSettings"]

_LOOPS = frozenset((*LOOP_REASONS, *FAILURE_REASONS))
_NO_COST = Decimal(0)  # run_cost's answer for a run that cost_budget has not priced
_TEMPLATE_FIELDS = {"what": "model calls", "used": 60, "limit": 80, "percent": 75}


class ConversationLimitsSettings(BudgetSettings):
    """``[plugins.conversation_limits]``."""

    warn_at: float | None = warn_at_field(
        "warn once per conversation when a limit reaches this fraction; unset: never"
    )

    templates = ("warning", "stop_message")
    template_sample = _TEMPLATE_FIELDS

    max_turns: int | None = Field(
        default=40,
        ge=1,
        description="user turns (runs) per conversation; the run past it is refused (max_turns)",
    )
    max_idle_turns: int | None = Field(
        default=20,
        ge=1,
        description="user turns in a row "
        "without a tool call; the run past it is refused "
        "(max_turns, rule idle_turns)",
    )
    max_loop_stops: int | None = Field(
        default=3,
        ge=1,
        description="runs stopped by a loop "
        "or failure guard per conversation; the run after "
        "them is refused (max_turns, rule loop_stops)",
    )
    max_model_calls: int | None = Field(
        default=165,
        ge=1,
        description="model calls per conversation, the final wrap-up turn included",
    )
    max_tool_calls: int | None = Field(
        default=None,
        ge=1,
        description="tool calls per conversation; unset (the default): max_model_calls x "
        "tool_calls.max_per_turn bounds them (an agent that fans out makes many calls per "
        "turn: docs/defaults.md, 'Fan-out')",
    )
    max_tokens: int | None = Field(
        default=3_398_000, ge=1, description="billed tokens (prompt + completion) per conversation"
    )
    max_cost: Decimal | None = Field(
        default=None,
        gt=0,
        description="cost per conversation (needs cost_budget enabled before this plugin)",
    )
    reserve_output_tokens: int = Field(
        default=1000,
        ge=0,
        description="output reserved "
        "per call for max_tokens (the request's "
        "max_output_tokens if set)",
    )
    soft: bool = Field(
        default=True, description="stop softly (one last tool-less turn) where the limit allows it"
    )
    warning: str = Field(
        default="This conversation has used {used} of its {limit} {what} ({percent}%). "
        "Plan the remaining work within that.",
        description="the warning ({what}, {used}, {limit}, {percent})",
    )
    stop_message: str = Field(
        default="This conversation has reached its limit of {limit} {what}.",
        description="why the run stops ({what}, {used}, {limit}, {percent})",
    )


@dataclass(slots=True)
class _Totals:
    """What the conversation's finished runs spent, and which warnings it was given."""

    turns: int = 0
    idle_turns: int = 0  # turns in a row without a tool call
    loop_stops: int = 0  # runs a loop or failure guard stopped
    model_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: Decimal = Decimal(0)
    warned: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _State:
    tool_calls: int = 0  # this run's counted tool calls


_WHAT = {
    "max_turns": "user turns",
    "idle_turns": "user turns in a row without a tool call",
    "loop_stops": "runs stopped by a loop guard",
    "max_steps": "model calls",
    "max_tool_calls": "tool calls",
    "max_tokens": "tokens",
    "max_cost": "cost",
}


class ConversationLimits(Plugin[ConversationLimitsSettings]):
    """Limits user turns, model calls, tool calls, tokens and cost per conversation."""

    name = "conversation_limits"
    Settings = ConversationLimitsSettings

    def new_state(self) -> _State:
        return _State()

    def new_conversation_state(self) -> _Totals:
        return _Totals()

    # -- helpers -----------------------------------------------------------------------

    def _evidence(self, run: Run, rule: str, used: Any, limit: Any) -> dict[str, Any]:
        return dict(
            scope="conversation",
            window="conversation",
            key=run.conversation.id,
            rule=rule,
            limit=limit,
            spent=used,
            count=used,
            turn=self.conversation_state(run).turns + 1,
        )

    def _text(self, template: str, rule: str, used: Any, limit: Any) -> str:
        return render_note(
            template,
            what=runtime(_WHAT[rule]),
            used=used,
            limit=limit,
            percent=percent(used, limit),
        )

    def _stop(
        self, run: Run, reason: str, used: Any, limit: Any, *, soft: bool, rule: str | None = None
    ) -> Verdict:
        rule = rule or reason
        return self.stop(
            reason,
            soft=soft and self.settings.soft,
            message=self._text(self.settings.stop_message, rule, used, limit),
            **self._evidence(run, rule, used, limit),
        )

    def _maybe_warn(self, run: Run, reason: str, used: Any, limit: Any) -> Verdict | None:
        """The once-per-conversation warning for ``reason`` when ``used`` reached ``warn_at``
        of ``limit``.  The per-step hooks call it only past the threshold (the condition is
        checked inline there first: no call on a quiet step)."""
        s = self.settings
        totals: _Totals = self.conversation_state(run)
        if s.warn_at is None or reason in totals.warned:
            return None
        # a cost limit is a Decimal, which refuses to multiply a float: the fraction as one
        level = limit * (Decimal(str(s.warn_at)) if isinstance(limit, Decimal) else s.warn_at)
        if used < level:
            return None
        totals.warned.add(reason)
        return self.warn(
            self._text(s.warning, reason, used, limit),
            threshold=s.warn_at,
            **self._evidence(run, reason, used, limit),
        )

    # -- hooks -------------------------------------------------------------------------

    @hookimpl
    def on_start(self, run: Run) -> Verdict | None:
        s = self.settings
        totals: _Totals = self.conversation_state(run)
        idle = s.max_idle_turns
        if idle is not None and totals.idle_turns >= idle:
            return self._stop(
                run, "max_turns", totals.idle_turns + 1, idle, soft=False, rule="idle_turns"
            )
        loops = s.max_loop_stops
        if loops is not None and totals.loop_stops >= loops:
            return self._stop(
                run, "max_turns", totals.loop_stops, loops, soft=False, rule="loop_stops"
            )
        limit = s.max_turns
        if limit is None:
            return None
        turn = totals.turns + 1
        if turn > limit:
            return self._stop(run, "max_turns", turn, limit, soft=False)
        return self._maybe_warn(run, "max_turns", turn, limit)

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        s = self.settings
        totals: _Totals = self.conversation_state(run)
        final = request.final
        warn_at = s.warn_at
        warning: Verdict | None = None
        if s.max_model_calls is not None:
            limit = s.max_model_calls
            call_no = totals.model_calls + run.step + 1
            if call_no > limit:
                return self._stop(run, "max_steps", call_no, limit, soft=False)
            if call_no == limit and not final:
                return self._stop(run, "max_steps", call_no, limit, soft=True)
            if warn_at is not None and not call_no < limit * warn_at:
                warning = self._maybe_warn(run, "max_steps", call_no, limit)
        if s.max_tokens is not None:
            limit = s.max_tokens
            spent = totals.tokens + run.usage.total
            this_call = request.estimated_tokens + (
                request.max_output_tokens or s.reserve_output_tokens
            )
            rung = ladder(
                spent + this_call, spent + 2 * this_call, limit, final=final, warn_level=None
            )
            if rung in ("hard", "soft"):
                return self._stop(run, "max_tokens", spent + this_call, limit, soft=rung == "soft")
            if warning is None and warn_at is not None and not spent < limit * warn_at:
                warning = self._maybe_warn(run, "max_tokens", spent, limit)
        if s.max_cost is not None:
            limit_cost = s.max_cost
            cost = totals.cost + run.stash.get(RUN_COST, _NO_COST)  # run_cost(run)
            if cost >= limit_cost:
                return self._stop(run, "max_cost", cost, limit_cost, soft=not final)
            warning = warning or self._maybe_warn(run, "max_cost", cost, limit_cost)
        return warning

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        limit = self.settings.max_tool_calls
        if limit is None:
            return None
        st: _State = self.state(run)
        totals: _Totals = self.conversation_state(run)
        count = totals.tool_calls + st.tool_calls + 1
        if count > limit:
            return self._stop(run, "max_tool_calls", count, limit, soft=True)
        st.tool_calls += 1
        warn_at = self.settings.warn_at
        if warn_at is not None and not count < limit * warn_at:
            return self._maybe_warn(run, "max_tool_calls", count, limit)
        return None

    @hookimpl
    def on_stop(self, run: Run, outcome: RunOutcome) -> None:
        totals: _Totals = self.conversation_state(run)
        st: _State = self.state(run)
        totals.turns += 1
        totals.idle_turns = totals.idle_turns + 1 if run.tool_calls == 0 else 0
        if outcome.termination in _LOOPS:
            totals.loop_stops += 1
        totals.model_calls += run.step
        totals.tool_calls += st.tool_calls
        totals.tokens += run.usage.total
        totals.cost += run_cost(run)
