"""A deployment: one config, its plugins (configured once), a model, tools -- many runs.

::

    from loopwarden import Deployment

    dep = Deployment.from_config("config.toml")
    run = dep.run("查询订单 88231 的物流")          # the configured OpenAI-compatible model
    run = dep.run(scenario="refund")                 # the scripted model plays a scenario
    print(run.record())

Plugin objects serve every run of the deployment, concurrently (``arun``); per-run state lives
on the :class:`~loopwarden.Run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from loopwarden import signals
from loopwarden.clock import CancelToken, Clock, SystemClock
from loopwarden.config import Config, load_config
from loopwarden.engine.drivers import adrive, drive
from loopwarden.engine.loop import Engine
from loopwarden.exceptions import ConfigError, PluginLoadError, ToolError
from loopwarden.host import PluginSet, load_plugins
from loopwarden.mcp import secret_values as mcp_secrets
from loopwarden.models import endpoint, output_limit
from loopwarden.models.scenario import Scenario, ToolScript, load_scenario, scenario_path
from loopwarden.models.tokens import get_estimator
from loopwarden.redaction import Redactor, model_api_key
from loopwarden.run import Conversation, Limits, Run
from loopwarden.store import Shared
from loopwarden.tools import Tool, ToolContext, ToolRegistry
from loopwarden.tools.recorded import recorded_tool

if TYPE_CHECKING:
    from blinker import NamedSignal

    from loopwarden.engine.streaming import StreamEvent
    from loopwarden.mcp.client import McpServers
    from loopwarden.models import Model

__all__ = ["Deployment", "scripted_tools"]

log = logging.getLogger("loopwarden.deployment")


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def _scripted_func(script: ToolScript, name: str) -> Callable[..., Any]:
    """A tool body that plays ``script``: results in order (the last repeats), or an error."""
    position = [0]

    def play(**kwargs: Any) -> Any:
        ctx: ToolContext = kwargs.pop("_ctx")
        if script.delay_s:
            ctx.sleep(script.delay_s)
        if script.error is not None:
            err = script.error
            if isinstance(err, str):
                raise ToolError(err)
            raise ToolError(err.message, retryable=err.retryable)
        results = script.results or ["(no output)"]
        entry = results[min(position[0], len(results) - 1)]
        position[0] += 1
        if isinstance(entry, str):
            return entry
        raise ToolError(entry.error, retryable=entry.retryable)

    play.__name__ = name
    return play


def scripted_tools(base: ToolRegistry | None, scenario: Scenario) -> ToolRegistry:
    """``base`` with the scenario's ``[tools.*]`` behaviours swapped in (fresh per run)."""
    reg = base.copy() if base is not None else ToolRegistry()
    for name, script in scenario.tools.items():
        real = reg.get(name)
        plays_real = script.results is None and script.error is None
        if real is not None:
            if plays_real and not script.delay_s:
                continue
            if plays_real:  # only slowness added: delay, then run the real tool
                inner = real

                def slow(_inner: Tool = inner, _s: ToolScript = script, **kw: Any) -> Any:
                    ctx: ToolContext = kw.pop("_ctx")
                    ctx.sleep(_s.delay_s)
                    if _inner.context_param:
                        kw[_inner.context_param] = ctx
                    return _inner.func(**kw)

                func: Callable[..., Any] = slow
            else:
                func = _scripted_func(script, name)
            flags = {
                k: getattr(script, k)
                for k in ("read_only", "deterministic", "side_effect", "terminal")
                if getattr(script, k) is not None
            }
            tool = dataclasses.replace(
                real, func=func, context_param="_ctx", is_async=False, **flags
            )
        else:
            if plays_real:
                raise ConfigError(
                    "the deployment has no tool of this name: script its results or error",
                    path=scenario.path,
                    key=f"tools.{name}",
                )
            if script.declared is False:
                # as a framework's or an MCP server's tool nobody described: it runs every
                # time it is called, and its name only weighs detectors' evidence
                tool = dataclasses.replace(
                    recorded_tool(name),
                    func=_scripted_func(script, name),
                    description=script.description or f"Scripted tool {name}.",
                    context_param="_ctx",
                )
            else:
                tool = Tool(
                    name=name,
                    func=_scripted_func(script, name),
                    description=script.description or f"Scripted tool {name}.",
                    args_model=_AnyArgs,
                    read_only=bool(script.read_only),
                    deterministic=bool(script.deterministic),
                    side_effect=bool(script.side_effect),
                    terminal=bool(script.terminal),
                    context_param="_ctx",
                )
        reg.add(tool, replace=True)
    return reg


