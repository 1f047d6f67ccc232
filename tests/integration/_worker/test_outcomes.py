"""Every outcome reaches the database: results that cannot be stored, errors that carry what
jsonb refuses, and outcomes the database itself refuses never strand a job in `running`."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgq
from pgq._db import claims
from pgq._db.connections import create_pool
from pgq._worker import outcomes as completer
from pgq._worker.attempt import Outcome
from tests.integration._worker.test_liveness import FAST
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

# Never a rescue in these tests: the worker itself must settle every job. Some of their
# jobs hold the event loop for seconds (a 300 MB result is built and measured): the
# liveness bounds leave room for that, or the worker would rightly fence itself (its
# heartbeats held up too) and hand back the jobs it holds.
SETTINGS: dict[str, Any] = {
    **FAST,
    "rescue_interval": 3600,
    "heartbeat_interval": 2.0,
    "heartbeat_timeout": 1.0,
    "max_heartbeat_failures": 10,
    "stale_after": 60.0,
    "reap_after": 120.0,
}


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def results_app() -> pgq.App:
    app = pgq.App()

    @app.task(max_attempts=1)
    async def produce(ctx: pgq.JobContext, kind: str) -> Any:
        if kind == "huge":
            return "x" * 300_000_000  # 300 MB: more than jsonb holds
        if kind == "deep":
            return nested(100_000)
        if kind == "surrogate":
            return "caf\udce9"
        if kind == "nul-error":
            raise ValueError("bad \x00 byte and a lone \udce9 surrogate")
        if kind == "huge-error":
            raise ValueError("e" * 5_000_000)
        return {"kind": kind}

    return app


async def settled(client: pgq.Client, ids: list[int]) -> bool:
    for job_id in ids:
        job = await client.get_job(job_id)
        if job is None or not job.state.is_final:
            return False
    return True


async def test_results_that_cannot_be_stored_complete_their_jobs_with_the_reason(
    dsn: str, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    kinds = ["ok", "huge", "deep", "surrogate", "nul-error", "huge-error", "ok2"]
    jobs = await client.enqueue_many([pgq.JobSpec("produce", {"kind": k}) for k in kinds])
    ids = [j.id for j in jobs]
    caplog.set_level(logging.ERROR, "asyncio")
    async with pgq.Worker(results_app(), dsn, **SETTINGS):
        await until(lambda: settled(client, ids), limit_s=60)
    got = {k: await client.get_job(i) for k, i in zip(kinds, ids, strict=True)}
    for kind in ("ok", "ok2"):
        job = got[kind]
        assert job is not None and job.state is pgq.JobState.COMPLETED
        assert job.result == {"kind": kind}
    for kind, reason in (
        ("huge", "bytes of JSON, more than PostgreSQL's jsonb can hold"),
        ("deep", "nested too deeply"),
        ("surrogate", "lone surrogate"),
    ):
        job = got[kind]
        assert job is not None and job.state is pgq.JobState.COMPLETED, kind
        assert job.result is None
        (error,) = job.errors
        assert error["kind"] == "result" and reason in error["message"], kind
    for kind in ("nul-error", "huge-error"):
        job = got[kind]
        assert job is not None and job.state is pgq.JobState.DISCARDED, kind
        (error,) = job.errors
        assert error["kind"] == "exception" and error["message"].startswith("ValueError")
    nul = got["nul-error"]
    assert nul is not None and "\ufffd byte" in nul.errors[0]["message"]
    big = got["huge-error"]
    assert big is not None and "characters cut" in big.errors[0]["message"]
    assert len(big.errors[0]["message"]) < 20_000
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


REFUSE = """
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.args->>'refuse' = 'result' AND NEW.result IS NOT NULL THEN
        RAISE EXCEPTION 'results of this job are refused';
    END IF;
    IF NEW.args->>'refuse' = 'completion' AND NEW.state = 'completed' THEN
        RAISE EXCEPTION 'completion of this job is refused';
    END IF;
    IF NEW.args->>'refuse' = 'everything' AND OLD.state = 'running' THEN
        RAISE EXCEPTION 'every outcome of this job is refused';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE UPDATE ON pgq_jobs FOR EACH ROW EXECUTE FUNCTION refuse();
