"""A Worker's one run: a second or concurrent run is refused before it connects, and a stop
that comes while the run still connects ends it at once (nothing runs yet to wait for)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from pgq.errors import ConfigError

T = TypeVar("T")


class RunOnce:
    """The run of one worker (``name``, for the error): :meth:`open` begins it,
    :meth:`ended` ends it, :meth:`stop` cancels an opening under way (or to come)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._state: str | None = None  # "running", then "ran"
        self._opening: anyio.CancelScope | None = None
        self._stopped = False

    async def open(self, opener: Callable[[], Awaitable[T]]) -> T | None:
        """What ``opener`` opens; None when :meth:`stop` came first (before or during). A
        failed opening leaves the worker as it was: it may run later."""
        # Checked and set before the first await: of two concurrent runs, one opens.
        if self._state is not None:
            raise ConfigError(
                f"worker {self._name}: this Worker "
                f"{'is running' if self._state == 'running' else 'has run'} already; "
                "a Worker runs once: make a new pgq.Worker to run again"
            )
        self._state = "running"
        opened = None
        try:
            with anyio.CancelScope() as self._opening:
                if self._stopped:
                    self._opening.cancel()
                opened = await opener()
        except BaseException:
            self._state = None  # nothing ran: a start that could not connect may retry
            raise
        finally:
            self._opening = None
        if opened is None:
            self._state = "ran"
        return opened

    def stop(self) -> None:
        """A stop: an opening under way is cancelled, one to come never begins."""
        self._stopped = True
        if self._opening is not None:
            self._opening.cancel()

    def ended(self) -> None:
        """The run is over: any other is refused."""
        self._state = "ran"
