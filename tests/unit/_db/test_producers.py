"""A producer's status, judged by the bounds its worker recorded."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from pgq._db.producers import ProducerInfo


def info(age_s: float, *, healthy: bool = True, fence: float | None = 6.0,
         stale: float | None = 30.0) -> ProducerInfo:  # fmt: skip
    now = datetime.now(UTC)
    return ProducerInfo(
        id=uuid.uuid4(), worker_id=uuid.uuid4(), worker_name="w", queue="default",
        started_at=now, heartbeat_at=now, heartbeat_age_s=age_s, concurrency=1, running=0,
        healthy=healthy, claimed=0, completed=0, failed=0, rejected_outcomes=0,
        is_leader=False, fence_after_s=fence, stale_after_s=stale,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("producer", "override", "status"),
    [
        (info(1), None, "healthy"),
        (info(1, healthy=False), None, "fenced"),  # it said so itself
        (info(7), None, "fenced"),  # past its fencing bound: it has stopped claiming
        (info(31), None, "stale"),  # past its own stale_after: the leader rescues
        (info(7), 5.0, "stale"),  # an explicit bound wins over the recorded one
        (info(7, fence=None, stale=None), None, "healthy"),  # a row from before bounds
        (info(61, fence=None, stale=None), None, "stale"),  # judged by the default
    ],
)
def test_status(producer: ProducerInfo, override: float | None, status: str) -> None:
    assert producer.status(override, 60.0) == status
