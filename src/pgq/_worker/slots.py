"""A producer's execution slots: at most ``n`` jobs execute, the others wait in claim order."""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    """A counting gate like :class:`asyncio.Semaphore`, cut to what a producer does once
    per job: :meth:`take_free` takes a free slot without a coroutine, and :meth:`release`
    hands the slot straight to the longest waiter (no newcomer can take it in between).
    ``asyncio.Semaphore`` looks for cancelled waiters with a generator on every check,
    which cost more than the rest of a no-op job's slot handling."""

    __slots__ = ("_free", "_n", "_waiters")

    def __init__(self, n: int) -> None:
        self._n = n
        self._free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def in_use(self) -> int:
        """How many slots are taken."""
        return self._n - self._free

    def locked(self) -> bool:
        """Whether a newcomer would have to wait (no free slot, or others wait already)."""
        return self._free <= 0 or bool(self._waiters)

    def take_free(self) -> bool:
        """Take a slot if one is free and nobody waits; never waits."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a slot, waiting in line for one if none is free. A waiter stopped (cancelled,
        timed out, closed) leaves the line, and passes on a slot handed to it meanwhile."""
        if self.take_free():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:  # cancelled, timed out, or the coroutine closed
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot, but stopped before it resumed
            elif waiter in self._waiters:  # (release() drops a cancelled one it meets)
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to the free ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
