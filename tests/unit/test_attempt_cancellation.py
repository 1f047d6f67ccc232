"""Which cancellations belong to an attempt, on real asyncio tasks: the worker's one cancel
of an attempt is spent where it lands, and any other still ends the task."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

import pytest

from pgq._hooks import Hooks, JobEvent
from pgq._worker.executor import CANCEL, SHUTDOWN, Execution, cancel_spent, cancels_nothing
from pgq.job import Job, JobState

T = TypeVar("T")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def execution() -> Execution:
    return Execution(Job(1, "default", "t", {}, JobState.RUNNING))


async def caught_in(ex: Execution, fut: asyncio.Future[None], seen: list[str]) -> str:
    """Await ``fut`` as an attempt would; say how a cancellation was judged."""
    try:
        await fut
    except asyncio.CancelledError:
        if cancel_spent(ex):
            seen.append("spent")
            return "went on"
        seen.append("not spent" if not cancels_nothing() else "cancels nothing")
        raise
    return "finished"


async def started(ex: Execution, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    task = asyncio.get_running_loop().create_task(coro)
    ex.task, ex.started = cast("asyncio.Task[None]", task), True
    await asyncio.sleep(0)  # it runs up to its await
    return task


async def test_the_attempts_own_cancel_is_spent_once() -> None:
    ex, seen = execution(), list[str]()
    fut = asyncio.get_running_loop().create_future()
    task = await started(ex, caught_in(ex, fut, seen))
    ex.cancel(CANCEL)
    assert await task == "went on" and seen == ["spent"]
    assert task.cancelling() == 0  # nothing left to reach later awaits

    # A second cancellation of the same task (the worker torn down after the attempt's
    # own was spent) is not the attempt's: it ends the task.
    fut2 = asyncio.get_running_loop().create_future()
    task2 = await started(ex, caught_in(ex, fut2, seen))
    task2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task2
    assert seen == ["spent", "not spent"]


async def test_a_teardown_in_the_same_tick_as_the_attempts_cancel_still_ends_the_task() -> None:
    ex, seen = execution(), list[str]()
    fut = asyncio.get_running_loop().create_future()
    task = await started(ex, caught_in(ex, fut, seen))
    ex.cancel(SHUTDOWN)
    task.cancel()  # the worker's task group, torn down in the same tick
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["not spent"]


async def test_a_cancellation_nobody_asked_for_is_not_spent_and_cancels_nothing() -> None:
    ex, seen = execution(), list[str]()
    fut = asyncio.get_running_loop().create_future()
    task = await started(ex, caught_in(ex, fut, seen))
    fut.cancel()  # someone else cancelled what the attempt awaited; nobody cancelled it
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancels nothing"]


async def test_hooks_after_the_one_the_attempts_cancel_landed_in_still_run() -> None:
    ex, calls = execution(), []
    blocker = asyncio.get_running_loop().create_future()

    async def slow(event: JobEvent) -> None:
        calls.append("slow")
        await blocker

    def stray(event: JobEvent) -> None:
        calls.append("stray")
        raise asyncio.CancelledError  # cancels nothing: a failing hook like any other

    def after(event: JobEvent) -> None:
        calls.append("after")

    hooks = Hooks()
    hooks.handlers["job_finished"] = [slow, stray, after]
    event = JobEvent("job_finished", ex.ctx.job, JobState.COMPLETED)
    task = await started(ex, hooks.emit(event, lambda: cancel_spent(ex)))
    ex.cancel(CANCEL)
    await task
    assert calls == ["slow", "stray", "after"]

    # Without the attempt's say-so (the leader's events), a cancellation ends the emit.
    calls.clear()
    blocker = asyncio.get_running_loop().create_future()
    other = await started(execution(), hooks.emit(event))
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    assert calls == ["slow"]
