"""tool_calls: caps on tool calls per model turn, per run and per tool name.

An agent that fans out -- seventeen ``add_paragraph`` calls to build a document, five course
creations per turn -- does its job in wide turns; an agent that runs away makes more turns,
which ``max_steps`` and the loop detectors bound.  So the shipped default caps the width of
one turn (``max_per_turn``: a call past it is refused with an observation that asks for it in
the next turn, the run goes on) and sets no per-run cap: a run's calls are bounded by
``max_steps x max_per_turn``.  ``max_tool_calls`` (per run) and ``per_tool`` /
``max_per_tool`` are there for a deployment that wants them (docs/defaults.md, "Fan-out").

A call counts when it ran -- executed, failed, or was rejected as invalid -- one by one, so
the parallel calls of one turn are counted individually, in order.  Calls skipped by a guard
(and side-effect replays) are not counted: nothing ran.

A call past a cap is handled by ``on_exceed``:

``"continue"`` (default)
    the call is not executed; the model gets an error observation instead, and the other
    calls -- of this turn and later ones -- still run while they are within their caps.  The
    first refusal also injects a note.
``"end"``
    the run stops with ``max_tool_calls`` (soft by default: one last tool-less turn to answer
    from what is known).

``warn_at`` warns once when the run's count reaches that fraction of ``max_tool_calls`` (when
it is set).  The per-turn cap never stops a run, whatever ``on_exceed`` says: the refused
calls can be made in the next turn.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from loopwarden import Plugin, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.notes import render_note, runtime, tool_name
from loopwarden.plugins._budgets import BudgetSettings, warn_at_field

__all__ = ["ToolCalls", "ToolCallsSettings"]

_TEMPLATE_FIELDS = {"name": "query_order", "limit": 30, "used": 30, "scope": "run"}


class ToolCallsSettings(BudgetSettings):
    """``[plugins.tool_calls]``."""

    warn_at: float | None = warn_at_field(
        "warn once when the run's count reaches this fraction of max_tool_calls; unset it "
        "to never warn"
    )

    templates = (
        "warning",
        "refused_observation",
        "refused_hint",
        "turn_refused_observation",
        "stop_message",
    )
    template_sample = _TEMPLATE_FIELDS

    max_tool_calls: int | None = Field(
        default=None,
        ge=1,
        description="tool calls allowed per run; unset (the default): no per-run cap -- "
        "max_steps x max_per_turn bounds a run",
    )
    max_per_turn: int | None = Field(
        default=22,
        ge=1,
        description="tool calls allowed in one model turn; the rest of a wider turn is "
        "refused with turn_refused_observation and the run goes on (unset: no cap)",
    )
    max_per_tool: int | None = Field(
        default=None,
        ge=1,
        description="tool calls allowed per tool name, for every declared tool; unset: no "
        "cap per tool besides `per_tool`",
    )
    per_tool: dict[str, int] = Field(
        default_factory=dict,
        description="caps for single tools by name, e.g. { apply_refund = 1 } (override "
        "max_per_tool)",
    )
    on_exceed: Literal["continue", "end"] = Field(
        default="continue",
        description='a call past a cap: "continue" answers it with an error observation and '
        'the run goes on; "end" stops the run with max_tool_calls',
    )
    soft: bool = Field(
        default=True,
        description='with on_exceed = "end": stop softly (one last tool-less turn); false '
        "stops at once",
    )
    warning: str = Field(
        default="You have used {used} of {limit} tool calls for this {scope}. Plan the "
        "remaining calls carefully.",
        description="the warning ({used}, {limit}, {scope}, {name})",
    )
    refused_observation: str = Field(
        default="ERROR: LIMIT_REACHED: {name} was not executed: the limit of {limit} tool "
        "calls per {scope} is reached.",
        description='the observation of a refused call with on_exceed = "continue" ({name}, '
        "{limit}, {used}, {scope}: run or tool)",
    )
    refused_hint: str = Field(
        default="The limit of {limit} tool calls per {scope} is reached: further calls will "
        "not be executed. Answer from what you already know.",
        description="the note injected at the first refused call ({name}, {limit}, {used}, "
        "{scope})",
    )
    turn_refused_observation: str = Field(
        default="ERROR: LIMIT_REACHED: {name} was not executed: at most {limit} tool calls "
        "run per turn. Make this call again in your next turn if it is still needed.",
        description="the observation of a call past max_per_turn ({name}, {limit}, {used}, "
        "{scope})",
    )
    stop_message: str = Field(
        default="The limit of {limit} tool calls per {scope} is reached.",
        description='why the run stops with on_exceed = "end", put before the final turn\'s '
        "wrap-up instruction ({name}, {limit}, {used}, {scope})",
    )

    @model_validator(mode="after")
    def _check(self) -> ToolCallsSettings:
        bad = {k: v for k, v in self.per_tool.items() if v < 1}
        if bad:
            raise ValueError(f"per_tool caps must be at least 1, got {bad}")
        return self


@dataclass(slots=True)
class _State:
    used: int = 0  # calls that ran
    per_tool: Counter[str] = field(default_factory=Counter)  # only capped names
    refused: int = 0
    turn: int = -1  # the model turn whose calls `turn_used` counts
    turn_used: int = 0
    warned: bool = False
    hinted: bool = False


class ToolCalls(Plugin[ToolCallsSettings]):
    """Caps tool calls per run and per tool (see the module docstring)."""

    name = "tool_calls"
    Settings = ToolCallsSettings

    def new_state(self) -> _State:
        return _State()

    def tool_cap(self, call: ToolCall) -> int | None:
        """The per-tool cap that applies to ``call``, or None."""
        cap = self.settings.per_tool.get(call.name)
        if cap is None and call.tool is not None:
            cap = self.settings.max_per_tool
        return cap

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        cap = self.tool_cap(call)
        if call.step != st.turn:
            st.turn, st.turn_used = call.step, 0
        if s.max_tool_calls is not None and st.used >= s.max_tool_calls:
            scope, limit, used = "run", s.max_tool_calls, st.used
        elif cap is not None and st.per_tool[call.name] >= cap:
            scope, limit, used = "tool", cap, st.per_tool[call.name]
        elif s.max_per_turn is not None and st.turn_used >= s.max_per_turn:
            st.refused += 1
            fields = dict(
                name=tool_name(call), limit=s.max_per_turn, used=st.turn_used, scope=runtime("turn")
            )
            return self.skip(
                s.turn_refused_observation.format(**fields),
                tool=call.name,
                scope="turn",
                limit=s.max_per_turn,
                used=st.turn_used,
                refused=st.refused,
                run_calls=st.used,
            )
        else:
            st.turn_used += 1  # counted when let through: a parallel batch may run at once
            return None
        st.refused += 1
        fields = dict(name=tool_name(call), limit=limit, used=used, scope=runtime(scope))
        evidence: dict[str, Any] = dict(
            tool=call.name,
            scope=scope,
            limit=limit,
            used=used,
            refused=st.refused,
            run_calls=st.used,
            on_exceed=s.on_exceed,
        )
        if s.on_exceed == "end":
            return self.stop(
                "max_tool_calls",
                soft=s.soft,
                message=render_note(s.stop_message, **fields),
                **evidence,
            )
        hint = None if st.hinted else render_note(s.refused_hint, **fields)
        st.hinted = True
        return self.skip(s.refused_observation.format(**fields), message=hint, **evidence)

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        if result.skipped:
            return None
        s = self.settings
        st: _State = self.state(run)
        st.used += 1
        if self.tool_cap(call) is not None:
            st.per_tool[call.name] += 1
        if s.warn_at is None or st.warned or s.max_tool_calls is None:
            return None
        if st.used >= math.ceil(s.max_tool_calls * s.warn_at):
            st.warned = True
            return self.warn(
                render_note(
                    s.warning,
                    used=st.used,
                    limit=s.max_tool_calls,
                    scope=runtime("run"),
                    name=tool_name(call),
                ),
                used=st.used,
                limit=s.max_tool_calls,
                threshold=s.warn_at,
            )
        return None
