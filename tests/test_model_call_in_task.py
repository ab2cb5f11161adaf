"""The built-in client's async calls are bounded in the caller's own task (issue 23): no task
and no event-loop pass per model call, the same endings as the task-based deadline.

Mechanism tests, no timing: which task the request runs in, how many loop passes a wait
takes (tests/support/event_loop.py), what a deadline or a cancel token answers.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.event_loop import LoopPasses, stubborn
from support.openai_stream import push_stream
from support.openai_stub import Stub, completion

from loopwarden import Deployment, ModelRequest, ModelResponse
from loopwarden.clock import CancelToken, await_in_task
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.streaming import RunEnd
from loopwarden.models.openai_chat import OpenAIChatModel

needs_uncancel = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 falls back to the task-based deadline"
)


class _Probe(OpenAIChatModel):
    """Records the task each request (with its retries) runs in."""

    tasks: list[asyncio.Task[Any] | None]

    async def _acall(self, *args: Any, **kw: Any) -> Any:
        self.tasks.append(asyncio.current_task())
        return await super()._acall(*args, **kw)


def _probe(url: str) -> _Probe:
    m = _Probe(model="stub-model", api_key="sk-test-key-0123456789", base_url=url, max_retries=0)
    m.tasks = []
    return m


def _ask() -> ModelRequest:
    return ModelRequest(messages=[{"role": "user", "content": "hi"}], tools=[])


@needs_uncancel
def test_an_async_call_runs_in_the_caller_s_task(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.push(completion("one"))
    state.push(completion("two"))
    m = _probe(url)

    async def main() -> list[bool]:
        me = asyncio.current_task()
        await m.acomplete(_ask())
        items = [item async for item in m.astream(_ask())]
        assert items[-1].content == "two"  # type: ignore[union-attr]
        return [t is me for t in m.tasks]

    assert asyncio.run(main()) == [True, True]  # unstreamed and streamed


@needs_uncancel
def test_an_instant_wait_takes_no_loop_pass() -> None:
    async def instant() -> str:
        return "v"

    async def main() -> tuple[Any, int]:
        passes = LoopPasses()
        passes.start()
        out = await await_in_task(instant(), 5.0, CancelToken())
        return out, passes.stop()

    assert asyncio.run(main()) == (("ok", "v"), 0)


@needs_uncancel
def test_the_deadline_ends_the_wait_and_leaves_the_caller_uncancelled() -> None:
    async def main() -> tuple[Any, int, str]:
        out = await await_in_task(asyncio.Event().wait(), 0.0)
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)  # no cancellation left pending for the caller
        return out, task.cancelling(), "went on"

    assert asyncio.run(main()) == (("timeout", None), 0, "went on")


@needs_uncancel
def test_a_cancel_from_another_thread_ends_the_wait() -> None:
    cancel = CancelToken()

    async def main() -> Any:
        loop_ready = asyncio.Event()
        asyncio.get_running_loop().call_soon(loop_ready.set)
        await loop_ready.wait()
        threading.Thread(target=cancel.cancel).start()
        return await await_in_task(asyncio.Event().wait(), None, cancel)

    assert asyncio.run(main()) == ("cancelled", None)


@needs_uncancel
def test_a_token_cancelled_before_the_call_ends_it_cancelled() -> None:
    cancel = CancelToken()
    cancel.cancel()
    out = asyncio.run(await_in_task(asyncio.Event().wait(), 60.0, cancel))
    assert out == ("cancelled", None)


@needs_uncancel
def test_the_caller_s_own_cancellation_propagates() -> None:
    async def main() -> str:
        inner = asyncio.ensure_future(await_in_task(asyncio.Event().wait(), 60.0, CancelToken()))
        await asyncio.sleep(0)
        inner.cancel()
        try:
            await inner
        except asyncio.CancelledError:
            return "propagated"
        return "swallowed"

    assert asyncio.run(main()) == "propagated"


@needs_uncancel
def test_the_work_s_error_is_raised() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(await_in_task(failing(), 60.0))


@needs_uncancel
def test_work_that_swallows_the_cancellation_still_answers_the_deadline() -> None:
    """Work that catches the cancellation and returns: the deadline's ending, and the
    cancellation taken back (the caller goes on)."""

    async def swallowing() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "late value"
        return "never"

    async def main() -> tuple[Any, int]:
        out = await await_in_task(swallowing(), 0.0)
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return out, task.cancelling()

    assert asyncio.run(main()) == (("timeout", None), 0)


class _StreamProbe(OpenAIChatModel):
    """Records the task that reads each piece of its stream."""

    tasks: list[asyncio.Task[Any] | None]

    async def astream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        async for item in super().astream(request):
            self.tasks.append(asyncio.current_task())
            yield item


@needs_uncancel
def test_a_streamed_run_with_a_time_limit_reads_every_delta_in_its_own_task(
    stub: tuple[Stub, str],
) -> None:
    """With ``[plugins.timeout]`` each delta is awaited within the call's time: for the
    built-in client (``ends_when_cancelled``) in the run's task, not in a task per delta."""
    state, url = stub
    push_stream(state, "Order 88231 was signed for on 2026-06-22.", None, None)
    m = _StreamProbe(model="stub-model", api_key="sk-test", base_url=url, max_retries=0)
    m.tasks = []
    cfg = parse_config({"plugins": {"enabled": ["max_steps", "timeout"]}})
    dep = Deployment(cfg, model=m, tools=shop_tools())

    async def main() -> tuple[list[bool], str]:
        me = asyncio.current_task()
        events = [e async for e in dep.astream("where is 88231?")]
        end = events[-1]
        assert isinstance(end, RunEnd)
        return [t is me for t in m.tasks], end.record["termination"]

    same, termination = asyncio.run(main())
    assert termination == "final_answer" and len(same) > 3 and all(same)


