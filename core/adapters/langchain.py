"""loopwarden's guards in a LangChain v1 agent: ``LoopwardenMiddleware`` for ``create_agent``.

::

    from langchain.agents import create_agent
    from loopwarden import Deployment
    from loopwarden.adapters.langchain import LoopwardenMiddleware

    agent = create_agent(model, tools, middleware=[LoopwardenMiddleware(Deployment.from_config())])

Each ``invoke`` / ``ainvoke`` of the agent is one loopwarden run (same plugins, run records,
signals, metrics and alerts as ``loopwarden run``).  Verdicts become:

* **warn** -- the note is added to the next model request as a message (``[run]
  warning_role``: a ``HumanMessage`` for "user", else a ``SystemMessage``) and kept in the
  agent's messages just before the model's answer to it;
* **skip** -- ``wrap_tool_call`` answers with a ``ToolMessage`` holding the skip's observation;
  the tool is not called (so is a side effect already executed with the same idempotency key);
* **soft stop** -- the next model call is made with no tools bound; its text is the answer
  (tool calls it proposes anyway are dropped);
* **hard stop** -- no further model call: ``wrap_model_call`` answers in the model's place
  with the best-effort answer as an ``AIMessage`` without tool calls, so the agent ends on
  it (the effect of ``jump_to="end"``, without a ``before_model`` node on every step); a
  stop that came with the model's answer replaces that answer the same way.  A soft stop's
  wrap-up turn keeps the agent's ``response_format``: its structured response stands; a stop
  that gives none raises :class:`~loopwarden.exceptions.GuardStopped` (text cannot be it).

The result says how the run ended: ``result["loopwarden"]`` (:data:`RESULT_KEY`) holds the run
record's ``run_id``, its ``termination``, ``stopped`` (a guard stopped it), ``stopped_by`` and
``soft`` -- the invocation's own, whatever runs concurrently.

A LangGraph thread (``config["configurable"]["thread_id"]``) is the run's conversation, so
``conversation_limits`` and conversation-scoped budgets count across the thread's invocations
(as ``ModelCallLimitMiddleware(thread_limit=...)`` does).

Where the invocation ends without returning to the middleware, the run is still recorded
(``ended_by_framework``): an interrupt ends it -- in a tool, or in another node
(``HumanInTheLoopMiddleware``: when the agent graph's run ends) -- and the resumed invocation,
in any process behind the same checkpointer, is a new run of the thread, its pending tool
calls guarded; in
LangGraph's last step (``recursion_limit``) it ends before ``GraphRecursionError``; an
exception raised outside the middleware (another middleware's ``ModelCallLimitExceededError``,
LangGraph's ``GraphRecursionError``) is recorded when the agent graph's run fails (its
``on_chain_error`` callback).  A cancellation is ``cancelled``.

Needs ``pip install 'loopwarden[langchain]'`` (with ``langchain-openai`` for ``ChatOpenAI``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Annotated, Any
from uuid import UUID

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    OmitFromInput,
    PrivateStateAttr,
)
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.tracers.context import register_configure_hook
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp, GraphInterrupt, GraphRecursionError
from langgraph.managed.is_last_step import RemainingStepsManager
from langgraph.types import Command
from typing_extensions import NotRequired

from loopwarden import events
from loopwarden.adapters._driver import (
    Answer,
    GuardedRun,
    NatureSpec,
    nature_tables,
    off_loop,
    proposed,
    tool_result,
    usage,
)
from loopwarden.clock import WATCHDOG
from loopwarden.engine.calls import parse_calls
from loopwarden.exceptions import StoreError
from loopwarden.plugins.otel import AGENT_NAME
from loopwarden.run import Conversation, Run

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime

    from loopwarden.deployment import Deployment

__all__ = ["RESULT_KEY", "LoopwardenMiddleware", "LoopwardenState"]

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
MAX_LAST = 256
#: the part of LangGraph's ``GraphRecursionError`` message the record quotes
RECURSION = "LangGraph's recursion_limit: the graph raises GraphRecursionError next"


class _GraphErrors(BaseCallbackHandler):
    """The one hook that sees an agent invocation end on an exception raised outside the
    middleware (another middleware's node -- ``ModelCallLimitExceededError`` --, LangGraph's
    own ``GraphRecursionError``, a cancellation between steps): the agent graph's run ends
    with ``on_chain_error``.  Added to every callback manager of the process through
    LangChain's configure hook (registered by the first middleware made; it ignores every
    event but chains'), it learns the graph run of each loopwarden run from the start of the
    middleware's ``before_agent`` node and calls the run's closer when that graph run fails."""

    run_inline = True  # a dict look-up: never worth an executor hop

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()  # the middlewares' before_agent node names
        self._graphs: OrderedDict[UUID, UUID] = OrderedDict()  # node run -> its graph run
        self._open: dict[UUID, Callable[[BaseException | None], None]] = {}
        self._lock = threading.Lock()

    @property
    def ignore_llm(self) -> bool:
        return True

    @property
    def ignore_chat_model(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_agent(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is not None and kwargs.get("name") in self.names:
            with self._lock:
                self._graphs[run_id] = parent_run_id
                while len(self._graphs) > MAX_LAST:
                    self._graphs.popitem(last=False)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id, error)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id, None)

    def _ended(self, run_id: UUID, error: BaseException | None) -> None:
        if not self._open:  # the common case: no loopwarden run waits on a graph run
            return
        with self._lock:
            closer = self._open.pop(run_id, None)
        if closer is not None:
            closer(error)

    def watch(
        self, node_run: UUID | None, closer: Callable[[BaseException | None], None]
    ) -> UUID | None:
        """Call ``closer`` (with the exception, or None) when the graph run of the node run
        ``node_run`` ends while the watch is on (the middleware unwatches a run it ends); its
        id."""
        with self._lock:
            graph = self._graphs.pop(node_run, None) if node_run is not None else None
            if graph is not None:
                self._open[graph] = closer
        return graph

    def unwatch(self, graph: UUID) -> None:
        with self._lock:
            self._open.pop(graph, None)


_GRAPH_ERRORS = _GraphErrors()
_GRAPH_ERRORS_VAR: ContextVar[_GraphErrors | None] = ContextVar(
    "loopwarden_langchain_graph_errors", default=_GRAPH_ERRORS
)
_registered = False
_registering = threading.Lock()


def _watch_graph_errors(node_name: str) -> None:
    """Register :data:`_GRAPH_ERRORS` with LangChain's callback configuration (once per
    process) and have it learn the graph runs of the node ``node_name``."""
    global _registered
    with _registering:
        _GRAPH_ERRORS.names.add(node_name)
        if not _registered:
            register_configure_hook(_GRAPH_ERRORS_VAR, True)
            _registered = True


def _last_steps(state: Mapping[str, Any]) -> bool:
    """LangGraph raises ``GraphRecursionError`` once the node after this one has run: one
    step is left at most (``remaining_steps``), and after a model or tools node another node
    always comes (the tools or the model, this middleware's ``after_agent`` at the least)."""
    remaining = state.get("remaining_steps")
    return remaining is not None and remaining <= 1


class LoopwardenState(AgentState[Any]):
    """The agent state with loopwarden's keys: the id of the invocation's run (private), the
    stop in the result (:data:`RESULT_KEY`), and LangGraph's remaining steps (private)."""

    loopwarden_run_id: NotRequired[Annotated[str, PrivateStateAttr]]
    loopwarden_tip: NotRequired[Annotated[str, PrivateStateAttr]]
    loopwarden: NotRequired[Annotated[dict[str, Any] | None, OmitFromInput]]
    remaining_steps: NotRequired[Annotated[int, PrivateStateAttr, RemainingStepsManager]]


def _stop(guarded: GuardedRun) -> dict[str, Any]:
    """What the result says of the run: its id (the run record's ``run_id``), how it ended,
    the plugin that stopped it, soft or hard."""
    o = guarded.outcome
    return {
        "run_id": guarded.run.run_id,
        "termination": o.termination if o else None,
        "stopped": o is not None and o.stopped_by is not None,
        "stopped_by": o.stopped_by if o else None,
        "soft": bool(o and o.soft),
    }


def _get(state: Any, key: str) -> Any:
    """A key of the graph state (a mapping, or an object with attributes)."""
    return state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)


