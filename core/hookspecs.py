"""Hook specifications: the plugin author's reference.

The loop calls these hooks, in this order, for every run::

    on_start(run)                         once, before the first model call
    loop:
      before_model(run, request)          before paying for a model call
      after_response(run, response)       after the model answered
      for each proposed tool call:
        before_tool(run, call)            before the call executes
        after_tool(run, call, result)     after it executed (or was skipped)
    on_stop(run, outcome)                 once, always -- also when a model or tool raised

Every hook except ``on_stop`` may return ``None`` (carry on) or one verdict
(:func:`loopwarden.warn`, :func:`loopwarden.skip`, :func:`loopwarden.stop`).  Every enabled
plugin's implementation is called -- none is ``firstresult`` -- in the order ``[plugins]
enabled`` gives in ``config.toml``; the loop then resolves the verdicts: hard stop > soft stop
> skip > warn, ties to the plugin earlier in the config, all warnings kept.

Rules for implementations:

* Take only the arguments you need; names are identical across hooks (``run``, ``request``,
  ``response``, ``call``, ``result``, ``outcome``).  pluggy never passes an argument to a
  parameter that has a default value.
* Keep per-run state in ``run.state`` (see :meth:`loopwarden.Plugin.state`), never on the
  plugin object: one plugin object serves many concurrent runs.
* Hooks are synchronous.  Do not block: read ``run.clock`` for time.
* An exception in a hook fails closed: the run stops with ``plugin_error`` naming the plugin.
* Treat payloads as read-only, except where a hook documents a field you may set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from loopwarden.events import ModelRequest, ModelResponse, ToolCall, ToolResult
    from loopwarden.run import Run, RunOutcome
    from loopwarden.verdicts import Verdict

PROJECT = "loopwarden"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

HOOK_NAMES = (
    "on_start",
    "before_model",
    "after_response",
    "before_tool",
    "after_tool",
    "on_stop",
)

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
def after_response(run: Run, response: ModelResponse) -> Verdict | None:
    """Called after every model response, before its tool calls run.

    ``run.step`` and ``run.usage`` already include this response; ``run.cost`` does for
    plugins placed after ``cost_budget`` (which prices it here).  Usage accounting,
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
        ``step`` and ``index``.  You may lower ``call.timeout`` (seconds) and raise
        ``call.delay_s`` (a backoff the loop waits, on the run's clock, before executing).
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
