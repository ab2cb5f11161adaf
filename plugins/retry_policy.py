"""retry_policy: a retryable failure may be retried -- ``max_retries`` times, after a backoff.

A call (by fingerprint: tool name + canonical arguments) whose result failed with
``retryable`` set (a 429, a 5xx, a timeout -- whatever the tool flagged) may be executed again.
When the model repeats it, ``before_tool`` asks the loop to wait first (``call.delay_s``): the
backoff ``backoff_s * backoff_factor ** (n - 1)`` for the n-th retry, capped at
``max_backoff_s``, measured on the run's clock from the failure -- time the model spent
thinking counts toward it.  The loop waits cancellably, before executing.

When a fingerprint has failed ``max_retries + 1`` times, ``after_tool`` sets
``result.retryable = False``: the retry budget is spent.  Plugins later in the config order
see it -- ``repeat_call`` then treats the call like any other failed call (skip the next
repeat with a hint, then stop).  This plugin never stops a run itself.

A success or a non-retryable failure forgets the fingerprint; skipped calls are not results
and change nothing.  State is bounded: at most ``max_fingerprints`` failing fingerprints per
run (least recent forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pydantic import Field

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl

__all__ = ["RetryPolicy", "RetryPolicySettings"]


class RetryPolicySettings(PluginSettings):
    """``[plugins.retry_policy]``."""

    max_retries: int = Field(
        default=1,
        ge=0,
        description="times a call that failed with a retryable error may be executed again",
    )
    backoff_s: float = Field(
        default=1.0, ge=0, description="seconds to wait before the first retry"
    )
    backoff_factor: float = Field(
        default=2.0, ge=1, description="each further retry waits this many times longer"
    )
    max_backoff_s: float = Field(default=30.0, ge=0, description="the longest backoff")
    retry_timeouts: bool = Field(
        default=True,
        description="treat a tool that overran its deadline as retryable; false: a timeout "
        "is never retried",
    )
    max_fingerprints: int = Field(
        default=256,
        ge=1,
        description="failing calls remembered per run, least recent forgotten first (bounds "
        "memory)",
    )


@dataclass(slots=True)
class _Failure:
    failures: int = 0  # retryable failures of this fingerprint
    at: float = 0.0  # when the last one arrived (run clock)


@dataclass(slots=True)
class _State:
    failing: OrderedDict[str, _Failure] = field(default_factory=OrderedDict)
    retries: int = 0  # retries granted in this run (for the curious)


class RetryPolicy(Plugin[RetryPolicySettings]):
    """Grants a bounded number of delayed retries per failing call (see the module doc)."""

    name = "retry_policy"
    Settings = RetryPolicySettings

    def new_state(self) -> _State:
        return _State()

    def backoff(self, retry: int) -> float:
        """The backoff before the ``retry``-th retry (1-based)."""
        s = self.settings
        return float(min(s.backoff_s * s.backoff_factor ** (retry - 1), s.max_backoff_s))

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        st: _State = self.state(run)
        f = st.failing.get(call.fingerprint)
        if f is None or f.failures > self.settings.max_retries:
            return None  # not a retry, or its budget is spent (later plugins decide)
        st.retries += 1
        wait = f.at + self.backoff(f.failures) - run.clock.now()
        if wait > 0:
            call.delay_s = max(call.delay_s, wait)
        return None

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        if result.skipped:
            return None
        s = self.settings
        st: _State = self.state(run)
        fp = call.fingerprint
        if result.ok or not result.retryable:
            st.failing.pop(fp, None)  # nothing left to retry (repeat_call judges repeats)
            return None
        if result.error == "timeout" and not s.retry_timeouts:
            result.retryable = False
            return None
        f = st.failing.get(fp)
        if f is None:
            f = st.failing[fp] = _Failure()
            if len(st.failing) > s.max_fingerprints:
                st.failing.popitem(last=False)
        else:
            st.failing.move_to_end(fp)
        f.failures += 1
        f.at = run.clock.now()
        if f.failures > s.max_retries:
            result.retryable = False  # the retry budget of this call is spent
        return None