def _warn_unknown_tools(scenario: Scenario, tools: ToolRegistry) -> None:
    """Say so when a scenario's turns call tools the run will not have: the calls become
    unknown-tool observations (and with no tools at all the scripted model only answers),
    which is right for a scenario about bad calls and a surprise for one written against
    other tools -- the built-in scenarios need the demo shop's."""
    called = {c.name for t in scenario.model.turns for c in t.tool_calls}
    missing = sorted(called.difference(tools.names))
    if missing:
        log.warning(
            "scenario %r calls tools the deployment neither has nor scripts: %s (they will "
            "be unknown tools; give the deployment its tools, e.g. tools=loopwarden.demo."
            "shop_tools() for the built-in scenarios)",
            scenario.name,
            ", ".join(missing),
        )


class _Router:
    """The one blinker receiver of a signal for every deployment in the process: it looks up
    the run's deployment and calls that deployment's receivers, each isolated (a failing one
    is logged once and never stops the others).

    One receiver per deployment made every send call each live deployment's receiver, only for
    all but one to find the run was not theirs: O(deployments) per signal, per step, for a
    process serving many.  The router is connected while some deployment has receivers for its
    signal, so ``signal.receivers`` stays empty -- and the loop skips building what nobody
    reads -- when none does.
    """

    __slots__ = ("connected", "routes", "signal")

    def __init__(self, signal: NamedSignal) -> None:
        self.signal = signal
        #: id(deployment) -> (a weak reference to it, its receivers of this signal)
        self.routes: dict[int, tuple[weakref.ref[Deployment], list[Callable[..., Any]]]] = {}
        self.connected = False
        signals.set_dispatcher(signal, self)  # connected for every sender, strongly (add)

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        dep = getattr(sender, "deployment", None)
        route = self.routes.get(id(dep))
        if route is None or route[0]() is not dep:
            return
        for rec in route[1]:
            try:
                rec(sender, **kwargs)
            except Exception:
                signals.receiver_failed(self.signal, rec)

    def add(self, dep: Deployment, receiver: Callable[..., Any]) -> None:
        route = self.routes.get(id(dep))
        if route is None or route[0]() is not dep:
            route = self.routes[id(dep)] = (weakref.ref(dep), [])
        route[1].append(receiver)
        # connected after the route is in: a collection meanwhile may drop the last other
        # route and disconnect, and this connects again
        if not self.connected:
            self.signal.connect(self, weak=False)
            self.connected = True

    def drop(self, key: int) -> None:
        """Forget the deployment whose id was ``key`` (closed or collected)."""
        if self.routes.pop(key, None) is not None and not self.routes and self.connected:
            self.signal.disconnect(self)
            self.connected = False


#: one router per signal, shared by every deployment of the process
_ROUTERS: dict[NamedSignal, _Router] = {}
# re-entrant: a deployment collected while another connects drops its routes in that thread
_ROUTERS_LOCK = threading.RLock()


def _router(signal: NamedSignal) -> _Router:
    router = _ROUTERS.get(signal)
    if router is None:
        router = _ROUTERS[signal] = _Router(signal)
    return router


def _disconnect_all(key: int, routed: list[NamedSignal]) -> None:
    """Take the deployment whose id was ``key`` off the routers of ``routed``."""
    with _ROUTERS_LOCK:
        for signal in routed:
            _ROUTERS[signal].drop(key)
    routed.clear()


