"""Hook specifications: the plugin author's reference.

The loop calls these hooks, in this order, for every run::

    on_start(run)                         once, before the first model call
    loop:
      before_model(run, request)          before paying for a model call
      on_model_delta(run, request, delta) streamed runs only: each piece of the answer
      after_response(run, response)       after the model answered
      for each proposed tool call:
        before_tool(run, call)            before the call executes
        after_tool(run, call, result)     after it executed (or was skipped)
    on_stop(run, outcome)                 once, always -- also when a model or tool raised

Around the runs, the lifecycle hooks (in the manner of pytest's ``pytest_configure``)::

    on_configure(deployment)              once, when a deployment is built
    validate_model(model, path)           before a model is used (refuse it: raise ConfigError)
    validate_config(config)               on ``loopwarden config check`` (refuse: ConfigError)
    budget_limits(run)                    when an observer asks which limits a run had
    record_fields(run)                    whenever the run record is built
    on_unconfigure(deployment)            once, when the deployment closes

Every run hook except ``on_stop`` may return ``None`` (carry on) or one verdict
(:func:`loopwarden.warn`, :func:`loopwarden.skip`, :func:`loopwarden.stop`) -- but only one
the hook can honour: a ``skip`` is for ``before_tool`` alone (anywhere else it fails closed
as ``plugin_error`` naming the plugin).  Every enabled
plugin's implementation is called -- none is ``firstresult`` -- in the order ``[plugins]
enabled`` gives in ``config.toml``; the loop then resolves the verdicts: hard stop > soft stop
> skip > warn, ties to the plugin earlier in the config, all warnings kept.  What each verdict
does -- where a ``message`` goes, what the user gets on a hard stop (its ``answer=``, from any
hook, else the best-effort answer) -- is in :mod:`loopwarden.verdicts` and
[the API reference](api.md), which also lists every field of the objects the hooks receive
(``ToolCall``, ``ToolResult``, ``ModelRequest``, ``ModelResponse``, ``Run``, ``RunOutcome``)
and the testing kit.

Rules for implementations:

* Take only the arguments you need; names are identical across hooks (``run``, ``request``,
  ``response``, ``call``, ``result``, ``outcome``).  pluggy never passes an argument to a
  parameter that has a default value.
* Keep per-run state in ``run.stash`` under a typed :class:`~loopwarden.StashKey` (or in
  ``run.state``, see :meth:`loopwarden.Plugin.state`), never on the plugin object: one plugin
  object serves many concurrent runs.
* Evidence uses the standard keys (``count``, ``signature``, ``tool``, ``threshold``,
  ``limit``, ``spent``, ``scope``, ``window``, ``rule``; docs/contracts.md), so reports and
  dashboards need no per-plugin knowledge.
* Hooks are synchronous.  Do not block: read ``run.clock`` for time.
* An exception in a hook fails closed: the run stops with ``plugin_error`` naming the plugin.
* Treat payloads as read-only, except where a hook documents a field you may set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from typing import Any

    from loopwarden.config import Config
    from loopwarden.events import ModelDelta, ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.run import DeploymentView, Run, RunOutcome
    from loopwarden.verdicts import Verdict

PROJECT = "loopwarden"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: the hooks of one run, in the order the loop calls them
RUN_HOOK_NAMES = (
    "on_start",
    "before_model",
    "on_model_delta",
    "after_response",
    "before_tool",
    "after_tool",
    "on_stop",
)

#: the hooks around runs: a deployment's life, model checks, limits and the run record
LIFECYCLE_HOOK_NAMES = (
    "on_configure",
    "validate_model",
    "validate_config",
    "budget_limits",
    "record_fields",
    "on_unconfigure",
)

#: every hook specification
HOOK_NAMES = RUN_HOOK_NAMES + LIFECYCLE_HOOK_NAMES


# ---------------------------------------------------------------------------------------------
# Pre-flight
# ---------------------------------------------------------------------------------------------


@hookspec
def on_start(run: Run) -> Verdict | None:
    """Called once when a run starts, before the first model call.

    Use it to check limits, allowed tools and prices, or to prepare per-run state.

    :param run: the run that starts (``run.user``, ``run.tools``, ``run.limits``,
        ``run.clock``).
    :return: ``None``, or a :func:`~loopwarden.stop` verdict to refuse the run before any
        model call (a warning is injected into the first request).
    :may stop the run: yes.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------------
# The model turn
# ---------------------------------------------------------------------------------------------