def _thread(config: Mapping[str, Any] | None) -> str | None:
    """The LangGraph thread of the invocation (``configurable.thread_id``), if any."""
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return None if thread is None else str(thread)


def _config() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:  # called outside a graph (a test calling a hook directly)
        return {}


def _pending(messages: list[BaseMessage]) -> AIMessage | None:
    """The last message when it is the model's answer with tool calls still unanswered."""
    if not messages:
        return None
    last = messages[-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return last
    return None


def _received(messages: list[BaseMessage]) -> str | None:
    """The text the caller receives as the agent's answer (its last message's)."""
    if not messages or isinstance(messages[-1], HumanMessage):
        return None
    return _text(messages[-1])


def _text(msg: BaseMessage) -> str:
    content = msg.content
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


def _openai(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    converted = convert_to_openai_messages(messages)
    return [m for m in converted if isinstance(m, dict)]


def _structured_text(value: Any) -> str:
    """A structured response as the answer's text (JSON where it can be)."""
    dump = getattr(value, "model_dump_json", None)
    if callable(dump):
        return str(dump())
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _response(
    result: ModelResponse[Any] | AIMessage | Any, *, with_usage: bool = True
) -> tuple[AIMessage | None, events.ModelResponse]:
    """The framework's model answer as loopwarden's.  With a structured response
    (``response_format``), the calls that the answer itself settled (ToolStrategy's output
    tool, answered by its ``ToolMessage``) are the answer, not tools to run: its text is the
    structured output when the model gave none."""
    msgs = result.result if isinstance(result, ModelResponse) else [result]
    ai = next((m for m in msgs if isinstance(m, AIMessage)), None)
    if ai is None:
        return None, events.ModelResponse(content=None)
    structured = result.structured_response if isinstance(result, ModelResponse) else None
    settled = (
        {m.tool_call_id for m in msgs if isinstance(m, ToolMessage)}
        if structured is not None
        else set()
    )
    content = _text(ai) or None
    if structured is not None and content is None:
        content = _structured_text(structured)
    meta = ai.usage_metadata if with_usage else None
    return ai, events.ModelResponse(
        content=content,
        tool_calls=[
            proposed(tc["name"], tc.get("args") or {}, tc.get("id") or "")
            for tc in ai.tool_calls
            if tc.get("id") not in settled
        ],
        usage=usage(meta["input_tokens"], meta["output_tokens"]) if meta else None,
        model=(ai.response_metadata or {}).get("model_name"),
        finish_reason=(ai.response_metadata or {}).get("finish_reason"),
    )


def _server_calls(ai: AIMessage) -> list[dict[str, Any]]:
    """The provider-side tool calls in the answer (LangChain's ``server_tool_call`` content
    blocks: web search ... run during the model call): no hook saw them, the record says
    they ran."""
    if isinstance(ai.content, str):  # no content blocks: no server tool call
        return []
    return [
        {"type": b.get("name"), "id": b.get("id")}
        for b in ai.content_blocks
        if b.get("type") == "server_tool_call"
    ]


def _schema(tool: Any) -> tuple[str, str, dict[str, Any] | None]:
    if isinstance(tool, dict):
        fn = tool.get("function", tool)
        return str(fn.get("name")), str(fn.get("description") or ""), fn.get("parameters")
    try:
        params = tool.tool_call_schema.model_json_schema()
    except Exception:  # a tool without a pydantic schema: counted without its parameters
        params = None
    return str(tool.name), str(getattr(tool, "description", "") or ""), params


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


class LoopwardenMiddleware(AgentMiddleware[LoopwardenState, Any]):
    """loopwarden's plugins guarding a LangChain ``create_agent`` loop (see the module doc).

    ``tools`` adds tool natures to the deployment's ``[tools.<name>]`` tables
    (``{"refund_order": {"side_effect": True, "idempotency_keys": ["order_id"]}}``);
    ``model_name`` prices the run for ``cost_budget`` (default: the model's own name, when it
    reports one); ``profile`` and ``meta`` are those of ``Deployment.run``.
    """

    state_schema = LoopwardenState

    def __init__(
        self,
        deployment: Deployment,
        *,
        tools: NatureSpec | None = None,
        model_name: str | None = None,
        profile: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.deployment = deployment
        self.natures = nature_tables(tools)
        self.model_name = model_name
        self.profile = profile
        self.meta = dict(meta or {})
        # open runs by the run id the graph state carries (a resumed run: the id it resumes)
        self._runs: dict[str, GuardedRun] = {}
        self._unwatch: dict[str, Callable[[], None]] = {}
        self._conversations: OrderedDict[str, Conversation] = OrderedDict()
        self._lock = threading.Lock()
        self._resuming = threading.Lock()
        # runs ended in LangGraph's last steps: the step left answers from them (no new run)
        self._last: OrderedDict[str, GuardedRun] = OrderedDict()
        self._graphs: dict[str, UUID] = {}  # run key -> the agent graph's run (callbacks)
        self.tools = []
        # the nodes whose start tells a run its graph run: where a run begins, or resumes
        for node in (f"{self.name}.before_agent", "model", "tools"):
            _watch_graph_errors(node)

    # -- runs ----------------------------------------------------------------------------

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

    # -- hooks ---------------------------------------------------------------------------

    def before_agent(self, state: LoopwardenState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._begin(state)

    async def abefore_agent(
        self, state: LoopwardenState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        if not state.get(_KEY):  # no earlier run of the thread to record: nothing to wait on
            return self._begin(state)
        return await off_loop(None, self.deployment, self._begin, state)

    def _prepare(
        self, key: str, guarded: GuardedRun, request: ModelRequest[Any]
    ) -> tuple[ModelRequest[Any] | None, list[HumanMessage | SystemMessage]]:
        """The request as loopwarden's verdicts shape it (None: answer without the model),
        and the guard notes added to it."""
        if _last_steps(request.state):
            # LangGraph raises whatever the model says: no model call whose answer nobody
            # receives
            self._out_of_steps(key, guarded)
            return None, []
        self._declare(guarded, request)
        if guarded.run.model_name is None:
            guarded.run.model_name = getattr(request.model, "model_name", None)
        guarded.system(request.system_prompt)
        turn = self._turn(key, guarded)
        if turn is None:
            return None, []
        notes: list[HumanMessage | SystemMessage] = []
        if turn.notes:
            settings = self.deployment.engine.settings
            cls = HumanMessage if settings.warning_role == "user" else SystemMessage
            notes = [cls(content=settings.warning_prefix + n) for n in turn.notes]
            request = request.override(messages=[*request.messages, *notes])
        if turn.final:
            request = request.override(tools=[], tool_choice=None)
        return request, notes

    @staticmethod
    def _declare(guarded: GuardedRun, request: ModelRequest[Any]) -> None:
        """Make the request's tools known to the run (before a step decides whether it may
        wait on the store: a declared side effect says so)."""
        known = guarded.run.tools
        for t in request.tools:
            name = t.get("name") if isinstance(t, dict) else getattr(t, "name", None)
            if known is None or name not in known:
                guarded.declare(*_schema(t))

    def _stopped(self, key: str, guarded: GuardedRun, request: ModelRequest[Any]) -> AIMessage:
        """The answer in the model's place once the run has ended: loopwarden's text -- or,
        when the agent must give a structured response (``response_format``), which text
        cannot be, :class:`~loopwarden.exceptions.GuardStopped` (the run is recorded)."""
        if request.response_format is not None and guarded.finished:
            self._drop(key, guarded)
            raise guarded.stopped_error()
        return AIMessage(content=guarded.final_answer)

    def _answer(
        self,
        key: str,
        guarded: GuardedRun,
        result: Any,
        notes: list[HumanMessage | SystemMessage],
        must_structure: bool,
    ) -> Any:
        """The model's answer as the agent keeps it: the notes that preceded it first (so they
        stay in the conversation, in order), and loopwarden's answer in its place when the
        run ended on it -- unless the answer is the agent's structured output (a soft stop's
        wrap-up turn may produce it: it stands, as the model's answer).  ``must_structure``:
        the agent has a ``response_format``, so a stop without one raises GuardStopped."""
        ai, response = _response(result)
        if ai is not None:
            guarded.unguarded.extend(_server_calls(ai))
        guarded.model_done(response)
        structured = isinstance(result, ModelResponse) and result.structured_response is not None
        if guarded.replaced and not structured:
            if must_structure:  # text cannot be the agent's structured response
                self._drop(key, guarded)
                raise guarded.stopped_error()
            result = AIMessage(content=guarded.final_answer)
        if not notes:
            return result
        if isinstance(result, ModelResponse):
            return ModelResponse(
                result=[*notes, *result.result], structured_response=result.structured_response
            )
        return ModelResponse(result=[*notes, result])

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        found = self._guarded(request.state)
        if found is None:
            return handler(request)
        key, guarded = found
        prepared, notes = self._prepare(key, guarded, request)
        if prepared is None:
            return self._stopped(key, guarded, request)
        try:
            result = handler(prepared)
        except BaseException as exc:
            self._failed(key, guarded, exc, model=True)
            raise
        answer = self._answer(key, guarded, result, notes, prepared.response_format is not None)
        return self._tipped(request.state, guarded, answer)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        found = await self._aguarded(request.state)
        if found is None:
            return await handler(request)
        key, guarded = found
        self._declare(guarded, request)
        prepared, notes = await guarded.off_loop(self._prepare, key, guarded, request)
        if prepared is None:
            return self._stopped(key, guarded, request)
        try:
            result = await handler(prepared)
        except BaseException as exc:
            await guarded.off_loop(self._failed, key, guarded, exc, model=True)
            raise
        must = prepared.response_format is not None
        answer = await guarded.off_loop(self._answer, key, guarded, result, notes, must)
        return self._tipped(request.state, guarded, answer)

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

    @staticmethod
    def _tipped(
        state: Any, guarded: GuardedRun, answer: ModelResponse[Any] | AIMessage
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """The answer, with the thread's tip moved to this run when it names another (a
        resumed run's first answer): the claims of this answer's calls are this run's."""
        run_id = guarded.run.run_id
        tip = _get(state, _TIP)
        if tip == run_id or guarded.finished:
            return answer
        response = answer if isinstance(answer, ModelResponse) else ModelResponse(result=[answer])
        return ExtendedModelResponse(
            model_response=response, command=Command(update={_TIP: run_id})
        )

    @staticmethod
    def _skipped(request: ToolCallRequest, answer: Answer) -> ToolMessage:
        call = request.tool_call
        return ToolMessage(content=answer.text, tool_call_id=call["id"] or "", name=call["name"])

    @staticmethod
    def _result(out: ToolMessage | Command[Any]) -> Any:
        if isinstance(out, ToolMessage):
            return tool_result(
                out.content if isinstance(out.content, str) else out.text, ok=out.status != "error"
            )
        return tool_result(repr(out))  # a Command: the tool changed the graph's state

    def _tool_guard(self, request: ToolCallRequest) -> tuple[str, GuardedRun] | None:
        found = self._guarded(request.state, request.runtime.config)
        if found is not None and request.tool is not None:
            found[1].declare(*_schema(request.tool))
        return found

    def _settled(self, key: str, guarded: GuardedRun, request: ToolCallRequest) -> None:
        """After a tool call: in LangGraph's last steps, the last call of the answer ends the
        run (the graph raises ``GraphRecursionError`` next)."""
        if _last_steps(request.state) and not guarded.expects_tool:
            self._out_of_steps(key, guarded)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        found = self._tool_guard(request)
        if found is None:
            return handler(request)
        key, guarded = found
        call_id = request.tool_call["id"] or ""
        decision = guarded.tool(call_id)
        if isinstance(decision, Answer):
            self._settled(key, guarded, request)
            return self._skipped(request, decision)
        try:
            out = handler(request)
        except BaseException as exc:
            self._failed(key, guarded, exc, call_id=call_id)
            raise
        guarded.tool_done(call_id, self._result(out))
        self._settled(key, guarded, request)
        return out

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        found = await self._aguarded(request.state, request.runtime.config)
        if found is None:
            return await handler(request)
        key, guarded = found
        if request.tool is not None:
            guarded.declare(*_schema(request.tool))
        call_id = request.tool_call["id"] or ""
        decision = await guarded.atool(call_id)
        if isinstance(decision, Answer):
            await guarded.off_loop(self._settled, key, guarded, request)
            return self._skipped(request, decision)
        try:
            out = await handler(request)
        except BaseException as exc:
            await guarded.off_loop(self._failed, key, guarded, exc, call_id=call_id)
            raise
        await guarded.off_loop(self._done, key, guarded, request, call_id, out)
        return out

    def _done(
        self, key: str, guarded: GuardedRun, request: ToolCallRequest, call_id: str, out: Any
    ) -> None:
        guarded.tool_done(call_id, self._result(out))
        self._settled(key, guarded, request)

    def after_agent(self, state: LoopwardenState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._end(state)

    async def aafter_agent(
        self, state: LoopwardenState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        with self._lock:
            guarded = self._runs.get(str(state.get(_KEY) or ""))
        if guarded is None:
            return self._end(state)
        ended: dict[str, Any] | None = await guarded.off_loop(self._end, state)
        return ended
