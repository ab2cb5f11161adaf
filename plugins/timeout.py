"""timeout: the run's clock, and a deadline for every tool call.

``max_seconds`` bounds the run, measured on ``run.clock`` from the run's start; a run's profile
(``[profiles.*] max_seconds``) overrides it.

* ``before_tool`` gives each call ``min(its own timeout, tool_timeout_s, time left)``
  (``call.timeout``).  The loop enforces it: a blocking tool runs in a worker thread that is
  abandoned at the deadline; an async tool is cancelled.  A cooperative tool (one that takes a
  :class:`~loopwarden.tools.ToolContext`) runs inline in sync runs and *promises* to honour
  ``ctx.deadline`` (``ctx.sleep``, ``ctx.time_left``): one that blocks past it delays the run
  until it returns.  Either way an overrun comes back as ``error == "timeout"`` and the late
  result is discarded, never recorded as a success.
* ``after_tool`` stops the run with ``timeout`` once the run's time is up -- and, with
  ``stop_on_tool_timeout`` (default), as soon as any tool overran.
* ``before_model`` refuses a model call once the time is up, and gives every call at most the
  time left (``request.timeout``; a final turn: up to the end of the grace period).  A call
  that overruns it is abandoned and the run ends ``timeout``.
* ``after_response`` and ``after_tool`` also stop a call that took longer than the time this
  plugin gave it although nothing cut it -- the plugin is shadowed (its deadlines are undone:
  see shadow mode in docs/real-traffic.md), or a synchronous model does not bound itself -- so
  a shadow run records the timeout it would have had.

A watchdog backs these checks up: past ``max_seconds + grace_s`` (``run.deadline``) a run still
going -- stuck in a hook, or in a tool or model call that cannot be abandoned -- is ended with
``timeout`` from outside and its record written; the stuck code runs on until it returns.

The stop is **soft** while the run is still inside the grace period (``grace_s`` past
``max_seconds``): the final tool-less turn fits in it.  Past the grace period it is **hard**.
``warn_at`` warns once when that fraction of ``max_seconds`` has passed.

The time left is measured when ``before_tool`` runs; a backoff that a later plugin requests
(``call.delay_s``, e.g. retry_policy's) is waited before the tool's own deadline starts, so it
can carry a tool past the run's end by at most that backoff -- ``after_tool`` then stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from loopwarden import (
    ModelRequest,
    Plugin,
    Run,
    ToolCall,
    ToolResult,
    Verdict,
    hookimpl,
)
from loopwarden.clock import DEADLINE_SLACK_S
from loopwarden.notes import render_note, runtime, tool_name
from loopwarden.plugin import PositiveSeconds, Seconds
from loopwarden.plugins._budgets import BudgetSettings, warn_at_field

__all__ = ["Timeout", "TimeoutSettings"]

_TEMPLATE_FIELDS = {
    "elapsed": 84.0,
    "limit": 120.0,
    "left": 36.0,
    "percent": 70,
    "tool": "query_logistics",
}


class TimeoutSettings(BudgetSettings):
    """``[plugins.timeout]``."""

    warn_at: float | None = warn_at_field(
        "warn once when this fraction of max_seconds has passed; unset it to never warn"
    )

    templates = ("warning", "stop_message", "tool_stop_message")
    template_sample = _TEMPLATE_FIELDS

    max_seconds: PositiveSeconds = Field(
        default=1800.0,
        description="seconds a run may take on its clock; a run profile's max_seconds overrides it",
    )
    tool_timeout_s: PositiveSeconds | None = Field(
        default=30.0,
        description="the longest any single tool call may run (a tool's own, shorter timeout "
        "wins); unset: only the tool's own timeout and the time left",
    )
    grace_s: Seconds = Field(
        default=15.0,
        description="seconds past max_seconds within which the run still gets its final "
        "tool-less turn (soft stop); later the stop is hard",
    )
    stop_on_tool_timeout: bool = Field(
        default=True,
        description="stop the run as soon as a tool overruns its deadline; false: only when "
        "the run's time is up (a tool's own timeout is then a retryable failure)",
    )
    warning: str = Field(
        default="This run has used {elapsed:.0f}s of its {limit:.0f}s time budget. Plan to "
        "finish within the time left.",
        description="the warning ({elapsed}, {limit}, {left}, {percent})",
    )
    stop_message: str = Field(
        default="The time budget of this run ({limit:.0f}s) is used up.",
        description="why the run stops when its time is up, put before the final turn's "
        "wrap-up instruction ({elapsed}, {limit}, {left}, {percent}, {tool})",
    )
    tool_stop_message: str = Field(
        default="{tool} did not answer in time.",
        description="why the run stops when a tool overran (stop_on_tool_timeout), put "
        "before the final turn's wrap-up instruction ({tool}, {elapsed}, {limit}, {left}, "
        "{percent})",
    )


@dataclass(slots=True)
class _State:
    warned: bool = False
    #: the call whose timeout is the run's time left (its overrun means the time is up)
    run_bound: ToolCall | None = None
    #: the last call given a deadline, and the deadline given (seconds)
    call: ToolCall | None = None
    call_timeout: float | None = None
    #: the model call under way: when it was asked (run clock), the time it was given, and
    #: whether it is a final turn
    model_asked: float | None = None
    model_timeout: float | None = None
    model_final: bool = False


class Timeout(Plugin[TimeoutSettings]):
    """Bounds a run's time and every tool call's (see the module docstring)."""

    name = "timeout"
    Settings = TimeoutSettings

    def new_state(self) -> _State:
        return _State()

    @hookimpl
    def budget_limits(self, run: Run) -> dict[str, float]:
        """The ``seconds`` budget this plugin enforces for ``run`` (for the metrics)."""
        return {"seconds": self.limit(run)}

    def limit(self, run: Run) -> float:
        """The run's time limit in seconds: its profile's, else ``max_seconds``."""
        return run.limits.max_seconds or self.settings.max_seconds

    def _fields(self, run: Run, tool: str = runtime("")) -> dict[str, float | int | str]:
        limit, elapsed = self.limit(run), run.elapsed
        return dict(
            elapsed=elapsed,
            limit=limit,
            left=max(0.0, limit - elapsed),
            percent=int(100 * elapsed / limit),
            tool=tool,
        )

    def _stop(
        self,
        run: Run,
        *,
        final: bool = False,
        call: ToolCall | None = None,
        result: ToolResult | None = None,
    ) -> Verdict | None:
        """The stop for a run whose time is up (or whose tool overran); None when a final
        turn already under way may still finish within the grace period."""
        s = self.settings
        limit, elapsed = self.limit(run), run.elapsed
        in_grace = elapsed < limit + s.grace_s
        if final and in_grace:
            return None
        tool = tool_name(call) if call is not None else runtime("")
        time_up = elapsed >= limit
        template = s.stop_message if time_up or call is None else s.tool_stop_message
        evidence: dict[str, Any] = dict(
            limit=limit,
            spent=round(elapsed, 3),
            elapsed_s=round(elapsed, 3),
            limit_s=limit,
            grace_s=s.grace_s,
            source=f"profile {run.limits.name}" if run.limits.max_seconds else "plugins.timeout",
        )
        if call is not None:
            st: _State = self.state(run)
            given = st.call_timeout if st.call is call else call.timeout
            evidence.update(tool=call.name, tool_timeout_s=given, step=call.step)
        if result is not None:
            evidence.update(tool_error=result.error, tool_duration_s=round(result.duration_s, 3))
        return self.stop(
            "timeout",
            soft=in_grace,
            message=render_note(template, **self._fields(run, tool)),
            **evidence,
        )

    @hookimpl
    def on_start(self, run: Run) -> None:
        # the watchdog's deadline: a run still going past it is ended from outside
        deadline = run.started_at + self.limit(run) + self.settings.grace_s
        run.deadline = deadline if run.deadline is None else min(run.deadline, deadline)

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        s = self.settings
        # one clock read for the time spent and the time the model was asked (run.elapsed
        # and clock.now() read it twice, microseconds apart)
        now = run.clock.now()
        ended = run.ended_at
        limit, elapsed = self.limit(run), (now if ended is None else ended) - run.started_at
        # the call itself may take no more than the time left (a final turn: the grace too)
        left = limit + (s.grace_s if request.final else 0.0) - elapsed
        st: _State = self.state(run)
        st.model_asked, st.model_timeout, st.model_final = None, None, request.final
        if left > 0:
            timeout = request.timeout
            request.timeout = left if timeout is None or left < timeout else timeout
            st.model_asked, st.model_timeout = now, request.timeout
        if elapsed >= limit:
            return self._stop(run, final=request.final)
        if s.warn_at is not None and not st.warned and elapsed >= limit * s.warn_at:
            st.warned = True
            return self.warn(
                render_note(s.warning, **self._fields(run)),
                limit=limit,
                spent=round(elapsed, 3),
                elapsed_s=round(elapsed, 3),
                limit_s=limit,
                threshold=s.warn_at,
            )
        return None

    @hookimpl
    def after_response(self, run: Run) -> Verdict | None:
        # A model call that took longer than the time it was given: cut in an enforced run
        # (the driver abandons it, and the run ends), so this answers only when nothing cut
        # it -- the plugin shadowed, or a synchronous model that does not bound itself.
        st: _State = self.state(run)
        asked, given = st.model_asked, st.model_timeout
        st.model_asked = st.model_timeout = None
        if asked is None or given is None:
            return None
        if run.clock.now() - asked <= given + DEADLINE_SLACK_S:
            return None
        return self._stop(run, final=st.model_final)

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        left = self.limit(run) - run.elapsed
        if left <= 0:
            return self._stop(run, call=call)
        st: _State = self.state(run)
        # the tighter of the tool's own bound and tool_timeout_s (either may be None), as
        # conditions: no list, no min() on every call
        bound, ours = call.timeout, self.settings.tool_timeout_s
        if bound is None or (ours is not None and ours < bound):
            bound = ours
        if bound is None or left < bound:
            call.timeout = left
            st.run_bound = call
        else:
            call.timeout = bound
            st.run_bound = None
        st.call, st.call_timeout = call, call.timeout
        return None

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        if result.skipped:
            return None
        st: _State = self.state(run)
        # an overrun: cut at the deadline, or (nothing cut it: the plugin is shadowed) a
        # call that took longer than the deadline this plugin gave it
        given = st.call_timeout if st.call is call else None
        overran = result.error == "timeout" or (given is not None and result.duration_s > given)
        time_up = run.elapsed >= self.limit(run) or (overran and st.run_bound is call)
        st.run_bound = None
        stop = None
        if time_up or (overran and self.settings.stop_on_tool_timeout):
            stop = self._stop(run, call=call, result=result)
        st.call = st.call_timeout = None
        return stop
