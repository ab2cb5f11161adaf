"""The run: one agent loop's live state, its outcome and its record.

A deployment's plugin objects serve many runs, concurrently; everything that belongs to one
run lives here, including the plugins' per-run state (typed, in ``run.stash``; or one slot per
plugin, ``run.state[plugin_name]``).  Time comes
from ``run.clock``; the caller cancels through ``run.cancel``.

A run, the hook specs and the plugins see their deployment through :class:`DeploymentView`,
a small protocol that :class:`~loopwarden.Deployment` satisfies: the modules below the
deployment name the view, never the class that assembles them (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import time
import types
import uuid
import warnings
from dataclasses import dataclass, field
from operator import is_
from typing import TYPE_CHECKING, Any, Protocol

from loopwarden.clock import CancelToken, Clock, SystemClock
from loopwarden.events import ToolResult, Usage
from loopwarden.models.tokens import TextEstimator, estimate_message, estimate_text
from loopwarden.sanitize import jsonable as _jsonable
from loopwarden.stash import Stash, StashKey

if TYPE_CHECKING:
    from collections.abc import Callable, Container
    from decimal import Decimal

    from blinker import NamedSignal

    from loopwarden.config import Config
    from loopwarden.store import Shared
    from loopwarden.tools import ToolRegistry
    from loopwarden.verdicts import Stop

__all__ = [
    "MEASURED_FIELDS",
    "PLUGIN_FIELD_DEFAULTS",
    "Conversation",
    "DeploymentView",
    "Limits",
    "Run",
    "RunOutcome",
]

#: run-record fields that plugins fill in (``record_fields``), with their value when the
#: plugin is not enabled -- the record always has them
PLUGIN_FIELD_DEFAULTS: dict[str, Any] = {
    "cost": 0.0,
    "duplicate_calls": 0,
    "oscillation_hits": 0,
    "stall_rounds": 0,
    "cost_currency": None,
}

#: the measurements among them: a record lists those no enabled plugin made in
#: ``unmeasured``, so that their default (0) is never read as a count
MEASURED_FIELDS: tuple[str, ...] = ("cost", "duplicate_calls", "oscillation_hits", "stall_rounds")


@dataclass(frozen=True, slots=True)
class Limits:
    """A run's profile limits (None: the plugin's own setting applies)."""

    #: the profile's name
    name: str | None = None
    #: model turns at most
    max_steps: int | None = None
    #: tokens at most
    max_tokens: int | None = None
    #: wall time at most
    max_seconds: float | None = None
    #: prompt tokens at most per request
    max_context: int | None = None


@dataclass(slots=True)
class RunOutcome:
    """How a run ended.

    ``termination`` is a stop reason (``final_answer``, ``max_steps``, ``repeat_call``, ...);
    ``soft`` is True when a soft stop granted the final tool-less turn; ``stopped_by`` names the
    plugin (None when the model finished by itself); ``final_answer_present`` is True when the
    answer came from the model's own final turn (or a terminal tool), not from the best-effort
    fallback of a hard stop.
    """

    #: the stop reason (``final_answer``, ``max_steps``, ``repeat_call``, ...)
    termination: str
    #: True when a soft stop granted the final tool-less turn
    soft: bool = False
    #: the plugin that ended the run; None when the model finished by itself
    stopped_by: str | None = None
    #: what the stopping plugin saw
    evidence: dict[str, Any] = field(default_factory=dict)
    #: the answer the user gets
    final_answer: str | None = None
    #: True when the answer came from the model (or a plugin that ends runs normally, e.g. a
    #: terminal tool), not from a best effort or a stopping plugin's substitute
    final_answer_present: bool = False
    #: the stop's ``message``: for logs, alerts and the record, never shown to the user or the
    #: model
    message: str | None = None
    #: the error text when the run ended on a failure (``model_error``), else None
    error: str | None = None


class Conversation:
    """A conversation: one run per user message, sharing what must carry on.

    The messages carry on from run to run (so the context grows as it really does), so does
    the ledger of side effects that took place (such an idempotency key never runs again in
    the conversation; across conversations, processes and hosts the deployment's shared ledger
    in ``[store]`` sees to it), and so does conversation-scoped plugin state
    (:meth:`loopwarden.Plugin.conversation_state`); per-run state and per-run limits start
    afresh with every run.  Pass one to
    ``Deployment.run(..., conversation=conv)`` for each user message; a run without one gets a
    conversation of its own.  Not for concurrent runs: a conversation's runs follow each other.
    """

    def __init__(self, conversation_id: str | None = None) -> None:
        #: the conversation's id (made up when not given)
        self.id = conversation_id or uuid.uuid4().hex
        self._messages: list[dict[str, Any]] = []
        #: what the loop settled in ``messages`` (see :meth:`_settle`): a snapshot of the
        #: message objects, their estimated tokens, and the estimator that counted them
        self._known: tuple[tuple[dict[str, Any], ...], int, TextEstimator] | None = None
        #: conversation-scoped plugin state, keyed by plugin name
        self.state: dict[str, Any] = {}
        #: side effects that took place (or may have: a timeout) in this conversation, by
        #: idempotency key -- the loop's ledger: such a key never runs again
        self.side_effects: dict[str, ToolResult] = {}
        #: runs finished in this conversation
        self.runs = 0

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages so far (the last run's, including its system prompt): the next run
        opens with them.  Edit the history by assigning a list, or by adding, replacing or
        removing messages in it; a message dict changed in place keeps the token estimate it
        had when the loop settled it (as ``Run.messages`` does)."""
        return self._messages

    @messages.setter
    def messages(self, value: list[dict[str, Any]]) -> None:
        self._messages = value
        self._known = None

    def _settle(self, messages: list[dict[str, Any]], run: Run) -> None:
        """Take ``messages`` -- ``run``'s own, then what settling its end added -- as the
        history, and keep their token estimate, so that the next run opens without counting
        the whole history again (a long conversation's turns stay as cheap as its first).

        The estimate is the run's ``context_tokens`` when every message the run holds is one it
        added and counted (:meth:`Run.add_message`); otherwise (a message replaced, as a
        withheld answer is) nothing is kept and the next run counts them all."""
        self._messages = messages
        self._known = None
        own, added = run.messages, run._added
        n = len(own)
        if len(added) != n or len(messages) < n:
            return
        if not all(map(is_, added, own)) or not all(map(is_, messages, own)):  # C-level scans
            return
        est = run.estimator
        tokens = run.context_tokens + sum(estimate_message(m, est) for m in messages[n:])
        self._known = (tuple(messages), tokens, est)

    def _known_tokens(self, estimator: TextEstimator) -> int | None:
        """The estimated tokens of :attr:`messages` by ``estimator`` when they are still the
        messages :meth:`_settle` counted (the same objects, none added, replaced or removed),
        else None."""
        known = self._known
        if known is None:
            return None
        snapshot, tokens, counted_by = known
        msgs = self._messages
        if counted_by is not estimator or len(msgs) != len(snapshot):
            return None
        return tokens if all(map(is_, msgs, snapshot)) else None

    def __repr__(self) -> str:
        return f"<Conversation {self.id[:8]} runs={self.runs} messages={len(self.messages)}>"


