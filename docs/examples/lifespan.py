"""A worker's resources, opened once and handed to every task (docs/embedding.md): run it with
`pgq worker lifespan:app`; pgq's suite runs it from the installed wheel."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pgq

app = pgq.App()


@dataclass
class Resources:
    """What every task of the worker shares: an engine, an HTTP client, a model..."""

    greeting: str
    greeted: list[str] = field(default_factory=list)


@app.lifespan
@contextlib.asynccontextmanager
async def resources() -> AsyncIterator[Resources]:
    print("lifespan: opened", flush=True)  # e.g. engine = create_async_engine(...)
    res = Resources("hello")
    try:
        yield res
    finally:  # runs however the worker stops: a signal, --burst's end, leaving `async with`
        print(f"lifespan: closed after greeting {', '.join(res.greeted)}", flush=True)


@app.task
async def greet(ctx: pgq.JobContext, name: str) -> str:
    res = ctx.state(Resources)  # typed: a Resources, or a TypeError saying what it is
    res.greeted.append(name)
    return f"{res.greeting} {name}"
