"""await_within: the race between work, its deadline and the run's cancel token -- how each
ends, and how soon the waiter wakes (in event-loop passes: deterministic, no clock)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from loopwarden import clock as _deadline
from loopwarden.clock import CancelToken, await_within
from loopwarden.engine import execution
from tests.support.event_loop import LoopPasses, stubborn


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Abandoned work gets 0.01 s, not 0.5 s, to wind down (keeps the suite quick)."""
    monkeypatch.setattr(_deadline, "CANCEL_GRACE_S", 0.01)


async def _instant(value: int) -> int:
    return value


def test_work_that_ends_at_once_wakes_the_waiter_within_two_loop_passes() -> None:
    # The work's own task settles the race: it runs in pass 1, the waiter resumes in pass 2.
    # Through asyncio.wait (before 0.5) a third pass relayed the task's end to the waiter.
    async def main() -> tuple[object, int]:
        passes = LoopPasses()
        passes.start()
        result = await await_within(_instant(7), 60.0, CancelToken())
        return result, passes.stop()

    result, count = asyncio.run(main())
    assert result == ("ok", 7)
    assert count <= 2


def test_a_worker_threads_future_wakes_the_waiter_one_pass_after_its_result() -> None:
    async def main() -> tuple[object, int]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        passes = LoopPasses()
        passes.start()
        loop.call_soon(future.set_result, 3)  # as daemon_thread's delivery does
        result = await await_within(future, 60.0, CancelToken())
        return result, passes.stop()

    result, count = asyncio.run(main())
    assert result == ("ok", 3)
    assert count <= 2


def test_the_deadline_abandons_work_that_swallows_its_cancellation() -> None:
    seen: list[str] = []

    async def main() -> tuple[object, list[str]]:
        ending = await await_within(stubborn(seen), 0.01, CancelToken())
        return ending, list(seen)

    ending, at_return = asyncio.run(main())
    assert ending == ("timeout", None)
    # cancelled (at the deadline, again after the grace) and still going: abandoned
    assert "cancelled" in at_return and "finished" not in at_return


def test_the_cancel_token_ends_the_wait_from_another_thread() -> None:
    token = CancelToken()

    async def main() -> object:
        never = asyncio.get_running_loop().create_future()
        threading.Timer(0.01, token.cancel).start()
        return await await_within(never, None, token)

    assert asyncio.run(main()) == ("cancelled", None)


def test_a_token_cancelled_before_the_call_ends_it_without_a_result() -> None:
    token = CancelToken()
    token.cancel()

    async def main() -> object:
        never = asyncio.get_running_loop().create_future()
        return await await_within(never, None, token)

    assert asyncio.run(main()) == ("cancelled", None)


def test_the_works_exception_is_raised_to_the_waiter() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(await_within(fails(), 60.0, CancelToken()))


def test_work_that_cancels_itself_raises_cancelled_error() -> None:
    async def gives_up() -> None:
        raise asyncio.CancelledError

    async def main() -> None:
        await await_within(gives_up(), 60.0, CancelToken())

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_cancelling_the_waiter_cancels_the_work() -> None:
    seen: list[str] = []

    async def main() -> None:
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                seen.append("work cancelled")
                raise

        waiter = asyncio.ensure_future(await_within(work(), 60.0, CancelToken()))
        await started.wait()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)

    asyncio.run(main())
    assert seen == ["work cancelled"]


def test_a_tool_threads_late_result_is_discarded_and_its_thread_not_reused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    names: list[str] = []

    def slow() -> str:
        names.append(threading.current_thread().name)
        release.wait(5)
        return "late"

    async def main() -> tuple[object, bool]:
        future = execution.daemon_thread(slow, name="slow")
        result = await await_within(future, 0.01, CancelToken())
        release.set()
        await asyncio.sleep(0.05)
        return result, future.cancelled()

    with caplog.at_level(logging.ERROR):
        result, cancelled = asyncio.run(main())
    assert result == ("timeout", None)
    assert cancelled  # the worker sees it abandoned: it ends instead of taking the next call
    assert names == ["loopwarden-tool-slow"]
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_work_failing_after_its_deadline_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def fails_late() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            raise RuntimeError("failed while cancelled") from None

    async def main() -> object:
        return await await_within(fails_late(), 0.01, CancelToken())

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(main()) == ("timeout", None)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