def check_model_object(model: object, where: str) -> None:
    """Refuse, before anything is built, a ``model`` that cannot answer a request -- no
    ``complete(request)`` nor ``acomplete(request)`` -- naming what to pass instead (a
    script's table, a model's name), rather than letting the first run end in
    ``model_error``."""
    if model is None or any(callable(getattr(model, m, None)) for m in ("complete", "acomplete")):
        return
    kind = type(model).__name__
    if kind == "ScriptConfig" or (
        isinstance(model, (list, tuple)) and all(isinstance(t, Mapping) for t in model)
    ):
        hint = (
            "a script plays through a scripted model: model=ScriptedModel(script(...)) "
            "(from loopwarden.testing import ScriptedModel, script) -- one ScriptedModel per "
            "run, it keeps its place -- or drive a plugin with "
            "loopwarden.testing.run_plugin(..., turns=[...])"
        )
    elif isinstance(model, str):
        hint = (
            "a model's name goes in config.toml's [model] name (with base_url); model= takes "
            "an object with complete(request)"
        )
    else:
        hint = "pass an object with complete(request) (and optionally acomplete(request))"
    raise TypeError(f"{where}: got a {kind}, which is not a model -- {hint}")


class Deployment:
    """A configured set of plugins, a model and tools, serving many runs."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        model: Model | None = None,
        tools: ToolRegistry | Iterable[Tool] | None = None,
        plugins: Mapping[str, Any] | None = None,
        extra_plugins: Iterable[str] = (),
        clock: Clock | None = None,
    ) -> None:
        check_model_object(model, "Deployment(model=...)")
        #: the validated config.toml the deployment was built from
        self.config = config if config is not None else load_config()
        #: the loaded plugins, in call order (``names``, ``get(name)``)
        self.plugins: PluginSet = load_plugins(self.config, extra=extra_plugins, objects=plugins)
        #: the typed facade the loop calls hooks through
        self.hooks = self.plugins.hooks
        key = model_api_key(self)
        #: the MCP servers' tools are taken when the plugins are configured (see _start_mcp)
        self.mcp: McpServers | None = None
        secrets = mcp_secrets(self.config) if self.config.mcp.servers else []
        #: masks secrets (the model's API key, bearer credentials, ``sk-`` keys, ``token=``
        #: pairs, the MCP servers' env and header values) in the error texts that reach
        #: records, logs and alerts
        self.redactor = Redactor(literals=[key, *secrets] if key else secrets)
        self.hooks.redact = self.redactor.text
        #: the step machine that runs every run, sync, async, streamed or replayed
        self.engine = Engine(self.hooks, self.config.run, shadow=self._shadowed())
        self.engine.redactor = self.redactor
        #: the text-to-tokens estimator of ``[run] token_estimator``
        self.estimator = get_estimator(self.config.run.token_estimator)
        #: the clock runs measure time on (a FakeClock in tests)
        self.clock = clock or SystemClock()
        self._model = model
        self._checked_models: set[str] = set()  # names validate_model accepted
        if tools is None or isinstance(tools, ToolRegistry):
            self._tools: ToolRegistry | None = tools
        else:
            self._tools = ToolRegistry(tools)
        #: the shared store (budgets, side-effect ledger), opened on first use
        self.shared = Shared(self.config.store)
        #: the signals this deployment has receivers for (see :meth:`connect`)
        self._routed: list[NamedSignal] = []
        # an unclosed deployment's receivers go when it does (a signal that is rarely sent
        # would otherwise keep one dead receiver per deployment connected for ever)
        weakref.finalize(self, _disconnect_all, id(self), self._routed)
        try:
            self.hooks.configure(self)
        except Exception as exc:  # a plugin that cannot start: a clear start-up error
            with contextlib.suppress(Exception):
                self.close()
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            culprit = self.hooks.blame(exc)
            ref = self.plugins.enabled_as(culprit)
            raise PluginLoadError(
                (f"(enabled as {ref!r}) " if ref else "")
                + f"on_configure (connect) failed: {text}",
                plugin=culprit,
                path=self.config.path,
            ) from exc
        if self.config.mcp.servers:
            self._start_mcp()

    def _start_mcp(self) -> None:
        """Start the ``[mcp.servers.<name>]`` servers and add their tools to the deployment's
        (a copy of the registry it was given); a server that cannot start closes the
        deployment and raises :class:`ConfigError` naming its table."""
        from loopwarden.mcp import start_servers

        try:
            self.mcp, mcp_tools = start_servers(self.config, self.redactor.text)
            registry = self._tools.copy() if self._tools is not None else ToolRegistry()
            for t in mcp_tools:
                if t.name in registry:
                    raise ConfigError(
                        f"MCP tool {t.name!r} has the name of one of the deployment's own "
                        "tools: set a prefix",
                        path=self.config.path,
                        key="mcp.servers",
                    )
                registry.add(t)
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise
        self._tools = registry
        # an unclosed deployment's servers are closed when it is collected (or at exit)
        weakref.finalize(self, self.mcp.close)

    def _shadowed(self) -> list[str]:
        """The plugins in shadow mode: every one but the essential ones and normal endings
        under ``[run] mode = "shadow"``, else those whose table says ``shadow = true``."""
        essential = {lp.name for lp in self.plugins if getattr(lp.obj, "essential", False)}
        cfg = self.config
        if cfg.run.mode == "shadow":
            return [
                lp.name
                for lp in self.plugins
                if lp.name not in essential and not getattr(lp.obj, "ends_runs_normally", False)
            ]
        named = cfg.plugins.shadowed()
        bad = sorted(essential.intersection(named))
        if bad:
            raise ConfigError(
                f"{bad[0]} is essential: it cannot run in shadow mode (a shadowed run must "
                "still end)",
                path=cfg.path,
                key=f"plugins.{bad[0]}.shadow",
            )
        return named

    @classmethod
    def from_config(cls, path: str | Path | None = None, **kwargs: Any) -> Deployment:
        """Load ``path`` (or ./config.toml, or the shipped default) and build a deployment."""
        return cls(load_config(path), **kwargs)

    # -- parts ---------------------------------------------------------------------------

    @property
    def tools(self) -> ToolRegistry:
        """The deployment's tools: those it was given, else none (a scenario then scripts
        every tool it calls)."""
        if self._tools is None:
            self._tools = ToolRegistry()
        return self._tools

    @property
    def model(self) -> Model:
        """The configured OpenAI-compatible model (built on first use)."""
        if self._model is None:
            from loopwarden.models import model_from_config

            self.check_model(self.config.model.name)
            self._model = model_from_config(self.config.model)
        return self._model

    def check_model(self, name: str) -> None:
        """Let plugins refuse a model before any run (the ``validate_model`` hook).

        The cost budget raises :class:`ConfigError` for a model it has no price for (with
        ``unknown_model = "error"``; by default it logs a note instead).  ``loopwarden run``
        checks the configured model, framework adapters the model each run names.  A name
        that passed is not checked again (once per deployment and model: adapters call this
        for every run); a refused one raises every time.
        """
        if name in self._checked_models:
            return
        self.hooks.validate_model(name, self.config.path)
        if len(self._checked_models) >= 1024:  # bounded, however many names callers pass
            self._checked_models.clear()
        self._checked_models.add(name)

    def limits(self, profile: str | None = None) -> Limits:
        """The limits of ``profile`` (else ``[run] profile``; none: the plugins' own)."""
        p = self.config.profile(profile)
        if p is None:
            return Limits()
        return Limits(
            name=profile or self.config.run.profile,
            max_steps=p.max_steps,
            max_tokens=p.max_tokens,
            max_seconds=p.max_seconds,
            max_context=p.max_context,
        )

    def connect(self, signal: NamedSignal, receiver: Callable[..., Any]) -> None:
        """Subscribe ``receiver`` to ``signal`` for this deployment's runs only.

        Every deployment of the process shares one blinker receiver per signal, which looks up
        the run's deployment and calls its receivers (each isolated: a failing one is logged
        once and never stops the others), so a send costs the same however many deployments
        are alive.  The deployment is held weakly: its receivers go when it is closed or
        collected, so an unclosed deployment leaks nothing.
        """
        with _ROUTERS_LOCK:
            _router(signal).add(self, receiver)
            if signal not in self._routed:
                self._routed.append(signal)

    def close(self) -> None:
        """Disconnect signal receivers and close plugins (files, threads)."""
        _disconnect_all(id(self), self._routed)
        self.hooks.unconfigure(self)
        self.shared.close()
        if self.mcp is not None:
            self.mcp.close()

    async def aclose(self) -> None:
        """:meth:`close` from an event loop (closing MCP servers waits for them: in a
        thread, so the loop goes on)."""
        import asyncio

        await asyncio.to_thread(self.close)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Deployment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- runs ----------------------------------------------------------------------------

    def prepare(
        self,
        user: str | None = None,
        *,
        scenario: Scenario | str | Path | None = None,
        model: Any = None,
        tools: ToolRegistry | None = None,
        profile: str | None = None,
        clock: Clock | None = None,
        cancel: CancelToken | None = None,
        run_id: str | None = None,
        meta: dict[str, Any] | None = None,
        conversation: Conversation | None = None,
    ) -> tuple[Run, Any]:
        """Build a run and the model that will answer it (without starting it).

        ``conversation`` continues a conversation: its messages open the run, and
        conversation-scoped plugin state carries on (see :class:`~loopwarden.Conversation`).
        """
        sc: Scenario | None = None
        if scenario is not None:
            sc = (
                scenario
                if isinstance(scenario, Scenario)
                else load_scenario(scenario_path(str(scenario)))
            )
        if sc is not None:
            from loopwarden.models.scripted import ScriptedModel

            user = user if user is not None else sc.user
            model = model or ScriptedModel(sc.model, estimator=self.estimator)
            tools = scripted_tools(tools if tools is not None else self.tools, sc)
            _warn_unknown_tools(sc, tools)
            profile = profile or sc.profile
        if user is None:
            raise ValueError("a run needs the user's message (or a scenario)")
        check_model_object(model, "model=")
        model = model if model is not None else self.model
        run = Run(
            user,
            deployment=self,
            tools=tools if tools is not None else self.tools,
            clock=clock or self.clock,
            cancel=cancel,
            limits=self.limits(profile),
            scenario=sc.name if sc is not None else None,
            run_id=run_id,
            estimator=self.estimator,
            model_name=getattr(model, "name", None),
            model_url=endpoint(model),
            # the model's own cap, else the deployment's: a model that does not say its cap
            # (scripted, given with model=, a framework's) gets [model] max_output_tokens on
            # its requests, and budgets reserve it
            max_output_tokens=output_limit(model) or self.config.model.max_output_tokens,
            meta=meta,
            conversation=conversation,
        )
        run.shared = self.shared
        self.engine.start(run)
        return run, model

    def run(self, user: str | None = None, **kwargs: Any) -> Run:
        """Run one agent loop to its end, synchronously; returns the finished run."""
        run, model = self.prepare(user, **kwargs)
        drive(self.engine, run, model)
        return run

    async def arun(self, user: str | None = None, **kwargs: Any) -> Run:
        """Run one agent loop to its end on the event loop; returns the finished run."""
        run, model = self.prepare(user, **kwargs)
        await adrive(self.engine, run, model)
        return run

    def stream(self, user: str | None = None, **kwargs: Any) -> Iterator[StreamEvent]:
        """Run one agent loop, yielding its events as they happen: text deltas, tool calls
        proposed / executed / skipped, verdicts, and last a
        :class:`~loopwarden.engine.streaming.RunEnd` with the outcome and the record
        (:mod:`loopwarden.engine.streaming`).  Takes the arguments of :meth:`run`; the run is built
        at once (bad arguments raise here), and starts when the first event is asked for.
        Guards act mid-stream: an answer past its output cap, the run's time or an
        ``on_model_delta`` stop is cut there.  Stop iterating to cancel the run."""
        from loopwarden.engine.streaming import stream_drive

        run, model = self.prepare(user, **kwargs)
        return stream_drive(self.engine, run, model)

    def astream(self, user: str | None = None, **kwargs: Any) -> AsyncIterator[StreamEvent]:
        """:meth:`stream` on the event loop: ``async for event in dep.astream(...)``."""
        from loopwarden.engine.streaming import astream_drive

        run, model = self.prepare(user, **kwargs)
        return astream_drive(self.engine, run, model)
