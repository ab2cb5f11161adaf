"""loopwarden's guards in a pydantic-ai agent: the ``Loopwarden`` capability.

::

    from pydantic_ai import Agent
    from loopwarden import Deployment
    from loopwarden.adapters.pydantic_ai import Loopwarden

    agent = Agent(model, tools=[...], capabilities=[Loopwarden(Deployment.from_config())])

Each agent run (``run``, ``run_sync``, ``iter``, ``run_stream``, ``run_stream_sync``) is one
loopwarden run (same plugins, run records, signals, metrics and alerts as ``loopwarden run``):
:meth:`Loopwarden.for_run` gives every run its own instance.  Its run id is pydantic-ai's
``run_id``, and the result's ``metadata["loopwarden"]`` (:data:`METADATA_KEY`) says how it
ended (``run_id``, ``termination``, ``stopped_by``, ``soft``, ``final_answer_present``).  A
run continuing a ``message_history`` continues its loopwarden conversation (keyed on
pydantic-ai's ``conversation_id``), so conversation-scoped limits count across it.  Verdicts
become:

* **warn** -- ``before_model_request`` enqueues the note (``RunContext.enqueue``): it reaches
  this request and stays in the message history;
* **skip** -- ``wrap_tool_execute`` returns the skip's observation as the tool's return value
  without running the tool (so is a side effect already executed with the same idempotency key);
* **soft stop** -- ``prepare_tools`` removes every function tool for the next request, whose
  text -- or, for an ``output_type``, its call of the output tool or its ``NativeOutput`` /
  ``PromptedOutput`` JSON, which a note next to the wrap-up instruction asks for -- is the
  answer (function tool calls it proposes anyway are dropped);
* **hard stop** -- ``wrap_model_request`` answers in the model's place with the best-effort
  answer as text, which ends the run.

A call of an output tool (``final_result``) is the model's answer, never a tool call.  A run
ending in ``DeferredToolRequests`` (approvals, external calls) is recorded as paused
(``evidence.deferred``); the run given ``deferred_tool_results`` adopts the paused answer as
its first (token-free) model answer -- once pydantic-ai has validated the approved calls, with
the arguments an approval edited (``ToolApproved(override_args=...)``) -- so the approved
calls go through the guards and the ledger as they will run.  Under
``run_stream`` the run is finished when the graph ends (the stream read to its end), not when
the stream is closed: the streamed response is read from the model's stream
(:class:`_Watched`), which pydantic-ai hands to ``wrap_model_request`` only at the close.

A stop that gives no structured output where the ``output_type`` does not accept text (a hard
stop, a wrap-up answered with text) raises :class:`~loopwarden.exceptions.GuardStopped`, the
run recorded first.  Limits: a tool call whose arguments
pydantic-ai refuses before execution (a retry prompt) is recorded as not run by the framework
(``evidence.adapter``) -- its ``before_tool`` verdicts, if any, were given all the same.

Needs ``pip install 'loopwarden[pydantic-ai]'``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import NoOpTracer
from pydantic_ai import messages as pm
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, UsageLimitExceeded
from pydantic_ai.models import Model, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_graph import End

from loopwarden import events
from loopwarden.adapters._driver import (
    Answer,
    GuardedRun,
    NatureSpec,
    conversation_for,
    nature_tables,
    proposed,
    stop_info,
    structured_wrap_up,
    tool_result,
    usage,
)
from loopwarden.adapters._exchange import model_url
from loopwarden.plugins.otel import AGENT_NAME, FRAMEWORK_SPANS

if TYPE_CHECKING:
    from pydantic_ai.capabilities.abstract import (
        AgentNode,
        NodeResult,
        RawToolArgs,
        ValidatedToolArgs,
        WrapModelRequestHandler,
        WrapRunHandler,
        WrapToolExecuteHandler,
        WrapToolValidateHandler,
    )
    from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext, ToolDefinition

    from loopwarden.deployment import Deployment

__all__ = ["METADATA_KEY", "Loopwarden"]

#: the key of loopwarden's entry in the run result's ``metadata`` (see :func:`stop_info`)
METADATA_KEY = "loopwarden"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(c if isinstance(c, str) else "" for c in content or ())


def _openai(history: list[pm.ModelMessage]) -> list[dict[str, Any]]:
    """pydantic-ai messages as OpenAI chat messages (for loopwarden's token estimates)."""
    out: list[dict[str, Any]] = []
    for msg in history:
        if isinstance(msg, pm.ModelRequest):
            for part in msg.parts:
                if isinstance(part, pm.SystemPromptPart):
                    out.append({"role": "system", "content": part.content})
                elif isinstance(part, pm.UserPromptPart):
                    out.append({"role": "user", "content": _text(part.content)})
                elif isinstance(part, pm.ToolReturnPart):
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": part.tool_call_id,
                            "content": part.model_response_str(),
                        }
                    )
        elif isinstance(msg, pm.ModelResponse):
            _, response = _response(msg)
            entry: dict[str, Any] = {"role": "assistant", "content": response.content}
            if response.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": str(c.arguments)},
                    }
                    for c in response.tool_calls
                ]
            out.append(entry)
    return out


