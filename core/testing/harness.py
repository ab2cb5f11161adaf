"""The test kit's harness: call one hook of one plugin, or drive it through a scripted run.

Private: import these from :mod:`loopwarden.testing`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from loopwarden import signals as _signals
from loopwarden.clock import Clock, FakeClock
from loopwarden.config import Config, load_config, parse_config
from loopwarden.deployment import Deployment
from loopwarden.host import (
    LoadedPlugin,
    instantiate_plugin,
    plugin_name,
    register,
    resolve_plugin_name,
)
from loopwarden.models.scenario import Scenario, ToolScript, load_scenario, scenario_path
from loopwarden.models.scripted import ScriptedModel
from loopwarden.run import Run, RunOutcome
from loopwarden.testing.builders import ToolsArg, _registry, make_run, script
from loopwarden.testing.recorders import HookRecorder, SignalRecorder
from loopwarden.verdicts import Verdict


def _plugin_object(
    plugin: Any, settings: Mapping[str, Any] | BaseModel | None, name: str | None
) -> tuple[str, Any]:
    import inspect

    pname = name or plugin_name(plugin)  # the loader's rule: one name in tests and production
    if inspect.isclass(plugin):
        table = settings.model_dump() if isinstance(settings, BaseModel) else dict(settings or {})
        obj, _ = instantiate_plugin(pname, plugin, table, "<test>")
        return pname, obj
    if settings is not None:
        raise TypeError("settings need the plugin's class, not an instance")
    return pname, plugin


def call_hook(
    plugin: Any,
    hook: str,
    /,
    *,
    settings: Mapping[str, Any] | BaseModel | None = None,
    **kwargs: Any,
) -> Any:
    """Call one hook of one plugin through pluggy and return what it returned (or None).

    The plugin is registered as the loader would (a class is built with ``settings``; unknown
    or misspelled hooks and wrong argument names fail with
    :class:`~loopwarden.PluginLoadError`), so pluggy passes only the arguments the
    implementation takes.  ``run`` defaults to :func:`make_run`; exceptions propagate.
    """
    name, obj = _plugin_object(plugin, settings, None)
    pset = register([LoadedPlugin(name, "object", repr(obj), obj)])
    kwargs.setdefault("run", make_run())
    results = getattr(pset.pm.hook, hook)(**kwargs)
    return results[0] if results else None


def make_deployment(
    config: Mapping[str, Any] | Config | str | Path | None = None,
    **kwargs: Any,
) -> Deployment:
    """A :class:`~loopwarden.Deployment` from a config mapping (validated like a file), a
    :class:`~loopwarden.Config`, or a file path.  ``kwargs`` go to ``Deployment`` (``model``,
    ``tools``, ``plugins``, ``clock``).  Close it when done (or use the ``lw_deployment``
    fixture).
    """
    if config is None or isinstance(config, Mapping):
        cfg = parse_config(dict(config or {}), path="<test>")
    elif isinstance(config, Config):
        cfg = config
    else:
        cfg = load_config(config)
    return Deployment(cfg, **kwargs)


@dataclasses.dataclass(frozen=True)
class VerdictRecord:
    """A verdict as the loop recorded it: at which step, from which hook."""

    #: the model turn the verdict was given at
    step: int
    #: the hook that returned it
    hook: str
    #: the verdict itself
    verdict: Verdict


@dataclasses.dataclass
class PluginRun:
    """What :func:`run_plugin` returns: the finished run and everything seen on the way.

    ``plugin`` is the plugin object as registered (named ``name``); ``run`` the finished
    :class:`~loopwarden.Run`; ``hooks`` and ``signals`` the recorders of every hook call and
    signal of the run; ``model`` the scripted model (``model.requests`` are the requests it
    got); ``deployment`` the (closed) deployment, e.g. for ``deployment.plugins.describe()``.
    """

    #: the plugin object as registered
    plugin: Any
    #: its name
    name: str
    #: the finished run
    run: Run
    #: a recorder of every hook call of the run
    hooks: HookRecorder
    #: a recorder of every signal of the run
    signals: SignalRecorder
    #: the scripted model (``model.requests``: the requests it got)
    model: ScriptedModel
    #: the (closed) deployment, e.g. for ``deployment.plugins.describe()``
    deployment: Deployment
    _tmp: Any = dataclasses.field(default=None, repr=False)

    @property
    def record(self) -> dict[str, Any]:
        """The run record (the contract in docs/contracts.md)."""
        return self.run.record()

    @property
    def outcome(self) -> RunOutcome:
        """How the run ended."""
        if self.run.outcome is None:  # pragma: no cover - run_plugin returns finished runs
            raise RuntimeError("the run has not finished")
        return self.run.outcome

    @property
    def termination(self) -> str:
        """The outcome's stop reason."""
        return self.outcome.termination

    @property
    def log(self) -> list[VerdictRecord]:
        """Every plugin's verdicts in order, with step and hook."""
        return [
            VerdictRecord(r.kwargs["step"], r.kwargs["hook"], r.kwargs["verdict"])
            for r in self.signals.get(_signals.guard_triggered.name)
        ]

    @property
    def verdicts(self) -> list[Verdict]:
        """This plugin's verdicts, in order."""
        return [r.verdict for r in self.log if r.verdict.plugin == self.name]

    @property
    def warnings(self) -> list[str]:
        """The warning messages injected into requests (every plugin's), in order."""
        return [w["message"] for w in self.run.warnings]

    @property
    def executed(self) -> list[str]:
        """Names of the tool calls that really executed (not skipped, not invalid)."""
        return [
            r.kwargs["call"].name
            for r in self.signals.get(_signals.tool_finished.name)
            if not r.kwargs["result"].skipped and r.kwargs["call"].error is None
        ]


