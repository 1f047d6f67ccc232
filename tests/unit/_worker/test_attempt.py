"""Which cancellations belong to an attempt, on real asyncio tasks: the worker's one cancel
of an attempt is spent where it lands; a teardown still ends the task; any other
CancelledError is the task's own failure, never a reason to drop the attempt."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

import pytest

from pgq._core.hooks import Hooks, JobEvent
from pgq._worker.attempt import CANCEL, SHUTDOWN, Execution
from pgq.job import Job, JobState

T = TypeVar("T")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def execution() -> Execution:
    return Execution(Job(1, "default", "t", {}, JobState.RUNNING))


async def caught_in(ex: Execution, fut: asyncio.Future[None], seen: list[str]) -> str:
    """Await ``fut`` as an attempt would, and do what the verdict says."""
    try:
        await fut
    except asyncio.CancelledError:
        verdict = ex.judge_cancel()
        seen.append(verdict)
        if verdict == "raise":
            raise
        return "went on" if verdict == "spent" else "failed"
    return "finished"


async def started(ex: Execution, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    task = asyncio.get_running_loop().create_task(coro)
    ex.task, ex.started = cast("asyncio.Task[None]", task), True
    await asyncio.sleep(0)  # it runs up to its await
    return task


def future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


async def test_the_attempts_own_cancel_is_spent_once() -> None:
    ex, seen = execution(), list[str]()
    task = await started(ex, caught_in(ex, future(), seen))
    ex.cancel(CANCEL)
    assert await task == "went on" and seen == ["spent"]
    assert task.cancelling() == 0  # nothing left to reach later awaits

    # Another cancellation of a task whose attempt's cancel was spent is not the worker's.
    fut = future()
    task2 = await started(ex, caught_in(ex, fut, seen))
    task2.cancel()
    assert await task2 == "failed" and seen == ["spent", "stray"]


@pytest.mark.parametrize("order", ["stop first", "teardown first"])
async def test_a_teardown_in_the_same_tick_as_the_attempts_cancel_ends_the_task(
    order: str,
) -> None:
    ex, seen = execution(), list[str]()
    task = await started(ex, caught_in(ex, future(), seen))
    if order == "stop first":
        ex.cancel(SHUTDOWN)
        ex.tear_down()
    else:
        ex.tear_down()
        ex.cancel(SHUTDOWN)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["raise"]


async def test_a_task_that_once_caught_its_own_cancellation_is_still_stopped() -> None:
    """A body that cancelled itself and caught it (an old-style timeout) leaves the task's
    cancellation count above zero: the worker's cancel is still the attempt's."""
    ex, seen = execution(), list[str]()

    async def body() -> str:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        # a timeout of its own, handled; no uncancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1)
        return await caught_in(ex, future(), seen)

    task = await started(ex, body())
    await asyncio.sleep(0)
    assert task.cancelling() == 1
    ex.cancel(CANCEL)
    assert await task == "went on" and seen == ["spent"]


@pytest.mark.parametrize("how", ["a future cancelled by someone else", "the task itself"])
async def test_a_cancellation_the_worker_did_not_ask_for_is_the_tasks_own_failure(
    how: str,
) -> None:
    ex, seen = execution(), list[str]()
    fut = future()
    task = await started(ex, caught_in(ex, fut, seen))
    if how == "the task itself":
        task.cancel()  # as asyncio.current_task().cancel() in the body would
    else:
        fut.cancel()
    assert await task == "failed" and seen == ["stray"]


async def test_hooks_after_the_one_the_attempts_cancel_landed_in_still_run() -> None:
    ex, calls = execution(), list[str]()
    blocker = future()

    async def slow(event: JobEvent) -> None:
        calls.append("slow")
        await blocker

    def stray(event: JobEvent) -> None:
        calls.append("stray")
        raise asyncio.CancelledError  # the worker's? no: a failing hook like any other

    def after(event: JobEvent) -> None:
        calls.append("after")

    hooks = Hooks()
    hooks.handlers["job_finished"] = [slow, stray, after]
    event = JobEvent("job_finished", ex.ctx.job, JobState.COMPLETED)
    task = await started(ex, hooks.emit(event, ex.judge_cancel))
    ex.cancel(CANCEL)
    await task
    assert calls == ["slow", "stray", "after"]

    # A teardown that lands in a hook ends the emit.
    calls.clear()
    blocker = future()
    torn = execution()
    task = await started(torn, hooks.emit(event, torn.judge_cancel))
    torn.tear_down()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == ["slow"]

    # Without an attempt (the leader's events), a cancellation ends the emit.
    calls.clear()
    blocker = future()
    other = await started(execution(), hooks.emit(event))
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    assert calls == ["slow"]
