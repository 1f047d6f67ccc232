"""The App's lifespan run around a worker's jobs (or pgq.testing's): entered once, its value
made what ``ctx.state`` returns, left shielded from cancellation however the run ends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from pgq.errors import ConfigError
from pgq.job import LIFESPAN_STATE

#: What ``@app.lifespan`` takes: an async context manager factory taking no argument.
Lifespan = Callable[[], contextlib.AbstractAsyncContextManager[Any]]


@contextlib.asynccontextmanager
async def running(lifespan: Lifespan | None) -> AsyncIterator[None]:
    """Enter ``lifespan`` (if any) and make its value what ``ctx.state`` returns in the jobs
    run inside."""
    if lifespan is None:
        yield
        return
    manager = lifespan()
    if not isinstance(manager, contextlib.AbstractAsyncContextManager):
        raise ConfigError(
            f"the lifespan {lifespan!r} returned {manager!r}, not an async context manager: "
            "decorate it with @contextlib.asynccontextmanager"
        )
    value = await manager.__aenter__()
    token = LIFESPAN_STATE.set(value)
    try:
        yield
    except BaseException as exc:
        LIFESPAN_STATE.reset(token)
        # Shielded: a worker leaving on an error (its task group cancelled) still closes
        # what its lifespan opened.
        with anyio.CancelScope(shield=True):
            if not await manager.__aexit__(type(exc), exc, exc.__traceback__):
                raise
    else:
        LIFESPAN_STATE.reset(token)
        with anyio.CancelScope(shield=True):
            await manager.__aexit__(None, None, None)
