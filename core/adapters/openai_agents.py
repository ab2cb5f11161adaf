"""loopwarden's guards in the OpenAI Agents SDK: ``LoopwardenRunner`` in place of ``Runner``.

::

    from agents import Agent
    from loopwarden import Deployment
    from loopwarden.adapters.openai_agents import LoopwardenRunner

    runner = LoopwardenRunner(Deployment.from_config())
    result = await runner.run(agent, "Where is my order?")      # or runner.run_sync(...)

Each ``run`` is one loopwarden run (same plugins, run records, signals, metrics and alerts as
``loopwarden run``).  The runner calls the SDK's own ``Runner.run`` with a per-run copy of the
agent (``Agent.clone``) whose model and function tools are wrapped; every other argument
(``context``, ``max_turns``, ``hooks``, ``run_config``, ``session`` ...) is passed through.
Verdicts become:

* **warn** -- the note is appended to the model input of the next call, as a message of
  ``[run] warning_role`` (the SDK keeps no copy of it in its history);
* **skip** -- the wrapped tool returns the skip's observation without running the tool (so is
  a side effect already executed with the same idempotency key);
* **soft stop** -- the next model call is made with no tools and no handoffs; its text is the
  final output (tool calls it proposes anyway are dropped);
* **hard stop** -- the model is not called: the wrapped model answers with the best-effort
  answer as an assistant message, which becomes the run's final output.

The SDK's extension points that only observe (``RunHooks``) or only filter the input
(``call_model_input_filter``) cannot remove tools or end a run with an answer, which is why the
model is wrapped: that is the one point that sees -- and may replace -- every model call.  The
SDK's ``max_turns`` is kept: when it is hit, a ``max_turns`` error handler (unless you pass
your own) ends the run with loopwarden's best answer, and the loopwarden run is recorded as
``ended_by_framework``.

Limits: only the starting agent is guarded -- after a handoff the other agent's calls are not
seen, and the loopwarden run ends as ``ended_by_framework``; ``Runner.run_streamed`` is not
wrapped; a hard stop's answer is text, so an agent with a structured ``output_type`` fails
its output validation on it.

Needs ``pip install 'loopwarden[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from agents import Agent, FunctionTool, RunConfig, Runner, RunResult
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_error_handlers import RunErrorHandlerInput, RunErrorHandlerResult
from agents.usage import Usage as SDKUsage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

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
    from agents.tool_context import ToolContext

    from loopwarden.deployment import Deployment
    from loopwarden.run import Run

__all__ = ["LoopwardenRunner"]


def _message(text: str) -> Any:
    from openai.types.responses import ResponseOutputText

    return ResponseOutputMessage(
        id="loopwarden-answer",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value)


def _openai(items: list[Any]) -> list[dict[str, Any]]:
    """Responses-API input items as chat messages (for loopwarden's token estimates)."""
    out: list[dict[str, Any]] = []
    for item in items:
        d = item if isinstance(item, dict) else getattr(item, "model_dump", lambda: {})()
        role = d.get("role")
        if role in ("user", "system", "developer", "assistant"):
            content = d.get("content")
            if not isinstance(content, str):
                content = "".join(
                    str(p.get("text", "")) for p in content or () if isinstance(p, dict)
                )
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif d.get("type") == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": d.get("call_id"), "content": str(d.get("output"))}
            )
    return out


def _response(resp: ModelResponse, handoffs: set[str]) -> events.ModelResponse:
    texts: list[str] = []
    calls = []
    for item in resp.output:
        if isinstance(item, ResponseOutputMessage):
            texts.extend(getattr(c, "text", "") for c in item.content)
        elif isinstance(item, ResponseFunctionToolCall) and item.name not in handoffs:
            calls.append(proposed(item.name, item.arguments, item.call_id))
    u = resp.usage
    return events.ModelResponse(
        content="".join(texts) or None,
        tool_calls=calls,
        usage=usage(u.input_tokens, u.output_tokens),
    )