"""


def refused_app() -> pgq.App:
    app = pgq.App()

    @app.task(max_attempts=1)
    async def echo(ctx: pgq.JobContext, refuse: str, n: int) -> int:
        return n

    return app


async def test_an_outcome_the_database_refuses_never_holds_back_the_others(
    dsn: str, conn: Conn, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    await conn.execute(REFUSE)
    # One batch: all are claimed at once and finish together.
    specs = [pgq.JobSpec("echo", {"refuse": "none", "n": n}) for n in range(8)]
    specs[3] = pgq.JobSpec("echo", {"refuse": "result", "n": 3})
    specs[5] = pgq.JobSpec("echo", {"refuse": "completion", "n": 5})
    ids = [j.id for j in await client.enqueue_many(specs)]
    caplog.set_level(logging.ERROR, "pgq.completer")
    async with pgq.Worker(refused_app(), dsn, queues={"default": 20}, **SETTINGS):
        await until(lambda: settled(client, ids), limit_s=30)
    jobs = [await client.get_job(i) for i in ids]
    for n, job in enumerate(jobs):
        assert job is not None
        if n in (3, 5):
            continue
        assert job.state is pgq.JobState.COMPLETED and job.result == n
    salvaged = jobs[3]
    assert salvaged is not None and salvaged.state is pgq.JobState.COMPLETED
    assert salvaged.result is None
    assert salvaged.errors[0]["kind"] == "outcome"
    assert "results of this job are refused" in salvaged.errors[0]["message"]
    failed = jobs[5]
    assert failed is not None and failed.state is pgq.JobState.DISCARDED, "its only attempt"
    assert failed.errors[0]["kind"] == "outcome"
    assert "completion of this job is refused" in failed.errors[0]["message"]
    assert any(f"job {ids[3]} attempt 1 was refused" in r.getMessage() for r in caplog.records)


async def test_an_outcome_refused_in_every_form_is_held_and_written_later(
    dsn: str,
    conn: Conn,
    client: pgq.Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completer, "HELD_RETRY_S", 0.2)
    await conn.execute(REFUSE)
    job = await client.enqueue("echo", {"refuse": "everything", "n": 1})
    async with pgq.Worker(refused_app(), dsn, **SETTINGS) as worker:

        async def held() -> bool:
            return bool(worker.stats()["outcomes_held"] == 1)

        await until(held)
        stored = await client.get_job(job.id)
        assert stored is not None and stored.state is pgq.JobState.RUNNING
        await conn.execute("DROP TRIGGER refuse ON pgq_jobs")
        await until(lambda: settled(client, [job.id]))
        assert worker.stats()["outcomes_pending"] == 0
    done = await client.get_job(job.id)
    assert done is not None and done.state is pgq.JobState.COMPLETED and done.result == 1


@pytest.mark.parametrize("with_result", [False, True], ids=["no-result", "result"])
async def test_the_lean_completion_returns_what_the_fence_let_through_and_is_silent_on_none(
    dsn: str, conn: Conn, client: pgq.Client, with_result: bool
) -> None:
    # complete_successes, as the completer calls it for plain successes (without a result:
    # its statement without the results array). Three running attempts, each with its token.
    jobs = await client.enqueue_many([pgq.JobSpec("anything", {"i": i}) for i in range(3)])
    rows = await conn.fetch(
        "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempt_token = gen_random_uuid()"
        " WHERE id = ANY($1::bigint[]) RETURNING id, attempt_token",
        [j.id for j in jobs],
    )
    token = {r["id"]: r["attempt_token"] for r in rows}
    a, b, c = sorted(token)
    result = '{"x": 1}' if with_result else None
    announced: list[str] = []
    heard = anyio.Event()

    def on_done(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        announced.append(str(payload))
        heard.set()

    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener("pgq_done", on_done)
        # A zombie's batch: every token stale. Nothing written, nothing announced.
        stale = [uuid.uuid4()] * 3
        assert not (await claims.complete_successes(conn, [a, b, c], stale, [result] * 3)).states
        assert set((await claims.complete_successes(conn, [a], [token[a]], [result])).states) == {a}
        with anyio.fail_after(10):
            await heard.wait()
        # Notifications arrive in commit order: the zombie's batch would have come first.
        assert announced[0] == str(a)
        # Part of a batch let through: only that part is returned, and written.
        written = await claims.complete_successes(
            conn, [b, c], [token[b], uuid.uuid4()], [result, None]
        )
        assert set(written.states) == {b} and written.passed_over == []
    finally:
        await listener.close()
    states = {j.id: j for j in [await client.get_job(i) for i in (a, b, c)] if j is not None}
    assert [states[i].state for i in (a, b, c)] == [
        pgq.JobState.COMPLETED, pgq.JobState.COMPLETED, pgq.JobState.RUNNING,
    ]  # fmt: skip
    expected = {"x": 1} if with_result else None
    assert (states[a].result, states[b].result, states[c].result) == (expected, expected, None)


class BrokenBackoff(pgq.Backoff):
    """A backoff whose delay raises: pgq cannot compute the retry the task's failure asks."""

    def delay(self, attempt: int, rng: Any = None) -> float:
        raise RuntimeError("backoff broke")


