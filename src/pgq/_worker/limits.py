"""A queue's flow-control limits as its producer last read them, read again before the
next claim when a change is announced, and when an unlimited claim finds nothing for a
while (a change no notification brought)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pgq._db.claims import QueueLimits

#: An idle producer of an unlimited queue reads the queue's limits again this often.
LIMITS_REFRESH_S = 10.0


class LimitsCache:
    """The limits of one queue (None: to be read before the next claim), and whether they
    hold the producer's claims back now."""

    __slots__ = ("_changes", "_held_back", "_limits", "_read", "_read_at")

    def __init__(self, read: Callable[[], Awaitable[QueueLimits]]) -> None:
        self._read = read
        self._limits: QueueLimits | None = None
        # When they were read, and a count of the changes announced, so that a read
        # overtaken by one is not kept.
        self._read_at, self._changes = 0.0, 0
        self._held_back = False

    @property
    def unlimited(self) -> bool:
        """Whether the queue is known to have no limits (claims may go ahead of the slots)."""
        limits = self._limits
        return limits is not None and not limits.limited

    @property
    def known(self) -> bool:
        """Whether the queue's limits are known (read, and no change announced since)."""
        return self._limits is not None

    @property
    def held_back(self) -> bool:
        """Whether the limits held the last claim back: look again soon, not after a poll,
        and as soon as an outcome is written."""
        return self._held_back

    def changed(self) -> None:
        """The queue's limits were set or cleared (or a notification may have been missed):
        read them before the next claim."""
        self._limits = None
        self._changes += 1

    async def current(self, now: float) -> QueueLimits:
        """The limits a claim at ``now`` goes by: as known, or read now (and kept unless a
        change was announced meanwhile)."""
        limits = self._limits
        if limits is None:
            changes = self._changes
            limits = await self._read()
            if changes == self._changes:  # else read again next time
                self._limits, self._read_at = limits, now
        return limits

    def claimed_limited(self, held_back: bool, under_lock: QueueLimits) -> None:
        """A limited claim came back: whether the limits held it back, and the limits as it
        read them under the queue's lock."""
        self._held_back = held_back
        if not under_lock.limited:  # cleared meanwhile: back to the single statement
            self._limits = under_lock

    def claiming_unlimited(self) -> None:
        """An unlimited claim goes out: nothing holds it back."""
        self._held_back = False

    def found_nothing(self, now: float) -> None:
        """An unlimited claim found no job: limits set while no notification could reach
        us (poll_only, a lost LISTEN) would look like this, so read them again if they are
        old."""
        if now - self._read_at > LIMITS_REFRESH_S:
            self._limits = None
