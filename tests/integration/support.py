"""Helpers the integration tests of the worker share: a burst run."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel

import pgq


async def burst(app: pgq.App, dsn: str, limit_s: float = 30, **kw: Any) -> None:
    with anyio.fail_after(limit_s):
        await pgq.Worker(app, dsn, **kw).run(burst=True)
