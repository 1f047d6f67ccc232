"""How long a failed job waits before its next attempt."""

from __future__ import annotations

import random
from dataclasses import dataclass

from pgq.errors import ConfigError
from pgq.job import MAX_SECONDS


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: ``base_s * 2**(attempt-1)``, capped at ``max_s``,
    then spread by ``±jitter`` (a fraction) so failed jobs do not retry in lockstep."""

    base_s: float = 1.0
    max_s: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        numbers = (self.base_s, self.max_s, self.jitter)
        if (
            any(isinstance(x, bool) or not isinstance(x, int | float) for x in numbers)
            or not 0 <= self.base_s <= self.max_s <= MAX_SECONDS
            or not 0 <= self.jitter < 1
        ):
            raise ConfigError(
                f"invalid backoff {self!r}: need numbers with 0 <= base_s <= max_s <= "
                f"{MAX_SECONDS:g} (seconds) and 0 <= jitter < 1"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the attempt after ``attempt`` (which failed)."""
        raw = min(self.max_s, self.base_s * 2.0 ** min(max(attempt - 1, 0), 60))
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, raw * (1.0 + spread))