class _StubbornStream:
    """An async stream that gives one piece, then swallows every cancellation for ~2 s (a
    model without ``ends_when_cancelled``: the driver must not wait for it)."""

    name = "stubborn"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("streamed runs call astream")

    async def astream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        yield "one piece "
        await stubborn(self.seen, passes=1000)
        yield ModelResponse(content="too late")


def test_a_stream_that_swallows_its_cancellation_is_still_abandoned_at_the_deadline() -> None:
    model = _StubbornStream()
    cfg = parse_config(
        {"plugins": {"enabled": ["timeout"], "timeout": {"max_seconds": 0.2, "grace_s": 0}}}
    )
    dep = Deployment(cfg, model=model, tools=shop_tools())

    async def main() -> tuple[str, list[str]]:
        events = [e async for e in dep.astream("hi")]
        end = events[-1]
        assert isinstance(end, RunEnd)
        return end.record["termination"], list(model.seen)  # as the run ended

    termination, seen_then = asyncio.run(main())
    assert termination == "timeout"
    assert "cancelled" in seen_then and "finished" not in seen_then  # abandoned, not awaited


@needs_uncancel
def test_a_run_with_a_time_limit_calls_the_built_in_client_in_the_run_s_task(
    stub: tuple[Stub, str],
) -> None:
    """With ``[plugins.timeout]`` the driver bounds each model call too: for the built-in
    client (``ends_when_cancelled``) in the run's task, not in a task of its own."""
    state, url = stub
    state.push(completion("Order 88231 was signed for."))
    m = _probe(url)
    cfg = parse_config({"plugins": {"enabled": ["max_steps", "timeout"]}})
    dep = Deployment(cfg, model=m, tools=shop_tools())

    async def main() -> tuple[list[bool], str]:
        me = asyncio.current_task()
        run = await dep.arun("where is 88231?")
        return [t is me for t in m.tasks], run.record()["termination"]

    assert asyncio.run(main()) == ([True], "final_answer")
