"""Typed enqueue that a type checker must refuse: each line marked BAD is an error."""

from __future__ import annotations

import pgq

app = pgq.App()


@app.task
async def send_welcome(ctx: pgq.JobContext, to: str) -> None: ...


async def use(client: pgq.Client) -> None:
    send_welcome.spec(signupid=1)  # BAD: no such argument
    send_welcome.spec(to=42)  # BAD: wrong type
    send_welcome.spec()  # BAD: missing argument
    job = await client.enqueue(send_welcome.spec(to="a@b.c"))
    done = await client.wait(job)
    done.result.upper()  # BAD: the result is None


def run(dsn: str) -> None:
    pgq.Worker(app, dsn, stale_afer=5)  # BAD: a misspelt setting
    pgq.Worker(app, dsn, concurrency="4")  # BAD: a setting of the wrong type


@app.task
async def reads_state(ctx: pgq.JobContext) -> int:
    return ctx.state(str)  # BAD: the state asked for is a str