@hookspec
def before_model(run: Run, request: ModelRequest) -> Verdict | None:
    """Called before every model call, before any money is spent on it.

    Budget and time checks belong here: refuse a call that would pass a limit.  ``run.step``
    is the number of model calls made so far, so this request is call number
    ``run.step + 1`` (``request.step``).

    :param run: the run.
    :param request: the request about to be sent: ``messages``, ``tools``, ``tool_choice``,
        ``notes`` (warnings injected into it), ``final`` (True for a soft stop's wrap-up turn),
        ``estimated_tokens`` (the estimated prompt size).
    :return: ``None``, a warning, or a stop.  A *soft* stop turns this very request into the
        final tool-less turn; a *hard* stop ends the run without calling the model.
    :may stop the run: yes.

    .. versionadded:: 0.1
    """


@hookspec
def on_model_delta(run: Run, request: ModelRequest, delta: ModelDelta) -> Verdict | None:
    """Called for each piece of text of a *streamed* answer, as it arrives -- only in runs
    driven by :meth:`Deployment.stream() <loopwarden.Deployment.stream>` / ``astream()``;
    an unstreamed run never calls it.  Optional: most plugins judge whole responses in
    ``after_response``, which is called for streamed answers too, with the whole response.

    Checks that must act before an answer has been paid for in full belong here: degenerate
    repetition inside one answer (``no_progress``).  Keep the work per call constant: read
    ``delta.text`` (this piece), keep what you need in per-run state.

    :param run: the run.
    :param request: the request being answered (``max_output_tokens``, ``timeout``).
    :param delta: this piece (``text``), its position (``index``) and the answer's estimated
        output tokens so far (``tokens``); ``delta.content()`` joins the text so far.
    :return: ``None``, a warning (queued for the next request), or a stop: a stop *cuts
        the stream here* -- the connection is closed, the answer so far (without its tool
        calls) goes through ``after_response`` and the stop is honoured as if that hook had
        returned it; a soft stop on a tool turn gives the model its tool-less wrap-up turn.
    :may stop the run: yes.

    .. versionadded:: 0.3
    """


