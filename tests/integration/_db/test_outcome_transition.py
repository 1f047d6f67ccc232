"""The transition an attempt's outcome makes is the same on every path that ends an attempt:
the worker's outcome batch, its lean completion, the last-resort failure, a task's own
settle, the leader's rescue and a restarted worker's takeover. Each is driven through
{cancel requested or not} x {the outcomes it can want}; a cancel request redirects only an
outcome that would run the job again (retryable, available -> cancelled, with a 'cancel'
entry), and an outcome that ends the job stands (completed, discarded)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

import pgq
from pgq._db import claims, maintenance, producers, sql
from pgq._db.claims import ClaimPlan
from pgq._db.drivers import AsyncpgDriver
from pgq._worker.attempt import Outcome, error_entry

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

QUEUE = "transition"
WORKER = "transition-worker"
#: A job wanted retryable or available has attempts left; one wanted discarded has none.
ATTEMPTS_LEFT, LAST_ATTEMPT = 3, 1


@dataclass(frozen=True)
class Running:
    """A job claimed by ``producer_id``, its first attempt running."""

    job: pgq.Job
    producer_id: uuid.UUID


#: Writes the outcome ``wanted`` for the running job on the path under test.
Write = Callable[["Conn", Running, str], Awaitable[None]]


#: The error entry the worker writes with each outcome (none with a completion).
WORKER_KINDS = {"completed": None, "retryable": "exception", "discarded": "exception",
                "available": "shutdown"}  # fmt: skip
LEADER_ID = uuid.uuid4()


def entry_for(job: pgq.Job, wanted: str) -> str | None:
    kind = WORKER_KINDS[wanted]
    return None if kind is None else error_entry(job.attempt, kind, "stopped")


async def via_outcome_batch(conn: Conn, running: Running, wanted: str) -> None:
    job = running.job
    delta = -1 if wanted == "available" else 0  # a hand-back does not count its attempt
    outcome = Outcome.of(job, wanted, error=entry_for(job, wanted), attempt_delta=delta)
    written = await claims.write_outcomes(conn, [outcome])
    assert job.id in written.states


async def via_lean_completion(conn: Conn, running: Running, wanted: str) -> None:
    assert wanted == "completed"
    job = running.job
    written = await claims.complete_successes(conn, [job.id], [job.attempt_token], [None])
    assert written.states == {job.id: "completed"}


async def via_last_resort(conn: Conn, running: Running, wanted: str) -> None:
    job = running.job
    entry = error_entry(job.attempt, "exception", "refused")
    assert await claims.fail_attempt(conn, job.id, job.attempt_token, entry)


async def via_own_transaction(conn: Conn, running: Running, wanted: str) -> None:
    job = running.job
    async with conn.transaction():
        state = await claims.write_in_transaction(
            AsyncpgDriver(conn),
            job.id,
            job.attempt_token,
            uuid.uuid4(),
            wanted,
            error=entry_for(job, wanted),
        )
    assert state is not None


async def via_leader_rescue(conn: Conn, running: Running, wanted: str) -> None:
    # The job's producer is gone: no row was ever registered under its id.
    await rescued_before(conn, running, wanted)
    assert await producers.acquire_lease(conn, LEADER_ID, "the-leader", 60)
    rescued = await maintenance.rescue(conn, LEADER_ID, stale_after=0, grace=0, limit=10)
    assert [r.id for r in rescued] == [running.job.id]


async def via_takeover(conn: Conn, running: Running, wanted: str) -> None:
    # The predecessor registered, then went silent past its fencing bound.
    bounds = producers.Bounds(1.0, 3.0, 1.0, ("work",))
    row = producers.ProducerRow(running.producer_id, QUEUE, 10)
    await producers.register(conn, uuid.uuid4(), WORKER, [row], bounds)
    await conn.execute(
        "UPDATE pgq_producers SET heartbeat_at = now() - interval '1 hour' WHERE id = $1",
        running.producer_id,
    )
    await rescued_before(conn, running, wanted)
    rescued = await maintenance.rescue_predecessor(conn, [running.producer_id], 0.5)
    assert [r.id for r in rescued] == [running.job.id]


async def rescued_before(conn: Conn, running: Running, wanted: str) -> None:
    """A rescue makes a job available at once the first time, retryable after: for
    ``retryable``, the job was rescued once already."""
    if wanted == "retryable":
        await conn.execute(
            "UPDATE pgq_jobs SET metadata = '{\"pgq_rescues\": 1}' WHERE id = $1",
            running.job.id,
        )


@dataclass(frozen=True)
class Path:
    """A path that ends an attempt: how it writes, the outcomes it can want, and the kind of
    the error entry it writes for each (None: none)."""

    write: Write
    outcomes: tuple[str, ...]
    kind: Callable[[str], str | None]


EVERY_OUTCOME = ("completed", "retryable", "discarded", "available")
RESCUES = ("available", "retryable", "discarded")
PATHS = {
    "outcome batch": Path(via_outcome_batch, EVERY_OUTCOME, WORKER_KINDS.__getitem__),
    "lean completion": Path(via_lean_completion, ("completed",), WORKER_KINDS.__getitem__),
    "last resort": Path(via_last_resort, ("retryable", "discarded"), lambda _: "exception"),
    "own transaction": Path(via_own_transaction, EVERY_OUTCOME, WORKER_KINDS.__getitem__),
    "leader rescue": Path(via_leader_rescue, RESCUES, lambda _: "rescued"),
    "takeover": Path(via_takeover, RESCUES, lambda _: "rescued"),
}


async def start(client: pgq.Client, conn: Conn, wanted: str) -> Running:
    await client.enqueue(
        "work",
        {},
        queue=QUEUE,
        max_attempts=LAST_ATTEMPT if wanted == "discarded" else ATTEMPTS_LEFT,
    )
    producer_id = uuid.uuid4()
    plan = ClaimPlan(QUEUE, ("work",), (None,), (ATTEMPTS_LEFT,))
    [job] = await claims.claim(conn, plan, producer_id, WORKER, 1)
    assert job.attempt == 1 and job.state is pgq.JobState.RUNNING
    return Running(job, producer_id)


CANCEL_ENTRY = {"attempt": 1, "kind": "cancel", "message": "cancelled by request",
                "traceback": None}  # fmt: skip


def expected(kind: str | None, wanted: str, cancel_requested: bool) -> tuple[object, ...]:
    """The rule, written once for every path: a cancel request redirects only an outcome
    that would run the job again; the job is finalized when its state is final; its errors
    get the path's own entry, then the cancel entry when the outcome was redirected."""
    state = pgq.JobState(wanted)
    redirected = cancel_requested and not state.is_final
    if redirected:
        state = pgq.JobState.CANCELLED
    kinds = [k for k in (kind, "cancel" if redirected else None) if k]
    return state, state.is_final, kinds, CANCEL_ENTRY if redirected else None