class _GuardedModel(Model):
    """The agent's model, with loopwarden deciding before and after every call."""

    def __init__(self, inner: Model, guarded: GuardedRun) -> None:
        self.inner = inner
        self.guarded = guarded

    def _answer(self, text: str, base: ModelResponse | None = None) -> ModelResponse:
        return ModelResponse(
            output=[_message(text)],
            usage=base.usage if base is not None else SDKUsage(),
            response_id=base.response_id if base is not None else None,
        )

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        guarded = self.guarded
        for t in tools:
            if isinstance(t, FunctionTool):
                guarded.declare(t.name, t.description, t.params_json_schema)
        guarded.system(system_instructions)
        turn = guarded.model_turn()
        if turn is None:
            return self._answer(guarded.final_answer)
        if turn.notes:
            settings = guarded.engine.settings
            input = [
                *_items(input),
                *(
                    {"role": settings.warning_role, "content": settings.warning_prefix + n}
                    for n in turn.notes
                ),
            ]
        if turn.final:
            tools, handoffs = [], []
        try:
            resp = await self.inner.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **kwargs,
            )
        except BaseException as exc:
            guarded.model_failed(exc)  # the SDK may retry; recorded if the run ends on it
            raise
        guarded.model_done(_response(resp, {h.tool_name for h in handoffs}))
        if guarded.replaced:
            return self._answer(guarded.final_answer, resp)
        return resp

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("LoopwardenRunner does not wrap Runner.run_streamed")

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        await self.inner.close()


def _wrap_tool(tool: FunctionTool, guarded: GuardedRun) -> FunctionTool:
    inner = tool.on_invoke_tool

    async def invoke(ctx: ToolContext[Any], input_json: str) -> Any:
        call_id = ctx.tool_call_id
        decision = await guarded.atool(call_id)
        if isinstance(decision, Answer):
            return decision.text
        try:
            value = await inner(ctx, input_json)
        except Exception as exc:
            guarded.tool_done(call_id, tool_result(None, error=exc))
            raise
        guarded.tool_done(call_id, tool_result(value))
        return value

    return dataclasses.replace(tool, on_invoke_tool=invoke)


class LoopwardenRunner:
    """``Runner.run`` / ``Runner.run_sync`` with loopwarden's plugins guarding the run.

    ``tools`` adds tool natures to the deployment's ``[tools.<name>]`` tables;
    ``model_name`` prices the run for ``cost_budget`` (default: the agent's model name);
    ``profile`` and ``meta`` are those of ``Deployment.run``.  :attr:`last_run` is the
    loopwarden run of the latest ``run`` (its record: ``runner.last_run.record()``).
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
        self.last_run: Run | None = None

    def _model(self, agent: Agent[Any], run_config: RunConfig) -> Model:
        chosen = run_config.model if run_config.model is not None else agent.model
        if isinstance(chosen, Model):
            return chosen
        return run_config.model_provider.get_model(chosen)

    async def run(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """Run ``agent`` on ``input`` with the SDK's ``Runner.run``, guarded."""
        run_config = kwargs.pop("run_config", None) or RunConfig()
        if isinstance(run_config, dict):
            run_config = RunConfig(**run_config)
        inner = self._model(agent, run_config)
        items = _items(input)
        user = next((m["content"] for m in reversed(_openai(items)) if m["role"] == "user"), "")
        name = self.model_name or getattr(inner, "model", None)
        guarded = GuardedRun(
            self.deployment,
            user=user,
            history=_openai(items),
            natures=self.natures,
            model_name=name if isinstance(name, str) else None,
            meta=self.meta,
            profile=self.profile,
            adapter="openai_agents",
        )
        self.last_run = guarded.run
        wrapped = agent.clone(
            model=_GuardedModel(inner, guarded),
            tools=[
                _wrap_tool(t, guarded) if isinstance(t, FunctionTool) else t for t in agent.tools
            ],
        )
        handlers = dict(kwargs.pop("error_handlers", None) or {})

        def max_turns(data: RunErrorHandlerInput[Any]) -> RunErrorHandlerResult:
            guarded.finish(detail=f"max_turns: {data.error}")
            return RunErrorHandlerResult(final_output=guarded.final_answer)

        handlers.setdefault("max_turns", max_turns)
        run_config = dataclasses.replace(run_config, model=None)
        try:
            result = await Runner.run(
                wrapped,
                input,
                run_config=run_config,
                error_handlers=handlers,  # type: ignore[arg-type]
                **kwargs,
            )
        except BaseException as exc:
            guarded.finish(exc)
            raise
        guarded.finish(detail="the agent ended before loopwarden's run did (a handoff?)")
        return result

    def run_sync(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """:meth:`run` from sync code (not from inside a running event loop)."""
        return asyncio.run(self.run(agent, input, **kwargs))
