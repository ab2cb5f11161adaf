"""The test kit's recorders: every hook call of a plugin manager, every signal of a run.

Private: import these from :mod:`loopwarden.testing`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pluggy
from blinker import ANY

from loopwarden import signals as _signals
from loopwarden.deployment import Deployment
from loopwarden.host import PluginSet
from loopwarden.verdicts import Skip, Stop, Verdict, Warn

if TYPE_CHECKING:
    from blinker import NamedSignal


class HookCall:
    """One recorded hook call: ``name``, its keyword arguments as attributes
    (``call.run``, ``call.request``, ``call.result`` ...), and what it returned.

    ``returned`` is the list of non-None values the implementations returned (verdicts);
    ``excinfo`` the exception that escaped the call, if any.
    """

    def __init__(self, name: str, kwargs: Mapping[str, Any]) -> None:
        #: the hook's name
        self.name = name
        #: the arguments pluggy passed, by name
        self.kwargs = dict(kwargs)
        #: what the implementations returned
        self.returned: list[Any] = []
        #: the exception an implementation raised, else None
        self.excinfo: BaseException | None = None

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["kwargs"][key]
        except KeyError:
            raise AttributeError(key) from None

    def __repr__(self) -> str:
        return f"<HookCall {self.name} {sorted(self.kwargs)}>"


class HookRecorder:
    """Records every hook call of a plugin manager (pytester's ``HookRecorder``).

    Built on pluggy's ``add_hookcall_monitoring``; pass a :class:`~loopwarden.Deployment`, a
    :class:`~loopwarden.host.PluginSet` or a pluggy manager.  Use it as a context
    manager, or call :meth:`finish_recording`.
    """

    def __init__(self, target: Deployment | PluginSet | pluggy.PluginManager) -> None:
        if isinstance(target, Deployment):
            target = target.plugins
        self._pm: pluggy.PluginManager = target.pm if isinstance(target, PluginSet) else target
        #: every hook call so far, in order
        self.calls: list[HookCall] = []
        self._pending: list[HookCall] = []
        self._undo: Any = self._pm.add_hookcall_monitoring(self._before, self._after)

    def _before(self, hook_name: str, hook_impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        call = HookCall(hook_name, kwargs)
        self.calls.append(call)
        self._pending.append(call)

    def _after(
        self,
        outcome: pluggy.Result[Any],
        hook_name: str,
        hook_impls: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        call = self._pending.pop()
        if outcome.exception is not None:
            call.excinfo = outcome.exception
        else:
            value = outcome.get_result()
            call.returned = list(value) if isinstance(value, list) else [value]

    def finish_recording(self) -> None:
        """Stop recording (idempotent)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def __enter__(self) -> HookRecorder:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish_recording()

    @property
    def names(self) -> list[str]:
        """The hook names in call order: the run's lifecycle, one entry per call."""
        return [c.name for c in self.calls]

    def getcalls(self, names: str | Iterable[str]) -> list[HookCall]:
        """The calls of the given hooks (a space-separated string or an iterable), in order."""
        wanted = set(names.split() if isinstance(names, str) else names)
        return [c for c in self.calls if c.name in wanted]

    def getcall(self, name: str) -> HookCall:
        """The one call of ``name``; raises ``LookupError`` unless there is exactly one."""
        found = self.getcalls(name)
        if len(found) != 1:
            raise LookupError(f"expected exactly one {name} call, got {len(found)}")
        return found[0]

    def verdicts(self, names: str | Iterable[str] | None = None) -> list[Verdict]:
        """Every verdict returned in the recorded calls (of ``names``), in call order."""
        calls = self.calls if names is None else self.getcalls(names)
        return [v for c in calls for v in c.returned if isinstance(v, (Warn, Skip, Stop))]

    def clear(self) -> None:
        """Forget the calls recorded so far."""
        self.calls.clear()


@dataclasses.dataclass(frozen=True)
class SignalRecord:
    """One received signal: its name, the sender (the run) and the keyword arguments."""

    #: the signal's name (``run-started``, ``guard-triggered``, ...)
    name: str
    #: what sent it (the run, or the deployment)
    sender: Any
    #: the signal's data, by name
    kwargs: Mapping[str, Any]

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["kwargs"][key]
        except KeyError:
            raise AttributeError(key) from None


class SignalRecorder:
    """Records loopwarden's signals while active (blinker's ``connected_to``).

    ``SignalRecorder()`` records all of them; pass signals to narrow it, and ``sender`` (a run)
    or ``deployment`` to keep only that run's or that deployment's.  Use as a context manager::

        from loopwarden import Deployment
        from loopwarden.demo import shop_tools
        from loopwarden.testing import SignalRecorder

        with Deployment(tools=shop_tools()) as deployment, SignalRecorder() as rec:
            deployment.run(scenario="refund")
        assert rec.names()[0] == "run-started" and rec.names()[-1] == "run-stopped"
    """

    def __init__(self, *signals: NamedSignal, sender: Any = ANY, deployment: Any = None) -> None:
        #: the signals recorded (default: all of them)
        self.signals = signals or _signals.ALL
        #: only signals from this sender, when given
        self.sender = sender
        #: only signals of this deployment's runs, when given
        self.deployment = deployment
        #: every signal received so far, in order
        self.records: list[SignalRecord] = []
        self._stack: contextlib.ExitStack | None = None

    def _receiver(self, name: str) -> Any:
        def receive(sender: Any, **kwargs: Any) -> None:
            if (
                self.deployment is not None
                and getattr(sender, "deployment", None) is not self.deployment
            ):
                return
            self.records.append(SignalRecord(name, sender, kwargs))

        return receive

    def __enter__(self) -> SignalRecorder:
        stack = contextlib.ExitStack()
        for sig in self.signals:
            stack.enter_context(sig.connected_to(self._receiver(sig.name), sender=self.sender))
        self._stack = stack
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def names(self) -> list[str]:
        """The received signal names, in order (kebab-case, e.g. ``"guard-triggered"``)."""
        return [r.name for r in self.records]

    def get(self, name: str) -> list[SignalRecord]:
        """The records of the signal called ``name``."""
        return [r for r in self.records if r.name == name]

    def verdicts(self) -> list[Verdict]:
        """The verdicts sent with ``guard-triggered``, in order."""
        return [r.kwargs["verdict"] for r in self.get(_signals.guard_triggered.name)]