class PluginsView(Protocol):
    """What a run and its plugins see of a deployment's loaded plugins."""

    def get(self, name: str) -> Any:
        """The plugin object enabled as ``name``, or None."""

    @property
    def blocking_io(self) -> bool:
        """Whether one of the plugins declares ``blocking_io`` (its hooks may wait on I/O)."""

    @property
    def other_io(self) -> bool:
        """Whether one of them waits on I/O other than the store's (``blocking_io = True``)."""


class HooksView(Protocol):
    """The hook calls a run and its plugins make outside the loop's own events."""

    def record_fields(
        self, run: Run, reserved: Container[str] = ...
    ) -> tuple[dict[str, Any], list[dict[str, str]]]:
        """The plugins' fields for ``run``'s record, and the failures of those that raised."""

    def budget_limits(self, run: Run) -> dict[str, float]:
        """The limits the plugins enforce for ``run``, by budget."""

    def ends_runs_normally(self, plugin: str) -> bool:
        """Whether ``plugin``'s stops are normal endings (a hand-off), not guards."""


class DeploymentView(Protocol):
    """A deployment as the layers below it see it: the run (``run.deployment``), the hook
    specs (``on_configure``) and the plugins (``Plugin.connect``).  A
    :class:`~loopwarden.Deployment` is one; the view keeps the low modules from naming the
    class that assembles them."""

    @property
    def config(self) -> Config:
        """The deployment's validated ``config.toml``."""

    @property
    def plugins(self) -> PluginsView:
        """The loaded plugins, by name."""

    @property
    def hooks(self) -> HooksView:
        """The hook calls outside a run's events."""

    def connect(self, signal: NamedSignal, receiver: Callable[..., Any]) -> None:
        """Subscribe ``receiver`` to ``signal`` for this deployment's runs only."""