@pytest.mark.parametrize("name", list(PATHS))
async def test_every_path_makes_the_same_transition(
    name: str, client: pgq.Client, conn: Conn
) -> None:
    path = PATHS[name]
    observed: dict[tuple[str, bool], tuple[object, ...]] = {}
    wanted_by_rule: dict[tuple[str, bool], tuple[object, ...]] = {}
    for wanted in path.outcomes:
        for cancel_requested in (False, True):
            case = (wanted, cancel_requested)
            running = await start(client, conn, wanted)
            if cancel_requested:
                requested = await client.cancel(running.job.id)
                assert requested is not None and requested.state is pgq.JobState.RUNNING
            await path.write(conn, running, wanted)
            job = await client.get_job(running.job.id)
            assert job is not None
            kinds = [e["kind"] for e in job.errors]
            last = {k: v for k, v in job.errors[-1].items() if k != "at"} if job.errors else {}
            observed[case] = (
                job.state,
                job.finalized_at is not None,
                kinds,
                last if kinds[-1:] == ["cancel"] else None,
            )
            wanted_by_rule[case] = expected(path.kind(wanted), wanted, cancel_requested)
            if path.kind(wanted) is not None:
                own = job.errors[0]  # the attempt's own entry, enriched
                assert own["attempt"] == 1 and own["producer_id"] == str(running.producer_id)
                assert own["started_at"] is not None and own["at"] is not None, case
            # Out of the way of the next case's claim (a job made available again would be
            # claimed first).
            await conn.execute("DELETE FROM pgq_jobs WHERE id = $1", job.id)
    assert observed == wanted_by_rule


FUNCTIONS = ("pgq_is_final", "pgq_outcome_state", "pgq_failed_state", "pgq_outcome_finalized_at",
             "pgq_attempt_error", "pgq_cancel_entry", "pgq_outcome_errors")  # fmt: skip
TOKEN = uuid.uuid4()
#: Each statement that ends an attempt (or cancels a job), with arguments to plan it with.
STATEMENTS: dict[str, tuple[object, ...]] = {
    "COMPLETE_JOBS": ([1], [TOKEN], ["retryable"], [None], ["{}"], [None], [0], False, False, None),
    "FAIL_ATTEMPT": (1, TOKEN, "{}", False),
    "SETTLE_ATTEMPT": (1, TOKEN, TOKEN, "retryable", None, "{}", None, 0),
    "RESCUE_JOBS": (LEADER_ID, 30.0, 5.0, 100),
    "RESCUE_PREDECESSOR": ([TOKEN], 1.0),
    "CANCEL_JOBS": ([1],),
}  # fmt: skip


@pytest.mark.parametrize("name", list(STATEMENTS))
async def test_the_planner_inlines_the_transition(name: str, conn: Conn) -> None:
    """The functions cost the statements nothing: their plans hold the functions' bodies,
    never a call to one of them."""
    statement = getattr(sql, name)
    assert any(f in statement for f in FUNCTIONS), name
    rows = await conn.fetch("EXPLAIN (VERBOSE, COSTS OFF) " + statement, *STATEMENTS[name])
    plan = "\n".join(r[0] for r in rows)
    assert "jsonb_build_object" in plan
    assert [f for f in FUNCTIONS if f in plan] == []
