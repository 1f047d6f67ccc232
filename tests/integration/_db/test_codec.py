"""The claim's rows decoded: a task sees its job as stored, every column read."""

from datetime import UTC, datetime, timedelta

import pytest

import pgq
from tests.tests_support import burst

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("concurrency", "key_concurrency"), [(None, None), (50, None), (None, 5)],
    ids=["plain", "limited", "keyed"],
)  # fmt: skip
async def test_a_task_sees_its_job_as_stored_every_column_read(
    client: pgq.Client, dsn: str, concurrency: int | None, key_concurrency: int | None
) -> None:
    # The claim returns fewer columns, read by position (codec.jobs_from_claim); a read by id
    # reads them all by name (job_from_row). Every column set to a value of its own: they
    # must agree, whichever statement claims (plain, under the queue's limits, per key).
    app = pgq.App()
    seen: list[tuple[pgq.Job, pgq.Job | None]] = []

    @app.task
    async def parent(ctx: pgq.JobContext) -> None:
        pass

    @app.task(max_attempts=7)
    async def child(ctx: pgq.JobContext, n: int, note: str) -> None:
        seen.append((ctx.job, await client.get_job(ctx.job.id)))
        if note == "again" and ctx.job.attempt == 1:
            raise pgq.Retry(0, "once more")  # its second attempt is claimed with its errors

    if concurrency or key_concurrency:
        await client.set_queue_limits(
            "default", concurrency=concurrency, key_concurrency=key_concurrency
        )
    first = await client.enqueue(parent.spec())
    await burst(app, dsn)
    # Five jobs in one claim. In claim order (priority, then schedule): two of one enqueue
    # (one creation time, sent once: the second row carries none), the job of every column,
    # the third of that enqueue (its creation time sent again, after the other's), and a
    # job due before it was created (scheduled_at is sent only when it differs from
    # created_at). The first row carries the start for all, and is not the lowest id.
    past = datetime.now(UTC) - timedelta(days=1)
    late = await client.enqueue(child.spec(4, "x").with_options(run_at=past))
    batch = await client.enqueue_many(
        [
            child.spec(5, "a").with_options(priority=9),
            child.spec(6, "again").with_options(priority=9),
            child.spec(7, "c").with_options(priority=1),
        ]
    )
    job = await client.enqueue(
        child.spec(3, "é").with_options(
            priority=5, tags=["a", "b"], metadata={"m": [1, {"x": None}]},
            unique_key="k-1", limit_key="tenant-1", depends_on=[first],
        )
    )  # fmt: skip
    await burst(app, dsn)
    assert len(seen) == 6  # five jobs, one of them twice
    for claimed, read in seen:
        assert claimed == read
    once = {c.id: c for c, _ in seen if c.attempt == 1}
    assert sorted(once) == sorted([late.id, *(j.id for j in batch), job.id])
    assert len({c.attempted_at for c in once.values()}) == 1  # one claim
    assert once[batch[0].id].created_at == once[batch[2].id].created_at != job.created_at
    claimed_late = once[late.id]
    assert claimed_late.scheduled_at == past != claimed_late.created_at
    ((again, read_again),) = [(c, r) for c, r in seen if c.attempt == 2]
    assert again.id == batch[1].id
    assert [e["message"] for e in again.errors] == ["once more"]
    assert again == read_again
    claimed = once[job.id]
    assert (claimed.id, claimed.args, claimed.tags, claimed.metadata) == (
        job.id, {"n": 3, "note": "é"}, ["a", "b"], {"m": [1, {"x": None}]},
    )  # fmt: skip
    assert (claimed.unique_key, claimed.limit_key, claimed.depends_on) == (
        "k-1", "tenant-1", [first.id],
    )  # fmt: skip
    assert claimed.state is pgq.JobState.RUNNING and claimed.attempt == 1
    assert claimed.max_attempts == 7 and claimed.priority == 5
    assert claimed.attempt_token is not None and claimed.producer_id is not None
    assert claimed.attempted_at is not None and claimed.created_at is not None
    assert (claimed.queue, batch[0].tags, once[batch[0].id].errors) == ("default", [], [])
    a, c = once[batch[0].id], once[batch[2].id]  # empty, yet each job's own to change
    assert a.errors is not c.errors and a.tags is not c.tags and a.metadata is not c.metadata
