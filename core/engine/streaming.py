"""Streamed runs: :meth:`Deployment.stream() <loopwarden.Deployment.stream>` and
:meth:`~loopwarden.Deployment.astream` yield typed events while a run goes on.

::

    for event in dep.stream(scenario="refund"):
        if isinstance(event, TextDelta):
            print(event.text, end="", flush=True)
        elif isinstance(event, RunEnd):
            print(event.record["termination"])

The events: :class:`TextDelta` (a piece of the model's answer, as it arrives),
:class:`ToolCallProposed`, :class:`ToolCallExecuted`, :class:`ToolCallSkipped` (by a skip
verdict, answered by the side-effect ledger, or refused as invalid), :class:`VerdictIssued`
(every verdict, as the run record lists them), :class:`ResponseCut` (a guard cut the answer
mid-stream) and, always last, :class:`RunEnd` with the outcome and the run record -- also when
a guard stopped the run mid-stream.  A consumer that stops iterating (``close()``,
``aclose()``, a ``break``) ends the run as ``cancelled``, with its record.

**Models.**  A model streams when it has ``stream(request)`` (and ``astream`` for async
runs): an iterator of text deltas (``str``) ending with the whole
:class:`~loopwarden.ModelResponse` -- the same one ``complete()`` would return.  Closing the
iterator abandons the call (the HTTP connection is closed: the rest is not paid for).  The
OpenAI-compatible client and the scripted model stream; any other model is called as usual
and its answer arrives as one delta.

**Guards mid-stream.**  Each delta is checked before the next is read:

* past ``request.max_output_tokens`` (estimated over the text so far) the answer is cut --
  ``finish_reason = "length"``, as a server that honours the cap would end it -- and goes on
  to ``after_response`` as it stands (its tool calls dropped: they were not complete);
* past the time the call was given (``request.timeout``, from the ``timeout`` plugin) or on
  the run's cancellation the call fails as an unstreamed call would at that moment (the run
  ends ``timeout`` / ``cancelled``);
* the optional ``on_model_delta`` hook sees every delta: a stop verdict cuts the answer there
  and is honoured after ``after_response`` has seen the answer so far (``no_progress``
  stops an answer that repeats one sentence again and again).

``after_response`` always sees one whole response (the cut one, when it was cut); the five
run hooks keep their contracts, and an unstreamed run calls nothing of this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopwarden import signals
from loopwarden.clock import DEADLINE_SLACK_S, await_in_task, await_within
from loopwarden.engine import execution
from loopwarden.engine.drivers import (
    _Done,
    _nothing,
    _step,
    _Stepper,
    _watch,
    abandon,
    atool_runner,
    internal_error,
    tool_runner,
)
from loopwarden.engine.effects import CallModel, Effect, Failed
from loopwarden.engine.guards import CORE
from loopwarden.engine.outcomes import best_effort
from loopwarden.engine.streamevents import (
    ResponseCut,
    RunEnd,
    StreamEvent,
    TextDelta,
    ToolCallExecuted,
    ToolCallProposed,
    ToolCallSkipped,
    VerdictIssued,
)
from loopwarden.events import ModelDelta, ModelRequest, ModelResponse, ToolCall, ToolResult, Usage
from loopwarden.exceptions import ModelError
from loopwarden.run import Run, RunOutcome
from loopwarden.verdicts import Stop, Verdict

if TYPE_CHECKING:
    from loopwarden.engine.loop import Engine

__all__ = [
    "CutResponse",
    "ModelDelta",
    "ResponseCut",
    "RunEnd",
    "StreamEvent",
    "TextDelta",
    "ToolCallExecuted",
    "ToolCallProposed",
    "ToolCallSkipped",
    "VerdictIssued",
    "astream_drive",
    "stream_drive",
]


# -- what plugins and the machine see ---------------------------------------------------------


@dataclass(slots=True)
class CutResponse(ModelResponse):
    """A streamed answer cut before its end: the text so far, no tool calls, estimated usage.

    ``cut`` says why (``max_output_tokens`` or ``verdict``); ``cut_by`` is the
    ``on_model_delta`` stop the machine honours after ``after_response``."""

    cut: str = ""
    cut_by: Stop | None = None


# -- the mid-stream guard ----------------------------------------------------------------------


class _Guard:
    """Checks each delta of one model call: cancellation, the call's time, the plugins'
    ``on_model_delta``, the output cap.  Constant work per delta (the token estimate is
    summed piece by piece)."""

    def __init__(self, engine: Engine, run: Run, model: Any, request: ModelRequest) -> None:
        self.engine, self.run, self.request = engine, run, request
        self.model_name = getattr(model, "name", None)
        self.hook = engine.hooks.implements("on_model_delta")
        self.parts: list[str] = []
        self.tokens = 0
        timeout = request.timeout
        self.deadline = None if timeout is None else run.clock.now() + timeout
        self.cap = request.max_output_tokens
        self.cut: ResponseCut | None = None

    def feed(self, text: str) -> CutResponse | Failed | None:
        """Take one delta; the value to answer the call with when the stream ends here."""
        run, request = self.run, self.request
        self.parts.append(text)
        self.tokens += run.estimator(text)
        step = run.step + 1
        if run.cancel.is_set():
            self.cut = ResponseCut(step, "cancelled", self.tokens)
            return Failed(
                ModelError("the run was cancelled during the model call", kind="cancelled")
            )
        if self.deadline is not None and run.clock.now() >= self.deadline:
            self.cut = ResponseCut(step, "timeout", self.tokens)
            return Failed(
                ModelError(
                    f"the model did not finish within {request.timeout:.3f}s: its stream was "
                    "cut there",
                    kind="timeout",
                )
            )
        if self.hook:
            engine = self.engine
            delta = ModelDelta(text, len(self.parts) - 1, self.tokens, self.parts)
            res = engine.hooks.on_model_delta(run, request, delta)
            if res.verdicts:
                res = engine.guards.note(run, "on_model_delta", res)
            if res.stop is not None:
                self.cut = ResponseCut(step, "verdict", self.tokens, res.stop.plugin)
                return self._response("verdict", "stop", res.stop)
        if self.cap is not None and self.tokens > self.cap:
            self.cut = ResponseCut(step, "max_output_tokens", self.tokens)
            return self._response("max_output_tokens", "length", None)
        return None

    def _response(self, cut: str, finish: str, stop: Stop | None) -> CutResponse:
        return CutResponse(
            content="".join(self.parts),
            usage=Usage(prompt=self.request.estimated_tokens, completion=max(self.tokens, 1)),
            finish_reason=finish,
            model=self.model_name if isinstance(self.model_name, str) else None,
            cut=cut,
            cut_by=stop,
        )


def _no_end() -> Failed:
    return Failed(ModelError("the model's stream ended without its response", kind="malformed"))


def _open(model: Any, request: ModelRequest) -> Iterator[Any]:
    """The model's stream, or its whole answer as one delta when it does not stream."""
    stream = getattr(model, "stream", None)
    if stream is not None:
        it: Iterator[Any] = iter(stream(request))
        return it
    return _whole(model.complete(request))


