"""Which of pgq's source files one job's path crosses, from ``Client.enqueue`` to the commit
of its outcome in a real worker: the figure of docs/architecture.md's "path of a job".

    .venv/bin/python -m tests.tools.job_path        # PGQ_TEST_DSN, or 127.0.0.1:5432

A worker runs in this process on a database of its own (pgq.testing.TestDatabase), its
background rounds (heartbeats, the leader's services, polls) set far apart so that none
falls in a window. Each window runs under ``sys.setprofile``: it opens with the call of
``Client.enqueue`` and closes when the statement that writes the outcome returns (its
commit done: ``OUTCOME_WRITES``); the tool then waits until the job reads ``completed`` on
a connection of its own (asyncpg, no pgq code). A warm-up job goes first; the files are
those every one of ``ROUNDS`` windows called into.
"""

from __future__ import annotations

import asyncio
import dis
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg

import pgq
from pgq.testing import TestDatabase

SRC = Path(pgq.__file__).resolve().parent
ROUNDS = 3
#: The functions whose return ends a window: the outcome's statement has committed.
OUTCOME_WRITES = {"complete_successes", "write_outcomes"}
_RETURN = dis.opmap["RETURN_VALUE"]
#: Far apart: no background round of the worker's falls in a window of a few milliseconds.
QUIET = {
    "poll_interval": 600.0,
    "heartbeat_interval": 60.0,
    "stale_after": 600.0,
    "rescue_interval": 600.0,
    "schedule_interval": 600.0,
    "retention_interval": 600.0,
    "leader_ttl": 600.0,
    "reap_after": 3600.0,
}


def _app() -> pgq.App:
    app = pgq.App()

    @app.task(queue="path")
    async def noop(ctx: pgq.JobContext) -> None:
        return None

    return app


async def _window(client: pgq.Client, conn: asyncpg.Connection[Any]) -> set[str]:
    """The pgq files one job's path calls into."""
    files: set[str] = set()
    src = str(SRC)
    written = False

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal written
        if written:
            return
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(src):
            files.add(code.co_filename)
        elif (
            event == "return"
            and code.co_name in OUTCOME_WRITES
            and code.co_filename.startswith(src)
            and code.co_code[frame.f_lasti] == _RETURN  # returned, not suspended at an await
        ):
            written = True

    sys.setprofile(profile)
    try:
        job = await client.enqueue("noop", {})
        state = None
        # Polled: nothing of pgq's may run to tell us. Both, so that no write of this job's
        # returns in the next window.
        while state != "completed" or not written:
            await asyncio.sleep(0.001)
            state = await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", job.id)
    finally:
        sys.setprofile(None)
    return files


async def _measure(dsn: str) -> tuple[set[str], Counter[str]]:
    app = _app()
    seen: Counter[str] = Counter()
    conn = await asyncpg.connect(dsn)
    try:
        async with (
            pgq.Client(dsn, app=app) as client,
            pgq.Worker(app, dsn, queues={"path": 1}, **QUIET) as worker,  # type: ignore[arg-type]
        ):
            await worker.started.wait()
            await _window(client, conn)  # warm-up: first-use costs are not the path
            await asyncio.sleep(0.5)  # the eager leader services' first rounds end
            for _ in range(ROUNDS):
                seen.update(await _window(client, conn))
    finally:
        await conn.close()
    every = {f for f, n in seen.items() if n == ROUNDS}
    return every, seen


def main() -> None:
    """Print the files on the path, by package, and their count."""
    database = TestDatabase.start(prefix="pgq_job_path")
    try:
        dsn = database.create()
        every, seen = asyncio.run(_measure(dsn))
    finally:
        database.close()
    for name in sorted(every):
        print(Path(name).relative_to(SRC.parent))
    sometimes = sorted(set(seen) - every)
    if sometimes:
        print(f"(in some windows only: {', '.join(Path(f).name for f in sometimes)})")
    print(f"{len(every)} files on the path of a job")


if __name__ == "__main__":
    main()
