"""A database with jobs in every state, made by real workers: what the dashboard shows."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

import pgq

#: Content that must render as text, never run: a script element, an event attribute.
SCRIPT = "<script>window.__xss = 1</script>"
ATTRIBUTE = '<img src=x onerror="window.__xss = 2">'

app = pgq.App()


@app.task(queue="emails")
async def send_email(ctx: pgq.JobContext, to: str, subject: str = "hello") -> dict[str, str]:
    return {"sent_to": to}


@app.task(queue="emails", max_attempts=2, backoff=pgq.Backoff(base_s=0, max_s=0, jitter=0))
async def broken(ctx: pgq.JobContext, note: str = "") -> None:
    raise RuntimeError(f"SMTP refused {note}")


@app.task(queue="emails", max_attempts=5, backoff=pgq.Backoff(base_s=3600, max_s=3600))
async def flaky(ctx: pgq.JobContext) -> None:
    raise ConnectionError("upstream timed out")


@app.task(queue="reports")
async def report(ctx: pgq.JobContext, month: str) -> None:
    await anyio.sleep(3600)


@app.periodic("*/5 * * * *", queue="reports", name="nightly-report", args={"month": "last"})
async def nightly(ctx: pgq.JobContext, month: str) -> None: ...


@dataclass
class Seeded:
    """The ids of the jobs made, by what they are."""

    completed: list[int] = field(default_factory=list)
    discarded: int = 0
    xss: int = 0
    retryable: int = 0
    scheduled: int = 0
    cancelled: int = 0
    available: int = 0


async def seed(dsn: str, *, completed: int = 12) -> Seeded:
    """Run real workers (burst) until every state but ``running`` has its jobs."""
    out = Seeded()
    async with pgq.Client(dsn) as client:
        for i in range(completed):
            job = await client.enqueue(
                "send_email", {"to": f"user{i}@example.com"}, queue="emails", tags=["welcome"]
            )
            out.completed.append(job.id)
        out.discarded = (await client.enqueue("broken", {"note": "once"}, queue="emails")).id
        out.xss = (
            await client.enqueue(
                "broken", {"note": f"{SCRIPT} {ATTRIBUTE}"}, queue="emails", tags=[ATTRIBUTE]
            )
        ).id
        out.retryable = (await client.enqueue("flaky", queue="emails")).id
        out.scheduled = (
            await client.enqueue("send_email", {"to": "later@example.com"}, delay=3600)
        ).id
        cancelled = await client.enqueue("send_email", {"to": "never@example.com"}, delay=3600)
        await client.cancel(cancelled.id)
        out.cancelled = cancelled.id
        out.available = (
            await client.enqueue("send_email", {"to": "held@example.com"}, queue="held")
        ).id
    await pgq.Worker(app, dsn, queues={"emails": 4}).run(burst=True)
    return out