def _response(
    msg: pm.ModelResponse, output_tools: frozenset[str] = frozenset()
) -> tuple[list[pm.ToolCallPart], events.ModelResponse]:
    """The function tool calls of ``msg``, and ``msg`` as loopwarden's model response: a call
    of an output tool (``output_tools``: ``final_result`` ...) is the answer, not a tool call
    -- its arguments are the answer's text."""
    calls = [
        p for p in msg.parts if isinstance(p, pm.ToolCallPart) and p.tool_name not in output_tools
    ]
    text = "".join(p.content for p in msg.parts if isinstance(p, pm.TextPart))
    outputs = [_args_text(p.args) for p in _output_calls(msg, output_tools)]
    if outputs:
        text = "\n".join([text, *outputs]) if text else "\n".join(outputs)
    u = msg.usage
    return calls, events.ModelResponse(
        content=text or None,
        tool_calls=[
            proposed(c.tool_name, c.args if c.args is not None else {}, c.tool_call_id)
            for c in calls
        ],
        usage=usage(u.input_tokens, u.output_tokens) if u is not None else None,
        model=msg.model_name,
        finish_reason=msg.finish_reason,
        id=getattr(msg, "provider_response_id", None) or None,
    )


def _open_calls(
    history: list[pm.ModelMessage],
) -> tuple[list[pm.ModelMessage], pm.ModelResponse | None]:
    """Split a run's starting history where it ends in an answer whose tool calls are still
    open (a run resuming deferred calls -- ``deferred_tool_results`` -- or pending ones): the
    messages before that answer, and the answer with only its open calls (None when there is
    none).  Calls answered in a later request are settled already."""
    answered: set[str] = set()
    for i in range(len(history) - 1, -1, -1):
        msg = history[i]
        if isinstance(msg, pm.ModelRequest):
            answered |= {
                p.tool_call_id
                for p in msg.parts
                if isinstance(p, (pm.ToolReturnPart, pm.RetryPromptPart))
            }
            continue
        parts = [
            p
            for p in msg.parts
            if not (isinstance(p, pm.ToolCallPart) and p.tool_call_id in answered)
        ]
        if not any(isinstance(p, pm.ToolCallPart) for p in parts):
            break
        return history[:i], dataclasses.replace(msg, parts=parts)
    return history, None


def _pending_args(pending: pm.ModelResponse | None, call_id: str) -> Any:
    """The arguments the open call ``call_id`` of ``pending`` was proposed with."""
    for p in pending.parts if pending is not None else ():
        if isinstance(p, pm.ToolCallPart) and p.tool_call_id == call_id:
            return p.args
    return None


def _native(msg: pm.ModelResponse) -> list[dict[str, Any]]:
    """The native (built-in) tool calls the provider ran during the model call -- web
    search, code execution ...: no hook saw them, the record says they ran."""
    return [
        {"type": p.tool_name, "id": p.tool_call_id}
        for p in msg.parts
        if isinstance(p, pm.NativeToolCallPart)
    ]


def _output_calls(msg: pm.ModelResponse, output_tools: frozenset[str]) -> list[pm.ToolCallPart]:
    return [p for p in msg.parts if isinstance(p, pm.ToolCallPart) and p.tool_name in output_tools]


def _args_text(args: Any) -> str:
    if args is None:
        return "{}"
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, default=str)


def _text_output(request_context: ModelRequestContext) -> bool:
    """Plain text is a valid output of the run (``output_type`` accepts ``str``): in the
    ``auto``, ``native`` and ``prompted`` modes text must be the output object's JSON."""
    params = request_context.model_request_parameters
    return params.allow_text_output and params.output_mode not in ("auto", "native", "prompted")


def _json_output(request_context: ModelRequestContext) -> bool:
    """Text is the output object's JSON (``NativeOutput``: the provider's response format;
    ``PromptedOutput``), which pydantic-ai validates as the output."""
    params = request_context.model_request_parameters
    return params.allow_text_output and not _text_output(request_context)


