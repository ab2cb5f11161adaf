"""Signals: the observation path.

Hooks decide; signals observe.  Logging, alerting and metrics subscribe to these and can never
change a run.  The sender is always the :class:`~loopwarden.Run`; data comes in keyword
arguments, so receivers should accept ``**extra``.  A receiver that raises never breaks a run:
:func:`send` logs the failure once per receiver and carries on.

=================  ===========================================================
signal             keyword arguments
=================  ===========================================================
run_started        --
model_responded    ``request``, ``response``, ``duration_s``
tool_finished      ``call``, ``result``
guard_triggered    ``verdict``, ``hook``, ``step``
step_finished      ``step``
run_stopped        ``outcome``, ``record``
record_failed      ``path``, ``error`` (a run record could not be written)
breaker_changed    ``breaker`` (a :class:`~loopwarden.store.BreakerView`),
                   ``message``, ``tool`` (a fleet-wide circuit breaker opened,
                   went half-open or closed; sent by circuit_breaker)
=================  ===========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from blinker import NamedSignal, Namespace

__all__ = [
    "breaker_changed",
    "guard_triggered",
    "model_responded",
    "record_failed",
    "run_started",
    "run_stopped",
    "send",
    "step_finished",
    "tool_finished",
]

_signals = Namespace()

run_started: NamedSignal = _signals.signal("run-started", doc="A run started.")
model_responded: NamedSignal = _signals.signal(
    "model-responded", doc="The model answered a request."
)
tool_finished: NamedSignal = _signals.signal(
    "tool-finished", doc="A tool call executed, failed or was skipped."
)
guard_triggered: NamedSignal = _signals.signal(
    "guard-triggered", doc="A plugin returned a verdict (warn, skip or stop)."
)
step_finished: NamedSignal = _signals.signal(
    "step-finished", doc="A model turn and its tools ended."
)
run_stopped: NamedSignal = _signals.signal("run-stopped", doc="A run ended; its record is final.")
record_failed: NamedSignal = _signals.signal(
    "record-failed", doc="A run record could not be written (sent by run_record)."
)
breaker_changed: NamedSignal = _signals.signal(
    "breaker-changed",
    doc="A fleet-wide circuit breaker opened, went half-open or closed (sent by "
    "circuit_breaker, by the run whose call changed it).",
)

ALL = (
    run_started,
    model_responded,
    tool_finished,
    guard_triggered,
    step_finished,
    run_stopped,
    record_failed,
    breaker_changed,
)

log = logging.getLogger("loopwarden.signals")
_reported: set[tuple[str, int]] = set()

#: signal -> (its key in ``signal.receivers``, its dispatcher): see :func:`set_dispatcher`
_dispatchers: dict[NamedSignal, tuple[int, Callable[..., Any]]] = {}


def set_dispatcher(signal: NamedSignal, receiver: Callable[..., Any]) -> None:
    """Name ``receiver`` -- an object (not a bound method) that its owner connects to
    ``signal`` strongly (``weak=False``) for every sender -- as the signal's dispatcher: while
    it is the signal's only receiver, :func:`send` calls it directly, without asking blinker
    which receivers take this sender (the deployments' router, sent to twice a step)."""
    _dispatchers[signal] = (id(receiver), receiver)


def send(signal: NamedSignal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal``; a failing receiver is logged (once per receiver) and never raises."""
    receivers = signal.receivers
    if not receivers:
        return
    if len(receivers) == 1:
        known = _dispatchers.get(signal)
        # blinker keys a receiver object by its id: the one receiver is the dispatcher, and
        # a dispatcher takes every sender -- exactly what receivers_for would yield
        if known is not None and receivers.get(known[0]) is known[1]:
            try:
                known[1](sender, **kwargs)
            except Exception:
                receiver_failed(signal, known[1])
            return
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, **kwargs)
        except Exception:
            receiver_failed(signal, receiver)


def receiver_failed(signal: NamedSignal, receiver: Any) -> None:
    """Log a receiver's exception (call from an ``except`` block), once per receiver."""
    key = (signal.name, id(receiver))
    if key not in _reported:
        _reported.add(key)
        log.exception("signal %s: receiver %r failed (reported once)", signal.name, receiver)