@hookspec
def after_response(run: Run, response: ModelResponse) -> Verdict | None:
    """Called after every model response, before its tool calls run.

    ``run.step`` and ``run.usage`` already include this response; the run's cost
    (:func:`loopwarden.plugins.cost_budget.run_cost`) does for plugins placed after
    ``cost_budget`` (which prices it here).  Usage accounting,
    content-similarity and oscillation checks belong here.

    :param run: the run.
    :param response: the model's ``content``, proposed ``tool_calls`` and ``usage``;
        ``calls`` holds the proposals parsed into :class:`~loopwarden.ToolCall` objects (with
        ``fingerprint``), the same objects ``before_tool`` receives next.
    :return: ``None``, a warning, or a stop (none of the proposed calls then runs).
    :may stop the run: yes.  On a response without tool calls (the answer, or a soft stop's
        wrap-up turn) a *hard* stop is a veto: the model's text is withheld and the run ends
        with the stop's ``answer`` or the configured fallback (an output guard); a soft stop
        there changes nothing.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------


@hookspec
def before_tool(run: Run, call: ToolCall) -> Verdict | None:
    """Called before each proposed tool call executes -- also for unknown tools and
    malformed arguments, which then fail without running anything.

    :param run: the run.
    :param call: the parsed call: ``name``, ``arguments`` (None if unparseable),
        ``fingerprint`` (shared canonical signature), ``tool`` (the declaration, or None),
        ``step`` and ``index``.  You may lower ``call.timeout`` (seconds), raise
        ``call.delay_s`` (a backoff the loop waits, on the run's clock, before executing) and
        set ``call.retry`` (a :class:`~loopwarden.RetryPlan`: the runtime then retries a
        retryable failure itself, within ``call.timeout``).
    :return: ``None``, a warning, a :func:`~loopwarden.skip` (do not execute; the model gets
        the skip's observation instead), or a stop.  A side-effecting call is never executed
        twice for the same idempotency key, whatever the verdicts.
    :may stop the run: yes.

    .. versionadded:: 0.1
    """


@hookspec
def after_tool(run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
    """Called after each tool call executed, failed, or was skipped.

    :param run: the run.
    :param call: the call (as in :func:`before_tool`).
    :param result: its observation: ``content``, ``ok``, ``error`` (kind), ``retryable``,
        ``skipped`` (a synthetic observation, not a tool result: do not count it as one),
        ``duration_s``, ``digest``.  You may set ``result.retryable = False`` (a spent retry
        budget); plugins later in the config order see it.
    :return: ``None``, a warning, or a stop (later calls of the same turn do not run).
    :may stop the run: yes.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------------
# Post-flight
# ---------------------------------------------------------------------------------------------


@hookspec
def on_stop(run: Run, outcome: RunOutcome) -> None:
    """Called once when the run ends, however it ends -- also after a model or tool raised,
    or a plugin failed.

    :param run: the finished run; ``run.record()`` is its run record.
    :param outcome: ``termination``, ``soft``, ``stopped_by``, ``evidence``, ``final_answer``.
    :return: nothing; the return value is ignored.  An exception here is logged and recorded
        in the run's ``errors``, and never stops the other plugins' ``on_stop``.
    :may stop the run: no (it has ended).

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------------
# Lifecycle
# ---------------------------------------------------------------------------------------------


@hookspec
def on_configure(deployment: DeploymentView) -> None:
    """Called once when a deployment has loaded its plugins (subscribe to signals here, with
    ``deployment.connect(signal, receiver)``, or open files).

    :class:`~loopwarden.Plugin` implements it by calling the plugin's ``connect(deployment)``,
    so plugins written for 0.1 keep working.

    :param deployment: the deployment being built (``config``, ``plugins``, ``shared``).
    :return: nothing.  An exception fails the deployment's construction.
    :may stop the run: no (no run exists yet).

    .. versionadded:: 0.2
    """


@hookspec
def validate_model(model: str, path: str | None) -> None:
    """Called before a deployment uses the model ``model`` (and by ``loopwarden config
    check``): refuse a model you cannot work with by raising
    :class:`~loopwarden.ConfigError` (the cost budget refuses a model it has no price for).

    :class:`~loopwarden.Plugin` implements it by calling the plugin's
    ``check_model(model, path=path)`` when it has one (the 0.1 spelling).

    :param model: the model's name.
    :param path: the config file the name came from (for the error message), or None.
    :return: nothing; raise :class:`~loopwarden.ConfigError` to refuse.
    :may stop the run: no (no run exists yet).

    .. versionadded:: 0.2
    """


@hookspec
def validate_config(config: Config) -> None:
    """Called by ``loopwarden config check`` once the deployment is built: refuse what only
    the plugin can find out about its surroundings -- a records file that cannot be written,
    say -- by raising :class:`~loopwarden.ConfigError` naming the key.  Create nothing.

    :class:`~loopwarden.Plugin` implements it by calling the plugin's
    ``check_config(path=config.path)`` when it has one.

    :param config: the deployment's configuration (``config.path`` is its file, or None).
    :return: nothing; raise :class:`~loopwarden.ConfigError` to refuse.
    :may stop the run: no (no run exists yet).

    .. versionadded:: 0.2
    """


@hookspec
def budget_limits(run: Run) -> dict[str, float] | None:
    """Called when an observer (the metrics plugin) asks which limits ``run`` had: return
    the limits this plugin enforces, by budget (``steps``, ``tokens``, ``seconds``, or a
    budget of your own).

    :param run: the run (its profile limits are in ``run.limits``).
    :return: ``{"steps": 30}`` and the like, or ``None``.  Later plugins in the config order
        do not override an earlier plugin's figure for the same budget.
    :may stop the run: no.

    .. versionadded:: 0.2
    """


@hookspec
def record_fields(run: Run) -> dict[str, Any] | None:
    """Called whenever the run record is built (``run.record()``): add your plugin's fields.

    The detector counters of the record (``duplicate_calls``, ``oscillation_hits``,
    ``stall_rounds``) are filled in this way by their plugins, and are 0 when the plugin is
    not enabled; so are ``cost`` and ``cost_currency`` by ``cost_budget`` (0.0 and null
    without it).  The record's own fields (``run_id``, ``termination``, ...) cannot be
    replaced; values must be JSON-serialisable (others are printed with ``str``).

    :param run: the run (finished, or still going for a live view).
    :return: a mapping of field names to values, or ``None``.  An exception is logged and
        recorded in the record's ``errors``; the record is still built.
    :may stop the run: no.

    .. versionadded:: 0.2
    """


@hookspec
def on_unconfigure(deployment: DeploymentView) -> None:
    """Called once when the deployment closes: flush files, stop threads.

    :class:`~loopwarden.Plugin` implements it by calling the plugin's ``close()``.

    :param deployment: the deployment being closed.
    :return: nothing.
    :may stop the run: no (it is about the deployment, not a run).

    .. versionadded:: 0.2
    """