async def test_a_failure_whose_backoff_raises_still_ends_the_attempt_and_counts_it(
    dsn: str,
) -> None:
    """The task raises, its backoff raises too: the attempt ends retryable, counted, with
    an internal error entry whose traceback keeps the task's own error; the job is not left
    running, nor run again as the same attempt."""
    app = pgq.App()

    @app.task(max_attempts=3, backoff=BrokenBackoff())
    async def fails(ctx: pgq.JobContext) -> None:
        raise ConnectionError("upstream refused")

    async with pgq.Client(dsn, app=app) as client:
        job = await client.enqueue(fails.spec())
        with anyio.fail_after(30):
            await pgq.Worker(app, dsn, **SETTINGS).run(burst=True)
        after = await client.get_job(job.id)
    assert after is not None and after.state is pgq.JobState.RETRYABLE, after
    assert after.attempt == 1
    (entry,) = after.errors
    assert entry["kind"] == "internal" and "backoff broke" in entry["message"], entry
    assert "ConnectionError: upstream refused" in entry["traceback"]
    assert after.scheduled_at is not None and after.attempted_at is not None
    assert (after.scheduled_at - after.attempted_at).total_seconds() > 30


# The backends of this database waiting for a row lock (an outcome batch, here).
ROW_LOCK_WAITERS = """
SELECT pid FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database() AND pid <> pg_backend_pid()
"""


async def running_attempts(conn: Conn, client: pgq.Client, n: int) -> dict[int, uuid.UUID]:
    """``n`` jobs made running, each under a token of its own: {id: token}."""
    jobs = await client.enqueue_many([pgq.JobSpec("anything", {"i": i}) for i in range(n)])
    rows = await conn.fetch(
        "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempt_token = gen_random_uuid()"
        " WHERE id = ANY($1::bigint[]) RETURNING id, attempt_token",
        [j.id for j in jobs],
    )
    return {r["id"]: r["attempt_token"] for r in rows}


async def states(conn: Conn, ids: list[int]) -> set[str]:
    rows = await conn.fetch("SELECT state::text FROM pgq_jobs WHERE id = ANY($1::bigint[])", ids)
    return {r["state"] for r in rows}