def _whole(response: Any) -> Iterator[Any]:
    content = getattr(response, "content", None)
    if isinstance(content, str) and content:
        yield content
    yield response


# -- events from the machine's signals ---------------------------------------------------------


class _Collector:
    """Turns the run's signals into events (blinker receivers for this run only)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.events: list[StreamEvent] = []
        self.executing: ToolCall | None = None  # the call the driver is running
        self._connected: list[tuple[Any, Callable[..., None]]] = [
            (signals.model_responded, self._responded),
            (signals.guard_triggered, self._verdict),
            (signals.tool_finished, self._tool),
        ]
        for signal, receiver in self._connected:
            signal.connect(receiver, sender=run, weak=False)

    def close(self) -> None:
        for signal, receiver in self._connected:
            signal.disconnect(receiver, sender=self.run)
        self._connected = []

    def take(self) -> list[StreamEvent]:
        out, self.events = self.events, []
        return out

    def _responded(self, run: Run, response: ModelResponse, **_: Any) -> None:
        self.events.extend(ToolCallProposed(run.step, c) for c in response.calls)

    def _verdict(
        self, run: Run, verdict: Verdict, hook: str, step: int, shadow: bool = False, **_: Any
    ) -> None:
        self.events.append(VerdictIssued(step, hook, verdict, shadow))

    def _tool(self, run: Run, call: ToolCall, result: ToolResult, **_: Any) -> None:
        if call is self.executing:
            self.events.append(ToolCallExecuted(run.step, call, result))
            return
        if result.skipped and result.skipped_by != CORE:
            event = ToolCallSkipped(run.step, call, result, "verdict", result.skipped_by or "")
        elif result.skipped:
            event = ToolCallSkipped(run.step, call, result, "ledger", CORE)
        else:
            event = ToolCallSkipped(run.step, call, result, "invalid", CORE)
        self.events.append(event)


def _consumer_left(engine: Engine, run: Run) -> RunOutcome:
    return RunOutcome(
        termination="cancelled",
        evidence={"reason": "the stream's consumer stopped reading"},
        final_answer=best_effort(engine.settings, run),
    )


def _end(run: Run) -> RunEnd:
    outcome = run.outcome
    assert outcome is not None
    return RunEnd(run, outcome, run.record())


# -- the sync driver ---------------------------------------------------------------------------


def stream_drive(engine: Engine, run: Run, model: Any) -> Iterator[StreamEvent]:
    """Run the machine synchronously, yielding events; the last is :class:`RunEnd`."""
    seen = _Collector(run)
    gen = engine.machine(run)
    run_tool = tool_runner(engine)
    unwatch = _nothing
    try:
        try:
            eff: Effect = next(gen)
            yield from seen.take()
            unwatch = _watch(engine, run)
            while run.outcome is None:  # else the watchdog ended the run meanwhile
                if isinstance(eff, CallModel):
                    value = yield from _call_model(engine, run, model, eff.request, seen)
                else:
                    seen.executing = eff.call
                    value = run_tool(eff, run)
                eff = gen.send(value)
                yield from seen.take()
            abandon(gen, eff)  # the watchdog ended the run: eff was never started
        except StopIteration as done:
            engine.finish(run, done.value)
        except GeneratorExit:  # the consumer left: eff (a call yielded at most) never started
            abandon(gen, eff)
            if run.outcome is None:
                engine.finish(run, _consumer_left(engine, run))
            raise
        except BaseException as exc:
            if run.outcome is None:
                engine.finish(run, internal_error(engine, run, exc))
            raise
        finally:
            unwatch()
        yield from seen.take()
    finally:
        seen.close()
    yield _end(run)


def _call_model(
    engine: Engine, run: Run, model: Any, request: ModelRequest, seen: _Collector
) -> Generator[StreamEvent, None, Any]:
    """One model call, streamed: yields its text deltas; returns what answers the effect."""
    guard = _Guard(engine, run, model, request)
    try:
        it = _open(model, request)
    except Exception as exc:
        return Failed(exc)
    try:
        while True:
            try:
                item = next(it)
            except StopIteration:
                return _no_end()
            except Exception as exc:
                return Failed(exc)
            if not isinstance(item, str):
                return item  # the whole response (the machine checks it)
            if not item:
                continue
            yield TextDelta(run.step + 1, item)
            answer = guard.feed(item)
            yield from seen.take()
            if answer is not None:
                if guard.cut is not None:
                    yield guard.cut
                return answer
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


# -- the async driver --------------------------------------------------------------------------


async def astream_drive(engine: Engine, run: Run, model: Any) -> AsyncIterator[StreamEvent]:
    """Run the machine on the event loop, yielding events; the last is :class:`RunEnd`.

    Like :func:`loopwarden.engine.loop.adrive`: a run whose hooks may block on I/O advances its
    machine in a worker thread."""
    seen = _Collector(run)
    gen = engine.machine(run)
    run_tool_async = atool_runner(engine)
    stepper = _Stepper(engine, run, gen)
    inline = stepper.context is None
    unwatch = _nothing
    try:
        try:
            eff = _step(gen, None) if inline else await stepper.step(None)
            for event in seen.take():
                yield event
            unwatch = _watch(engine, run)
            while not isinstance(eff, _Done) and run.outcome is None:
                stepper.parked = None  # started now: a cancel from here on hits it in flight
                if isinstance(eff, CallModel):
                    value: Any = None
                    async with contextlib.aclosing(
                        _acall_model(engine, run, model, eff.request, seen)
                    ) as calls:
                        async for piece, answer in calls:
                            if piece is not None:
                                yield piece
                            else:
                                value = answer
                else:
                    seen.executing = eff.call
                    value = await run_tool_async(eff, run)
                eff = _step(gen, value) if inline else await stepper.step(value)
                for event in seen.take():
                    yield event
            if isinstance(eff, _Done):
                if inline:
                    engine.finish(run, eff.outcome)
                else:
                    await stepper.finish(eff.outcome)
            elif inline:  # the watchdog ended the run: eff was never started
                abandon(gen, eff)
            else:
                await stepper.call(abandon, gen, eff)
        except GeneratorExit:  # aclose(): the consumer left between two events
            await stepper.abandon()  # a call yielded but never started: its claim released
            if run.outcome is None:
                await stepper.finish(_consumer_left(engine, run))
            raise
        except BaseException as exc:
            await stepper.settle()
            await stepper.abandon()
            if run.outcome is None:
                await stepper.finish(internal_error(engine, run, exc))
            raise
        finally:
            unwatch()
        for event in seen.take():
            yield event
    finally:
        seen.close()
    yield _end(run)


async def _anext_within(it: AsyncIterator[Any], run: Run, deadline: float, in_task: bool) -> Any:
    """The stream's next item, within the call's time (a watchdog for any async model; in
    the caller's task when the model's stream ends when cancelled, see :func:`_aopen`)."""
    left = max(0.0, deadline - run.clock.now() + DEADLINE_SLACK_S)
    if in_task:
        ending, value = await await_in_task(it.__anext__(), left, run.cancel)
    else:
        ending, value = await await_within(it.__anext__(), left, run.cancel)
    if ending == "ok":
        return value
    if ending == "cancelled":
        raise ModelError("the run was cancelled during the model call", kind="cancelled")
    raise ModelError("the model did not answer within the time it was given", kind="timeout")


def _aopen(model: Any, request: ModelRequest) -> AsyncGenerator[Any, None]:
    """The model's async stream (itself: no generator in between when it can be closed), or
    its whole answer as one delta."""
    astream = getattr(model, "astream", None)
    if astream is not None:
        items = astream(request)
        if hasattr(items, "aclose") and hasattr(items, "__anext__"):
            return items  # type: ignore[no-any-return]
        return _aclosing(items)
    return _acomplete(model, request)


async def _aclosing(items: Any) -> AsyncGenerator[Any, None]:
    async with contextlib.aclosing(items):
        async for item in items:
            yield item


async def _acomplete(model: Any, request: ModelRequest) -> AsyncGenerator[Any, None]:
    """An async model that does not stream: its whole answer as one delta."""
    acomplete = getattr(model, "acomplete", None)
    if acomplete is not None:
        response = await acomplete(request)
    else:  # a sync model: a daemon worker, as the unstreamed driver does
        response = await execution.daemon_thread(model.complete, request, name="model")
    for item in _whole(response):
        yield item


async def _acall_model(
    engine: Engine, run: Run, model: Any, request: ModelRequest, seen: _Collector
) -> AsyncGenerator[tuple[StreamEvent | None, Any], None]:
    """One model call, streamed: ``(event, None)`` pairs, then ``(None, answer)``."""
    guard = _Guard(engine, run, model, request)
    try:
        it = _aopen(model, request)
    except Exception as exc:  # an ``astream`` that fails before its first item
        yield None, Failed(exc)
        return
    deadline = guard.deadline
    in_task = getattr(model, "ends_when_cancelled", False) is True
    try:
        while True:
            try:
                if deadline is None:
                    item = await it.__anext__()
                else:
                    item = await _anext_within(it, run, deadline, in_task)
            except StopAsyncIteration:
                yield None, _no_end()
                return
            except Exception as exc:
                yield None, Failed(exc)
                return
            if not isinstance(item, str):
                yield None, item
                return
            if not item:
                continue
            yield TextDelta(run.step + 1, item), None
            answer = guard.feed(item)
            for event in seen.take():
                yield event, None
            if answer is not None:
                if guard.cut is not None:
                    yield guard.cut, None
                yield None, answer
                return
    finally:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await it.aclose()
