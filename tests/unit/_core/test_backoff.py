"""Backoff: the wait before a failed job's next attempt."""

import random

import pytest

from pgq._core.backoff import Backoff
from pgq.errors import ConfigError


def test_backoff_doubles_then_caps_with_bounded_jitter() -> None:
    b = Backoff(base_s=1.0, max_s=10.0, jitter=0.1)
    rng = random.Random(7)
    for attempt, raw in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (40, 10.0)]:
        delay = b.delay(attempt, rng)
        assert raw * 0.9 <= delay <= raw * 1.1


def test_backoff_without_jitter_is_exact() -> None:
    assert Backoff(base_s=0.5, max_s=100, jitter=0).delay(3) == 2.0


@pytest.mark.parametrize(
    "fields", [{"base_s": float("nan")}, {"max_s": float("inf")}, {"base_s": "1"}, {"max_s": 1e10}]
)
def test_a_backoff_whose_delays_the_database_could_not_hold_is_refused(
    fields: dict[str, object],
) -> None:
    with pytest.raises(ConfigError, match="invalid backoff"):
        Backoff(**fields)  # type: ignore[arg-type]