def _output_tools(request_context: ModelRequestContext) -> frozenset[str]:
    return frozenset(t.name for t in request_context.model_request_parameters.output_tools)


class _Watched(WrapperModel):
    """The run's model, keeping a handle on each streamed response it opens: under
    ``run_stream`` the response is complete when the caller has read the stream, long before
    pydantic-ai hands it to ``wrap_model_request`` (when the stream is closed)."""

    def __init__(self, wrapped: Model, owner: Loopwarden) -> None:
        super().__init__(wrapped)
        self._owner = owner

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[pm.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as streamed:
            self._owner._streamed = streamed
            yield streamed


def _attach(result: AgentRunResult[Any], guarded: GuardedRun) -> None:
    """Put loopwarden's stop (:func:`~loopwarden.adapters._driver.stop_info`) into the run
    result's ``metadata`` under :data:`METADATA_KEY` -- a new dict: the caller's own metadata
    mapping (shared by the agent's runs) is not changed."""
    info = stop_info(guarded)
    state = getattr(result, "_state", None)  # where pydantic-ai keeps a result's metadata
    if info is None or state is None:
        return
    state.metadata = {**(state.metadata or {}), METADATA_KEY: info}


class Loopwarden(AbstractCapability[Any]):
    """loopwarden's plugins guarding a pydantic-ai agent (see the module doc).

    ``tools`` adds tool natures to the deployment's ``[tools.<name>]`` tables;
    ``model_name`` prices the run for ``cost_budget`` (default: the model's own name);
    ``profile`` and ``meta`` are those of ``Deployment.run``.
    """

    def __init__(
        self,
        deployment: Deployment,
        *,
        tools: NatureSpec | None = None,
        model_name: str | None = None,
        profile: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.deployment = deployment
        self.natures = nature_tables(tools)
        self.model_name = model_name
        self.profile = profile
        self.meta = dict(meta or {})
        self.guarded: GuardedRun | None = None  # this run's (set on the for_run copy)
        self._streaming = False  # the current model request is streamed
        self._streamed: StreamedResponse | None = None  # its response, once opened
        self._output_tools: frozenset[str] = frozenset()
        self._adopted = False  # the run began with an earlier answer's open calls
        self._pending: pm.ModelResponse | None = None  # those calls, until adopted
        #: the arguments an approval put in place of a pending call's (``ToolApproved(
        #: override_args=...)``), seen when pydantic-ai validates them -- before adoption
        self._edits: dict[str, Any] = {}
        #: pending calls whose arguments pydantic-ai refused before adoption: call id -> why
        self._refusals: dict[str, str] = {}
        self._adopting: asyncio.Future[None] | None = None  # the adoption, once begun
        #: the last answer's output-tool text when function tools were called beside it: the
        #: run ends on it once pydantic-ai has run them (``end_strategy``)
        self._output_text: str | None = None

    async def for_run(self, ctx: RunContext[Any]) -> AbstractCapability[Any]:
        return Loopwarden(
            self.deployment,
            tools=self.natures,
            model_name=self.model_name,
            profile=self.profile,
            meta=self.meta,
        )

    def _guard(self, ctx: RunContext[Any]) -> GuardedRun:
        if self.guarded is None:
            model_name = self.model_name or getattr(ctx.model, "model_name", None)
            key = ctx.conversation_id  # inherited from message_history= when one is given
            history, pending = _open_calls(list(ctx.messages))
            meta = dict(self.meta)
            if not isinstance(ctx.tracer, NoOpTracer):  # pydantic-ai's instrumentation is on
                meta[FRAMEWORK_SPANS] = True
            if ctx.agent is not None and ctx.agent.name:
                meta.setdefault(AGENT_NAME, ctx.agent.name)
            if pending is not None and pending.run_id:
                meta["resumed_from"] = pending.run_id
            self.guarded = GuardedRun(
                self.deployment,
                user=_text(ctx.prompt),
                history=_openai(history),
                natures=self.natures,
                model_name=model_name,
                meta=meta,
                profile=self.profile,
                run_id=ctx.run_id,  # the result's run_id is the run record's
                conversation=conversation_for(self.deployment, key) if key else None,
                adapter="pydantic_ai",
            )
            self.guarded.run.model_url = model_url(ctx.model)
            self._pending = pending
        return self.guarded

    async def _started(self, ctx: RunContext[Any]) -> GuardedRun:
        """The run's :class:`GuardedRun`, the open calls it starts from adopted (off the
        event loop: its steps may wait on the store) -- with the arguments an approval
        edited, so what executes is what the guards and the ledger see."""
        guarded = self._guard(ctx)
        pending, self._pending = self._pending, None
        if pending is not None:  # once; parallel calls all wait for it (none is decided before)
            self._adopting = asyncio.ensure_future(
                guarded.off_loop(self._adopt, guarded, pending, self._edits, self._refusals)
            )
            self._adopted = True
        if self._adopting is not None:
            await self._adopting
        return guarded

    @staticmethod
    def _adopt(
        guarded: GuardedRun,
        pending: pm.ModelResponse,
        edits: Mapping[str, Any],
        refusals: Mapping[str, str],
    ) -> None:
        """The run starts with an earlier run's answer whose calls are still open (approved,
        or given results, in ``deferred_tool_results``): that answer is the run's first model
        answer -- no tokens, the run that received it paid them -- so its calls go through
        the guards and the side-effect ledger like any other, each with the arguments it
        will run with (``edits``); the calls pydantic-ai refused (``refusals``) are not run."""
        parts = [
            dataclasses.replace(p, args=edits[p.tool_call_id])
            if isinstance(p, pm.ToolCallPart) and p.tool_call_id in edits
            else p
            for p in pending.parts
        ]
        calls, event = _response(dataclasses.replace(pending, parts=parts))
        for c in calls:
            guarded.declare(c.tool_name)
        if guarded.model_turn() is not None:
            guarded.model_done(dataclasses.replace(event, usage=None))
        for call_id, reason in refusals.items():
            guarded.not_run(call_id, reason)

    # -- the run -------------------------------------------------------------------------

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        try:
            result = await handler()
        except UsageLimitExceeded as exc:  # pydantic-ai's own limits ended the run
            if self.guarded is not None:
                await self.guarded.off_loop(
                    self.guarded.finish, None, detail=f"{type(exc).__name__}: {exc}"
                )
            raise
        except BaseException as exc:
            if self.guarded is not None:
                await self.guarded.off_loop(self.guarded.finish, exc)
            raise
        guarded = self.guarded
        if guarded is not None:
            await guarded.off_loop(self._ended, guarded, result.output, self._output_text)
            _attach(result, guarded)
        return result

    @staticmethod
    def _ended(guarded: GuardedRun, output: Any, answer: str | None) -> None:
        """The agent's run ended with ``output``: finish loopwarden's run if it has not.  A
        run paused for approvals or external results (``DeferredToolRequests``) is recorded
        ``ended_by_framework`` with the paused calls' ids in ``evidence.deferred``; the calls
        are not run (their side-effect keys stay free for the run that resumes them).  An
        output tool called beside function tools (``answer``: its text) is the model's own
        answer: ``final_answer`` once pydantic-ai has run (or skipped) those tools."""
        if isinstance(output, DeferredToolRequests):
            ids = [c.tool_call_id for c in [*output.calls, *output.approvals]]
            guarded.end_by_framework(
                "paused: the calls wait for deferred_tool_results", None, deferred=ids
            )
        elif answer is not None:
            guarded.answered(answer)
        guarded.finish(detail="the agent ended before loopwarden's run did")

    def _keep_answer(
        self, msg: pm.ModelResponse, calls: list[pm.ToolCallPart], event: events.ModelResponse
    ) -> None:
        """Keep the answer's text when the model called the output tool beside function tools
        (``calls``): the run ends on it once pydantic-ai has run them; forget it otherwise."""
        beside = bool(calls) and bool(_output_calls(msg, self._output_tools))
        self._output_text = event.content if beside else None

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        """The agent's graph has ended: finish loopwarden's run now.  Under ``run_stream``
        (and ``run_stream_sync``) the graph ends when the caller has consumed the stream,
        while the streamed response reaches ``wrap_model_request`` only when the stream is
        closed -- possibly never, for a result that is not closed: the run is recorded from
        the final output here."""
        guarded = self.guarded
        if isinstance(result, End) and guarded is not None and not guarded.finished:
            if self._streamed is not None:  # read to its end: the whole response, usage too
                streamed = self._streamed.get()
                calls, event = _response(streamed, self._output_tools)
                self._keep_answer(streamed, calls, event)
                guarded.unguarded.extend(_native(streamed))
                await guarded.off_loop(guarded.model_done, event)
            output = getattr(result.data, "output", None)
            await guarded.off_loop(self._ended, guarded, output, self._output_text)
        return result

    def get_wrapper_model(self, model: Model) -> Model | None:
        return _Watched(model, self) if self._streaming else None

    # -- model requests ------------------------------------------------------------------

    async def prepare_tools(
        self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        guarded = self._guard(ctx)
        for t in tool_defs:
            guarded.declare(t.name, t.description or "", t.parameters_json_schema)
        if self._pending is not None or (self._adopted and guarded.expects_tool):
            # the tools to run the open calls with, no model call yet: they are adopted
            # after pydantic-ai has validated them (an approval may edit their arguments)
            return tool_defs
        self._adopted = False
        turn = await guarded.off_loop(guarded.model_turn)
        if turn is None or turn.final:
            return []  # the wrap-up turn (or the run is over): no tool can be called
        return tool_defs

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        guarded = await self._started(ctx)
        parts = request_context.model_request_parameters.instruction_parts or []
        guarded.system("\n\n".join(p.content for p in parts))  # counted from the next turn
        turn = await guarded.off_loop(guarded.model_turn)
        if turn is not None and (turn.notes or turn.final):
            texts = list(turn.notes)
            if turn.final and not _text_output(request_context):  # answer in the output type
                texts.append(structured_wrap_up(sorted(_output_tools(request_context))))
            settings = self.deployment.engine.settings
            for note in texts:
                text = settings.warning_prefix + note
                if settings.warning_role == "user":
                    ctx.enqueue(text)
                else:
                    ctx.enqueue(pm.SystemPromptPart(content=text))
        return request_context

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> pm.ModelResponse:
        guarded = await self._started(ctx)
        text_ok = _text_output(request_context)
        if await guarded.off_loop(guarded.model_turn) is None:
            if not text_ok:  # the answer would be text the output type refuses
                raise guarded.stopped_error()
            return pm.ModelResponse(parts=[pm.TextPart(guarded.final_answer)])
        output_tools = self._output_tools = _output_tools(request_context)
        self._streaming, self._streamed = request_context.streaming, None
        try:
            response = await handler(request_context)
        except BaseException as exc:
            guarded.model_failed(exc)  # pydantic-ai may retry; recorded if the run ends on it
            raise
        calls, event = _response(response, output_tools)
        self._keep_answer(response, calls, event)
        guarded.unguarded.extend(_native(response))
        await guarded.off_loop(guarded.model_done, event)
        if guarded.replaced:
            # the wrap-up's structured output stands -- its output tool call, or the output's
            # JSON as text (native, prompted) -- its function tool calls dropped; otherwise
            # the answer is loopwarden's text
            o = guarded.outcome
            if o is not None and o.soft and o.final_answer_present:
                outputs = _output_calls(response, output_tools)
                if outputs:
                    return dataclasses.replace(response, parts=[*outputs])
                if _json_output(request_context):  # pydantic-ai validates it as the output
                    texts = [p for p in response.parts if isinstance(p, pm.TextPart)]
                    return dataclasses.replace(response, parts=texts)
            if not text_ok:  # no structured output came: text would fail validation
                raise guarded.stopped_error()
            return dataclasses.replace(response, parts=[pm.TextPart(guarded.final_answer)])
        return response

    # -- tools ---------------------------------------------------------------------------

    async def wrap_tool_validate(
        self,
        ctx: RunContext[Any],
        *,
        call: pm.ToolCallPart,
        tool_def: ToolDefinition,
        args: RawToolArgs,
        handler: WrapToolValidateHandler,
    ) -> ValidatedToolArgs:
        adopting = self._pending is not None  # an open call of the run's starting answer
        if adopting and call.args != _pending_args(self._pending, call.tool_call_id):
            self._edits[call.tool_call_id] = call.args  # an approval edited the arguments
        try:
            return await handler(args)
        except Exception as exc:  # refused before execution: a retry prompt, not a run
            reason = f"arguments refused ({type(exc).__name__})"
            if adopting:
                self._refusals[call.tool_call_id] = reason
            else:
                guarded = await self._started(ctx)
                await guarded.off_loop(guarded.not_run, call.tool_call_id, reason)
            raise

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: pm.ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        guarded = await self._started(ctx)
        decision = await guarded.atool(call.tool_call_id)
        if isinstance(decision, Answer):
            return decision.text
        try:
            value = await handler(args)
        except (ApprovalRequired, CallDeferred):  # deferred: not run; it may come again
            guarded.release(call.tool_call_id)
            await guarded.off_loop(guarded.not_run, call.tool_call_id, "deferred")
            raise
        except Exception as exc:
            await guarded.off_loop(
                guarded.tool_done, call.tool_call_id, tool_result(None, error=exc)
            )
            raise
        await guarded.off_loop(guarded.tool_done, call.tool_call_id, tool_result(value))
        return value
