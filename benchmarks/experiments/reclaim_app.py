"""The App the kill -9 measurement runs: jobs that take long enough to be killed mid-run."""

from __future__ import annotations

import anyio

import pgq

app = pgq.App()


@app.task
async def long_job(ctx: pgq.JobContext, seconds: float) -> None:
    """Sleep: stands in for work that is under way when its worker dies."""
    await anyio.sleep(seconds)
