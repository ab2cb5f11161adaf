"""max_steps: the hard step cap -- essential, it can be configured but not disabled.

A limit of N allows exactly N model calls, the soft-stop wrap-up turn included: calls 1..N-1
run normally, call N is the tool-less final turn (soft stop ``max_steps``), and a call past N
is refused outright (hard stop).  With ``warn_remaining`` steps left, the model is told to wrap
up.  A run's profile (``[profiles.*] max_steps``) overrides ``max_steps``.
"""

from __future__ import annotations

from pydantic import Field

from loopwarden import ModelRequest, Plugin, PluginSettings, Run, Verdict, hookimpl


class MaxStepsSettings(PluginSettings):
    max_steps: int = Field(default=10, ge=1, description="model calls allowed per run")
    warn_remaining: int = Field(default=2, ge=0, description="warn when this many steps are left")
    message: str = Field(
        default="You have {remaining} step(s) left. Wrap up: answer from what you know.",
        description="the warning injected into the request ({remaining}, {limit})",
    )


class MaxSteps(Plugin[MaxStepsSettings]):
    """Caps model calls per run; the last allowed call is the soft-stop final turn."""

    name = "max_steps"
    Settings = MaxStepsSettings
    essential = True

    def limit(self, run: Run) -> int:
        return run.limits.max_steps or self.settings.max_steps

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        limit = self.limit(run)
        call_no = run.step + 1  # the call about to be made
        if call_no > limit:
            return self.stop("max_steps", limit=limit, steps=run.step)
        if call_no == limit:
            return self.stop("max_steps", soft=True, limit=limit, steps=run.step)
        remaining = limit - run.step  # calls left, this one included
        if self.settings.warn_remaining and remaining - 1 == self.settings.warn_remaining:
            return self.warn(
                self.settings.message.format(remaining=remaining - 1, limit=limit),
                limit=limit, remaining=remaining - 1,
            )
        return None
