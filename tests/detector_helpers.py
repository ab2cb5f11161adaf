"""Builders for hook-level detector tests: a run, declared tools, calls, results, responses.

A :class:`Feed` drives one plugin object through hook calls exactly as the loop orders them
(``after_response`` with the parsed calls, then ``before_tool`` / ``after_tool`` per call), so
unit tests read like the run they describe.
"""

from __future__ import annotations

import json
from typing import Any

from loopwarden import FakeClock, ModelResponse, Run, ToolCall, ToolResult
from loopwarden.fingerprint import Fingerprinter
from loopwarden.tools import Tool, ToolRegistry, tool
from loopwarden.verdicts import Skip, Stop, Verdict, Warn


@tool(read_only=True, deterministic=True)
def lookup(key: str) -> str:
    """A read-only, deterministic lookup."""
    return key


@tool(read_only=True, deterministic=False)
def clock() -> str:
    """A read-only, non-deterministic tool."""
    return "now"


@tool(side_effect=True, idempotency_keys=("order_id",))
def refund(order_id: str) -> str:
    """A side-effecting tool."""
    return order_id


@tool(deterministic=True)
def recompute(key: str) -> str:
    """Deterministic but not declared read-only."""
    return key


TOOLS = ToolRegistry([lookup, clock, refund, recompute])
FINGERPRINT = Fingerprinter()


def ok(content: str) -> ToolResult:
    return ToolResult(content=content)


def fail(content: str, *, retryable: bool = False, error: Any = "tool_error") -> ToolResult:
    return ToolResult(content=content, ok=False, error=error, retryable=retryable)


def skipped(content: str, by: str = "other") -> ToolResult:
    return ToolResult(content=content, skipped=True, skipped_by=by)


class Feed:
    """One run fed through one plugin's hooks."""

    def __init__(self, plugin: Any, tools: ToolRegistry = TOOLS) -> None:
        self.plugin = plugin
        self.tools = tools
        self.run = Run("user", tools=tools, clock=FakeClock())
        self.verdicts: list[Verdict] = []
        self._ids = 0

    def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        index: int = 0,
        error: Any = None,
    ) -> ToolCall:
        args = arguments if arguments is not None else {}
        t: Tool | None = self.tools.get(name)
        self._ids += 1
        return ToolCall(
            name=name,
            arguments=args,
            raw_arguments=json.dumps(args, ensure_ascii=False),
            id=f"call_{self._ids}",
            step=self.run.step,
            index=index,
            fingerprint=FINGERPRINT(name, args),
            tool=t,
            error=error if error is not None else (None if t is not None else "unknown_tool"),
        )

    def field(self, name: str) -> Any:
        """The plugin's run-record field ``name`` (its ``record_fields`` hook)."""
        return self.plugin.record_fields(run=self.run)[name]

    def _hook(self, name: str, **kwargs: Any) -> Verdict | None:
        fn = getattr(self.plugin, name, None)
        if fn is None:
            return None
        v: Verdict | None = fn(run=self.run, **kwargs)
        if v is not None:
            self.verdicts.append(v)
        return v

    def respond(self, content: str | None, calls: list[ToolCall] | None = None) -> Verdict | None:
        """A model turn: ``run.step`` advances, ``after_response`` sees the parsed calls."""
        self.run.step += 1
        calls = calls or []
        for c in calls:
            c.step = self.run.step
        self.run.tool_calls += len(calls)
        return self._hook("after_response", response=ModelResponse(content=content, calls=calls))

    def before(self, call: ToolCall) -> Verdict | None:
        return self._hook("before_tool", call=call)

    def after(self, call: ToolCall, result: ToolResult) -> Verdict | None:
        return self._hook("after_tool", call=call, result=result)

    def tool(self, call: ToolCall, result: ToolResult) -> tuple[Verdict | None, Verdict | None]:
        """before_tool, then after_tool with ``result`` -- or the skip's observation when the
        plugin skipped the call, as the loop does."""
        b = self.before(call)
        if isinstance(b, Skip):
            result = skipped(b.observation, by=b.plugin)
        return b, self.after(call, result)

    def turn(self, content: str | None, *calls: tuple[ToolCall, ToolResult]) -> list[Verdict]:
        """A whole model turn with its tool calls; returns every verdict given in it."""
        out: list[Verdict] = []
        v = self.respond(content, [c for c, _ in calls])
        if v is not None:
            out.append(v)
            if isinstance(v, Stop):
                return out
        for c, r in calls:
            b, a = self.tool(c, r)
            out.extend(x for x in (b, a) if x is not None)
            if isinstance(b, Stop) or isinstance(a, Stop):
                break
        return out


def kinds(verdicts: list[Verdict | None]) -> list[str | None]:
    """Verdict kinds, with stops as 'stop:<reason>'."""
    out: list[str | None] = []
    for v in verdicts:
        if v is None:
            out.append(None)
        elif isinstance(v, Stop):
            out.append(f"stop:{v.reason}")
        elif isinstance(v, (Skip, Warn)):
            out.append(v.kind)
    return out
