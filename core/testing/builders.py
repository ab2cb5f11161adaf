"""The test kit's payload builders: a run, every hook payload, tools and scripted turns.

Private: import these from :mod:`loopwarden.testing`.  They build what the loop builds, with the
loop's own code (``parse_calls``), so a hook sees in a unit test what it sees in a real run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from loopwarden.clock import CancelToken, Clock, FakeClock
from loopwarden.config import RunConfig
from loopwarden.engine.loop import parse_calls
from loopwarden.events import (
    ErrorKind,
    ModelRequest,
    ModelResponse,
    ProposedCall,
    ToolCall,
    ToolResult,
    Usage,
)
from loopwarden.models.scenario import ScriptConfig
from loopwarden.models.tokens import estimate_tools
from loopwarden.notes import instruction_text
from loopwarden.run import Limits, Run, RunOutcome
from loopwarden.tools import Tool, ToolRegistry

ToolsArg = ToolRegistry | Iterable[Tool] | None


# -- tools ---------------------------------------------------------------------------------


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def make_tool(
    name: str,
    result: Any = "OK",
    *,
    read_only: bool = False,
    deterministic: bool = False,
    side_effect: bool = False,
    terminal: bool = False,
    description: str | None = None,
    parameters: Mapping[str, type] | None = None,
) -> Tool:
    """A tool declaration for tests: any (or the given typed) arguments, a fixed ``result``.

    ``result`` may be a callable taking the arguments as keywords, or an exception instance to
    raise (e.g. ``ToolError("429", retryable=True)``).
    """
    if parameters:
        fields: dict[str, Any] = {k: (v, ...) for k, v in parameters.items()}
        args_model: type[BaseModel] = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid", coerce_numbers_to_str=True),
            **fields,
        )
    else:
        args_model = _AnyArgs

    def body(**kwargs: Any) -> Any:
        if isinstance(result, BaseException):
            raise result
        return result(**kwargs) if callable(result) else result

    body.__name__ = name
    return Tool(
        name=name,
        func=body,
        description=description or f"Test tool {name}.",
        args_model=args_model,
        read_only=read_only,
        deterministic=deterministic,
        side_effect=side_effect,
        terminal=terminal,
    )


def _registry(tools: ToolsArg) -> ToolRegistry:
    if tools is None:
        return ToolRegistry()
    if isinstance(tools, ToolRegistry):
        return tools
    return ToolRegistry(tools)


# -- builders ------------------------------------------------------------------------------


def make_run(
    user: str = "What is the status of order 1001?",
    *,
    tools: ToolsArg = None,
    clock: Clock | None = None,
    limits: Limits | None = None,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    max_seconds: float | None = None,
    step: int = 0,
    usage: tuple[int, int] | Usage | None = None,
    cost: float | Decimal | None = None,
    tool_calls: int = 0,
    scenario: str | None = None,
    run_id: str = "test-run",
    deployment: Any = None,
    meta: dict[str, Any] | None = None,
) -> Run:
    """A :class:`~loopwarden.Run` as hooks see it, with a :class:`FakeClock` at 0.

    ``tools`` defaults to none (build declarations with :func:`make_tool`).
    ``max_steps``/``max_tokens``/``max_seconds`` set the run's profile limits; ``step``,
    ``usage`` (prompt, completion), ``cost`` and ``tool_calls`` set its counters as if that
    much had happened (``cost`` as ``cost_budget`` keeps it: read it back with
    :func:`loopwarden.plugins.cost_budget.run_cost`).  The conversation holds the user's
    message.
    """
    if limits is None and (max_steps, max_tokens, max_seconds) != (None, None, None):
        limits = Limits(
            name="test", max_steps=max_steps, max_tokens=max_tokens, max_seconds=max_seconds
        )
    run = Run(
        user,
        deployment=deployment,
        tools=_registry(tools),
        clock=clock if clock is not None else FakeClock(),
        cancel=CancelToken(),
        limits=limits,
        scenario=scenario,
        run_id=run_id,
        meta=meta,
    )
    run.add_message({"role": "user", "content": user})
    run.step = step
    run.tool_calls = tool_calls
    if usage is not None:
        run.usage.add(usage if isinstance(usage, Usage) else Usage(*usage))
    if cost is not None:
        from loopwarden.plugins.cost_budget import RUN_COST  # the cost is cost_budget's state

        run.stash[RUN_COST] = Decimal(str(cost))
    return run


def _run_config(run: Run) -> RunConfig:
    dep = run.deployment
    cfg = getattr(getattr(dep, "config", None), "run", None)
    return cfg if isinstance(cfg, RunConfig) else RunConfig()


def make_request(
    run: Run | None = None,
    *,
    notes: Sequence[str] = (),
    final: bool = False,
    step: int | None = None,
) -> ModelRequest:
    """The request the loop would send next for ``run`` (``request.step == run.step + 1``).

    ``notes`` are guard warnings injected into it; as in the loop they are also appended to the
    conversation.  ``final=True`` makes it a soft stop's tool-less wrap-up turn.
    """
    run = run if run is not None else make_run()
    cfg = _run_config(run)
    notes = [instruction_text(n) for n in notes]  # as the loop puts them (loopwarden.notes)
    for n in notes:
        run.add_message({"role": cfg.warning_role, "content": cfg.warning_prefix + n})
    schemas = run.tools.schemas() if run.tools is not None else []
    return ModelRequest(
        messages=run.messages,
        tools=schemas,
        tool_choice="none" if final else "auto",
        step=step if step is not None else run.step + 1,
        notes=list(notes),
        final=final,
        estimated_tokens=run.context_tokens + estimate_tools(schemas, run.estimator),
    )


def tool_call(
    name: str, arguments: Mapping[str, Any] | str | None = None, /, **kwargs: Any
) -> dict[str, Any]:
    """One proposed tool call for a scripted turn: ``tool_call("query_order", order_id="1")``.

    ``arguments`` may also be raw JSON text (e.g. malformed, to test the loop's handling).
    """
    args: Any = dict(arguments) if isinstance(arguments, Mapping) else arguments
    if args is None:
        args = {}
    if isinstance(args, dict):
        args.update(kwargs)
    return {"name": name, "arguments": args}


def turn(content: str | None = None, *calls: Mapping[str, Any]) -> dict[str, Any]:
    """One scripted model turn: content and/or tool calls (built with :func:`tool_call`)."""
    return {"content": content, "tool_calls": [dict(c) for c in calls]}


def _proposed(calls: Iterable[Any]) -> list[ProposedCall]:
    import json

    out = []
    for i, c in enumerate(calls):
        if isinstance(c, ProposedCall):
            out.append(c)
            continue
        if isinstance(c, tuple):
            c = tool_call(*c)
        args = c.get("arguments", {})
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        out.append(ProposedCall(name=c["name"], arguments=text, id=c.get("id") or f"call_{i}"))
    return out


def make_response(
    content: str | None = None,
    *calls: Any,
    run: Run | None = None,
    usage: tuple[int, int] | Usage | None = None,
    finish_reason: str | None = None,
    model: str | None = "scripted",
) -> ModelResponse:
    """A model response: ``make_response("我查一下", tool_call("query_order", order_id="1"))``.

    Calls may be :func:`tool_call` dicts, ``(name, arguments)`` tuples or
    :class:`~loopwarden.ProposedCall`.  ``usage`` is (prompt, completion) tokens.  When the
    response type carries parsed ``calls``, they are filled as the loop fills them.
    """
    proposed = _proposed(calls)
    response = ModelResponse(
        content=content,
        tool_calls=proposed,
        usage=usage if isinstance(usage, Usage) or usage is None else Usage(*usage),
        finish_reason=finish_reason or ("tool_calls" if proposed else "stop"),
        model=model,
    )
    parsed_field = "calls"  # ModelResponse.calls, where the loop provides it
    if parsed_field in {f.name for f in dataclasses.fields(ModelResponse)}:
        run = run if run is not None else make_run()
        setattr(response, parsed_field, parse_calls(run, response, _run_config(run)))
    return response


def make_tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None = None,
    /,
    *,
    run: Run | None = None,
    index: int = 0,
    id: str | None = None,
    **kwargs: Any,
) -> ToolCall:
    """A parsed :class:`~loopwarden.ToolCall`, exactly as the loop hands it to ``before_tool``.

    ``make_tool_call("query_order", order_id="88231")``: the tool is looked up in ``run.tools``
    (default: no tools), the arguments are validated against its schema (an unknown tool
    or bad arguments set ``call.error`` as in the loop), and ``fingerprint``,
    ``idempotency_key`` and ``timeout`` are computed by the loop's own code.  ``step`` is
    ``run.step``.  Pass raw JSON text as ``arguments`` to build a malformed call.
    """
    run = run if run is not None else make_run()
    proposal = tool_call(name, arguments, **kwargs)
    (proposed,) = _proposed([proposal])
    proposed.id = id or f"call_{run.step}_{index}"
    response = ModelResponse(tool_calls=[proposed])
    (call,) = parse_calls(run, response, _run_config(run))
    call.index = index
    return call


def make_tool_result(
    content: str = "OK",
    *,
    ok: bool = True,
    error: ErrorKind | None = None,
    retryable: bool = False,
    skipped: bool = False,
    skipped_by: str | None = None,
    duration_s: float = 0.0,
    value: Any = None,
) -> ToolResult:
    """A tool's observation.  ``error`` (a kind such as ``"tool_error"``) implies ``ok=False``."""
    return ToolResult(
        content=content,
        ok=ok and error is None,
        error=error,
        retryable=retryable,
        skipped=skipped,
        skipped_by=skipped_by,
        duration_s=duration_s,
        value=value,
    )


def make_outcome(
    termination: str = "final_answer",
    *,
    soft: bool = False,
    stopped_by: str | None = None,
    final_answer: str | None = "OK.",
    evidence: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """How a run ended, as ``on_stop`` receives it."""
    return RunOutcome(
        termination=termination,
        soft=soft,
        stopped_by=stopped_by,
        evidence=dict(evidence or {}),
        final_answer=final_answer,
        final_answer_present=final_answer is not None and termination == "final_answer",
    )


def script(
    turns: Sequence[Mapping[str, Any]] = (),
    *,
    then: Literal["repeat_last", "cycle", "final"] = "final",
    on_warning: Literal["ignore", "final"] = "ignore",
    final_text: str = "OK.",
) -> ScriptConfig:
    """A scripted model's script (a scenario's ``[model]`` table) from :func:`turn` dicts."""
    return ScriptConfig.model_validate(
        {
            "turns": [dict(t) for t in turns],
            "then": then,
            "on_warning": on_warning,
            "final_text": final_text,
        }
    )
