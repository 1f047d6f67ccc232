"""The leader's periodic enqueuer: each schedule slot becomes one job, exactly once."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime

from pgq._db import maintenance
from pgq._db.connections import Connection, Pool
from pgq.app import App, JobSpec, Schedule
from pgq.client import Client
from pgq.job import JobState

log = logging.getLogger("pgq.periodic")

ALL_STATES = tuple(JobState)


class PeriodicFailed(Exception):
    """One or more schedules failed this round; the message names each and its error."""


class Periodic:
    """Enqueues the due slot of each of the App's schedules.

    A slot's job carries the unique key ``pgq:periodic:NAME:SLOT`` across *every* state, so
    two leaders in turn (or at once) can never enqueue it twice. ``pgq_periodic`` remembers
    the last slot enqueued: a schedule seen for the first time starts with its next slot,
    and a leader back after downtime enqueues only the most recent missed slot.
    """

    name = "periodic"
    eager = True

    def __init__(
        self,
        pool: Pool,
        app: App,
        worker_id: uuid.UUID,
        *,
        interval_s: float,
        term: Callable[[], int],
        worker_name: str = "",
    ) -> None:
        self._pool = pool
        self._app = app
        self._worker_id = worker_id
        self._worker_name = worker_name
        self._client = Client(pool=pool, app=app, check_schema=False)
        self._last: dict[str, datetime] = {}
        self._term = 0
        self._current_term = term
        self.interval_s = interval_s
        self.enqueued = 0

    async def run_once(self) -> int:
        """One pass over every schedule; returns how many jobs it enqueued. A schedule that
        fails does not keep the others from running; the round then raises, naming each."""
        now = await maintenance.database_now(self._pool)
        term = self._current_term()
        new_term = term != self._term
        self._term = term
        before = self.enqueued
        failed: list[str] = []
        for schedule in self._app.schedules:
            try:
                await self._tick(schedule, now, term if new_term else None)
            except Exception as exc:
                failed.append(f"{schedule.name}: {type(exc).__name__}: {exc}")
        if failed:
            raise PeriodicFailed("; ".join(failed))
        return self.enqueued - before

    async def _tick(self, schedule: Schedule, now: datetime, new_term: int | None) -> None:
        slot = schedule.when.latest(now)
        if new_term is not None:
            self._last.pop(schedule.name, None)  # another leader may have moved on
            if schedule.run_on_start:
                await self._enqueue(schedule, f"start:{self._worker_id}:{new_term}", None)
        if self._last.get(schedule.name) != slot:
            await self._advance(schedule, slot)

    async def _advance(self, schedule: Schedule, slot: datetime) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            last = await maintenance.lock_periodic(conn, schedule.name)
            if last is not None and slot > last:
                await self._enqueue(schedule, slot.isoformat(), conn)
            record = maintenance.ScheduleRecord(
                schedule.name,
                schedule.task.name,
                schedule.queue or schedule.task.queue,
                schedule.when.describe(),
                slot,
                schedule.when.following(slot),
                self._worker_name,
                slot,
            )
            await maintenance.record_periodic(conn, record, advance=last is None or slot > last)
        self._last[schedule.name] = slot

    async def _enqueue(self, schedule: Schedule, slot_id: str, conn: Connection | None) -> None:
        spec = JobSpec(
            schedule.task,
            schedule.args,
            queue=schedule.queue,
            priority=schedule.priority,
            max_attempts=schedule.max_attempts,
            metadata={"pgq_periodic": schedule.name, "pgq_slot": slot_id},
            unique_key=f"pgq:periodic:{schedule.name}:{slot_id}",
            unique_states=ALL_STATES,
        )
        (job,) = await self._client.enqueue_many([spec], connection=conn)
        if job.duplicate:
            log.debug("periodic %s slot %s was already enqueued", schedule.name, slot_id)
        else:
            self.enqueued += 1
            log.info("periodic %s: enqueued job %d for slot %s", schedule.name, job.id, slot_id)