def run_plugin(
    plugin: Any,
    *,
    turns: Sequence[Mapping[str, Any]] = (),
    scenario: Scenario | str | Path | None = None,
    user: str | None = None,
    settings: Mapping[str, Any] | BaseModel | None = None,
    name: str | None = None,
    enabled: Sequence[str] | None = None,
    plugins: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    then: Literal["repeat_last", "cycle", "final"] = "final",
    on_warning: Literal["ignore", "final"] = "ignore",
    final_text: str = "OK.",
    tool_results: Mapping[str, Sequence[str | Mapping[str, Any]]] | None = None,
    tools: ToolsArg = None,
    profile: str | None = None,
    clock: Clock | None = None,
) -> PluginRun:
    """Drive ``plugin`` through one short scripted run of the real loop.

    :param plugin: a plugin class (built with ``settings``), an instance, a module, or a name
        the loader resolves (built-in, entry point, ``module:attr``).
    :param turns: the scripted model's turns (:func:`turn`); or ``scenario``: a scenario file,
        name or :class:`~loopwarden.models.scenario.Scenario`.
    :param settings: the plugin's ``[plugins.<name>]`` table (validated like the file's).
    :param enabled: the call order (names; the plugin's own name included), to run it beside
        other plugins; default: the plugin alone (plus the essential ``max_steps``).
    :param plugins: more plugins built in code, by name (classes get their table from
        ``config``); place them with ``enabled``.
    :param config: more config tables, e.g. ``{"plugins": {"max_steps": {"max_steps": 4}}}``.
    :param tool_results: scripted results per tool name (``{"query_order": ["NOT_FOUND"]}``;
        an entry may be ``{"error": "...", "retryable": True}``); other tools run for real from
        ``tools`` (default: none, so every tool the turns call needs scripted results).
    :param clock: default a :class:`FakeClock`, so tool delays and timeouts cost no time.
    :return: a :class:`PluginRun` with the run, its record, this plugin's verdicts and the
        recorded hook calls and signals.
    """
    # a throwaway directory for the shared store: a test run never sees the side-effect
    # ledger or the budgets of earlier runs (nor leaves its own behind)
    tmp = tempfile.TemporaryDirectory(prefix="loopwarden-run-", ignore_cleanup_errors=True)
    registry = _registry(tools)
    data: dict[str, Any] = {
        k: dict(v) if isinstance(v, Mapping) else v for k, v in (config or {}).items()
    }
    store_table: dict[str, Any] = dict(data.get("store") or {})
    store_table.setdefault("url", f"sqlite:///{Path(tmp.name) / 'store.sqlite3'}")
    data["store"] = store_table
    plugins_table: dict[str, Any] = dict(data.get("plugins", {}))
    objects: dict[str, Any] = dict(plugins or {})
    if isinstance(plugin, str):
        pname = resolve_plugin_name(plugin)  # "mod:Cls" -> the name the plugin declares
        if name is not None and name != pname:
            raise ValueError(
                f"{plugin!r} is the plugin {pname!r}: a plugin enabled by reference keeps its "
                "own name (name= renames only objects and classes)"
            )
        if settings is not None:
            plugins_table[pname] = (
                settings.model_dump() if isinstance(settings, BaseModel) else dict(settings)
            )
    else:
        pname, obj = _plugin_object(plugin, settings, name)
        objects[pname] = obj
    ref = plugin if isinstance(plugin, str) else pname
    plugins_table["enabled"] = list(enabled) if enabled is not None else [ref]
    if ref not in plugins_table["enabled"]:
        raise ValueError(f"enabled={list(plugins_table['enabled'])} does not name {ref!r}")
    data["plugins"] = plugins_table
    cfg = parse_config(data, path="<test>")
    if scenario is not None:
        sc = (
            scenario
            if isinstance(scenario, Scenario)
            else load_scenario(scenario_path(str(scenario)))
        )
    else:
        sc = Scenario(
            name="test",
            user=user or "What is the status of order 1001?",
            model=script(turns, then=then, on_warning=on_warning, final_text=final_text),
            tools={
                k: ToolScript.model_validate({"results": list(v)})
                for k, v in (tool_results or {}).items()
            },
        )
    if user is not None and scenario is not None:
        sc = sc.model_copy(update={"user": user})
    clock = clock if clock is not None else FakeClock()
    dep = Deployment(cfg, tools=registry, plugins=objects, clock=clock)
    try:
        model = ScriptedModel(sc.model, estimator=dep.estimator)
        with HookRecorder(dep) as hooks, SignalRecorder(deployment=dep) as sigs:
            run = dep.run(scenario=sc, model=model, profile=profile)
    finally:
        dep.close()
    return PluginRun(
        plugin=dep.plugins.get(pname),
        name=pname,
        run=run,
        hooks=hooks,
        signals=sigs,
        model=model,
        deployment=dep,
        _tmp=tmp,
    )
