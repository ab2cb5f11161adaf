"""What the budget-and-cap plugin tests share beyond :mod:`loopwarden.testing`: a scenario and
a config built in code, and payloads with the numbers those plugins read (a request's prompt
estimate, a response's usage), so each test states only what it is about."""

from __future__ import annotations

from typing import Any

from loopwarden import Config, ModelRequest, ModelResponse, Run, Usage
from loopwarden.config import parse_config
from loopwarden.models.scenario import Scenario
from loopwarden.testing import make_request, make_response, tool_call

FINAL = "FINAL ANSWER"


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
    """A scenario built in code (the scenario file format of docs/contracts.md, as a mapping)."""
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


def request(
    run: Run, estimated: int, *, final: bool = False, max_output: int | None = None
) -> ModelRequest:
    """The kit's request for call ``run.step + 1``, with a given prompt estimate (instead of
    the estimate of the run's conversation) and output cap."""
    req = make_request(run, final=final)
    req.estimated_tokens = estimated
    req.max_output_tokens = max_output
    return req


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
    """The kit's response with ``tools`` proposed ``query_order`` calls and the given usage
    (``cached`` input tokens included, which the kit's ``(prompt, completion)`` pair lacks)."""
    calls = [tool_call("query_order", order_id="88231") for _ in range(tools)]
    return make_response(
        content,
        *calls,
        usage=Usage(prompt=prompt, completion=completion, cached=cached) if usage else None,
        model=model,
    )
