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
  wrap-up turn keeps the agent's ``response_format`` (and a note next to the wrap-up
  instruction asks for it): its structured response stands; a stop
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

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
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
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.managed.is_last_step import RemainingStepsManager
from langgraph.types import Command
from typing_extensions import NotRequired

from loopwarden.adapters._driver import (
    Answer,
    GuardedRun,
    NatureSpec,
    nature_tables,
    off_loop,
    structured_wrap_up,
    tool_result,
)
from loopwarden.adapters._exchange import model_url
from loopwarden.adapters._graphwatch import MAX_LAST as MAX_LAST
from loopwarden.adapters._graphwatch import RECURSION as RECURSION
from loopwarden.adapters._graphwatch import _last_steps, _watch_graph_errors
from loopwarden.adapters._lcmessages import (
    _get,
    _output_tools,
    _response,
    _schema,
    _server_calls,
    _tool_name,
)
from loopwarden.adapters._middlewareruns import _KEY, _TIP, RESULT_KEY, MiddlewareRuns
from loopwarden.adapters._middlewareruns import ABANDON_S as ABANDON_S
from loopwarden.adapters._middlewareruns import MAX_CONVERSATIONS as MAX_CONVERSATIONS
from loopwarden.run import Conversation

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime

    from loopwarden.deployment import Deployment

__all__ = ["RESULT_KEY", "LoopwardenMiddleware", "LoopwardenState"]


class LoopwardenState(AgentState[Any]):
    """The agent state with loopwarden's keys: the id of the invocation's run (private), the
    stop in the result (:data:`RESULT_KEY`), and LangGraph's remaining steps (private)."""

    loopwarden_run_id: NotRequired[Annotated[str, PrivateStateAttr]]
    loopwarden_tip: NotRequired[Annotated[str, PrivateStateAttr]]
    loopwarden: NotRequired[Annotated[dict[str, Any] | None, OmitFromInput]]
    remaining_steps: NotRequired[Annotated[int, PrivateStateAttr, RemainingStepsManager]]


class LoopwardenMiddleware(MiddlewareRuns, AgentMiddleware[LoopwardenState, Any]):
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
        self._declare(guarded, request.tools)
        if guarded.run.model_name is None:
            guarded.run.model_name = getattr(request.model, "model_name", None)
        if guarded.run.model_url is None:
            guarded.run.model_url = model_url(request.model)
        guarded.system(request.system_prompt)
        turn = self._turn(key, guarded)
        if turn is None:
            return None, []
        texts = list(turn.notes)
        if turn.final and request.response_format is not None:  # answer in the output type
            texts.append(structured_wrap_up(_output_tools(request.response_format)))
        notes: list[HumanMessage | SystemMessage] = []
        if texts:
            settings = self.deployment.engine.settings
            cls = HumanMessage if settings.warning_role == "user" else SystemMessage
            notes = [cls(content=settings.warning_prefix + n) for n in texts]
            request = request.override(messages=[*request.messages, *notes])
        if turn.final:
            request = request.override(tools=[], tool_choice=None)
        return request, notes

    @staticmethod
    def _declare(guarded: GuardedRun, tools: Iterable[Any]) -> None:
        """Make the tools known to the run (before a step decides whether it may wait on the
        store: a declared side effect says so).  A tool's schema is read only the first time
        (every step offers the same tools: reading it each time cost every step)."""
        known = guarded.run.tools
        for t in tools:
            if known is None or _tool_name(t) not in known:
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
        self._declare(guarded, request.tools)
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
            self._declare(found[1], [request.tool])
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
            self._declare(guarded, [request.tool])
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
