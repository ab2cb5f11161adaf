"""loopwarden-allowlist: keep an agent's tool calls inside an allow-list.

A defence line for deployments where the model may look things up freely but must not reach
for anything else.  A call to a tool outside the allow-list is not executed: the model gets an
observation saying so (a *skip*), and after ``max_refusals`` refused calls in one run the run
is stopped softly -- the model gets one last tool-less turn to answer from what it knows.

Quickstart::

    pip install loopwarden-allowlist

    # config.toml
    [plugins]
    enabled = ["max_steps", "allowlist"]

    [plugins.allowlist]
    allowed = ["search_knowledge", "query_*"]   # fnmatch patterns
    allow_read_only = false
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from pydantic import Field, field_validator

from loopwarden import Plugin, PluginSettings, Run, ToolCall, Verdict, hookimpl

__all__ = ["Allowlist", "AllowlistSettings"]
__version__ = "0.1.0"


def _check_template(value: str, **sample: object) -> str:
    try:
        value.format(**sample)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"bad template field {exc}; available: {', '.join(sample)}") from None
    return value


class AllowlistSettings(PluginSettings):
    """``[plugins.allowlist]``."""

    allowed: list[str] = Field(
        default_factory=list,
        description="tool names the agent may call, as fnmatch patterns (query_*)",
    )
    allow_read_only: bool = Field(
        default=True, description="also allow every tool declared read_only"
    )
    max_refusals: int = Field(
        default=2,
        ge=0,
        description="refused calls per run that are skipped; the next one stops the run (soft)",
    )
    refusal: str = Field(
        default=(
            "NOT ALLOWED: {name} is not on this deployment's allow-list, so it was not "
            "executed. Use only these tools: {allowed}; or answer with what you know."
        ),
        description="the observation the model gets for a refused call ({name}, {allowed})",
    )
    stop_message: str = Field(
        default="The agent called tools outside the allow-list {count} times.",
        description="why the run stops, shown to the model before its last turn ({count})",
    )

    @field_validator("refusal")
    @classmethod
    def _refusal_fields(cls, v: str) -> str:
        return _check_template(v, name="t", allowed="a, b")

    @field_validator("stop_message")
    @classmethod
    def _stop_fields(cls, v: str) -> str:
        return _check_template(v, count=1)


@dataclass
class _RunState:
    """Per-run state: how many calls this run had refused."""

    refused: int = 0


class Allowlist(Plugin[AllowlistSettings]):
    """Skips tool calls outside the allow-list; stops the run when the model keeps trying."""

    name = "allowlist"
    Settings = AllowlistSettings

    def new_state(self) -> _RunState:
        return _RunState()

    def allows(self, call: ToolCall) -> bool:
        """True when ``call`` may run: a read-only tool (if allowed) or a listed name."""
        if self.settings.allow_read_only and call.read_only:
            return True
        return any(fnmatchcase(call.name, pattern) for pattern in self.settings.allowed)

    def _allowed_names(self, run: Run) -> list[str]:
        if run.tools is None:
            return []
        return [
            t.name
            for t in run.tools
            if (self.settings.allow_read_only and t.read_only)
            or any(fnmatchcase(t.name, p) for p in self.settings.allowed)
        ]

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        if self.allows(call):
            return None
        state: _RunState = self.state(run)
        state.refused += 1
        limit = self.settings.max_refusals
        if state.refused > limit:
            return self.stop(
                "tool_not_allowed",
                soft=True,
                message=self.settings.stop_message.format(count=state.refused),
                tool=call.name,
                refused=state.refused,
                max_refusals=limit,
            )
        allowed = ", ".join(self._allowed_names(run)) or "(none)"
        return self.skip(
            self.settings.refusal.format(name=call.name, allowed=allowed),
            tool=call.name,
            refused=state.refused,
            max_refusals=limit,
        )

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, int]:
        """The run record's ``refused_calls``: how many calls this run had refused."""
        state: _RunState = self.state(run)
        return {"refused_calls": state.refused}
