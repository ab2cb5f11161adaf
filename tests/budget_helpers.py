"""Builders shared by the budget-and-cap plugin tests: scenarios, configs, runs and events
made in code, so each test states only what it is about."""

from __future__ import annotations

from typing import Any

from loopwarden import (
    Config,
    FakeClock,
    Limits,
    ModelRequest,
    ModelResponse,
    ProposedCall,
    Run,
    ToolCall,
    ToolResult,
    Usage,
)
from loopwarden.config import parse_config
from loopwarden.scenario import Scenario
from loopwarden.tools import Tool

FINAL = "FINAL ANSWER"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One scripted tool call."""
    return {"name": name, "arguments": arguments}


def turn(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """One scripted model turn."""
    out: dict[str, Any] = {"tool_calls": list(calls)}
    if content is not None:
        out["content"] = content
    return out


def scenario(
    turns: list[dict[str, Any]],
    *,
    then: str = "repeat_last",
    tools: dict[str, Any] | None = None,
    user: str = "查询订单 88231 的状态",
    final_text: str = FINAL,
    on_warning: str = "ignore",
    profile: str | None = None,
    name: str = "test",
) -> Scenario:
    """A scenario built in code (DESIGN's scenario file format, as a mapping)."""
    data: dict[str, Any] = {
        "name": name,
        "user": user,
        "model": {"turns": turns, "then": then, "on_warning": on_warning, "final_text": final_text},
        "tools": tools or {},
    }
    if profile is not None:
        data["profile"] = profile
    return Scenario.model_validate(data)


def config(*enabled: str, profiles: dict[str, Any] | None = None, **tables: Any) -> Config:
    """A config enabling ``enabled`` (in order) with ``[plugins.<name>]`` tables."""
    plugins: dict[str, Any] = {"enabled": list(enabled)}
    plugins.update(tables)
    data: dict[str, Any] = {"plugins": plugins}
    if profiles:
        data["profiles"] = profiles
    return parse_config(data, path="<test>")


def make_run(
    *,
    clock: FakeClock | None = None,
    limits: Limits | None = None,
    model: str = "scripted",
    user: str = "hello",
) -> Run:
    """A bare run on a fake clock (no deployment, no tools)."""
    return Run(user, clock=clock or FakeClock(), limits=limits, model_name=model)


def request(
    run: Run, estimated: int, *, final: bool = False, max_output: int | None = None
) -> ModelRequest:
    """The request for call ``run.step + 1`` with a given prompt estimate."""
    return ModelRequest(
        messages=[],
        tools=[],
        step=run.step + 1,
        final=final,
        estimated_tokens=estimated,
        max_output_tokens=max_output,
        tool_choice="none" if final else "auto",
    )


def response(
    *,
    prompt: int = 0,
    completion: int = 0,
    cached: int = 0,
    tools: int = 1,
    usage: bool = True,
    content: str | None = "ok",
    model: str | None = None,
) -> ModelResponse:
    """A model response with ``tools`` proposed calls and the given usage."""
    return ModelResponse(
        content=content,
        tool_calls=[
            ProposedCall(name="query_order", arguments='{"order_id": "88231"}')
            for _ in range(tools)
        ],
        usage=Usage(prompt=prompt, completion=completion, cached=cached) if usage else None,
        model=model,
    )


def tool_call(
    name: str = "query_order",
    *,
    tool: Tool | None = None,
    fingerprint: str = "",
    step: int = 1,
    index: int = 0,
    timeout: float | None = None,
) -> ToolCall:
    """A parsed tool call as before_tool/after_tool see it."""
    return ToolCall(
        name=name,
        arguments={},
        raw_arguments="{}",
        id=f"c{step}_{index}",
        step=step,
        index=index,
        fingerprint=fingerprint or f"{name}:fp",
        tool=tool,
        timeout=timeout,
    )


def ok(content: str = "result") -> ToolResult:
    return ToolResult(content=content)


def failed(
    content: str = "ERROR", *, retryable: bool = False, error: str = "tool_error"
) -> ToolResult:
    return ToolResult(content=content, ok=False, error=error, retryable=retryable)  # type: ignore[arg-type]


def skipped(content: str = "skipped") -> ToolResult:
    return ToolResult(content=content, skipped=True, skipped_by="other")