#: the stash key under which ``cost_budget`` keeps what a run spent (public as
#: ``loopwarden.plugins.cost_budget.RUN_COST``); defined here so that the deprecated
#: ``Run.cost`` alias reads it without the run importing a plugin
RUN_COST: StashKey[Decimal] = StashKey()


class Run:
    """One run's live state.  Plugins read it; the loop owns its counters."""

    def __init__(
        self,
        user: str,
        *,
        deployment: DeploymentView | None = None,
        tools: ToolRegistry | None = None,
        clock: Clock | None = None,
        cancel: CancelToken | None = None,
        limits: Limits | None = None,
        scenario: str | None = None,
        run_id: str | None = None,
        estimator: TextEstimator = estimate_text,
        model_name: str | None = None,
        meta: dict[str, Any] | None = None,
        conversation: Conversation | None = None,
        max_output_tokens: int | None = None,
        model_url: str | None = None,
    ) -> None:
        #: the run's id (the run record's ``run_id``)
        self.run_id: str = run_id or uuid.uuid4().hex
        #: the conversation this run belongs to (its messages, ledger and state carry on)
        self.conversation: Conversation = (
            conversation if conversation is not None else Conversation()
        )
        #: the user's message that started the run
        self.user: str = user
        #: the scenario's name, or None
        self.scenario: str | None = scenario
        #: the deployment running it (None for a hand-built run)
        self.deployment: DeploymentView | None = deployment
        #: the tools the model may call (a ToolRegistry)
        self.tools: ToolRegistry | None = tools
        #: the run's clock: measure time and wait on it (a FakeClock in tests)
        self.clock: Clock = clock or SystemClock()
        #: the run's cancel token (``run.cancel.set(reason)`` ends it as ``cancelled``)
        self.cancel: CancelToken = cancel or CancelToken()
        #: the profile's limits (None fields: the plugins' own settings apply)
        self.limits: Limits = limits or Limits()
        #: the model's name, when known
        self.model_name: str | None = model_name
        #: the URL of the endpoint the model calls (its ``base_url``), when known: telemetry's
        #: ``server.address`` / ``server.port``; None for the scripted model or a framework's
        self.model_url: str | None = model_url
        #: the model's cap on output tokens per call (``[model] max_output_tokens``): every
        #: ModelRequest carries it, so the budgets reserve what an answer may really cost
        self.max_output_tokens: int | None = max_output_tokens
        #: scope keys of this run (``{"tenant": "acme", "user": "u-17"}``): shared budgets
        #: are kept per scope key; the run record carries them
        self.meta: dict[str, Any] = meta or {}
        #: the deployment's shared store (budgets, ledger) -- set for live runs by
        #: ``Deployment.prepare``; None in replays and hand-built runs
        self.shared: Shared | None = None
        #: the text-to-tokens estimator the loop uses
        self.estimator: TextEstimator = estimator
        #: the time on ``clock`` the run started
        self.started_at: float = self.clock.now()
        #: the time on ``clock`` it ended, or None while it runs
        self.ended_at: float | None = None
        #: the wall-clock time (epoch seconds) the run started: a real time even when
        #: ``clock`` is a FakeClock (``run_record`` writes it as ``started_at``)
        self.wall_started_at: float = time.time()
        #: the conversation so far, in OpenAI chat format (the loop appends; do not mutate)
        self.messages: list[dict[str, Any]] = []
        #: estimated tokens of ``messages`` (maintained incrementally)
        self.context_tokens: int = 0
        #: the messages :meth:`add_message` appended, in order (``context_tokens`` counts them):
        #: the conversation keeps the estimate only while ``messages`` still matches
        self._added: list[dict[str, Any]] = []
        #: model calls made so far
        self.step: int = 0
        #: tool calls the model proposed / that actually executed
        self.tool_calls: int = 0
        #: tool executions that really ran (retries included)
        self.tools_executed: int = 0
        #: the run's billed tokens so far (a Usage)
        self.usage: Usage = Usage()
        #: warnings injected so far: ``step``, ``plugin``, ``message`` (the record's ``warnings``)
        self.warnings: list[dict[str, Any]] = []
        #: warnings not yet injected: the loop adds them to the next model request
        self.pending_notes: list[str] = []
        #: every verdict so far, as the run record lists them
        self.verdicts: list[dict[str, Any]] = []
        #: failures beside the outcome (a failing ``on_stop``, a record write): the record's
        #: ``errors``
        self.errors: list[dict[str, Any]] = []
        #: tool calls answered from a record of their declared side effect instead of running
        #: (the record's ``ledger_answers``: which call, from which record, and why)
        self.ledger_answers: list[dict[str, Any]] = []
        #: calls the runtime retried after a retryable failure (the record's ``tool_retries``:
        #: which call, how many attempts, their errors, the time waited, the outcome)
        self.tool_retries: list[dict[str, Any]] = []
        #: per-plugin state slots, keyed by plugin name
        self.state: dict[str, Any] = {}
        #: typed per-run plugin state (see :class:`~loopwarden.Stash`)
        self.stash: Stash = Stash()
        #: the latest non-empty model content (the best-effort answer's first choice)
        self.best_answer: str | None = None
        #: the last successful tool observation (the best-effort answer's second choice)
        self.last_observation: str | None = None
        #: how the run ended, or None while it runs
        self.outcome: RunOutcome | None = None
        #: the soft stop being honoured (its wrap-up turn), or None
        self.stopping: Stop | None = None
        #: the stop a shadowed plugin would have made first (shadow mode), else None
        self.shadow_stop: dict[str, Any] | None = None
        #: what shadowed plugins would have changed besides their verdicts (a call's timeout
        #: or delay, the run's deadline, a result's retryable flag), undone by the dispatcher:
        #: ``step``, ``hook``, ``plugin``, ``shadow``, ``effect``, ``value``, ``was`` (and
        #: ``tool``, ``call_id``); at most ``loopwarden.engine.shadow.MAX_EFFECTS``, the rest
        #: counted
        self.shadow_effects: list[dict[str, Any]] = []
        #: shadow effects beyond the cap, counted
        self.shadow_effects_dropped: int = 0
        #: the time on ``clock`` by which the run must have ended (set in ``on_start`` by the
        #: timeout plugin: its limit plus grace).  A watchdog ends a run still going shortly
        #: after it -- outcome ``timeout``, record written -- even while a hook, a tool or a
        #: model call blocks; the blocked code runs on, and its caller gets the run back
        #: when it returns.
        self.deadline: float | None = None
        #: held while the run is finished: one outcome, whoever finishes first
        self.finish_lock: threading.Lock = threading.Lock()

    # -- conversation ------------------------------------------------------------------

    def add_message(self, message: dict[str, Any]) -> None:
        """Append a message and keep the token estimate current (O(message), not O(history))."""
        self.messages.append(message)
        self._added.append(message)
        self.context_tokens += estimate_message(message, self.estimator)

    def _add_history(self, messages: list[dict[str, Any]]) -> None:
        """Open the run with a conversation's ``messages``: as :meth:`add_message` each, but
        with the estimate the conversation kept when they are its settled history unchanged
        (no Python work per message: a turn costs the same however long the history)."""
        tokens = (
            self.conversation._known_tokens(self.estimator)
            if messages is self.conversation.messages
            else None
        )
        if tokens is None:
            for m in messages:
                self.add_message(m)
            return
        self.messages.extend(messages)
        self._added.extend(messages)
        self.context_tokens += tokens

    @property
    def elapsed(self) -> float:
        """Seconds on ``clock`` since the run started (until it ended, once it has)."""
        end = self.ended_at if self.ended_at is not None else self.clock.now()
        return end - self.started_at

    @property
    def mode(self) -> str:
        """``"shadow"`` when the deployment runs in shadow mode, else ``"enforce"`` (single
        plugins may still be shadowed: see ``shadow_stop`` and the ``verdicts``)."""
        engine = getattr(self.deployment, "engine", None)
        return str(getattr(engine, "mode", "enforce"))

    @property
    def finished(self) -> bool:
        """The run has an outcome."""
        return self.outcome is not None

    @property
    def cost(self) -> Decimal:
        """Deprecated since 0.2 (removed in 0.3): what ``cost_budget`` has priced so far.

        The spend is the ``cost_budget`` plugin's own state now; read it with
        :func:`loopwarden.plugins.cost_budget.run_cost`.  This alias keeps 0.1 plugins that
        read ``run.cost`` working, with a :class:`DeprecationWarning`.
        """
        warnings.warn(
            "Run.cost is deprecated: use loopwarden.plugins.cost_budget.run_cost(run)",
            DeprecationWarning,
            stacklevel=2,
        )
        from decimal import Decimal as _Decimal

        return self.stash.get(RUN_COST, _Decimal(0))

    @cost.setter
    def cost(self, value: Decimal) -> None:
        warnings.warn(
            "Run.cost is deprecated: the spend is cost_budget's state "
            "(loopwarden.plugins.cost_budget.RUN_COST in run.stash)",
            DeprecationWarning,
            stacklevel=2,
        )
        from decimal import Decimal as _Decimal

        given: object = value  # 0.1 plugins are untyped: check what really came
        if isinstance(given, bool) or not isinstance(given, (int, float, _Decimal)):
            raise TypeError(f"Run.cost must be a number, got {type(given).__name__}")
        self.stash[RUN_COST] = _Decimal(str(given))

    # -- record --------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The run record (docs/contracts.md: one JSON object per run).

        The plugins add their fields through the ``record_fields`` hook; the fields in
        :data:`PLUGIN_FIELD_DEFAULTS` (``cost``, ``cost_currency``, the detector counters) keep
        their defaults when their plugin is not enabled, and ``unmeasured`` names the
        measurements (:data:`MEASURED_FIELDS`) that no plugin made.
        """
        o = self.outcome or RunOutcome(termination="running")
        record = {
            "run_id": self.run_id,
            "scenario": self.scenario,
            "termination": o.termination,
            "soft": o.soft,
            "steps": self.step,
            "tool_calls": self.tool_calls,
            "tokens": self.usage.as_dict(),
            **PLUGIN_FIELD_DEFAULTS,
            "warnings": list(self.warnings),
            "stopped_by": o.stopped_by,
            "evidence": _jsonable(o.evidence),
            "final_answer": o.final_answer,
            "final_answer_present": o.final_answer_present,
            "elapsed_s": round(self.elapsed, 6),
            # extensions (compatible additions to the contract in docs/contracts.md)
            "tools_executed": self.tools_executed,
            "profile": self.limits.name,
            "model": self.model_name,
            "errors": list(self.errors),
            "ledger_answers": list(self.ledger_answers),
            "tool_retries": list(self.tool_retries),
            "verdicts": list(self.verdicts),
            "mode": self.mode,
            "shadow_stop": _jsonable(self.shadow_stop),
            "shadow_effects": _jsonable(self.shadow_effects),
            "shadow_effects_dropped": self.shadow_effects_dropped,
            "meta": _jsonable(self.meta),
            "conversation_id": self.conversation.id,
            "unmeasured": list(MEASURED_FIELDS),
        }
        if self.deployment is not None:
            reserved = record.keys() - PLUGIN_FIELD_DEFAULTS.keys()
            fields, failures = self.deployment.hooks.record_fields(self, reserved)
            for key, value in fields.items():
                record[key] = _jsonable(value)
            if failures:
                record["errors"] = record["errors"] + failures
            record["unmeasured"] = [f for f in MEASURED_FIELDS if f not in fields]
        return record

    def trajectory(self) -> list[dict[str, Any]]:
        """The run as trajectory steps (docs/contracts.md), derived from the messages."""
        steps: list[dict[str, Any]] = []
        current: dict[str, Any] | None = None
        for m in self.messages:
            role = m.get("role")
            if role == "assistant":
                current = {
                    "content": m.get("content"),
                    "tool_calls": [
                        {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
                        for tc in m.get("tool_calls") or ()
                    ],
                    "observations": [],
                }
                steps.append(current)
            elif role == "tool" and current is not None:
                current["observations"].append(m.get("content"))
        return steps

    def __repr__(self) -> str:
        return f"<Run {self.run_id[:8]} step={self.step} scenario={self.scenario!r}>"


class _RunModule(types.ModuleType):
    """This module, callable: ``with loopwarden.run("ticket-4711"):`` names the run of the
    wrapped clients' requests in the block (:func:`loopwarden.gateway.wrap.run`, looked up by
    name: the vocabulary imports nothing of the front ends)."""

    def __call__(self, run_id: str) -> contextlib.AbstractContextManager[str]:
        wrap = importlib.import_module("loopwarden.gateway.wrap")
        named: contextlib.AbstractContextManager[str] = wrap.run(run_id)
        return named


sys.modules[__name__].__class__ = _RunModule
