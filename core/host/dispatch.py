"""Call: the typed facade the loop calls hooks through (:class:`Hooks`) -- call plans read off
pluggy, verdicts checked and resolved, failing plugins blamed by name (fail closed), shadowed
plugins' effects undone (:mod:`loopwarden.host.shadow`).

One module: the direct call plans, the pluggy fallback (wrappers, monitors) and the shadowed
calls share the plan steps, the verdict checks and the blame; split, each would reach back.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import traceback
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pluggy

from loopwarden import hookspecs
from loopwarden.host.shadow import Snapshot, record
from loopwarden.verdicts import (
    EMPTY,
    UNKNOWN_PLUGIN,
    Resolution,
    Skip,
    Stop,
    Warn,
    resolve,
)

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.events import ModelDelta, ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.run import DeploymentView, Run, RunOutcome
    from loopwarden.verdicts import Verdict

log = logging.getLogger("loopwarden.plugins")


def _impl_owner_map(pm: pluggy.PluginManager) -> dict[Any, list[tuple[str, Any]]]:
    """Map each hook implementation's code object to the (name, plugin) pairs that use it."""
    owners: dict[Any, list[tuple[str, Any]]] = {}
    for hname in hookspecs.HOOK_NAMES:
        for impl in getattr(pm.hook, hname).get_hookimpls():
            fn = getattr(impl.function, "__func__", impl.function)
            code = getattr(fn, "__code__", None)
            if code is not None:
                pairs = owners.setdefault(code, [])
                if all(n != impl.plugin_name for n, _ in pairs):
                    pairs.append((impl.plugin_name, impl.plugin))
    return owners


#: the arguments each decision hook passes, in order
_HOOK_ARGS: dict[str, tuple[str, ...]] = {
    "on_start": ("run",),
    "before_model": ("run", "request"),
    "on_model_delta": ("run", "request", "delta"),
    "after_response": ("run", "response"),
    "before_tool": ("run", "call"),
    "after_tool": ("run", "call", "result"),
}

#: one implementation in a call plan: plugin name, function, argument positions (None: all),
#: whether the plugin is shadowed (its changes to the arguments are undone)
_Step = tuple[str, Callable[..., Any], "tuple[int, ...] | None", bool]


_REDACTOR: list[Any] = []  # the default redactor, built on first use


def _ill_typed(v: Warn | Skip | Stop) -> str | None:
    """What is wrong with a verdict's fields (built by hand), or None: the loop puts its texts
    into requests, records and logs."""
    texts: dict[str, Any] = {"message": v.message}
    if isinstance(v, Skip):
        texts["observation"] = v.observation
    if isinstance(v, Stop):
        texts["answer"] = v.answer
        reason: Any = v.reason  # typed str, but a plugin may have passed anything
        soft: Any = v.soft
        if not isinstance(reason, str) or not reason:
            return "a reason that is not a non-empty str"
        if not isinstance(soft, bool):
            return "soft that is not a bool"
    for field_name, value in texts.items():
        required = field_name in ("observation",) or isinstance(v, Warn)
        if not isinstance(value, str) and (required or value is not None):
            return f"a {field_name} of type {type(value).__name__}, not str"
    evidence: Any = v.evidence
    plugin: Any = v.plugin
    if not isinstance(evidence, dict):
        return f"evidence of type {type(evidence).__name__}, not dict"
    if not isinstance(plugin, str):
        return "a plugin name that is not a str"
    return None


def _refused(hook: str, r: Any) -> bool:
    """Whether ``r``, returned from ``hook``, is no verdict the loop can honour."""
    return (
        not isinstance(r, (Warn, Skip, Stop))
        or _ill_typed(r) is not None
        or (type(r) is Skip and hook != "before_tool")
    )


def _fail_closed(plugin: str, message: str, hook: str, **evidence: str) -> Resolution:
    """The hard ``plugin_error`` stop a failing plugin earns."""
    verdict = Stop(
        reason="plugin_error",
        plugin=plugin,
        soft=False,
        message=message,
        evidence={"hook": hook, **evidence},
    )
    return Resolution(verdict, (), (verdict,))


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"


