"""What the hook-level detector tests share beyond :mod:`loopwarden.testing`: declared tools
of each kind, and a :class:`Feed`.

A :class:`Feed` drives one plugin object through hook calls exactly as the loop orders them
(``after_response`` with the parsed calls, then ``before_tool`` / ``after_tool`` per call), on
one run and one plugin object whose state carries over, so unit tests read like the run they
describe.  The run, the calls and the results are the kit's (:func:`~loopwarden.testing.make_run`,
:func:`~loopwarden.testing.make_tool_call`, :func:`~loopwarden.testing.make_tool_result`).
"""

from __future__ import annotations

from typing import Any

from loopwarden import ModelResponse, ToolCall, ToolResult
from loopwarden.testing import make_run, make_tool, make_tool_call, make_tool_result
from loopwarden.tools import ToolRegistry, tool
from loopwarden.verdicts import Skip, Stop, Verdict, Warn

#: a read-only, deterministic lookup that takes any arguments: the tests look things up by
#: key, by free-text query or by SKU, and add volatile keys such as ``request_id``
lookup = make_tool("lookup", read_only=True, deterministic=True)


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


class Feed:
    """One run fed through one plugin's hooks."""

    def __init__(self, plugin: Any, tools: ToolRegistry = TOOLS) -> None:
        self.plugin = plugin
        self.tools = tools
        self.run = make_run("user", tools=tools)
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
        """The kit's parsed call on this run (``error``: as if parsing had failed so)."""
        self._ids += 1
        call = make_tool_call(name, arguments, run=self.run, index=index, id=f"call_{self._ids}")
        if error is not None:
            call.error = error
        return call

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
            result = make_tool_result(b.observation, skipped=True, skipped_by=b.plugin)
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
