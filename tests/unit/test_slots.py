"""The producer's execution slots (pgq._worker.producer.Slots)."""

import asyncio

import pytest

from pgq._worker.producer import Slots

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_free_slots_are_taken_without_waiting_until_none_is_left() -> None:
    slots = Slots(2)
    assert not slots.locked() and slots.in_use == 0
    assert slots.take_free() and slots.take_free()
    assert slots.in_use == 2
    assert slots.locked() and not slots.take_free()
    slots.release()
    assert not slots.locked() and slots.take_free()


async def test_waiters_get_slots_in_the_order_they_came_and_no_newcomer_cuts_in() -> None:
    slots = Slots(1)
    assert slots.take_free()
    order: list[int] = []
    took = [asyncio.Event() for _ in range(3)]

    async def wait(i: int) -> None:
        await slots.acquire()
        order.append(i)
        took[i].set()

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)  # all three are waiting
    slots.release()
    assert not slots.take_free(), "the released slot belongs to the first waiter"
    for i in range(3):
        await asyncio.wait_for(took[i].wait(), 10)
        assert order == list(range(i + 1))
        slots.release()  # the job that took it ends
    await asyncio.gather(*tasks)
    assert slots.take_free() and slots.locked()


async def test_a_waiter_cancelled_while_waiting_leaves_the_line() -> None:
    slots = Slots(1)
    assert slots.take_free()
    first = asyncio.create_task(slots.acquire())
    second = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    slots.release()
    await asyncio.wait_for(second, 10)  # the slot went to the one still waiting
    assert slots.locked()
    slots.release()
    assert not slots.locked()


async def test_a_waiter_cancelled_after_a_slot_was_handed_to_it_passes_the_slot_on() -> None:
    slots = Slots(1)
    assert slots.take_free()
    first = asyncio.create_task(slots.acquire())
    second = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to the first ...
    first.cancel()  # ... which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 10)
    slots.release()
    assert not slots.locked() and slots.take_free() and not slots.take_free()


async def test_a_timeout_on_the_wait_loses_no_slot() -> None:
    slots = Slots(1)
    assert slots.take_free()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await slots.acquire()
    slots.release()
    assert slots.take_free() and not slots.take_free()


@pytest.mark.parametrize("first", ["handoff", "timeout"])
async def test_a_timeout_in_the_same_tick_as_a_handoff_loses_no_slot(first: str) -> None:
    """Whichever comes first, the waiter either holds the slot or has passed it on."""
    slots = Slots(1)
    assert slots.take_free()
    loop = asyncio.get_running_loop()
    when = loop.time() + 0.05
    released = asyncio.Event()
    holds: list[bool] = []

    def release() -> None:
        slots.release()
        released.set()

    async def wait() -> None:
        try:
            async with asyncio.timeout_at(when):
                await slots.acquire()
        except TimeoutError:
            holds.append(False)
        else:
            holds.append(True)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    loop.call_at(when - 1e-6 if first == "handoff" else when + 1e-6, release)
    await asyncio.wait_for(task, 10)
    await asyncio.wait_for(released.wait(), 10)
    if holds == [True]:
        slots.release()  # the job that took it ends
    assert not slots.locked() and slots.take_free() and not slots.take_free()


def test_a_waiting_coroutine_closed_leaves_the_line() -> None:
    slots = Slots(1)
    assert slots.take_free()

    async def main() -> None:
        waiting = slots.acquire()
        waiting.send(None)  # now waiting in line
        assert slots.locked()
        waiting.close()
        slots.release()

    asyncio.run(main())
    assert slots.take_free() and not slots.take_free()
