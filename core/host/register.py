"""Register: the loaded plugins go to one pluggy manager in config order, and are checked.

pluggy calls implementations last-registered-first, so plugins are registered in reverse config
order and the effective order of every hook is read back from ``get_hookimpls()`` and compared
with the config.  Start-up fails with :class:`~loopwarden.PluginLoadError` naming the plugin when
it implements no hook, misspells one (``befor_tool``), forgets ``@hookimpl`` on a hook-named
method, implements a hook as ``async def``, keeps a 0.1 lifecycle method on a plain object, or
carries a ``tryfirst``/``trylast`` that would break the configured order.
``LOOPWARDEN_TRACE_PLUGINS=1`` writes every hook call and its verdicts to stderr.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy
from pydantic import BaseModel

from loopwarden import hookspecs
from loopwarden.exceptions import PluginLoadError
from loopwarden.host.dispatch import Hooks
from loopwarden.plugin import Plugin, unused_shim

#: plugins that can be configured but never disabled (pytest's "essential plugins")
ESSENTIAL_PLUGINS: tuple[str, ...] = ("max_steps",)
ENV_TRACE = "LOOPWARDEN_TRACE_PLUGINS"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass
class LoadedPlugin:
    """One loaded plugin: its configured name, where it came from, the registered object.

    ``source`` is ``"builtin"``, ``"entry point (<distribution> <version>)"``,
    ``"module:attr"`` or ``"object"`` (built in code and handed to the deployment).
    """

    name: str
    source: str
    spec: str  # the module:attr it was loaded from (or the object's repr)
    obj: Any
    settings: BaseModel | None = None
    hooks: list[str] = field(default_factory=list)

    @property
    def observer(self) -> bool:
        """True for a pure observer: it implements no run hook, so it can never change a run
        (it subscribes to signals in ``on_configure``)."""
        return not any(h in hookspecs.RUN_HOOK_NAMES for h in self.hooks)


# -- registering ---------------------------------------------------------------------------


class LoopwardenPluginManager(pluggy.PluginManager):
    """pluggy's manager, telling the :class:`Hooks` facade when it must dispatch through pluggy.

    The facade calls hook implementations directly on the hot path (see :class:`Hooks`); it
    falls back to pluggy's own dispatch while anything monitors hook calls
    (``add_hookcall_monitoring``, which tracing and the test kit's ``HookRecorder`` use) and
    rebuilds its call plans after ``register``/``unregister``.
    """

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        self.monitors = 0
        self.generation = 0

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        if unused_shim(plugin, name):  # Plugin's lifecycle shims, when they would do nothing
            return None
        return super().parse_hookimpl_opts(plugin, name)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        try:
            return super().register(plugin, name)
        finally:
            self.generation += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        try:
            return super().unregister(plugin, name)
        finally:
            self.generation += 1

    def add_hookcall_monitoring(self, before: Any, after: Any) -> Callable[[], None]:
        undo_pluggy = super().add_hookcall_monitoring(before, after)
        self.monitors += 1
        undone = False

        def undo() -> None:
            nonlocal undone
            undo_pluggy()
            if not undone:
                undone = True
                self.monitors -= 1

        return undo


def new_plugin_manager() -> LoopwardenPluginManager:
    """A pluggy manager with loopwarden's hook specs (tracing with ``LOOPWARDEN_TRACE_PLUGINS``)."""
    pm = LoopwardenPluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if _env_flag(ENV_TRACE):
        pm.trace.root.setwriter(_trace_writer)
        pm.enable_tracing()
    return pm


def _trace_writer(text: str) -> None:
    sys.stderr.write("".join("[loopwarden trace] " + ln for ln in text.splitlines(True)))


#: 0.1 method names a plain (non-Plugin) object may still carry -> the hook that replaced them
_LEGACY_METHODS = {
    "connect": "on_configure",
    "close": "on_unconfigure",
    "check_model": "validate_model",
    "check_config": "validate_config",
}


def _check_plugin(pm: pluggy.PluginManager, lp: LoadedPlugin) -> None:
    """Unknown or unmarked hooks, async hooks, and plugins with nothing to do fail here; so does
    a plain object's 0.1 lifecycle method, no longer called (a :class:`~loopwarden.Plugin`
    subclass's are, by the base class's hook implementations), rather than be skipped."""
    callers = pm.get_hookcallers(lp.obj) or []
    implemented: list[str] = []
    for hc in callers:
        impls = [i for i in hc.get_hookimpls() if i.plugin is lp.obj]
        if not hc.has_spec():
            if all(i.optionalhook for i in impls):
                continue
            close = difflib.get_close_matches(hc.name, hookspecs.HOOK_NAMES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PluginLoadError(
                f"unknown hook {hc.name!r}: {hint}(known hooks: {', '.join(hookspecs.HOOK_NAMES)})",
                plugin=lp.name,
            )
        for impl in impls:
            fn = impl.function
            if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
                raise PluginLoadError(
                    f"{hc.name} is 'async def'; hooks are synchronous (pluggy would take the "
                    "coroutine for a result): make it a plain 'def'",
                    plugin=lp.name,
                )
        implemented.append(hc.name)
    for hname in hookspecs.HOOK_NAMES:
        if hname in implemented:
            continue
        attr = inspect.getattr_static(lp.obj, hname, None)
        if (
            attr is not None
            and not unused_shim(lp.obj, hname)
            and callable(getattr(lp.obj, hname, None))
        ):
            raise PluginLoadError(
                f"defines {hname}() without @hookimpl, so it would never be called "
                "(decorate it with 'from loopwarden import hookimpl')",
                plugin=lp.name,
            )
    plain = not isinstance(lp.obj, Plugin)
    for method, hook in _LEGACY_METHODS.items():
        if plain and hook not in implemented and callable(getattr(lp.obj, method, None)):
            raise PluginLoadError(
                f"defines {method}(), which loopwarden no longer calls on a plain object: "
                f"implement the hook {hook} with @hookimpl (or subclass loopwarden.Plugin)",
                plugin=lp.name,
            )
    lp.hooks = [h for h in hookspecs.HOOK_NAMES if h in implemented]
    if not lp.hooks:
        raise PluginLoadError(
            "implements no hook (expected @hookimpl methods named one of: "
            f"{', '.join(hookspecs.HOOK_NAMES)}, or a connect() that subscribes to signals)",
            plugin=lp.name,
        )


def register(loaded: list[LoadedPlugin]) -> PluginSet:
    """Register ``loaded`` (in call order) with a new pluggy manager and verify the order.

    pluggy refuses a name or an object registered twice; the object's other name is said."""
    pm = new_plugin_manager()
    for lp in reversed(loaded):
        try:
            pm.register(lp.obj, name=lp.name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            reason, other = str(exc), pm.get_name(lp.obj)
            if isinstance(exc, ValueError):  # pluggy's text ends with its registry: cut it
                reason = reason.splitlines()[0]
            if other not in (None, lp.name):
                reason = f"the same object is registered under two names ({other!r} too)"
            raise PluginLoadError(reason, plugin=lp.name) from exc
    for lp in loaded:
        _check_plugin(pm, lp)
    plugin_set = PluginSet(pm, loaded)
    config_order = [lp.name for lp in loaded]
    for hook in hookspecs.HOOK_NAMES:
        actual = plugin_set.call_order(hook)
        expected = [n for n in config_order if n in actual]
        if actual != expected:
            # pluggy calls tryfirst, then unmarked, then trylast implementations: at the first
            # place the orders differ, a tryfirst plugin jumped ahead (a) or a trylast one left (e)
            marked = {
                i.plugin_name
                for i in getattr(pm.hook, hook).get_hookimpls()
                if (i.tryfirst or i.trylast) and not (i.hookwrapper or i.wrapper)
            }
            culprit = next(
                a if a in marked else e for a, e in zip(actual, expected, strict=True) if a != e
            )
            raise PluginLoadError(
                f"its tryfirst/trylast on {hook} would break the configured order "
                f"(config: {expected}, effective: {actual}); remove the marker or move the "
                "plugin in [plugins] enabled",
                plugin=culprit,
            )
    return plugin_set


class PluginSet:
    """The plugins of one deployment, loaded and registered in config order."""

    def __init__(self, pm: pluggy.PluginManager, plugins: list[LoadedPlugin]) -> None:
        self.pm = pm
        self.plugins = plugins
        self.hooks = Hooks(pm)

    def __iter__(self) -> Iterator[LoadedPlugin]:
        return iter(self.plugins)

    def __len__(self) -> int:
        return len(self.plugins)

    def get(self, name: str) -> Any:
        """The plugin object registered as ``name``, or None."""
        for p in self.plugins:
            if p.name == name:
                return p.obj
        return None

    def enabled_as(self, name: str) -> str | None:
        """The ``module:attr`` reference that enabled the plugin ``name``, when the config
        names it so (errors then show both: the name and where it came from)."""
        for p in self.plugins:
            if p.name == name and p.source == "module:attr" and p.spec != name:
                return p.spec
        return None

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    @functools.cached_property
    def _io(self) -> tuple[bool, bool]:
        declared = [getattr(p.obj, "blocking_io", False) for p in self.plugins]
        return (
            any(d is True or d == "store" for d in declared),
            any(d is True for d in declared),
        )

    @property
    def blocking_io(self) -> bool:
        """Whether one of these plugins declares ``blocking_io`` (``True`` or ``"store"``: its
        hooks may wait on I/O): asked once, as a set's plugins are fixed once it is loaded."""
        return self._io[0]

    @property
    def other_io(self) -> bool:
        """Whether one of these plugins waits on I/O other than the store's (``blocking_io =
        True``): its runs' store-using steps always go to worker threads."""
        return self._io[1]

    def call_order(self, hook: str) -> list[str]:
        """The effective call order of ``hook`` (read from pluggy), wrappers excluded."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return [i.plugin_name for i in reversed(impls) if not (i.hookwrapper or i.wrapper)]

    def describe(self) -> list[dict[str, Any]]:
        """One row per plugin, in call order: position, name, source, spec, hooks, essential."""
        return [
            {
                "position": i,
                "name": p.name,
                "source": p.source,
                "spec": p.spec,
                "hooks": list(p.hooks),
                "essential": p.name in ESSENTIAL_PLUGINS,
            }
            for i, p in enumerate(self.plugins, 1)
        ]
