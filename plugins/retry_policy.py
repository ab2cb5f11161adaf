"""retry_policy: a retryable failure is retried -- by the runtime itself, then at most
``max_retries`` times in all, after a backoff.

A call (by fingerprint: tool name + canonical arguments) whose result failed with
``retryable`` set (a 429, a 5xx, a reset connection, a read-only call's timeout -- whatever
the tool flagged; never a semantic error such as "not found" or a validation error) may be
executed again, ``max_retries`` times per fingerprint and run.

* **The runtime retries** (``runtime = true``, the default): ``before_tool`` gives the call a
  :class:`~loopwarden.events.RetryPlan` with the retries left, and the loop executes the call
  again itself after a retryable failure -- waiting the backoff (with ``jitter``) or the
  ``Retry-After`` the failure carried, cancellably, and only while the attempt can start
  within the call's deadline (``call.timeout``: the tool's own limit and the run's time left).
  The model sees one observation, saying how many attempts it took.  Only a tool whose nature
  is declared is retried so; a side effect only when it declares ``idempotency_keys`` (the
  service can deduplicate), never after a timeout (it may have happened).
* **The model retries**: when the model proposes the same call again, ``before_tool`` asks
  the loop to wait first (``call.delay_s``): the backoff ``backoff_s * backoff_factor ** (n -
  1)`` for the n-th retry, capped at ``max_backoff_s`` (or the failure's ``Retry-After``, if
  longer), measured on the run's clock from the failure -- time the model spent thinking
  counts toward it.

When a fingerprint has failed ``max_retries + 1`` times (every attempt counts, the runtime's
too), ``after_tool`` sets ``result.retryable = False``: the retry budget is spent.  Plugins
later in the config order see it -- ``repeat_call`` then treats the call like any other
failed call (skip the next repeat with a hint, then stop).  This plugin never stops a run.

A success or a non-retryable failure forgets the fingerprint; skipped calls are not results
and change nothing.  State is bounded: at most ``max_fingerprints`` failing fingerprints per
run (least recent forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pydantic import Field

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.events import RetryPlan
from loopwarden.plugin import Seconds

__all__ = ["RetryPolicy", "RetryPolicySettings"]


class RetryPolicySettings(PluginSettings):
    """``[plugins.retry_policy]``."""

    max_retries: int = Field(
        default=2,
        ge=0,
        description="times a call that failed with a retryable error may be executed again "
        "(the runtime's attempts and the model's repeats together)",
    )
    runtime: bool = Field(
        default=True,
        description="the runtime retries a retryable failure of a declared tool itself, before "
        "the model sees it; false: only when the model proposes the call again",
    )
    backoff_s: Seconds = Field(default=1.0, description="seconds to wait before the first retry")
    backoff_factor: float = Field(
        default=2.0, ge=1, description="each further retry waits this many times longer"
    )
    max_backoff_s: Seconds = Field(
        default=30.0,
        description="the longest backoff; a Retry-After longer than this is not waited for by "
        "the runtime",
    )
    jitter: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="the fraction of each runtime backoff drawn at random, so that runs "
        "failing together do not retry together; 0: exact backoffs",
    )
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
    failures: int = 0  # failed executions of this fingerprint (every attempt counts)
    at: float = 0.0  # when the last one arrived (run clock)
    retry_after: float | None = None  # the wait the last failure asked for


@dataclass(slots=True)
class _State:
    failing: OrderedDict[str, _Failure] = field(default_factory=OrderedDict)
    retries: int = 0  # retries the model proposed and this plugin granted (for the curious)


class RetryPolicy(Plugin[RetryPolicySettings]):
    """Grants a bounded number of delayed retries per failing call (see the module doc)."""

    name = "retry_policy"
    Settings = RetryPolicySettings

    def __init__(self, settings: RetryPolicySettings | None = None) -> None:
        super().__init__(settings)
        #: the runtime's plan for a call with n failures so far, built once per n (plans are
        #: frozen, and depend only on n and the settings): at most max_retries of them
        self._plans: dict[int, RetryPlan] = {}

    def new_state(self) -> _State:
        return _State()

    def backoff(self, retry: int) -> float:
        """The backoff before the ``retry``-th retry (1-based)."""
        s = self.settings
        return float(min(s.backoff_s * s.backoff_factor ** (retry - 1), s.max_backoff_s))

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        s = self.settings
        st: _State = self.state(run)
        f = st.failing.get(call.fingerprint)
        failures = 0 if f is None else f.failures
        if failures > s.max_retries:
            return None  # its budget is spent (later plugins decide)
        if f is not None:  # the model proposes a failed call again
            st.retries += 1
            pause = self.backoff(failures)
            if f.retry_after is not None:
                pause = max(pause, f.retry_after)
            wait = f.at + pause - run.clock.now()
            if wait > 0:
                call.delay_s = max(call.delay_s, wait)
        left = s.max_retries - failures
        if s.runtime and left > 0 and _runtime_may_retry(call):
            plan = self._plans.get(failures)
            if plan is None:
                plan = self._plans[failures] = RetryPlan(
                    attempts=left + 1,
                    backoff_s=self.backoff(failures + 1),
                    factor=s.backoff_factor,
                    max_backoff_s=s.max_backoff_s,
                    jitter=s.jitter,
                    timeouts=s.retry_timeouts,
                )
            call.retry = plan
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
        f.failures += max(result.attempts, 1)
        f.at = run.clock.now()
        f.retry_after = result.retry_after
        if f.failures > s.max_retries:
            result.retryable = False  # the retry budget of this call is spent
        return None


def _runtime_may_retry(call: ToolCall) -> bool:
    """A call the runtime may execute again on its own: a declared tool, and a side effect
    only under declared ``idempotency_keys`` (a guess never changes execution)."""
    tool = call.tool
    if tool is None or not tool.declared or call.error is not None:
        return False
    return not tool.side_effect or tool.idempotency_keys is not None
