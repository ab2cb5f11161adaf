"""circuit_breaker: a tool that fails for everyone is paused for everyone.

When an upstream API goes down, every run that uses it fails the same way at the same moment,
and each would retry and loop until its own detectors stop it.  This plugin keeps one breaker
per tool -- and per MCP server, for all of its tools -- in the deployment's shared store
(``[store] url``), so every process and host that shares the store shares the breakers:

* **closed** -- calls run; their outcomes are counted in a sliding window of ``window_s``.
  Only **transient** failures count: a timeout, a call left in doubt (``unknown_outcome``: an
  MCP server that died mid-call), a failure the tool flagged ``retryable`` (a
  ``ToolError(retryable=True)``, a 429 or 5xx, a reset connection -- what ``retry_policy``
  retries), each execution of a runtime retry.  retry_policy clears a failure's flag once its
  budget is spent: placed before it, this plugin sees every flag; placed after it, still
  every timeout and every failure the runtime retried.  A semantic error (not found, an
  argument the service rejects: a failure not flagged retryable) is the caller's, not the
  dependency's: it counts as a call that was answered, never as a failure.  Calls that never
  reach the dependency (invalid arguments, an unknown tool, a skip, a ledger's answer) and
  calls the run cancelled count neither way.  The breaker **opens** at ``failures``
  transient failures in the window, or at a failure ratio of ``failure_ratio`` over at least
  ``min_calls`` calls.
* **open** -- every call of the tool is **skipped** with ``observation`` (the tool, since
  when, how many failures in what window: "do not retry it -- answer from what you have or hand
  off") and a skip verdict whose evidence says the same; the ``max_skips``-th skipped call of
  one run stops it softly with ``circuit_open`` (a model that keeps calling a paused tool is
  looping).  A log line (WARNING) and the ``breaker_changed`` signal -- which the alerting
  (severity ``warn``), metrics and otel plugins take up -- say that it opened.
* **half-open** -- ``open_s`` after it opened, exactly one call across the fleet is let
  through as a probe.  It holds the probe as long as it may run -- its own deadline (the
  tool's ``timeout_s``, as the timeout plugin leaves it, and its backoff) when that is longer
  than ``probe_timeout_s`` -- so a slow but healthy probe is never replaced while it runs;
  only a probe that outlives that (its process died, or a call with no deadline past
  ``probe_timeout_s``) lets another caller probe, and a late answer of the first still
  counts.  An answer (a success, or a semantic error: the dependency is up) **closes** it; a
  transient failure opens it again for ``open_s`` -- once probes from ``min_sources``
  distinct sources have failed (a run that names no source suffices).  A probe that failed
  for one source hands the next probe to another source at once; that source itself probes
  again only ``open_s`` later.  So one tenant whose own input times out never holds a
  deployment-wide breaker open against the others.
* **time** is the store's: Redis's ``TIME`` (read in the same round trip), so hosts whose
  clocks disagree agree on when a breaker opened and when ``open_s`` is over; a SQLite
  store is one host's file, whose clock all its processes share.

**Scope.**  Deployment-wide by default; ``scope = ["tenant"]`` keeps one breaker per tenant
(any meta keys a run carries, as spend_limits' scopes; a run without them is not covered).
**One tenant never opens a breaker shared with others**: semantic errors never count, and a
tenant's inputs that make a dependency time out (a huge export, a query that hits an upstream
bug) open a deployment-wide breaker only with the failures of at least ``min_sources``
distinct sources -- the values of the runs' ``source_key`` meta (``tenant``); failures of runs
that name no source are the deployment's own traffic and count as such.

**Fails open.**  A store that cannot be reached never pauses a tool: the error is logged and
noted in the run record's ``errors``, and the run carries on without breakers.  In shadow
mode the skips are recorded (``verdicts``) but the calls run; the counts go on.  Replays
(``run.shared`` is None) never touch a breaker.  ``loopwarden breakers`` lists the breakers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, PositiveInt, field_validator, model_validator

from loopwarden import (
    Plugin,
    PluginSettings,
    Run,
    ToolCall,
    ToolResult,
    Verdict,
    hookimpl,
    signals,
)
from loopwarden.clock import CANCEL_GRACE_S
from loopwarden.exceptions import StoreError
from loopwarden.notes import render_note, runtime
from loopwarden.plugin import PositiveSeconds, check_templates
from loopwarden.store import BreakerRule, BreakerView
from loopwarden.store.breakers import ANONYMOUS, Ident

if TYPE_CHECKING:
    from loopwarden.store import Shared

__all__ = ["CircuitBreaker", "CircuitBreakerSettings", "transient"]

log = logging.getLogger("loopwarden.plugins.circuit_breaker")

#: the skipped calls and transitions a run record lists at most (later ones are counted)
MAX_RECORDED = 20

_SAMPLE = {
    "tool": "search_flights",
    "target": "tool",
    "since": "10:02 UTC",
    "who": "for all users",
    "count": 12,
    "what": "timeouts",
    "window": 60,
    "scope": "deployment",
}


def transient(result: ToolResult) -> bool:
    """A failure of the dependency, not of the call: a timeout, a call left in doubt by a
    server or connection that died mid-call (``unknown_outcome``), a failure flagged
    retryable (a ``ToolError(retryable=True)``, a 429 / 5xx, a reset connection), or one the
    runtime retried (``attempts > 1``: it was retryable, even if retry_policy -- earlier in
    the config order -- has cleared the flag since, its retry budget spent)."""
    if result.ok or result.skipped or result.error == "cancelled":
        return False
    return result.error in ("timeout", "unknown_outcome") or result.retryable or result.attempts > 1


class CircuitBreakerSettings(PluginSettings):
    """``[plugins.circuit_breaker]``."""

    scope: list[str] = Field(
        default_factory=list,
        description='[] one breaker per tool for the whole deployment; ["tenant"] one per '
        "tenant (meta keys a run carries; a run without them is not covered)",
    )
    per_server: bool = Field(
        default=True,
        description="also one breaker per MCP server, for all of its tools: a server that is "
        "down pauses every tool it serves",
    )
    window_s: PositiveSeconds = Field(
        default=60.0, description="the sliding window the calls and failures are counted in"
    )
    failures: PositiveInt | None = Field(
        default=5,
        description="open at this many transient failures within the window (null: only the "
        "ratio rule)",
    )
    failure_ratio: float | None = Field(
        default=0.5,
        gt=0,
        le=1,
        description="open at this share of transient failures among the window's calls "
        "(null: only the count rule) ...",
    )
    min_calls: PositiveInt = Field(
        default=10, description="... once the window holds at least this many calls"
    )
    min_sources: PositiveInt = Field(
        default=2,
        description="a deployment-wide breaker opens only on failures from at least this many "
        "distinct sources (values of source_key; runs without it count as the deployment's "
        "own traffic, which suffices): one tenant's inputs never pause a tool for everyone",
    )
    source_key: str = Field(
        default="tenant", min_length=1, description="the meta key that names a failure's source"
    )
    open_s: PositiveSeconds = Field(
        default=30.0, description="how long an open breaker skips calls before one probe"
    )
    probe_timeout_s: PositiveSeconds = Field(
        default=60.0,
        description="a probe that reports nothing within this long (its process died) lets "
        "another caller probe; a probe call whose own deadline (timeout_s) is longer holds "
        "the probe until that deadline",
    )
    max_skips: PositiveInt | None = Field(
        default=2,
        description="the n-th call of one run skipped by an open breaker stops the run softly "
        "(circuit_open); null: never stop, only skip",
    )
    timezone: str = Field(default="UTC", description="the time zone of {since} in the texts")
    keep_s: PositiveSeconds = Field(
        default=86400.0, description="how long a breaker nobody touches stays in the store"
    )
    observation: str = Field(
        default="{tool} is unavailable since {since} {who} ({count} {what} in {window} s); do "
        "not retry it -- answer from what you have or hand off.",
        description="what the model gets instead of a skipped call ({tool}, {target}, {since}, "
        "{who}, {count}, {what}, {window}, {scope})",
    )
    stop_message: str = Field(
        default="{tool} is paused for {who_short}: a circuit breaker is open since {since}.",
        description="why a run stops after max_skips skipped calls (the same fields and "
        "{who_short})",
    )

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {v!r}: {exc}") from None
        return v

    @field_validator("scope")
    @classmethod
    def _scope(cls, v: list[str]) -> list[str]:
        if any(not k for k in v) or len(set(v)) != len(v):
            raise ValueError("scope lists distinct, non-empty meta keys")
        return v

    @model_validator(mode="after")
    def _check(self) -> CircuitBreakerSettings:
        if self.failures is None and self.failure_ratio is None:
            raise ValueError("set failures or failure_ratio (or both): a breaker needs a rule")
        check_templates(self, ("observation",), _SAMPLE)
        check_templates(self, ("stop_message",), {**_SAMPLE, "who_short": "all users"})
        return self

    def rule(self) -> BreakerRule:
        """The store's view of these settings."""
        return BreakerRule(
            window_s=self.window_s,
            failures=self.failures,
            failure_ratio=self.failure_ratio,
            min_calls=self.min_calls,
            min_sources=self.min_sources,
            open_s=self.open_s,
            probe_timeout_s=self.probe_timeout_s,
            keep_s=self.keep_s,
        )