def _default_redact(text: str) -> str:
    if not _REDACTOR:
        from loopwarden.redaction import Redactor

        _REDACTOR.append(Redactor())
    out: str = _REDACTOR[0].text(text)
    return out


class Hooks:
    """The typed facade the loop calls hooks through.

    Each decision hook returns a :class:`~loopwarden.verdicts.Resolution`; a plugin that raises,
    or returns what is not a verdict, is blamed by name and becomes a hard ``plugin_error`` stop
    (fail closed); ``on_stop`` runs every implementation even when one raises.  pluggy decides
    what is called, in which order; the facade calls the implementations in that order from
    call plans read off ``get_hookimpls()``, with positional arguments, and attributes a
    verdict built without ``plugin=`` to the plugin that returned it.  It yields to pluggy's
    own dispatch where a hook has wrappers or while anything monitors hook calls (tracing, the
    test kit's ``HookRecorder``) -- where such a verdict stays ``<unknown>`` -- and rebuilds
    its plans when plugins are (un)registered.  Shadowed plugins (:meth:`shadowing`) are
    called on both paths on a snapshot of the arguments, restored after each call.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        #: masks secrets in failing plugins' error texts; a deployment sets its own
        self.redact: Callable[[str], str] = _default_redact
        self._on_stop = pm.hook.on_stop
        #: plugins in shadow mode (:meth:`shadowing`)
        self.shadow: frozenset[str] = frozenset()
        #: our manager says when to yield to pluggy (monitors), when plans are stale
        #: (generation); with a plain pluggy one, pluggy always dispatches
        self._ours = hasattr(pm, "monitors") and hasattr(pm, "generation")
        self._build_plans()

    def shadowing(self, plugins: Iterable[str]) -> Hooks:
        """A facade over the same plugins in which ``plugins`` are shadowed: what they change
        in a hook's arguments never reaches the run, and is recorded in ``run.shadow_effects``
        (:mod:`loopwarden.host.shadow`).  This facade stays as it is (a replay honours all)."""
        other = copy.copy(self)
        other.shadow = frozenset(plugins)
        other._build_plans()
        return other

    def ends_runs_normally(self, plugin: str) -> bool:
        """Whether ``plugin``'s stops are normal endings (``terminal_tool``'s hand-off): only
        such a stop's ``answer=`` counts as a final answer present (docs/contracts.md)."""
        obj = self._pm.get_plugin(plugin)
        return bool(getattr(obj, "ends_runs_normally", False))

    # -- direct dispatch -------------------------------------------------------------------

    def _build_plans(self) -> None:
        """Read the call plans (None where wrappers need pluggy's multicall) and the blame map
        off pluggy; pluggy's path with shadowed plugins (:meth:`_pluggy`) starts afresh."""
        pm = self._pm
        self._plans: dict[str, tuple[_Step, ...] | None] = {}
        for hook in _HOOK_ARGS:
            impls = getattr(pm.hook, hook).get_hookimpls()
            wrapped = any(i.hookwrapper or i.wrapper for i in impls)
            self._plans[hook] = None if wrapped else self._steps(hook, impls)
        #: pluggy's path with shadowed plugins: a caller without them, and their own steps
        self._subsets: dict[str, tuple[Any, tuple[_Step, ...]]] = {}
        self._generation = getattr(pm, "generation", None)
        self._owners = _impl_owner_map(pm)

    def _steps(self, hook: str, impls: Sequence[Any]) -> tuple[_Step, ...]:
        """Call steps for ``impls`` (as pluggy lists them), in call order."""
        full, shadow = _HOOK_ARGS[hook], self.shadow
        plan: list[_Step] = []
        for impl in reversed(impls):  # pluggy calls the last registered first
            idx = tuple(full.index(a) for a in impl.argnames)
            every = idx == tuple(range(len(full)))
            name = impl.plugin_name
            plan.append((name, impl.function, None if every else idx, name in shadow))
        return tuple(plan)

    def _plan(self, hook: str) -> tuple[_Step, ...] | None:
        """The direct call plan for ``hook``, or None when pluggy must dispatch."""
        pm: Any = self._pm
        if not self._ours or pm.monitors:  # a plain pluggy manager: always pluggy
            return None
        if pm.generation != self._generation:
            self._build_plans()
        return self._plans.get(hook)

    def _shadowed(
        self,
        hook: str,
        name: str,
        fn: Callable[..., Any],
        idx: tuple[int, ...] | None,
        args: tuple[Any, ...],
        overlay: list[Callable[[], None]],
    ) -> Verdict | None:
        """Call a shadowed plugin on a snapshot of ``args``, restored afterwards, and record what
        it changed; return its verdict, or the ``plugin_error`` stop it earned, for the record
        (never keeping later plugins from their turn).  It sees what the shadowed plugins before
        it changed for this event (``overlay``: retry_policy's spent budget reaches a shadowed
        repeat_call, as when both are enforced), undone again after it."""
        names = _HOOK_ARGS[hook]
        real = mine = Snapshot(names, args)
        try:
            if overlay:
                for apply in overlay:
                    apply()
                mine = Snapshot(names, args)
            try:
                r = fn(*args) if idx is None else fn(*[args[i] for i in idx])
            except Exception as exc:
                return self._failed(hook, exc, plugin=name).stop
            finally:
                changes = mine.restore()
                if changes:
                    overlay.extend(c[3] for c in changes)
                    record(hook, name, args, changes)
        finally:
            if mine is not real:
                real.restore()
        if r is None:
            return None
        if _refused(hook, r):
            return self._not_a_verdict(hook, r, plugin=name).stop
        v: Verdict = r
        return dataclasses.replace(v, plugin=name) if v.plugin == UNKNOWN_PLUGIN else v

    def blame(self, exc: BaseException) -> str:
        """The plugin whose hook implementation raised ``exc``: the outermost on its traceback
        (``<unknown>`` if none)."""
        tb: TracebackType | None = exc.__traceback__
        while tb is not None:
            pairs = self._owners.get(tb.tb_frame.f_code)
            if pairs:
                if len(pairs) == 1:
                    return str(pairs[0][0])
                this = tb.tb_frame.f_locals.get("self")
                for name, plugin in pairs:
                    if plugin is this:
                        return str(name)
                return str(pairs[0][0])
            tb = tb.tb_next
        return "<unknown>"

    def _failed(self, hook: str, exc: Exception, plugin: str | None = None) -> Resolution:
        plugin = plugin or self.blame(exc)
        error = self._log_failure(plugin, hook, exc)
        return _fail_closed(
            plugin, f"plugin {plugin!r} raised in {hook}: {error}", hook, error=error
        )

    def _failure(self, plugin: str, hook: str, exc: BaseException) -> dict[str, str]:
        """A failure of an observing hook, logged, for the run record."""
        return {"plugin": plugin, "hook": hook, "error": self._log_failure(plugin, hook, exc)}

    def _log_failure(self, plugin: str, hook: str, exc: BaseException) -> str:
        """Log a plugin's failure with its traceback, both redacted; return the error text."""
        redact = self.redact
        try:
            text = f"{type(exc).__name__}: {exc}"
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # an exception whose __str__ raises is third-party code too
            text = trace = f"{type(exc).__name__}: <unprintable>"
        log.error("plugin %r failed in %s: %s", plugin, hook, redact(trace.rstrip()))
        return redact(text)

    def _not_a_verdict(self, hook: str, returned: Any, plugin: str | None = None) -> Resolution:
        who = f"plugin {plugin!r}" if isinstance(plugin, str) else f"a {hook} implementation"
        why = _ill_typed(returned) if isinstance(returned, (Warn, Skip, Stop)) else None
        shown = self.redact(_safe_repr(returned)[:500])
        if why is None and isinstance(returned, Skip):
            message = (
                f"{who} returned a skip from {hook}, which cannot honour it (only "
                "before_tool can skip a call): warn or stop instead"
            )
        else:
            what = f"a verdict with {why}" if why else f"{shown}, not a verdict"
            message = f"{who} returned {what} from {hook}"
        who = plugin if isinstance(plugin, str) else UNKNOWN_PLUGIN
        return _fail_closed(who, message, hook, returned=shown)

    def _call(self, hook: str, args: tuple[Any, ...]) -> Resolution:
        pm: Any = self._pm
        # the common case read inline (no call): our manager, unmonitored, plans current
        if self._ours and not pm.monitors and pm.generation == self._generation:
            plan = self._plans[hook]
        else:
            plan = self._plan(hook)
        if plan is None:
            return self._via_pluggy(hook, args)
        # direct dispatch, in this frame (four hooks a step)
        results: list[Any] = []
        overlay: list[Callable[[], None]] = []
        for name, fn, idx, shadowed in plan:
            if shadowed:
                v = self._shadowed(hook, name, fn, idx, args, overlay)
                if v is not None:
                    results.append(v)
                continue
            try:
                r = fn(*args) if idx is None else fn(*[args[i] for i in idx])
            except Exception as exc:
                return self._failed(hook, exc, plugin=name)
            if r is not None:
                if (
                    not isinstance(r, (Warn, Skip, Stop))
                    or _ill_typed(r)
                    or (type(r) is Skip and hook != "before_tool")
                ):
                    return self._not_a_verdict(hook, r, plugin=name)
                if r.plugin == UNKNOWN_PLUGIN:  # built with loopwarden.warn() & co.
                    r = dataclasses.replace(r, plugin=name)
                results.append(r)
        return resolve(results) if results else EMPTY

    def _via_pluggy(self, hook: str, args: tuple[Any, ...]) -> Resolution:
        """pluggy's dispatch: wrappers, monitors, or a plain pluggy manager."""
        caller, shadowed = self._pluggy(hook)
        try:
            results = caller(**dict(zip(_HOOK_ARGS[hook], args, strict=True)))
        except Exception as exc:
            return self._failed(hook, exc)
        overlay: list[Callable[[], None]] = []
        for name, fn, idx, _ in shadowed:
            v = self._shadowed(hook, name, fn, idx, args, overlay)
            if v is not None:
                results = [*results, v]
        for r in results:
            if _refused(hook, r):
                return self._not_a_verdict(hook, r, plugin=getattr(r, "plugin", None))
        return resolve(results) if results else EMPTY

    def _pluggy(self, hook: str) -> tuple[Any, tuple[_Step, ...]]:
        """pluggy's caller for ``hook`` without the shadowed plugins (wrappers and monitors
        still see the hook called), and the steps calling those after it, each on a snapshot;
        their wrappers, if any, are not called."""
        full = getattr(self._pm.hook, hook)
        if not self.shadow:
            return full, ()
        if not self._ours:  # a plain pluggy manager: nothing is cached
            self._subsets = {}
        elif self._pm.generation != self._generation:  # type: ignore[attr-defined]
            self._build_plans()
        cached = self._subsets.get(hook)
        if cached is not None:
            return cached
        impls = full.get_hookimpls()
        out = [i for i in impls if i.plugin_name in self.shadow]
        if not out:
            cached = (full, ())
        else:
            caller = self._pm.subset_hook_caller(hook, remove_plugins=[i.plugin for i in out])
            steps = self._steps(hook, [i for i in out if not (i.hookwrapper or i.wrapper)])
            cached = (caller, steps)
        self._subsets[hook] = cached
        return cached

    def on_start(self, run: Run) -> Resolution:
        return self._call("on_start", (run,))

    def before_model(self, run: Run, request: ModelRequest) -> Resolution:
        return self._call("before_model", (run, request))

    def on_model_delta(self, run: Run, request: ModelRequest, delta: ModelDelta) -> Resolution:
        return self._call("on_model_delta", (run, request, delta))

    def implements(self, hook: str) -> bool:
        """Whether any plugin implements ``hook`` (a stream skips an unused per-delta hook)."""
        return bool(getattr(self._pm.hook, hook).get_hookimpls())

    def after_response(self, run: Run, response: ModelResponse) -> Resolution:
        return self._call("after_response", (run, response))

    def before_tool(self, run: Run, call: ToolCall) -> Resolution:
        return self._call("before_tool", (run, call))

    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Resolution:
        return self._call("after_tool", (run, call, result))

    def on_stop(self, run: Run, outcome: RunOutcome) -> list[dict[str, str]]:
        """Call every ``on_stop``; return the failures (plugin, error) instead of raising."""
        failures: list[dict[str, str]] = []
        done: set[str] = set()
        caller = self._on_stop
        while True:
            try:
                caller(run=run, outcome=outcome)
                return failures
            except Exception as exc:
                plugin = self.blame(exc)
                failures.append(self._failure(plugin, "on_stop", exc))
                # call the implementations the exception skipped: those after the failing one
                impls = [
                    i.plugin_name
                    for i in reversed(self._on_stop.get_hookimpls())
                    if not (i.hookwrapper or i.wrapper)
                ]
                if plugin not in impls:
                    return failures
                done.update(impls[: impls.index(plugin) + 1])
                remove = [self._pm.get_plugin(n) for n in done]
                caller = self._pm.subset_hook_caller("on_stop", remove_plugins=remove)

    # -- lifecycle hooks (not on the hot path: pluggy dispatches them) ---------------------

    def configure(self, deployment: DeploymentView) -> None:
        """``on_configure``: once, when ``deployment`` has loaded its plugins."""
        self._pm.hook.on_configure(deployment=deployment)

    def unconfigure(self, deployment: DeploymentView) -> None:
        """``on_unconfigure``: once, when ``deployment`` closes."""
        self._pm.hook.on_unconfigure(deployment=deployment)

    def validate_model(self, model: str, path: str | None) -> None:
        """``validate_model``: a plugin refuses ``model`` by raising ConfigError."""
        self._checks("validate_model", {"model": model, "path": path}, path)

    def validate_config(self, config: Config) -> None:
        """``validate_config``: a plugin refuses what it finds about its surroundings by
        raising ConfigError (``loopwarden config check``)."""
        self._checks("validate_config", {"config": config}, config.path)

    def _checks(self, hook: str, kwargs: dict[str, Any], path: str | None) -> None:
        """Call a refusing hook plugin by plugin: a ConfigError is the plugin's answer, any
        other exception a broken check, reported as a ConfigError naming the plugin."""
        from loopwarden.exceptions import ConfigError

        for impl in reversed(getattr(self._pm.hook, hook).get_hookimpls()):
            try:
                impl.function(*(kwargs[name] for name in impl.argnames))
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(
                    f"{hook} failed: {type(exc).__name__}: {exc}",
                    path=path,
                    key=f"plugins.{impl.plugin_name}",
                ) from exc

    def budget_limits(self, run: Run) -> dict[str, float]:
        """``budget_limits``: the limits the plugins enforce for ``run``, by budget (the
        earlier plugin in config order wins a tie)."""
        out: dict[str, float] = {}
        for limits in self._pm.hook.budget_limits(run=run):
            if isinstance(limits, Mapping):
                for budget, value in limits.items():
                    out.setdefault(str(budget), value)
        return out

    def record_fields(
        self, run: Run, reserved: Container[str] = ()
    ) -> tuple[dict[str, Any], list[dict[str, str]]]:
        """``record_fields``: the plugins' fields for ``run``'s record, and the failures of
        those that raised or named a ``reserved`` field (each called on its own)."""
        fields: dict[str, Any] = {}
        failures: list[dict[str, str]] = []
        for impl in reversed(self._pm.hook.record_fields.get_hookimpls()):
            try:
                got = impl.function(run) if impl.argnames else impl.function()
                if got is not None and not isinstance(got, Mapping):
                    raise TypeError(f"returned {_safe_repr(got)[:200]}, not a mapping")
                taken = sorted(str(k) for k in (got or {}) if k in reserved)
                if taken:
                    raise ValueError(f"the record's own fields cannot be replaced: {taken}")
            except Exception as exc:
                failures.append(self._failure(impl.plugin_name, "record_fields", exc))
                continue
            for key, value in (got or {}).items():
                fields.setdefault(str(key), value)
        return fields, failures
