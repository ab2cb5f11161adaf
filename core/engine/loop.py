"""The guarded agent loop: one step machine of effects, made of two turns.

:meth:`Engine.machine` is a generator that holds the whole loop logic.  It never calls a model
or a tool itself: it *yields* an effect (:class:`CallModel`, :class:`RunTool`) and receives its
outcome.  Each step is a model turn and, when the model proposed calls, a tool turn -- two
units built once per engine, each over what it needs and passed it, never reaching back into
the engine: the model turn (:class:`~loopwarden.engine.calls.ModelTurn`: request,
``before_model``, the model effect, ``after_response``, the proposals parsed) and the tool turn
(:class:`~loopwarden.engine.toolturn.ToolTurn`: ``before_tool``, the ledgers, the tool effect,
``after_tool``), both over the hooks, the ``[run]`` settings and texts and the verdict handling
(:class:`~loopwarden.engine.guards.Guards`).  The machine delegates to them with
``yield from`` and keeps what spans the run: ``on_start``, the ledgers, cancellation and
``step_finished``.

The drivers execute the effects: :func:`~loopwarden.engine.drivers.drive` (sync),
:func:`~loopwarden.engine.drivers.adrive` (async), the replay driver and the framework adapters,
so ``run()``, ``arun()`` and ``loopwarden replay`` share one implementation of the contract.
They execute a ``RunTool`` through :mod:`loopwarden.engine.execution` directly; only an engine
subclass that overrides :meth:`Engine.run_tool_sync` / :meth:`Engine.run_tool_async` (to wrap
tool execution) has its method called instead (:func:`wraps_tools`).

This module re-exports the public names of the effects and of the call parsing, which sit below
it.  The drivers sit above the machine (they import it): ``drive`` and ``adrive`` keep their
old path here (0.2) by a name lookup on first use (:func:`__getattr__`), never an import, so
the machine imports nothing of what drives it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from loopwarden import signals
from loopwarden.engine import execution
from loopwarden.engine.calls import ModelTurn, parse_proposals
from loopwarden.engine.calls import parse_calls as parse_calls
from loopwarden.engine.effects import CallModel, Failed, Machine, RunTool
from loopwarden.engine.guards import Guards
from loopwarden.engine.outcomes import best_effort, settled_history
from loopwarden.engine.toolturn import ToolTurn
from loopwarden.events import ModelResponse, ToolCall, ToolResult
from loopwarden.fingerprint import AnswerMasks, Fingerprinter
from loopwarden.run import Run, RunOutcome
from loopwarden.sanitize import clean_text

if TYPE_CHECKING:
    from loopwarden.config import RunConfig
    from loopwarden.host import Hooks
    from loopwarden.redaction import Redactor

__all__ = ["CallModel", "Engine", "Failed", "RunTool", "parse_calls"]

#: names this module answers for :mod:`loopwarden.engine.drivers` (their 0.2 path)
_DRIVERS = frozenset({"adrive", "drive"})


def __getattr__(name: str) -> Any:
    """``drive`` / ``adrive`` from :mod:`loopwarden.engine.drivers`, looked up on first use:
    the old path keeps working while the machine imports nothing above it."""
    if name not in _DRIVERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("loopwarden.engine.drivers"), name)
    globals()[name] = value
    return value


log = logging.getLogger("loopwarden.loop")


class Engine:
    """The loop logic for one deployment (shared by all its runs; holds no run state)."""

    #: the model-turn unit the engine builds (a subclass may size requests its own way)
    model_turn_type: type[ModelTurn] = ModelTurn

    def __init__(self, hooks: Hooks, settings: RunConfig, shadow: Collection[str] = ()) -> None:
        self.settings = settings
        self.mode = settings.mode
        #: plugins in shadow mode: their verdicts are recorded and signalled, never honoured,
        #: and whatever else their hooks change (a deadline, a delay, a cleared flag) is
        #: undone and recorded as a shadow effect (see Hooks.shadowing)
        self.shadow = frozenset(shadow)
        self.hooks = hooks.shadowing(self.shadow) if self.shadow else hooks
        self.texts = settings.texts
        self.fingerprint = Fingerprinter(settings.volatile_keys)
        #: what tool answers say, volatile parts masked: every detector's result digest
        self.answers = AnswerMasks(
            settings.volatile_patterns,
            enabled=settings.mask_volatile,
            time_value_chars=settings.time_value_chars,
        )
        #: what both turns share: the hooks, settings and texts, and the verdict handling
        self.guards = Guards(self.hooks, settings, self.shadow)
        self.model_turn = self.model_turn_type(self.guards, self.fingerprint)
        self.tool_turn = ToolTurn(self.guards, self.answers)

    @property
    def redactor(self) -> Redactor | None:
        """Masks secrets in error texts (the deployment sets one that knows the model's key)."""
        return self.guards.redactor

    @redactor.setter
    def redactor(self, value: Redactor | None) -> None:
        self.guards.redactor = value

    # -- tool execution: the drivers call execution directly, and these two only when an
    # Engine subclass overrides them to wrap tool execution (see wraps_tools); the three
    # result builders are kept for drivers written against 0.1 ------------------------------

    def run_tool_sync(self, eff: RunTool, run: Run) -> ToolResult:
        """Execute one tool call in a synchronous run (:mod:`loopwarden.engine.execution`);
        a subclass may override it to wrap tool execution."""
        return execution.run_tool_sync(self.texts, eff, run)

    async def run_tool_async(self, eff: RunTool, run: Run) -> ToolResult:
        """Execute one tool call in an async run (:mod:`loopwarden.engine.execution`); a
        subclass may override it to wrap tool execution."""
        return await execution.run_tool_async(self.texts, eff, run)

    def tool_result(self, eff: RunTool, value: Any, started: float, run: Run) -> ToolResult:
        """Turn a tool's return value into a result (late results become timeouts)."""
        return execution.tool_result(self.texts, eff, value, started, run)

    def timeout_result(self, call: ToolCall, elapsed: float) -> ToolResult:
        """The result of a call abandoned at its deadline."""
        return execution.timeout_result(self.texts, call, elapsed)

    def error_result(self, eff: RunTool, exc: BaseException, elapsed: float) -> ToolResult:
        """The result of a tool that raised."""
        return execution.error_result(self.texts, eff, exc, elapsed)

    # -- helpers -------------------------------------------------------------------------

    def start(self, run: Run) -> None:
        """Seed the run: the conversation so far (or the system prompt), then the user."""
        history = run.conversation.messages
        if history:
            run._add_history(history)
        elif self.settings.system_prompt:
            run.add_message({"role": "system", "content": self.settings.system_prompt})
        run.user = clean_text(run.user)
        run.add_message({"role": "user", "content": run.user})

    def parse_calls(self, run: Run, response: ModelResponse) -> list[ToolCall]:
        """The response's proposed calls parsed into :class:`ToolCall` objects, as
        ``after_response`` and ``before_tool`` see them (see :func:`parse_calls`)."""
        return parse_proposals(run, response, self.fingerprint)

    # -- endings -------------------------------------------------------------------------

    def redact(self, run: Run, text: str) -> str:
        """``text`` with secrets masked -- the model's API key, bearer credentials, ``sk-``
        keys -- and cut to 2,000 characters (error texts go to records, logs, alerts)."""
        return self.guards.redact(run, text)

    def finish(self, run: Run, outcome: RunOutcome) -> RunOutcome:
        """Close the run: set its outcome, call every ``on_stop``, send ``run_stopped``.

        Only once: when the watchdog finished the run first, its outcome stands."""
        with run.finish_lock:
            if run.outcome is not None:
                return run.outcome
            run.ended_at = run.clock.now()
            run.outcome = outcome
        conversation = run.conversation
        conversation._settle(settled_history(self.settings, run, outcome), run)
        conversation.runs += 1
        failures = self.hooks.on_stop(run, outcome)
        run.errors.extend(failures)
        if signals.run_stopped.receivers:  # the record is built only for a listener
            signals.send(signals.run_stopped, run, outcome=outcome, record=run.record())
        return outcome

    # -- the machine ---------------------------------------------------------------------

    def machine(self, run: Run) -> Machine:
        """The loop as a generator of effects; returns the (not yet finished) outcome."""
        guards = self.guards
        signals.send(signals.run_started, run)
        res = self.hooks.on_start(run)
        if res.verdicts:
            res = guards.note(run, "on_start", res)
            stop = res.stop
            if stop is not None:
                if not stop.soft:
                    return guards.hard(run, stop)
                run.stopping = stop
        model_turn, tool_turn = self.model_turn, self.tool_turn
        # Side effects that happened (or may have: a timeout) are remembered for the whole
        # conversation; failures only for this run -- the user's next message may have fixed
        # what made them fail.
        ledger = run.conversation.side_effects
        failed_here: dict[str, ToolResult] = {}
        while True:
            if run.cancel.is_set():
                return RunOutcome(
                    termination="cancelled",
                    evidence={"reason": run.cancel.reason},
                    final_answer=best_effort(self.settings, run),
                )
            calls = yield from model_turn(run)
            if isinstance(calls, RunOutcome):
                return calls
            if calls:
                ended = yield from tool_turn(run, calls, ledger, failed_here)
                if ended is not None:
                    return ended
            if signals.step_finished.receivers:
                signals.send(signals.step_finished, run, step=run.step)


def wraps_tools(engine: Engine, is_async: bool = False) -> bool:
    """Whether ``engine``'s class overrides :meth:`Engine.run_tool_sync` (or, ``is_async``,
    :meth:`Engine.run_tool_async`): the drivers then execute tools through that method, and
    through :mod:`loopwarden.engine.execution` directly otherwise (one call, one hop less)."""
    name = "run_tool_async" if is_async else "run_tool_sync"
    return getattr(type(engine), name) is not getattr(Engine, name)
