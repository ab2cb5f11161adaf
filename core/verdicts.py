"""Verdicts: what a hook implementation returns to steer the run.

A hook returns ``None`` (carry on) or one verdict.  Verdicts are values, not exceptions: the
loop collects every plugin's verdict for an event and resolves them with :func:`resolve` --
hard stop > soft stop > skip > warn > carry on, ties to the plugin earlier in config order; all
warnings are kept.  Each verdict carries the name of the plugin that gave it, because pluggy's
result list carries no attribution.

What each verdict does (the same from every decision hook unless said)::

    warn(message)            message -> a warning in the next model request; the run goes on
    skip(observation,        before_tool only: the call does not run; the model gets
         message=None)       observation as the call's result, and message (when given)
                             as a warning in the next model request
    stop(reason, soft=True)  one last model turn without tools; message (when given) is
                             put before the wrap-up instruction the model gets
    stop(reason)             the run ends at once (a hard stop); message goes only to logs
                             and alerts (RunOutcome.message, the guard_triggered signal) --
                             never to the user nor the model

The user's answer on a hard stop is the stop's ``answer=`` when given -- from any hook:
``on_start``, ``before_model``, ``after_response``, ``before_tool``, ``after_tool`` -- else,
for a stop in ``before_tool`` on a call of a declared side-effecting tool, ``[run.texts]
side_effect_blocked`` (the action was not carried out: the model's own text may have announced
it), else the *best-effort answer*: the latest non-empty model content (even a half sentence such as
"One more time." said before the stopped call), else the last successful tool observation
wrapped in ``[run.texts] best_effort``, else ``[run] fallback_answer``.  A hard stop in
``after_response`` on a response without tool calls is a veto: the model's text is withheld,
and the answer is the stop's ``answer=`` or the fallback.  A soft stop's ``answer`` is used
only when its wrap-up turn is refused by a hard stop; otherwise the wrap-up turn answers.

``RunOutcome.final_answer_present`` (docs/contracts.md) is True only when the answer came from
the model or from a plugin whose stops are normal endings (``ends_runs_normally``, e.g.
``terminal_tool``'s hand-off) -- a guard's substitute ``answer=`` is not the model's answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Resolution",
    "Skip",
    "Stop",
    "Verdict",
    "Warn",
    "resolve",
    "skip",
    "stop",
    "warn",
]

UNKNOWN_PLUGIN = "<unknown>"


@dataclass(frozen=True, slots=True)
class Warn:
    """Inject ``message`` into the next model request; the run goes on."""

    #: the warning injected into the next model request
    message: str
    #: the plugin that gave the verdict (filled in by the dispatcher when left out)
    plugin: str = UNKNOWN_PLUGIN
    #: what the plugin saw: recorded in the run record and sent with the signal
    evidence: Mapping[str, Any] = field(default_factory=dict)
    #: the verdict's kind, for ``match`` and records
    kind: Literal["warn"] = "warn"

    @property
    def severity(self) -> str:
        """``"warn"`` (for alerts and logs)."""
        return "warn"


@dataclass(frozen=True, slots=True)
class Skip:
    """``before_tool`` only: do not execute the call, give the model ``observation`` instead.

    ``message`` (optional) is also injected as a warning into the next request.
    """

    #: what the model gets instead of the tool's result
    observation: str
    #: the plugin that gave the verdict (filled in by the dispatcher when left out)
    plugin: str = UNKNOWN_PLUGIN
    #: also injected as a warning into the next model request, when given
    message: str | None = None
    #: what the plugin saw: recorded in the run record and sent with the signal
    evidence: Mapping[str, Any] = field(default_factory=dict)
    #: the verdict's kind, for ``match`` and records
    kind: Literal["skip"] = "skip"

    @property
    def severity(self) -> str:
        """``"warn"`` (for alerts and logs)."""
        return "warn"


@dataclass(frozen=True, slots=True)
class Stop:
    """End the run with stop reason ``reason``.

    ``soft=True`` grants one last model turn with tools disabled and a wrap-up instruction;
    ``soft=False`` ends at once with the best-effort answer (or the configured fallback).
    ``answer`` (optional) is the run's final answer, e.g. a terminal tool's hand-off message.
    """

    #: the stop reason: the run record's ``termination``
    reason: str
    #: the plugin that gave the verdict (filled in by the dispatcher when left out)
    plugin: str = UNKNOWN_PLUGIN
    #: True: one last tool-less model turn to wrap up; False: the run ends at once
    soft: bool = False
    #: hard stop: for logs and alerts only, never shown to the user or the model; soft stop:
    #: put before the wrap-up instruction of the final turn
    message: str | None = None
    #: what the plugin saw: recorded in the run record and sent with the signal
    evidence: Mapping[str, Any] = field(default_factory=dict)
    #: the user's answer on a hard stop, from any hook (replaces the best-effort answer); ignored
    #: by a soft stop
    answer: str | None = None
    #: the verdict's kind, for ``match`` and records
    kind: Literal["stop"] = "stop"

    @property
    def severity(self) -> str:
        """``"soft_stop"`` or ``"hard_stop"`` (for alerts and logs)."""
        return "soft_stop" if self.soft else "hard_stop"


Verdict = Warn | Skip | Stop


def warn(message: str, *, plugin: str = UNKNOWN_PLUGIN, **evidence: Any) -> Warn:
    """A warning injected into the next model request."""
    return Warn(message=message, plugin=plugin, evidence=evidence)


def skip(
    observation: str, *, plugin: str = UNKNOWN_PLUGIN, message: str | None = None, **evidence: Any
) -> Skip:
    """Skip the tool call and hand the model ``observation`` instead."""
    return Skip(observation=observation, plugin=plugin, message=message, evidence=evidence)


def stop(
    reason: str,
    *,
    soft: bool = False,
    plugin: str = UNKNOWN_PLUGIN,
    message: str | None = None,
    answer: str | None = None,
    **evidence: Any,
) -> Stop:
    """End the run (``soft=True``: one last tool-less turn first)."""
    return Stop(
        reason=reason, plugin=plugin, soft=soft, message=message, evidence=evidence, answer=answer
    )


def _rank(v: Verdict) -> int:
    if isinstance(v, Stop):
        return 1 if v.soft else 0
    if isinstance(v, Skip):
        return 2
    return 3


@dataclass(frozen=True, slots=True)
class Resolution:
    """The outcome of one event's verdicts.

    ``decisive`` is the verdict that steers the run (a stop or a skip), or None; ``warnings``
    keeps every warning-like message in config order; ``verdicts`` keeps them all.
    """

    decisive: Stop | Skip | None
    warnings: tuple[Warn | Skip, ...]
    verdicts: tuple[Verdict, ...]

    @property
    def stop(self) -> Stop | None:
        return self.decisive if isinstance(self.decisive, Stop) else None

    @property
    def skip(self) -> Skip | None:
        return self.decisive if isinstance(self.decisive, Skip) else None


EMPTY = Resolution(None, (), ())


def resolve(verdicts: Iterable[Verdict]) -> Resolution:
    """Resolve verdicts given in config order: hard stop > soft stop > skip > warn."""
    vs = tuple(verdicts)
    if not vs:
        return EMPTY
    best: Verdict | None = None
    best_rank = 4
    for v in vs:
        r = _rank(v)
        if r < best_rank:  # strict: ties go to the earlier plugin
            best, best_rank = v, r
    decisive = best if isinstance(best, (Stop, Skip)) else None
    warnings = tuple(v for v in vs if isinstance(v, Warn) or (isinstance(v, Skip) and v.message))
    return Resolution(decisive, warnings, vs)
