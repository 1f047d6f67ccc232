"""A background loop that can be stopped on its own, and waited for, before the rest of the
worker stops."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


class Stoppable:
    """Runs ``loop`` until it returns or is cancelled; :meth:`stop` cancels it alone and
    waits until it has unwound (what its cleanup records is recorded by then)."""

    def __init__(self, loop: Callable[[], Awaitable[None]]) -> None:
        self._loop = loop
        self._scope = anyio.CancelScope()
        self._ended = anyio.Event()
        self._started = False

    async def run(self) -> None:
        """Run the loop (start this in a task group)."""
        self._started = True
        try:
            if not self._scope.cancel_called:  # stopped before it started: it never runs
                with self._scope:
                    await self._loop()
        finally:
            self._ended.set()

    async def stop(self) -> None:
        """Cancel the loop and wait until it has ended, however long its own cleanup takes
        (at once if it has not started: it then never runs)."""
        self._scope.cancel()
        if self._started:
            await self._ended.wait()
