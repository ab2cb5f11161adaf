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
  stop that came with the model's answer replaces that answer the same way.

Needs ``pip install 'loopwarden[langchain]'``.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langgraph.errors import GraphBubbleUp
from typing_extensions import NotRequired

from loopwarden import events
from loopwarden.adapters._driver import (
    Answer,
    GuardedRun,
    NatureSpec,
    nature_tables,
    proposed,
    tool_result,
    usage,
)

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime
    from langgraph.types import Command

    from loopwarden.deployment import Deployment

__all__ = ["LoopwardenMiddleware", "LoopwardenState"]

_KEY = "loopwarden_run_id"


class LoopwardenState(AgentState[Any]):
    """The agent state with the id of the loopwarden run of this invocation (private)."""

    loopwarden_run_id: NotRequired[Annotated[str, PrivateStateAttr]]


def _text(msg: BaseMessage) -> str:
    content = msg.content
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


def _openai(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    converted = convert_to_openai_messages(messages)
    return [m for m in converted if isinstance(m, dict)]


def _response(
    result: ModelResponse[Any] | AIMessage | Any,
) -> tuple[AIMessage | None, events.ModelResponse]:
    msgs = result.result if isinstance(result, ModelResponse) else [result]
    ai = next((m for m in msgs if isinstance(m, AIMessage)), None)
    if ai is None:
        return None, events.ModelResponse(content=None)
    meta = ai.usage_metadata
    return ai, events.ModelResponse(
        content=_text(ai) or None,
        tool_calls=[
            proposed(tc["name"], tc.get("args") or {}, tc.get("id") or "") for tc in ai.tool_calls
        ],
        usage=usage(meta["input_tokens"], meta["output_tokens"]) if meta else None,
        model=(ai.response_metadata or {}).get("model_name"),
    )


def _schema(tool: Any) -> tuple[str, str, dict[str, Any] | None]:
    if isinstance(tool, dict):
        fn = tool.get("function", tool)
        return str(fn.get("name")), str(fn.get("description") or ""), fn.get("parameters")
    try:
        params = tool.tool_call_schema.model_json_schema()
    except Exception:  # a tool without a pydantic schema: counted without its parameters
        params = None
    return str(tool.name), str(getattr(tool, "description", "") or ""), params


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
        self._runs: dict[str, GuardedRun] = {}
        self._lock = threading.Lock()
        self.tools = []

    # -- runs ----------------------------------------------------------------------------

    def _begin(self, state: Mapping[str, Any]) -> dict[str, Any]:
        messages: list[BaseMessage] = list(state.get("messages") or [])
        user = next((_text(m) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        guarded = GuardedRun(
            self.deployment,
            user=user,
            history=_openai(messages),
            natures=self.natures,
            model_name=self.model_name,
            meta=self.meta,
            profile=self.profile,
            adapter="langchain",
        )
        with self._lock:
            self._runs[guarded.run.run_id] = guarded
        return {_KEY: guarded.run.run_id}

    def _guarded(self, state: Any) -> GuardedRun | None:
        run_id = state.get(_KEY) if isinstance(state, Mapping) else getattr(state, _KEY, None)
        with self._lock:
            return self._runs.get(run_id) if run_id else None

    def _end(self, state: Mapping[str, Any]) -> None:
        run_id = state.get(_KEY)
        with self._lock:
            guarded = self._runs.pop(run_id, None) if run_id else None
        if guarded is not None:
            guarded.finish(detail="the agent ended before loopwarden's run did")

    def _failed(
        self,
        guarded: GuardedRun,
        exc: BaseException,
        *,
        model: bool = False,
        call_id: str | None = None,
    ) -> None:
        """The model or a tool raised and the exception leaves the middleware: LangChain has
        already applied its own error handling (``handle_tool_errors``) inside ``handler``, so
        the agent ends here -- the guards see the failure, and the run ends (recorded).
        An interrupt (``GraphBubbleUp``: human-in-the-loop) is not a failure: the run stays
        open for the resumed invocation, which finds it by the id kept in the state."""
        if isinstance(exc, GraphBubbleUp):
            if call_id is not None:
                guarded.release(call_id)
            return
        if model:
            guarded.model_failed(exc)
        elif call_id is not None:
            guarded.tool_done(call_id, tool_result(None, error=exc))
        guarded.finish(exc)
        with self._lock:
            self._runs.pop(guarded.run.run_id, None)

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
        return self._begin(state)

    def _prepare(
        self, guarded: GuardedRun, request: ModelRequest[Any]
    ) -> tuple[ModelRequest[Any] | None, list[HumanMessage | SystemMessage]]:
        """The request as loopwarden's verdicts shape it (None: answer without the model),
        and the guard notes added to it."""
        known = guarded.run.tools
        for t in request.tools:
            name = t.get("name") if isinstance(t, dict) else getattr(t, "name", None)
            if known is None or name not in known:
                guarded.declare(*_schema(t))
        if guarded.run.model_name is None:
            guarded.run.model_name = getattr(request.model, "model_name", None)
        guarded.system(request.system_prompt)
        try:
            turn = guarded.model_turn()  # the first one checks the model (validate_model)
        except BaseException:
            if guarded.refused:  # the run never started: nothing to finish, keep nothing
                with self._lock:
                    self._runs.pop(guarded.run.run_id, None)
            raise
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
    def _answer(guarded: GuardedRun, result: Any, notes: list[HumanMessage | SystemMessage]) -> Any:
        """The model's answer as the agent keeps it: the notes that preceded it first (so they
        stay in the conversation, in order), and loopwarden's answer in its place when the
        run ended on it."""
        _, response = _response(result)
        guarded.model_done(response)
        if guarded.replaced:
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
    ) -> ModelResponse[Any] | AIMessage:
        guarded = self._guarded(request.state)
        if guarded is None:
            return handler(request)
        prepared, notes = self._prepare(guarded, request)
        if prepared is None:
            return AIMessage(content=guarded.final_answer)
        try:
            result = handler(prepared)
        except BaseException as exc:
            self._failed(guarded, exc, model=True)
            raise
        answer: ModelResponse[Any] | AIMessage = self._answer(guarded, result, notes)
        return answer

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        guarded = self._guarded(request.state)
        if guarded is None:
            return await handler(request)
        prepared, notes = self._prepare(guarded, request)
        if prepared is None:
            return AIMessage(content=guarded.final_answer)
        try:
            result = await handler(prepared)
        except BaseException as exc:
            self._failed(guarded, exc, model=True)
            raise
        answer: ModelResponse[Any] | AIMessage = self._answer(guarded, result, notes)
        return answer

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

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        guarded = self._guarded(request.state)
        if guarded is None:
            return handler(request)
        call_id = request.tool_call["id"] or ""
        decision = guarded.tool(call_id)
        if isinstance(decision, Answer):
            return self._skipped(request, decision)
        try:
            out = handler(request)
        except BaseException as exc:
            self._failed(guarded, exc, call_id=call_id)
            raise
        guarded.tool_done(call_id, self._result(out))
        return out

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        guarded = self._guarded(request.state)
        if guarded is None:
            return await handler(request)
        call_id = request.tool_call["id"] or ""
        decision = await guarded.atool(call_id)
        if isinstance(decision, Answer):
            return self._skipped(request, decision)
        try:
            out = await handler(request)
        except BaseException as exc:
            self._failed(guarded, exc, call_id=call_id)
            raise
        guarded.tool_done(call_id, self._result(out))
        return out

    def after_agent(self, state: LoopwardenState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._end(state)
        return None

    async def aafter_agent(
        self, state: LoopwardenState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        self._end(state)
        return None
