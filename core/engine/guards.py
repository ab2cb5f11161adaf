"""What the step machine does with the guards' verdicts -- shared by both turns.

:class:`Guards` is the part of the engine that the model turn (:mod:`loopwarden.engine.calls`)
and the tool turn (:mod:`loopwarden.engine.toolturn`) both need, handed to each when the engine
is built, so that neither reaches back into the :class:`~loopwarden.engine.loop.Engine`: the
hooks (already wrapped for shadow mode), the ``[run]`` settings and their texts, and what to do
with a resolution -- record and signal every verdict, queue warnings for the next request
(:meth:`Guards.note`), end the run on a hard stop (:meth:`Guards.hard`), answer the calls that
will not run (:meth:`Guards.close_calls`), and mask secrets in error texts
(:meth:`Guards.redact`).  It holds no run state.

:meth:`Guards.note` is the one door every verdict passes on its way out -- into the run record
(``warnings``, ``verdicts``, ``evidence``), the ``guard_triggered`` signal (logs, alerts, spans,
metrics), the model's next request and a soft stop's wrap-up -- so secrets are masked there,
once, for every channel: a verdict's message (a guard's note quoting a call's arguments) and
its evidence go through the deployment's redactor (:meth:`Guards.mask`).  A skip's observation
is the tool's answer the model already had, and goes to it unchanged.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from loopwarden import signals
from loopwarden.engine.outcomes import hard
from loopwarden.notes import mask_note
from loopwarden.run import Run, RunOutcome
from loopwarden.verdicts import Resolution, Stop, Verdict, resolve

if TYPE_CHECKING:
    from loopwarden.config import RunConfig
    from loopwarden.events import ToolCall
    from loopwarden.host import Hooks
    from loopwarden.redaction import Redactor

__all__ = ["CORE", "Guards", "Turn"]

CORE = "loopwarden"  # the plugin name on notes and skips the loop writes itself
_ERROR_CHARS = 2000  # the longest error text kept in a record


def _clip_error(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ...[truncated]"


class Guards:
    """The hooks, settings and texts of one engine, and how a turn honours a resolution."""

    __slots__ = ("hooks", "redactor", "settings", "shadow", "texts")

    def __init__(self, hooks: Hooks, settings: RunConfig, shadow: Collection[str]) -> None:
        #: plugins in shadow mode: their verdicts are recorded and signalled, never honoured
        self.shadow = frozenset(shadow)
        self.hooks = hooks
        self.settings = settings
        self.texts = settings.texts
        #: masks secrets in error texts (the deployment sets one that knows the model's key)
        self.redactor: Redactor | None = None

    def note(self, run: Run, hook: str, res: Resolution) -> Resolution:
        """Record every verdict, keep every warning, queue warnings for the next request;
        return the resolution the run honours (without the verdicts of shadowed plugins).

        The turns skip the call when ``res.verdicts`` is empty (the common case).
        """
        if not res.verdicts:
            return res
        masked = tuple(self.mask(v) for v in res.verdicts)
        if any(m is not v for m, v in zip(masked, res.verdicts, strict=True)):
            res = resolve(masked)
        shadow = self.shadow
        shadowed = bool(shadow) and any(v.plugin in shadow for v in res.verdicts)
        for v in res.verdicts:
            entry: dict[str, Any] = {
                "step": run.step,
                "hook": hook,
                "plugin": v.plugin,
                "kind": v.kind,
            }
            if isinstance(v, Stop):
                entry["reason"] = v.reason
                entry["soft"] = v.soft
            if shadowed and v.plugin in shadow:
                entry["shadow"] = True
                if v.message:
                    entry["message"] = v.message
                run.verdicts.append(entry)
                if isinstance(v, Stop) and run.shadow_stop is None:
                    run.shadow_stop = {
                        k: entry[k] for k in ("step", "hook", "plugin", "reason", "soft")
                    }
                    run.shadow_stop["evidence"] = dict(v.evidence)
                signals.send(
                    signals.guard_triggered, run, verdict=v, hook=hook, step=run.step, shadow=True
                )
                continue
            run.verdicts.append(entry)
            signals.send(signals.guard_triggered, run, verdict=v, hook=hook, step=run.step)
        if shadowed:
            res = resolve(v for v in res.verdicts if v.plugin not in shadow)
        for w in res.warnings:
            message = w.message
            if message:
                run.warnings.append({"step": run.step, "plugin": w.plugin, "message": message})
                if message not in run.pending_notes:
                    run.pending_notes.append(message)
        return res

    def mask(self, verdict: Verdict) -> Verdict:
        """``verdict`` with secrets masked in its message and evidence (the same verdict when
        it holds none): values under secret keys, ``key=value`` pairs and ``"key": "value"``
        pairs -- also inside a note's quoted data --, API-key patterns, the model's key."""
        redactor = self._redactor()
        changed: dict[str, Any] = {}
        message = verdict.message
        if message:
            clean = mask_note(message, redactor.text)
            if clean is not message:
                changed["message"] = clean
        evidence = redactor.scrub(verdict.evidence)
        if evidence is not verdict.evidence:
            changed["evidence"] = evidence
        return replace(verdict, **changed) if changed else verdict

    def _redactor(self) -> Redactor:
        redactor = self.redactor
        if redactor is None:
            from loopwarden.redaction import Redactor

            redactor = self.redactor = Redactor()
        return redactor

    def hard(self, run: Run, stop: Stop, blocked: ToolCall | None = None) -> RunOutcome:
        """The outcome of a hard stop (see :func:`loopwarden.engine.outcomes.hard`);
        ``blocked`` is the call a stop in ``before_tool`` kept from running."""
        normal = self.hooks.ends_runs_normally(stop.plugin)
        return hard(self.settings, run, stop, normal=normal, blocked=blocked)

    def close_calls(self, run: Run, calls: list[ToolCall], reason: str) -> None:
        """Answer calls that will not run, so the conversation stays well-formed."""
        text = self.texts.not_executed.format(reason=reason)
        for call in calls:
            run.add_message({"role": "tool", "tool_call_id": call.id, "content": text})

    def redact(self, run: Run, text: str) -> str:
        """``text`` with secrets masked -- the model's API key, bearer credentials, ``sk-``
        keys -- and cut to :data:`_ERROR_CHARS` (error texts go to records, logs, alerts)."""
        redactor = self._redactor()
        return _clip_error(redactor.text(_clip_error(text, 2 * _ERROR_CHARS)), _ERROR_CHARS)


class Turn:
    """A turn unit's base: the :class:`Guards` it is built over, and the hooks, settings and
    texts read off them once (a turn runs every step: attributes, not properties)."""

    __slots__ = ("guards", "hooks", "settings", "texts")

    def __init__(self, guards: Guards) -> None:
        self.guards = guards
        self.hooks = guards.hooks
        self.settings = guards.settings
        self.texts = guards.texts
