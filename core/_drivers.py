"""The drivers: run the step machine to its end, executing its effects.

:func:`drive` (sync) and :func:`adrive` (async) call the model for a ``CallModel`` effect and
execute a ``RunTool`` through :mod:`loopwarden.execution`; the replay driver
(:mod:`loopwarden.replay`) and the framework adapters answer the same effects from a recording
or a framework's own loop.  Each arms the watchdog that ends a run still going past its
deadline, and finishes the run whatever happens.  Public through :mod:`loopwarden.loop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loopwarden import execution
from loopwarden._deadline import DEADLINE_SLACK_S, WATCHDOG, await_within
from loopwarden._effects import CallModel, Effect, Failed
from loopwarden._outcomes import best_effort
from loopwarden.events import ModelRequest
from loopwarden.exceptions import ModelError
from loopwarden.run import Run, RunOutcome

if TYPE_CHECKING:
    from loopwarden.loop import Engine
    from loopwarden.models import Model

__all__ = ["adrive", "drive"]

log = logging.getLogger("loopwarden.loop")

WATCHDOG_SLACK_S = 1.0  # how long past its deadline a run may go before the watchdog ends it


def drive(engine: Engine, run: Run, model: Model) -> RunOutcome:
    """Run the machine synchronously: call the model and the tools, finish the run."""
    gen = engine.machine(run)
    run_tool = engine.run_tool_sync  # an Engine subclass may wrap tool execution
    unwatch = _nothing
    try:
        eff: Effect = next(gen)
        unwatch = _watch(engine, run)
        while True:
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                gen.close()
                return run.outcome
            if isinstance(eff, CallModel):
                try:
                    value: Any = model.complete(eff.request)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = run_tool(eff, run)
            eff = gen.send(value)
    except StopIteration as done:
        return engine.finish(run, done.value)
    except BaseException as exc:
        if run.outcome is None:
            engine.finish(run, internal_error(engine, run, exc))
        raise
    finally:
        unwatch()


async def adrive(engine: Engine, run: Run, model: Model) -> RunOutcome:
    """Run the machine asynchronously (models with ``acomplete`` are awaited)."""
    gen = engine.machine(run)
    run_tool_async = engine.run_tool_async  # an Engine subclass may wrap tool execution
    acomplete = getattr(model, "acomplete", None)
    unwatch = _nothing
    try:
        eff: Effect = next(gen)
        unwatch = _watch(engine, run)
        while True:
            if run.outcome is not None:  # the watchdog ended the run meanwhile
                gen.close()
                return run.outcome
            if isinstance(eff, CallModel):
                try:
                    if acomplete is not None:
                        aw: Awaitable[Any] = acomplete(eff.request)
                    else:
                        # a sync model in an async run: a daemon worker, so that a hung call
                        # never keeps asyncio.run() from exiting
                        aw = execution.daemon_thread(model.complete, eff.request, name="model")
                    value = await _model_within(aw, eff.request, run)
                except Exception as exc:
                    value = Failed(exc)
            else:
                value = await run_tool_async(eff, run)
            eff = gen.send(value)
    except StopIteration as done:
        return engine.finish(run, done.value)
    except BaseException as exc:
        if run.outcome is None:
            engine.finish(run, internal_error(engine, run, exc))
        raise
    finally:
        unwatch()


def internal_error(engine: Engine, run: Run, exc: BaseException) -> RunOutcome:
    """The outcome of a run the machine itself failed in (or that was interrupted)."""
    kind = "cancelled" if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else "error"
    text = engine.redact(run, f"{type(exc).__name__}: {execution.safe_str(exc)}")
    return RunOutcome(termination=kind, evidence={"error": text}, error=text)


async def _model_within(aw: Awaitable[Any], request: ModelRequest, run: Run) -> Any:
    """Await a model call, abandoning it when ``request.timeout`` passes or the run is
    cancelled (a watchdog for any async model, the built-in client bounds itself too).
    The value is whatever the model returned: the machine checks it."""
    if request.timeout is None:
        return await aw
    ending, value = await await_within(aw, request.timeout + DEADLINE_SLACK_S, run.cancel)
    if ending == "ok":
        return value
    if ending == "cancelled":
        raise ModelError("the run was cancelled during the model call", kind="cancelled")
    raise ModelError(f"the model did not answer within {request.timeout:.3f}s", kind="timeout")


def _watch(engine: Engine, run: Run) -> Callable[[], None]:
    """Have the watchdog end ``run`` shortly after ``run.deadline`` unless it ended itself."""
    if run.deadline is None:
        return _nothing
    seconds = max(0.0, run.deadline - run.clock.now()) + WATCHDOG_SLACK_S

    def fire() -> None:
        if run.outcome is None:
            log.error(
                "run %s passed its deadline by %.1fs without reaching a check (a hook, "
                "tool or model call blocks): the watchdog ends it",
                run.run_id,
                WATCHDOG_SLACK_S,
            )
            engine.finish(
                run,
                RunOutcome(
                    termination="timeout",
                    evidence={
                        "watchdog": True,
                        "elapsed_s": round(run.elapsed, 3),
                        "deadline_s": round(run.deadline - run.started_at, 3)
                        if run.deadline is not None
                        else None,
                    },
                    final_answer=best_effort(engine.settings, run),
                ),
            )

    return WATCHDOG.watch(seconds, fire)


def _nothing() -> None:
    pass
