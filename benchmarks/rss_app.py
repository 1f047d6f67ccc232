"""The App of the memory benchmark: jobs that sleep."""

from __future__ import annotations

import anyio

import pgq

app = pgq.App()


@app.task
async def sleeper(ctx: pgq.JobContext, s: float) -> None:
    """Sleep for ``s`` seconds: a job waiting on I/O."""
    await anyio.sleep(s)
