"""Test helpers for plugin authors -- loopwarden's ``pytester``.

Everything a plugin's tests need, public and stable: builders for a run and for every hook
payload, the fake clock, the scripted model, recorders of hook calls and of signals, and a
harness that drives a plugin through a short scripted run.  Nothing here needs pytest; the
fixtures for pytest are opt-in (see below).

Unit-test one hook::

    from loopwarden.testing import call_hook, make_run, make_tool_call

    def test_refuses_refunds():
        verdict = call_hook(NoRefunds(), "before_tool",
                            call=make_tool_call("apply_refund", order_id="88231", reason="x"))
        assert verdict.kind == "stop" and verdict.reason == "forbidden_tool"

Drive it through a scripted run (the real loop; tools are yours, or scripted results)::

    from loopwarden.testing import make_tool, run_plugin, tool_call, turn

    refunds = []
    refund = make_tool("apply_refund", lambda **kw: refunds.append(kw), side_effect=True)
    result = run_plugin(NoRefunds, tools=[refund],
                        turns=[turn("Refunding.", tool_call("apply_refund", order_id="1001"))])
    assert result.termination == "forbidden_tool"
    assert refunds == []

pytest fixtures (``lw_clock``, ``lw_signals``, ``lw_hooks``, ``lw_deployment``) are active only
when asked for, like pytester: ``pytest -p loopwarden.testing``, or
``pytest_plugins = ["loopwarden.testing"]`` in the root ``conftest.py``, or
``loopwarden_testing = true`` in the pytest ini options.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import pluggy
from blinker import ANY
from pydantic import BaseModel, ConfigDict, create_model

from loopwarden import signals as _signals
from loopwarden.clock import CancelToken, Clock, FakeClock
from loopwarden.config import Config, RunConfig, load_config, parse_config
from loopwarden.deployment import Deployment
from loopwarden.events import (
    ErrorKind,
    ModelRequest,
    ModelResponse,
    ProposedCall,
    ToolCall,
    ToolResult,
    Usage,
)
from loopwarden.loop import parse_calls
from loopwarden.models.scripted import ScriptedModel
from loopwarden.pluginmanager import (
    LoadedPlugin,
    PluginSet,
    instantiate_plugin,
    register,
)
from loopwarden.run import Limits, Run, RunOutcome
from loopwarden.scenario import Scenario, ScriptConfig, ToolScript, load_scenario, scenario_path
from loopwarden.tokens import estimate_tools
from loopwarden.tools import Tool, ToolRegistry
from loopwarden.verdicts import Skip, Stop, Verdict, Warn

if TYPE_CHECKING:
    from blinker import NamedSignal

__all__ = [
    "FakeClock",
    "HookCall",
    "HookRecorder",
    "PluginRun",
    "ScriptedModel",
    "SignalRecord",
    "SignalRecorder",
    "VerdictRecord",
    "call_hook",
    "make_deployment",
    "make_outcome",
    "make_request",
    "make_response",
    "make_run",
    "make_tool",
    "make_tool_call",
    "make_tool_result",
    "run_plugin",
    "script",
    "tool_call",
    "turn",
]

#: pytest loads the fixtures only when this module is registered as a plugin (opt-in)
pytest_plugins = ["loopwarden._pytest_fixtures"]

ToolsArg = ToolRegistry | Iterable[Tool] | None


# -- tools ---------------------------------------------------------------------------------


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def make_tool(
    name: str,
    result: Any = "OK",
    *,
    read_only: bool = False,
    deterministic: bool = False,
    side_effect: bool = False,
    terminal: bool = False,
    description: str | None = None,
    parameters: Mapping[str, type] | None = None,
) -> Tool:
    """A tool declaration for tests: any (or the given typed) arguments, a fixed ``result``.

    ``result`` may be a callable taking the arguments as keywords, or an exception instance to
    raise (e.g. ``ToolError("429", retryable=True)``).
    """
    if parameters:
        fields: dict[str, Any] = {k: (v, ...) for k, v in parameters.items()}
        args_model: type[BaseModel] = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid", coerce_numbers_to_str=True),
            **fields,
        )
    else:
        args_model = _AnyArgs

    def body(**kwargs: Any) -> Any:
        if isinstance(result, BaseException):
            raise result
        return result(**kwargs) if callable(result) else result

    body.__name__ = name
    return Tool(
        name=name,
        func=body,
        description=description or f"Test tool {name}.",
        args_model=args_model,
        read_only=read_only,
        deterministic=deterministic,
        side_effect=side_effect,
        terminal=terminal,
    )


def _registry(tools: ToolsArg) -> ToolRegistry:
    if tools is None:
        return ToolRegistry()
    if isinstance(tools, ToolRegistry):
        return tools
    return ToolRegistry(tools)


# -- builders ------------------------------------------------------------------------------


def make_run(
    user: str = "What is the status of order 1001?",
    *,
    tools: ToolsArg = None,
    clock: Clock | None = None,
    limits: Limits | None = None,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    max_seconds: float | None = None,
    step: int = 0,
    usage: tuple[int, int] | Usage | None = None,
    cost: float | Decimal | None = None,
    tool_calls: int = 0,
    scenario: str | None = None,
    run_id: str = "test-run",
    deployment: Any = None,
    meta: dict[str, Any] | None = None,
) -> Run:
    """A :class:`~loopwarden.Run` as hooks see it, with a :class:`FakeClock` at 0.

    ``tools`` defaults to none (build declarations with :func:`make_tool`).
    ``max_steps``/``max_tokens``/``max_seconds`` set the run's profile limits; ``step``,
    ``usage`` (prompt, completion), ``cost`` and ``tool_calls`` set its counters as if that
    much had happened.  The conversation holds the user's message.
    """
    if limits is None and (max_steps, max_tokens, max_seconds) != (None, None, None):
        limits = Limits(
            name="test", max_steps=max_steps, max_tokens=max_tokens, max_seconds=max_seconds
        )
    run = Run(
        user,
        deployment=deployment,
        tools=_registry(tools),
        clock=clock if clock is not None else FakeClock(),
        cancel=CancelToken(),
        limits=limits,
        scenario=scenario,
        run_id=run_id,
        meta=meta,
    )
    run.add_message({"role": "user", "content": user})
    run.step = step
    run.tool_calls = tool_calls
    if usage is not None:
        run.usage.add(usage if isinstance(usage, Usage) else Usage(*usage))
    if cost is not None:
        run.cost = Decimal(str(cost))
    return run


def _run_config(run: Run) -> RunConfig:
    dep = run.deployment
    cfg = getattr(getattr(dep, "config", None), "run", None)
    return cfg if isinstance(cfg, RunConfig) else RunConfig()


def make_request(
    run: Run | None = None,
    *,
    notes: Sequence[str] = (),
    final: bool = False,
    step: int | None = None,
) -> ModelRequest:
    """The request the loop would send next for ``run`` (``request.step == run.step + 1``).

    ``notes`` are guard warnings injected into it; as in the loop they are also appended to the
    conversation.  ``final=True`` makes it a soft stop's tool-less wrap-up turn.
    """
    run = run if run is not None else make_run()
    cfg = _run_config(run)
    for n in notes:
        run.add_message({"role": cfg.warning_role, "content": cfg.warning_prefix + n})
    schemas = run.tools.schemas() if run.tools is not None else []
    return ModelRequest(
        messages=run.messages,
        tools=schemas,
        tool_choice="none" if final else "auto",
        step=step if step is not None else run.step + 1,
        notes=list(notes),
        final=final,
        estimated_tokens=run.context_tokens + estimate_tools(schemas, run.estimator),
    )


def tool_call(
    name: str, arguments: Mapping[str, Any] | str | None = None, /, **kwargs: Any
) -> dict[str, Any]:
    """One proposed tool call for a scripted turn: ``tool_call("query_order", order_id="1")``.

    ``arguments`` may also be raw JSON text (e.g. malformed, to test the loop's handling).
    """
    args: Any = dict(arguments) if isinstance(arguments, Mapping) else arguments
    if args is None:
        args = {}
    if isinstance(args, dict):
        args.update(kwargs)
    return {"name": name, "arguments": args}


def turn(content: str | None = None, *calls: Mapping[str, Any]) -> dict[str, Any]:
    """One scripted model turn: content and/or tool calls (built with :func:`tool_call`)."""
    return {"content": content, "tool_calls": [dict(c) for c in calls]}


def _proposed(calls: Iterable[Any]) -> list[ProposedCall]:
    import json

    out = []
    for i, c in enumerate(calls):
        if isinstance(c, ProposedCall):
            out.append(c)
            continue
        if isinstance(c, tuple):
            c = tool_call(*c)
        args = c.get("arguments", {})
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        out.append(ProposedCall(name=c["name"], arguments=text, id=c.get("id") or f"call_{i}"))
    return out


def make_response(
    content: str | None = None,
    *calls: Any,
    run: Run | None = None,
    usage: tuple[int, int] | Usage | None = None,
    finish_reason: str | None = None,
    model: str | None = "scripted",
) -> ModelResponse:
    """A model response: ``make_response("我查一下", tool_call("query_order", order_id="1"))``.

    Calls may be :func:`tool_call` dicts, ``(name, arguments)`` tuples or
    :class:`~loopwarden.ProposedCall`.  ``usage`` is (prompt, completion) tokens.  When the
    response type carries parsed ``calls``, they are filled as the loop fills them.
    """
    proposed = _proposed(calls)
    response = ModelResponse(
        content=content,
        tool_calls=proposed,
        usage=usage if isinstance(usage, Usage) or usage is None else Usage(*usage),
        finish_reason=finish_reason or ("tool_calls" if proposed else "stop"),
        model=model,
    )
    parsed_field = "calls"  # ModelResponse.calls, where the loop provides it
    if parsed_field in {f.name for f in dataclasses.fields(ModelResponse)}:
        run = run if run is not None else make_run()
        setattr(response, parsed_field, parse_calls(run, response, _run_config(run)))
    return response


def make_tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None = None,
    /,
    *,
    run: Run | None = None,
    index: int = 0,
    id: str | None = None,
    **kwargs: Any,
) -> ToolCall:
    """A parsed :class:`~loopwarden.ToolCall`, exactly as the loop hands it to ``before_tool``.

    ``make_tool_call("query_order", order_id="88231")``: the tool is looked up in ``run.tools``
    (default: no tools), the arguments are validated against its schema (an unknown tool
    or bad arguments set ``call.error`` as in the loop), and ``fingerprint``,
    ``idempotency_key`` and ``timeout`` are computed by the loop's own code.  ``step`` is
    ``run.step``.  Pass raw JSON text as ``arguments`` to build a malformed call.
    """
    run = run if run is not None else make_run()
    proposal = tool_call(name, arguments, **kwargs)
    (proposed,) = _proposed([proposal])
    proposed.id = id or f"call_{run.step}_{index}"
    response = ModelResponse(tool_calls=[proposed])
    (call,) = parse_calls(run, response, _run_config(run))
    call.index = index
    return call


def make_tool_result(
    content: str = "OK",
    *,
    ok: bool = True,
    error: ErrorKind | None = None,
    retryable: bool = False,
    skipped: bool = False,
    skipped_by: str | None = None,
    duration_s: float = 0.0,
    value: Any = None,
) -> ToolResult:
    """A tool's observation.  ``error`` (a kind such as ``"tool_error"``) implies ``ok=False``."""
    return ToolResult(
        content=content,
        ok=ok and error is None,
        error=error,
        retryable=retryable,
        skipped=skipped,
        skipped_by=skipped_by,
        duration_s=duration_s,
        value=value,
    )


def make_outcome(
    termination: str = "final_answer",
    *,
    soft: bool = False,
    stopped_by: str | None = None,
    final_answer: str | None = "OK.",
    evidence: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """How a run ended, as ``on_stop`` receives it."""
    return RunOutcome(
        termination=termination,
        soft=soft,
        stopped_by=stopped_by,
        evidence=dict(evidence or {}),
        final_answer=final_answer,
        final_answer_present=final_answer is not None and termination == "final_answer",
    )


def script(
    turns: Sequence[Mapping[str, Any]] = (),
    *,
    then: Literal["repeat_last", "cycle", "final"] = "final",
    on_warning: Literal["ignore", "final"] = "ignore",
    final_text: str = "OK.",
) -> ScriptConfig:
    """A scripted model's script (a scenario's ``[model]`` table) from :func:`turn` dicts."""
    return ScriptConfig.model_validate(
        {
            "turns": [dict(t) for t in turns],
            "then": then,
            "on_warning": on_warning,
            "final_text": final_text,
        }
    )


# -- calling one hook ----------------------------------------------------------------------


def _plugin_object(
    plugin: Any, settings: Mapping[str, Any] | BaseModel | None, name: str | None
) -> tuple[str, Any]:
    import inspect

    pname = name or getattr(plugin, "name", None) or getattr(plugin, "__name__", None)
    pname = str(pname or type(plugin).__name__)
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


# -- recorders -----------------------------------------------------------------------------


class HookCall:
    """One recorded hook call: ``name``, its keyword arguments as attributes
    (``call.run``, ``call.request``, ``call.result`` ...), and what it returned.

    ``returned`` is the list of non-None values the implementations returned (verdicts);
    ``excinfo`` the exception that escaped the call, if any.
    """

    def __init__(self, name: str, kwargs: Mapping[str, Any]) -> None:
        self.name = name
        self.kwargs = dict(kwargs)
        self.returned: list[Any] = []
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
    :class:`~loopwarden.pluginmanager.PluginSet` or a pluggy manager.  Use it as a context
    manager, or call :meth:`finish_recording`.
    """

    def __init__(self, target: Deployment | PluginSet | pluggy.PluginManager) -> None:
        if isinstance(target, Deployment):
            target = target.plugins
        self._pm: pluggy.PluginManager = target.pm if isinstance(target, PluginSet) else target
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
        self.calls.clear()


@dataclasses.dataclass(frozen=True)
class SignalRecord:
    """One received signal: its name, the sender (the run) and the keyword arguments."""

    name: str
    sender: Any
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

        with SignalRecorder() as rec:
            deployment.run(scenario="refund")
        assert rec.names().count("step-finished") == 4
    """

    def __init__(self, *signals: NamedSignal, sender: Any = ANY, deployment: Any = None) -> None:
        self.signals = signals or _signals.ALL
        self.sender = sender
        self.deployment = deployment
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


# -- deployments and the harness -----------------------------------------------------------


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

    step: int
    hook: str
    verdict: Verdict


@dataclasses.dataclass
class PluginRun:
    """What :func:`run_plugin` returns: the finished run and everything seen on the way.

    ``plugin`` is the plugin object as registered (named ``name``); ``run`` the finished
    :class:`~loopwarden.Run`; ``hooks`` and ``signals`` the recorders of every hook call and
    signal of the run; ``model`` the scripted model (``model.requests`` are the requests it
    got); ``deployment`` the (closed) deployment, e.g. for ``deployment.plugins.describe()``.
    """

    plugin: Any
    name: str
    run: Run
    hooks: HookRecorder
    signals: SignalRecorder
    model: ScriptedModel
    deployment: Deployment
    _tmp: Any = dataclasses.field(default=None, repr=False)

    @property
    def record(self) -> dict[str, Any]:
        """The run record (DESIGN's contract)."""
        return self.run.record()

    @property
    def outcome(self) -> RunOutcome:
        if self.run.outcome is None:  # pragma: no cover - run_plugin returns finished runs
            raise RuntimeError("the run has not finished")
        return self.run.outcome

    @property
    def termination(self) -> str:
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
        name or :class:`~loopwarden.scenario.Scenario`.
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
        pname = name or plugin
        if settings is not None:
            plugins_table[pname] = (
                settings.model_dump() if isinstance(settings, BaseModel) else dict(settings)
            )
    else:
        pname, obj = _plugin_object(plugin, settings, name)
        objects[pname] = obj
    plugins_table["enabled"] = list(enabled) if enabled is not None else [pname]
    if pname not in plugins_table["enabled"]:
        raise ValueError(f"enabled={list(plugins_table['enabled'])} does not name {pname!r}")
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
