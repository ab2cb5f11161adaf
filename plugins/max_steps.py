"""max_steps: the hard step cap -- essential, it can be configured but not disabled.

A limit of N allows exactly N model calls, the soft-stop wrap-up turn included: calls 1..N-1
run normally, call N is the tool-less final turn (soft stop ``max_steps``), and a call past N
is refused outright (hard stop).  A run's profile (``[profiles.*] max_steps``) overrides
``max_steps``.

When a response with tool calls leaves ``warn_remaining`` or fewer calls (default 2), the
model is told to wrap up, once; the note reaches it in the next request.  A response without
tool calls is the final answer, so it is not warned about.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, model_validator

from loopwarden import ModelRequest, ModelResponse, Plugin, PluginSettings, Run, Verdict, hookimpl
from loopwarden.plugins._budgets import check_templates

__all__ = ["MaxSteps", "MaxStepsSettings"]


class MaxStepsSettings(PluginSettings):
    """``[plugins.max_steps]``."""

    max_steps: int = Field(
        default=165,
        ge=1,
        description="model calls allowed per run, the soft stop's final turn included "
        "(a run profile's max_steps overrides it)",
    )
    warn_remaining: int = Field(
        default=2,
        ge=0,
        description="warn once when this many model calls (or fewer) are left; 0: never warn",
    )
    message: str = Field(
        default="You have {remaining} step(s) left. Wrap up: answer from what you know.",
        description="the warning injected into the next request ({remaining}, {limit})",
    )
    stop_message: str = Field(
        default="The step limit ({limit} model calls) is reached.",
        description="why the run stops, put before the wrap-up instruction of the final turn "
        "({limit}, {steps})",
    )

    @model_validator(mode="after")
    def _check(self) -> MaxStepsSettings:
        check_templates(
            self, ("message", "stop_message"), {"remaining": 2, "limit": 10, "steps": 9}
        )
        return self


@dataclass(slots=True)
class _State:
    warned: bool = False


class MaxSteps(Plugin[MaxStepsSettings]):
    """Caps model calls per run; the last allowed call is the soft-stop final turn."""

    name = "max_steps"
    Settings = MaxStepsSettings
    essential = True

    def new_state(self) -> _State:
        return _State()

    @hookimpl
    def budget_limits(self, run: Run) -> dict[str, float]:
        """The ``steps`` budget this plugin enforces for ``run`` (for the metrics)."""
        return {"steps": self.limit(run)}

    def limit(self, run: Run) -> int:
        """The step limit of ``run``: its profile's, else this plugin's setting."""
        return run.limits.max_steps or self.settings.max_steps

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        limit = self.limit(run)
        call_no = run.step + 1  # the call about to be made
        if call_no > limit:
            return self.stop(
                "max_steps",
                message=self.settings.stop_message.format(limit=limit, steps=run.step),
                limit=limit,
                steps=run.step,
                source=self._source(run),
            )
        if call_no == limit:
            return self.stop(
                "max_steps",
                soft=True,
                message=self.settings.stop_message.format(limit=limit, steps=run.step),
                limit=limit,
                steps=run.step,
                source=self._source(run),
            )
        return None

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        s = self.settings
        if not s.warn_remaining or not response.tool_calls:
            return None
        st: _State = self.state(run)
        limit = self.limit(run)
        remaining = limit - run.step  # calls left, the final turn included
        if st.warned or remaining < 1 or remaining > s.warn_remaining:
            return None
        st.warned = True
        return self.warn(
            s.message.format(remaining=remaining, limit=limit),
            limit=limit,
            remaining=remaining,
            steps=run.step,
            source=self._source(run),
        )

    def _source(self, run: Run) -> str:
        return f"profile {run.limits.name}" if run.limits.max_steps else "plugins.max_steps"