@pytest.mark.parametrize("kill", [False, True], ids=["both-land", "one-killed"])
async def test_a_batch_is_written_while_another_is_out(
    dsn: str, conn: Conn, client: pgq.Client, monkeypatch: pytest.MonkeyPatch, kill: bool
) -> None:
    """Two batches in flight at once, each on its connection: the second lands while the
    first waits for a row (here held by a transaction of the test's, and waited for as long
    as it takes); with ``kill``, the first's backend is then terminated, and its outcomes
    are kept and written again. Every outcome is reported written exactly once."""
    monkeypatch.setattr(completer, "LOCK_WAIT_MS", 60_000)
    token = await running_attempts(conn, client, 6)
    ids = sorted(token)
    first, second = ids[:3], ids[3:]
    written: Counter[int] = Counter()
    rejected: list[int] = []

    def report(ok: list[Outcome], refused: list[Outcome]) -> None:
        written.update(o.job_id for o in ok)
        rejected.extend(o.job_id for o in refused)

    def outcome(job_id: int) -> Outcome:
        return Outcome(job_id, token[job_id], 1, "default", "completed")

    async def first_waits() -> bool:
        return len(await conn.fetch(ROW_LOCK_WAITERS)) == 1

    async def second_landed() -> bool:
        return await states(conn, second) == {"completed"}

    pool = await create_pool(dsn, min_size=1, max_size=completer.WRITERS + 1)
    holder = await asyncpg.connect(dsn)
    try:
        lock = holder.transaction()
        await lock.start()
        await holder.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", first[0])
        # Batches of 4: a batch goes out beside another once one outcome (a quarter) waits.
        writer = completer.Completer(pool, report, batch_size=4)
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            for job_id in first:
                writer.add(outcome(job_id))
            await until(first_waits)
            for job_id in second:
                writer.add(outcome(job_id))
            await until(second_landed)
            if kill:
                (pid,) = [r["pid"] for r in await conn.fetch(ROW_LOCK_WAITERS)]
                assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)

                async def written_again() -> bool:
                    return [r["pid"] for r in await conn.fetch(ROW_LOCK_WAITERS)] not in ([], [pid])

                await until(written_again)  # kept, and waiting for its row again
            assert await states(conn, first) == {"running"}
            assert writer.pending == len(first)
            await lock.rollback()
            with anyio.fail_after(15):
                await writer.wait_idle()
            tg.cancel_scope.cancel()
    finally:
        await holder.close()
        await pool.close()
    assert await states(conn, ids) == {"completed"}
    assert written == Counter(ids) and rejected == []


async def test_hurry_writes_what_waits_without_the_rest_of_the_gather_window(
    conn: Conn, client: pgq.Client, dsn: str
) -> None:
    """A producer held back by its queue's limits hurries its outcomes: each frees a slot.
    With a gather window of an hour, what waits is written once hurried, and only then."""
    token = await running_attempts(conn, client, 2)
    ids = sorted(token)
    written: list[int] = []

    def report(ok: list[Outcome], refused: list[Outcome]) -> None:
        written.extend(o.job_id for o in ok)

    pool = await create_pool(dsn, min_size=1, max_size=completer.WRITERS + 1)
    try:
        writer = completer.Completer(pool, report, interval_s=3600)
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            writer.hurry()  # nothing waits: nothing to write, and the window stays
            writer.add(Outcome(ids[0], token[ids[0]], 1, "default", "completed"))
            with anyio.move_on_after(0.5):
                await writer.wait_idle()
            assert written == [] and await states(conn, ids[:1]) == {"running"}
            writer.hurry()
            with anyio.fail_after(15):
                await writer.wait_idle()
            assert written == ids[:1]
            writer.add(Outcome(ids[1], token[ids[1]], 1, "default", "completed"))
            writer.hurry()
            with anyio.fail_after(15):
                await writer.wait_idle()
            tg.cancel_scope.cancel()
    finally:
        await pool.close()
    assert written == ids and await states(conn, ids) == {"completed"}