@dataclass(slots=True)
class _State:
    shared: Shared | None = None  # None: inert (a replay, out of scope, or the store failed)
    scope: tuple[str, str] = ("deployment", "*")
    source: str = ANONYMOUS
    #: call id -> the breakers the call was admitted through (and counts in)
    admitted: dict[str, list[Ident]] = field(default_factory=dict)
    skips: int = 0
    #: the record's ``circuit_breaker`` field: calls skipped (with what the breaker saw) and
    #: the transitions this run's calls made (each list bounded by MAX_RECORDED)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)


class CircuitBreaker(Plugin[CircuitBreakerSettings]):
    """Fleet-wide circuit breakers per tool and MCP server (see the module doc)."""

    name = "circuit_breaker"
    Settings = CircuitBreakerSettings

    def __init__(self, settings: CircuitBreakerSettings | None = None) -> None:
        super().__init__(settings)
        self.rule = self.settings.rule()
        self.zone = ZoneInfo(self.settings.timezone)
        #: the breakers this process last saw open (key -> view), for the metrics gauge
        self.seen_open: dict[str, BreakerView] = {}

    @property
    def blocking_io(self) -> bool | Literal["store"]:
        """``"store"``: the hooks wait on the shared store, and on nothing else (async runs
        await those calls on the event loop)."""
        return "store"

    def new_state(self) -> _State:
        return _State()

    # -- helpers ---------------------------------------------------------------------------

    def _targets(self, st: _State, call: ToolCall) -> list[Ident]:
        tool = call.tool
        if tool is None or call.error is not None:
            return []  # never reaches a dependency: nothing to guard or count
        scope, key = st.scope
        out: list[Ident] = [(scope, key, "tool", tool.name)]
        if self.settings.per_server and tool.server:
            out.append((scope, key, "server", tool.server))
        return out

    def _failed(self, st: _State, run: Run, exc: StoreError, what: str) -> None:
        """Fail open: log, note on the run, and leave the breakers alone for this run."""
        log.error(
            "circuit_breaker: store %s unavailable while %s (run %s): %s -- carrying on "
            "without breakers (a store that is down never pauses a tool)",
            exc.url or "",
            what,
            run.run_id,
            exc,
        )
        run.errors.append(
            {
                "plugin": self.name,
                "hook": what,
                "error": str(exc),
                "store": exc.url or "",
                "on_store_error": "fail_open",
            }
        )
        st.shared = None

    def _fields(self, view: BreakerView, tool: str) -> dict[str, Any]:
        tripped = view.tripped or {}
        since = (
            datetime.fromtimestamp(view.since, self.zone).strftime("%H:%M %Z")
            if view.since is not None
            else "now"
        )
        per_scope = view.scope != "deployment"
        return {
            "tool": runtime(tool),
            "target": runtime(
                "tool" if view.target == "tool" else f"tools of MCP server {view.name}"
            ),
            "since": runtime(since),
            "who": runtime(f"for this {view.scope}" if per_scope else "for all users"),
            "who_short": runtime(f"this {view.scope}" if per_scope else "all users"),
            "count": int(tripped.get("failures", view.failures)),
            "what": runtime("timeouts" if tripped.get("error") == "timeout" else "failures"),
            "window": round(float(tripped.get("window_s", self.rule.window_s))),
            "scope": runtime(view.scope),
        }

    def _evidence(self, view: BreakerView, tool: str, **extra: Any) -> dict[str, Any]:
        tripped = view.tripped or {}
        return {
            "tool": tool,
            "breaker": view.target,
            "breaker_name": view.name,
            "state": view.state,
            "since": None
            if view.since is None
            else datetime.fromtimestamp(view.since, self.zone).isoformat(timespec="seconds"),
            "scope": view.scope,
            "key": view.scope_key,
            "rule": tripped.get("rule"),
            "count": tripped.get("failures", view.failures),
            "calls": tripped.get("calls", view.calls),
            "window": tripped.get("window_s", self.rule.window_s),
            "threshold": self.rule.failures
            if tripped.get("rule") != "failure_ratio"
            else self.rule.failure_ratio,
            "error": tripped.get("error"),
            "open_s": self.rule.open_s,
            **extra,
        }

    def _changed(self, st: _State, run: Run, view: BreakerView, tool: str) -> None:
        """Log a transition, note it for the record, and send ``breaker_changed``
        (alerting, metrics, otel)."""
        if view.changed is None:
            return
        if len(st.changes) < MAX_RECORDED:
            st.changes.append({"step": run.step, **self._evidence(view, tool, change=view.changed)})
        what = f"{view.target} {view.name}"
        where = (
            "deployment-wide" if view.scope == "deployment" else f"{view.scope}={view.scope_key}"
        )
        if view.changed in ("opened", "reopened"):
            self.seen_open[view.key] = view
            tripped = view.tripped or {}
            message = (
                f"circuit breaker {what} ({where}) {view.changed}: "
                f"{tripped.get('failures', view.failures)} transient failures in "
                f"{self.rule.window_s:g} s (rule {tripped.get('rule', 'probe')}); calls are "
                f"skipped for {self.rule.open_s:g} s, then one probe"
            )
            log.warning("%s (run %s)", message, run.run_id)
        elif view.changed == "closed":
            self.seen_open.pop(view.key, None)
            message = f"circuit breaker {what} ({where}) closed: the probe call succeeded"
            log.warning("%s (run %s)", message, run.run_id)
        else:
            message = f"circuit breaker {what} ({where}) half-open: one probe call goes through"
            log.info("%s (run %s)", message, run.run_id)
        if signals.breaker_changed.receivers:
            signals.send(signals.breaker_changed, run, breaker=view, message=message, tool=tool)

    # -- hooks -----------------------------------------------------------------------------

    @hookimpl
    def on_start(self, run: Run) -> None:
        st: _State = self.state(run)
        if run.shared is None:
            return
        s = self.settings
        if s.scope:
            values = [run.meta.get(k) for k in s.scope]
            if any(v is None or v == "" for v in values):
                return  # out of scope: no breaker covers this run
            key = str(values[0]) if len(values) == 1 else json.dumps(values, ensure_ascii=False)
            st.scope = (",".join(s.scope), key)
        source = run.meta.get(s.source_key)
        if s.source_key not in s.scope and source not in (None, ""):
            st.source = "=" + str(source)  # never ANONYMOUS, whatever a tenant is called
        st.shared = run.shared

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        st: _State = self.state(run)
        if st.shared is None:
            return None
        targets = self._targets(st, call)
        if not targets:
            return None
        owner = f"{run.run_id}/{call.id}"
        # should this call get the probe, it holds it as long as it may run: its backoff and
        # its deadline (every runtime retry fits in it), never less than probe_timeout_s
        lease_s = None if call.timeout is None else call.delay_s + call.timeout + CANCEL_GRACE_S
        admitted: list[Ident] = []
        for ident in targets:
            try:
                view = st.shared.store.breaker_admit(
                    ident, self.rule, owner, source=st.source, lease_s=lease_s
                )
            except StoreError as exc:
                self._failed(st, run, exc, "asking a circuit breaker")
                return None
            self._changed(st, run, view, call.name)
            if view.state == "closed":
                self.seen_open.pop(view.key, None)  # closed by another process
            if not view.allows:
                # the probes this call took on other breakers report nothing: their lease
                # (probe_timeout_s) runs out and another caller probes
                return self._skip(st, run, view, call)
            admitted.append(ident)
        st.admitted[call.id] = admitted
        return None

    def _skip(self, st: _State, run: Run, view: BreakerView, call: ToolCall) -> Verdict:
        if view.state == "open":
            self.seen_open[view.key] = view
        st.skips += 1
        tool = call.tool.name if call.tool is not None else call.name
        fields = self._fields(view, tool)
        s = self.settings
        evidence = self._evidence(view, tool, skipped_in_run=st.skips)
        if len(st.skipped) < MAX_RECORDED:
            st.skipped.append({"step": run.step, "call_id": call.id, **evidence})
        if s.max_skips is not None and st.skips >= s.max_skips:
            return self.stop(
                "circuit_open",
                soft=True,
                message=render_note(s.stop_message, **fields),
                **evidence,
            )
        return self.skip(render_note(s.observation, **fields), **evidence)

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        st: _State = self.state(run)
        admitted = st.admitted.pop(call.id, None)
        if st.shared is None or not admitted or result.skipped or result.error == "cancelled":
            return  # not executed (a skip, a ledger's answer), or cut off: no evidence
        failed = transient(result)
        owner = f"{run.run_id}/{call.id}"
        for ident in admitted:
            try:
                view = st.shared.store.breaker_record(
                    ident,
                    self.rule,
                    owner,
                    failed=failed,
                    source=st.source,
                    weight=max(1, result.attempts),
                    error=result.error if failed else None,
                )
            except StoreError as exc:
                self._failed(st, run, exc, "recording a call in a circuit breaker")
                return
            self._changed(st, run, view, call.name)

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, Any] | None:
        """``circuit_breaker``: the calls skipped and the transitions made (only when any)."""
        st: _State | None = run.state.get(self.name)
        if st is None or not (st.skipped or st.changes):
            return None
        return {
            "circuit_breaker": {
                "skipped_calls": st.skips,
                "skipped": st.skipped,
                "changes": st.changes,
            }
        }

    # -- for observers ---------------------------------------------------------------------

    def open_count(self) -> int:
        """Breakers this process last saw open (opened, reopened or skipping, not closed
        since): the metrics plugin's ``circuit_breakers_open`` gauge."""
        return len(self.seen_open)
