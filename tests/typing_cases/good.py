"""Typed enqueue that a type checker must accept (tests/unit/test_typing.py runs mypy)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import assert_type

import pgq

app = pgq.App()


@app.task(queue="emails")
async def send_welcome(ctx: pgq.JobContext, to: str, retries: int = 0) -> dict[str, str]:
    return {"sent": to}


@app.task
def report(ctx: pgq.JobContext, day: str) -> int:
    return len(day)


async def use(client: pgq.Client) -> None:
    spec = send_welcome.spec(to="ada@example.com")
    assert_type(spec, pgq.JobSpec[dict[str, str]])
    job = await client.enqueue(spec, delay=10)
    assert_type(job, pgq.Job[dict[str, str]])
    done = await client.wait(job)
    assert_type(done.result, dict[str, str] | None)
    await client.enqueue(send_welcome.spec("bob@example.com", retries=2).with_options(priority=5))
    await client.enqueue_many([send_welcome.spec(to="a@b.c"), report.spec(day="monday")])
    by_name = await client.enqueue("send_welcome", {"to": "cy@example.com"})
    assert_type(by_name, pgq.Job)


def workers(dsn: str) -> None:
    pgq.Worker(app, dsn, stale_after=60, concurrency=4, retention_completed=None, log_jobs=True)
    pgq.Worker(app, dsn, queues={"emails": 2}, settings=pgq.WorkerSettings(), poll_interval=0.5)


async def handles(client: pgq.Client) -> None:
    try:
        await client.get_job(1)
    except pgq.TransactionConflict as exc:
        assert_type(exc.sqlstate, str | None)
    except pgq.ClientClosed as exc:
        assert_type(exc, pgq.ClientClosed)


@dataclass
class Resources:
    greeting: str


@app.lifespan
@contextlib.asynccontextmanager
async def resources() -> AsyncIterator[Resources]:
    yield Resources("hello")


@app.task
async def greet(ctx: pgq.JobContext, name: str) -> str:
    res = ctx.state(Resources)
    assert_type(res, Resources)
    return f"{res.greeting} {name}"
