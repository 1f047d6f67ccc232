"""Test signals: counts of what a part did that a test can await, instead of polling the
part's fields (River's services expose the same for their tests)."""

from __future__ import annotations

import anyio


class Signal:
    """How many times something happened (a claim came back, a job was handed back), and a
    wait until it has happened so many times. Firing costs an addition and a test; the
    event exists only while someone waits."""

    __slots__ = ("_event", "count")

    def __init__(self) -> None:
        #: How many times it fired so far.
        self.count = 0
        self._event: anyio.Event | None = None

    def fire(self, n: int = 1) -> None:
        """It happened ``n`` more times."""
        self.count += n
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    async def wait(self, count: int = 1) -> None:
        """Return once it has happened at least ``count`` times in all."""
        while self.count < count:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
