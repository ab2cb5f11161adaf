"""Verdicts: what a hook implementation returns to steer the run.

A hook returns ``None`` (carry on) or one verdict.  Verdicts are values, not exceptions: the
loop collects every plugin's verdict for an event and resolves them with :func:`resolve` --
hard stop > soft stop > skip > warn > carry on, ties to the plugin earlier in config order; all
warnings are kept.  Each verdict carries the name of the plugin that gave it, because pluggy's
result list carries no attribution.
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

    message: str
    plugin: str = UNKNOWN_PLUGIN
    evidence: Mapping[str, Any] = field(default_factory=dict)
    kind: Literal["warn"] = "warn"

    @property
    def severity(self) -> str:
        return "warn"


@dataclass(frozen=True, slots=True)
class Skip:
    """``before_tool`` only: do not execute the call, give the model ``observation`` instead.

    ``message`` (optional) is also injected as a warning into the next request.
    """

    observation: str
    plugin: str = UNKNOWN_PLUGIN
    message: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    kind: Literal["skip"] = "skip"

    @property
    def severity(self) -> str:
        return "warn"


@dataclass(frozen=True, slots=True)
class Stop:
    """End the run with stop reason ``reason``.

    ``soft=True`` grants one last model turn with tools disabled and a wrap-up instruction;
    ``soft=False`` ends at once with the best-effort answer (or the configured fallback).
    ``answer`` (optional) is the run's final answer, e.g. a terminal tool's hand-off message.
    """

    reason: str
    plugin: str = UNKNOWN_PLUGIN
    soft: bool = False
    message: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    answer: str | None = None
    kind: Literal["stop"] = "stop"

    @property
    def severity(self) -> str:
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
