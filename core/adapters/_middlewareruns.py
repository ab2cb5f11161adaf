"""The LangChain middleware's run bookkeeping: which loopwarden run an agent invocation is,
and how each run ends -- begun, resumed (in this process or after another worker), watched for
an end outside the middleware, abandoned, closed.

:class:`MiddlewareRuns` is the half of :class:`~loopwarden.adapters.langchain.LoopwardenMiddleware`
that keeps the open runs; the middleware's hooks (``wrap_model_call``, ``wrap_tool_call``, ...)
live beside it in :mod:`loopwarden.adapters.langchain`, and its attributes are set by the
middleware's ``__init__``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.errors import GraphBubbleUp, GraphInterrupt, GraphRecursionError

from loopwarden import events
from loopwarden.adapters._driver import GuardedRun, NatureSpec, off_loop, tool_result
from loopwarden.adapters._graphwatch import _GRAPH_ERRORS, MAX_LAST, RECURSION
from loopwarden.adapters._lcmessages import (
    HITL_EDITS,
    _config,
    _edited,
    _get,
    _openai,
    _pending,
    _received,
    _response,
    _stop,
    _text,
    _thread,
)
from loopwarden.clock import WATCHDOG
from loopwarden.engine.calls import parse_calls
from loopwarden.exceptions import StoreError
from loopwarden.plugins.otel import AGENT_NAME
from loopwarden.run import Conversation, Run

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment

_KEY = "loopwarden_run_id"
#: the state key naming the run that holds the thread: the one that began the invocation or
#: took the model's last answer (its side-effect claims are the thread's)
_TIP = "loopwarden_tip"
#: the state key of the agent's result that says how loopwarden's run of the invocation ended
RESULT_KEY = "loopwarden"
#: seconds an open run waits for its framework when the run has no deadline (``timeout`` off)
ABANDON_S = 3600.0
#: thread conversations kept in memory (least recently used dropped first)
MAX_CONVERSATIONS = 10_000
#: runs ended by LangGraph's recursion limit kept for their invocation's last step


def _take_over_claims(run: Run, resumed: str, response: events.ModelResponse) -> None:
    """Free the shared-ledger claims that the resumed run ``resumed`` holds for the pending
    calls: a run interrupted outside the middleware (``HumanInTheLoopMiddleware``'s node)
    claimed them before the pause and never ran them, and this run is the one to run them
    now (a checkpointer resumes a thread once).  Only a ``running`` claim of that run for that
    call id is freed: a call the ledger records as done stays answered from the ledger."""
    shared = run.shared
    if shared is None or not shared.config.ledger:
        return
    for call in parse_calls(run, response):
        if call.idempotency_key is None:
            continue
        mine, theirs = f"{run.run_id}/{call.id}", f"{resumed}/{call.id}"  # Shared's owners
        try:
            store = shared.store
            ledger_key = shared._ledger_key(run, call.idempotency_key)
            entry = store.claim(ledger_key, mine, shared.config.ledger_ttl_s)  # read it
            if entry is None:  # nobody held it: leave it free for the machine's own claim
                store.release(ledger_key, mine)
            elif entry.state == "running" and entry.owner == theirs:
                store.release(ledger_key, theirs)
        except StoreError:  # the claim stays: the call is answered as running elsewhere
            continue


class MiddlewareRuns:
    """The open runs of a :class:`~loopwarden.adapters.langchain.LoopwardenMiddleware` by the
    run id the graph state carries (a resumed run: the id it resumes), and their ends."""

    deployment: Deployment
    natures: NatureSpec
    model_name: str | None
    profile: str | None
    meta: dict[str, Any]
    _runs: dict[str, GuardedRun]
    _unwatch: dict[str, Callable[[], None]]
    _conversations: OrderedDict[str, Conversation]
    _lock: threading.Lock
    _resuming: threading.Lock
    _last: OrderedDict[str, GuardedRun]
    _graphs: dict[str, UUID]

    def _conversation(self, thread: str | None) -> Conversation | None:
        """The conversation of a LangGraph thread (its id is the thread id), kept in memory;
        None (a conversation of the run's own) without a thread."""
        if thread is None:
            return None
        with self._lock:
            conv = self._conversations.get(thread)
            if conv is None:
                conv = self._conversations[thread] = Conversation(thread)
                while len(self._conversations) > MAX_CONVERSATIONS:
                    self._conversations.popitem(last=False)
            else:
                self._conversations.move_to_end(thread)
            return conv

    def _new(
        self,
        messages: list[BaseMessage],
        config: Mapping[str, Any],
        *,
        key: str | None = None,
        resumed_from: str | None = None,
    ) -> tuple[str, GuardedRun]:
        user = next((_text(m) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        meta = dict(self.meta)
        agent = (config.get("metadata") or {}).get("lc_agent_name")
        if isinstance(agent, str) and agent:  # create_agent(name=...)
            meta.setdefault(AGENT_NAME, agent)
        if resumed_from is not None:
            meta["resumed_from"] = resumed_from
        guarded = GuardedRun(
            self.deployment,
            user=user,
            history=_openai(messages),
            natures=self.natures,
            model_name=self.model_name,
            meta=meta,
            profile=self.profile,
            conversation=self._conversation(_thread(config)),
            adapter="langchain",
        )
        key = key or guarded.run.run_id
        with self._lock:
            self._runs[key] = guarded
        return key, guarded

    def _begin(self, state: Mapping[str, Any]) -> dict[str, Any]:
        earlier = state.get(_KEY)
        if earlier:  # the thread's last invocation ended where the middleware did not see it
            self._abandon(
                earlier, "the thread's next invocation began before this run was seen to end"
            )
        config = _config()
        key, guarded = self._new(list(state.get("messages") or []), config)
        self._watch_graph(key, config)
        return {_KEY: key, _TIP: guarded.run.run_id, RESULT_KEY: None}

    def _watch_graph(self, key: str, config: Mapping[str, Any]) -> None:
        """Have the run ``key`` recorded when its invocation's graph run ends without the
        middleware seeing it (see :class:`_GraphErrors`); ``config``: the current node's."""
        node_run = getattr(config.get("callbacks"), "parent_run_id", None)
        graph = _GRAPH_ERRORS.watch(node_run, lambda exc: self._graph_failed(key, exc))
        if graph is not None:
            with self._lock:
                self._graphs[key] = graph

    def _graph_failed(self, key: str, exc: BaseException | None) -> None:
        """The agent graph's run ended while the run was open: record it now.  On ``exc``:
        ``ended_by_framework`` for LangChain's and LangGraph's own limits, ``cancelled`` for
        a cancellation, ``error`` otherwise.  Without one the invocation returned without
        passing ``after_agent``: an interrupt raised in another node
        (``HumanInTheLoopMiddleware``) paused it -- ``ended_by_framework``
        (``evidence.interrupted``), its unrun calls' claims released; the invocation that
        resumes it is a new run.  Off the event loop when one runs (the record may reach the
        shared store)."""
        with self._lock:
            guarded = self._runs.get(key)
        if guarded is None or guarded.finished:
            return

        def close() -> None:
            name = type(exc).__name__
            if exc is None:
                detail = "interrupted in another node: the resumed invocation is a new run"
                guarded.end_by_framework(detail, None, interrupted=True)
            elif isinstance(exc, GraphRecursionError) or name == "ModelCallLimitExceededError":
                guarded.end_by_framework(f"{name}: {exc}", None, raised=name)
            else:
                guarded.finish(exc)

        # no longer this invocation's open run, at once: an invocation resuming the thread
        # before the record is written (under ainvoke, in a thread) is a new run -- not this
        # paused one carried on, which would run the calls with the arguments it was paused on
        self._drop(key, guarded)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            close()
        else:
            threading.Thread(target=close, name="loopwarden-graph-error", daemon=True).start()

    def _resume(
        self, key: str, resumed: str, state: Mapping[str, Any], config: Mapping[str, Any]
    ) -> GuardedRun:
        """A run re-established for an invocation that resumes the run ``resumed`` (the
        thread's tip: an interrupt ended it here, or it ran in another process): a new run of
        the same conversation, whose first model answer is the one whose tool calls are still
        to run, if any -- those calls go through the guards (and the side-effect ledger) as
        any other, the claims ``resumed`` took for them taken over."""
        messages: list[BaseMessage] = list(state.get("messages") or [])
        pending = _pending(messages)
        if pending is not None:  # the calls as they will run: with a reviewer's edits
            pending = _edited(pending, state.get(HITL_EDITS))
        _, guarded = self._new(
            messages[:-1] if pending else messages, config, key=key, resumed_from=resumed
        )
        self._watch_graph(key, _config())
        if pending is not None:
            for tc in pending.tool_calls:
                guarded.declare(tc["name"])
            self._turn(key, guarded)
            _, response = _response(pending, with_usage=False)  # counted by the run it ended
            _take_over_claims(guarded.run, resumed, response)
            guarded.model_done(response)
        return guarded

    @staticmethod
    def _holds(guarded: GuardedRun, tip: str | None) -> bool:
        """``guarded`` still holds the thread: the state's tip is this run, or the run it
        resumed (until this run's first answer moves the tip), or unknown."""
        run = guarded.run
        return tip is None or tip == run.run_id or tip == run.meta.get("resumed_from")

    def _guarded(
        self, state: Any, config: Mapping[str, Any] | None = None
    ) -> tuple[str, GuardedRun] | None:
        """The open run of the invocation: this process's, or a new one resuming the
        thread's tip.  A run of this process whose thread went on in another run since (a
        worker behind the same checkpointer served the turns in between) is stale: it is
        recorded (``ended_by_framework``, ``evidence.superseded_by``) and a new run resumes
        from the tip."""
        run_id, tip = _get(state, _KEY), _get(state, _TIP)
        if not run_id:
            return None
        with self._lock:
            guarded = self._runs.get(run_id) or self._last.get(run_id)
        if guarded is None or not self._holds(guarded, tip):
            with self._resuming:  # parallel tool calls of one resumed answer: one new run
                with self._lock:
                    guarded = self._runs.get(run_id)
                if guarded is not None and not self._holds(guarded, tip):
                    self._close(
                        run_id,
                        guarded,
                        "the thread went on in another run (another worker served it)",
                        abandoned=True,
                        superseded_by=tip,
                    )
                    guarded = None
                if guarded is None:
                    guarded = self._resume(
                        run_id, tip or run_id, state, _config() if config is None else config
                    )
        return run_id, guarded

    def _drop(self, key: str, guarded: GuardedRun) -> None:
        with self._lock:
            if self._runs.get(key) is guarded:
                del self._runs[key]
            unwatch = self._unwatch.pop(key, None)
            graph = self._graphs.pop(key, None)
        if unwatch is not None:
            unwatch()
        if graph is not None:
            _GRAPH_ERRORS.unwatch(graph)

    def _close(self, key: str, guarded: GuardedRun, detail: str, **evidence: Any) -> None:
        """The framework ended the run where the middleware sees no end of it: record it."""
        guarded.end_by_framework(detail, None, **evidence)
        self._drop(key, guarded)

    def _out_of_steps(self, key: str, guarded: GuardedRun) -> None:
        self._close(key, guarded, RECURSION, recursion_limit=True)
        with self._lock:
            self._last[key] = guarded
            while len(self._last) > MAX_LAST:
                self._last.popitem(last=False)

    def _abandon(self, key: str, detail: str) -> None:
        with self._lock:
            guarded = self._runs.get(key)
        if guarded is not None:
            self._close(key, guarded, detail, abandoned=True)

    def _turn(self, key: str, guarded: GuardedRun) -> events.ModelRequest | None:
        """The machine's next model call; the first one arms the watch for an invocation
        that ends without returning to the middleware (an exception raised outside it --
        another middleware's, LangGraph's -- or a cancellation between steps): past the run's
        deadline the run is recorded as ended by the framework."""
        try:
            turn = guarded.model_turn()  # the first one checks the model (validate_model)
        except BaseException:
            if guarded.refused:  # the run never started: nothing to finish, keep nothing
                self._drop(key, guarded)
            raise
        if key not in self._unwatch and not guarded.finished:
            run = guarded.run
            wait = ABANDON_S if run.deadline is None else run.deadline - run.clock.now()

            def fire() -> None:
                self._abandon(
                    key, "the invocation did not return to the middleware by the run's deadline"
                )

            with self._lock:
                if key in self._runs:
                    self._unwatch[key] = WATCHDOG.watch(max(0.0, wait) + 1.0, fire)
        return turn

    def _end(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        run_id = state.get(_KEY)
        if not run_id:
            return None
        with self._lock:
            guarded = self._runs.get(run_id)
        if guarded is None:
            return None
        if not guarded.finished:  # the framework ended the run: a limit, a structured output
            guarded.end_by_framework(
                "the agent ended before loopwarden's run did",
                _received(list(state.get("messages") or [])),
            )
        self._drop(run_id, guarded)
        return {RESULT_KEY: _stop(guarded)}

    def _failed(
        self,
        key: str,
        guarded: GuardedRun,
        exc: BaseException,
        *,
        model: bool = False,
        call_id: str | None = None,
    ) -> None:
        """The model or a tool raised and the exception leaves the middleware: LangChain has
        already applied its own error handling (``handle_tool_errors``) inside ``handler``, so
        the agent ends here -- the guards see the failure, and the run ends (recorded).

        An interrupt (``GraphBubbleUp``: human-in-the-loop) ends the invocation too: the
        interrupted call is recorded as not run (its side-effect claim released), the run as
        ended by the framework; the invocation that resumes it -- in this process or another
        behind the same checkpointer -- continues in a new run (:meth:`_resume`).  A
        cancellation is recorded ``cancelled``."""
        if isinstance(exc, GraphBubbleUp):
            if call_id is not None:
                guarded.release(call_id)
                guarded.not_run(call_id, "interrupted")
            interrupted = isinstance(exc, GraphInterrupt)
            detail = (
                "interrupted: the resumed invocation is a new run"
                if interrupted
                else f"{type(exc).__name__}: the graph left the agent"
            )
            self._close(key, guarded, detail, interrupted=interrupted)
            return
        if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
            guarded.finish(exc)
        else:
            if model:
                guarded.model_failed(exc)
            elif call_id is not None:
                guarded.tool_done(call_id, tool_result(None, error=exc))
            guarded.finish(exc)
        self._drop(key, guarded)

    def runs(self) -> list[Any]:
        """The loopwarden runs in progress (for inspection)."""
        with self._lock:
            return [g.run for g in self._runs.values()]

    async def _aguarded(
        self, state: Any, config: Mapping[str, Any] | None = None
    ) -> tuple[str, GuardedRun] | None:
        """:meth:`_guarded` from an async hook: the open run at once when this process holds
        it, else found or resumed off the event loop (a resume may wait on the store)."""
        run_id = _get(state, _KEY)
        if not run_id:
            return None
        with self._lock:
            guarded = self._runs.get(run_id) or self._last.get(run_id)
        if guarded is not None and self._holds(guarded, _get(state, _TIP)):
            return run_id, guarded
        return await off_loop(None, self.deployment, self._guarded, state, config)
