"""A task that logs through ``ctx.log``, run with JSON logs and traces (docs/observability.md):

    OTEL_TRACES_EXPORTER=console OTEL_SERVICE_NAME=billing \\
        pgq --log-format json worker observed:app --tracing --burst

pgq's suite runs it so from the installed wheel."""

from __future__ import annotations

import pgq

app = pgq.App()


@app.task(queue="billing")
async def charge(ctx: pgq.JobContext, amount: int) -> int:
    ctx.log.info("charging %d", amount)  # a JSON line with job_id, task, queue and attempt
    return amount
