"""terminal_tool: a successful hand-off ends the run.

Tools declared ``terminal`` (:attr:`loopwarden.tools.Tool.terminal`: a hand-off to a human, a
"done" tool) -- and the names listed in ``tools`` -- end the run as soon as one of them
*succeeds*: a hard stop ``terminal_tool`` whose final answer is the tool's observation, or the
``answer`` text.  Real runs have called a successful hand-off tool a hundred times; after the
first success there is nothing left for the agent to do.

A failed call, or a skipped one (a guard's synthetic observation, a side-effect replay), does
not end the run: nothing was handed off by it.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.plugins._budgets import check_templates

__all__ = ["TerminalTool", "TerminalToolSettings"]


class TerminalToolSettings(PluginSettings):
    """``[plugins.terminal_tool]``."""

    tools: list[str] = Field(
        default_factory=list,
        description="names of further tools that end the run once they succeed (besides the "
        "tools declared terminal)",
    )
    answer: str = Field(
        default="{observation}",
        description="the run's final answer after a terminal tool succeeded ({observation}: "
        "the tool's observation, {tool}: its name)",
    )
    max_evidence_chars: int = Field(
        default=500, ge=0, description="how much of the observation the evidence keeps"
    )

    @model_validator(mode="after")
    def _check(self) -> TerminalToolSettings:
        check_templates(self, ("answer",), {"observation": "o", "tool": "transfer_to_human"})
        return self


class TerminalTool(Plugin[TerminalToolSettings]):
    """Ends the run after the first successful call of a terminal tool."""

    name = "terminal_tool"
    Settings = TerminalToolSettings
    ends_runs_normally = True  # a hand-off ends the run for real, shadow mode or not

    def is_terminal(self, call: ToolCall) -> bool:
        """Whether ``call`` is of a terminal tool (declared, or named in ``tools``)."""
        return (call.tool is not None and call.tool.terminal) or call.name in self.settings.tools

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        if not result.ok or result.skipped or not self.is_terminal(call):
            return None
        s = self.settings
        return self.stop(
            "terminal_tool",
            answer=s.answer.format(observation=result.content, tool=call.name),
            tool=call.name,
            step=call.step,
            call_index=call.index,
            declared_terminal=call.tool is not None and call.tool.terminal,
            observation=result.content[: s.max_evidence_chars],
        )
