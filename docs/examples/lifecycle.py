"""The job-lifecycle features in one runnable example (the test suite runs `main`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pgq

app = pgq.App()
durations: dict[str, float] = {}


@app.middleware
async def timed(ctx: pgq.JobContext, call_next: Any) -> Any:
    """Middleware: time every job (a metrics integration would export this)."""
    start = time.perf_counter()
    try:
        return await call_next()
    finally:
        durations[ctx.job.task] = time.perf_counter() - start


@app.on("job_retried")
def report_retry(event: pgq.JobEvent) -> None:
    """An event hook: a Sentry integration would capture event.error here."""
    logging.getLogger("example").info("job %d will retry: %s", event.job.id, event.error)


@app.task(queue="reports")
async def build_report(ctx: pgq.JobContext, customer: int) -> dict[str, Any]:
    """A job whose result the caller waits for."""
    return {"customer": customer, "rows": 42}


@app.periodic("*/15 * * * *", timezone="Europe/Paris", args={"full": False})
async def sync_catalog(ctx: pgq.JobContext, full: bool) -> None:
    """Runs every 15 minutes; the leader enqueues each slot exactly once."""


async def main(dsn: str) -> dict[str, Any]:
    """Enqueue a unique job, run it, wait for its result; pause and resume a queue."""
    async with pgq.Client(dsn, app=app) as client:
        # Unique: a second request for the same report is folded into the first.
        job = await client.enqueue(build_report, {"customer": 7}, unique=True)
        again = await client.enqueue(build_report, {"customer": 7}, unique=True)
        assert again.duplicate and again.id == job.id

        async with pgq.Worker(app, dsn, queues=["reports"]):
            done = await client.wait(job.id, timeout=30)  # LISTEN-driven

            await client.pause_queue("reports")  # persisted; every worker obeys
            held = await client.enqueue(build_report, {"customer": 8})
            cancelled = await client.cancel(held.id)  # not running yet: cancelled at once
            await client.resume_queue("reports")

        return {
            "result": done.result,
            "cancelled": cancelled.state if cancelled else None,
            "timed": "build_report" in durations,
        }
