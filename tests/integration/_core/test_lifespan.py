"""@app.lifespan: opened once per worker, its value reached through ctx.state, closed on
every way a worker stops (pgq worker on a signal and at the end of --burst, an embedded
Worker, a start-up that fails half way, testing.drain and testing.run_task)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

import pgq
from pgq import testing

pytestmark = pytest.mark.anyio


@dataclass
class Resources:
    name: str
    events: list[str] = field(default_factory=list)


def app_with_lifespan(events: list[str], *, fail: bool = False) -> pgq.App:
    app = pgq.App()

    @app.lifespan
    @contextlib.asynccontextmanager
    async def resources() -> AsyncIterator[Resources]:
        events.append("open")
        if fail:
            raise RuntimeError("the model would not load")
        try:
            yield Resources("shared", events)
        finally:
            events.append("close")

    @app.task
    async def use(ctx: pgq.JobContext) -> str:
        res = ctx.state(Resources)
        res.events.append(f"job {ctx.id}")
        return res.name

    @app.task
    def use_in_a_thread(ctx: pgq.JobContext) -> str:
        return ctx.state(Resources).name

    return app


async def test_an_embedded_worker_opens_the_lifespan_once_and_closes_it_on_leaving(
    client: pgq.Client, dsn: str
) -> None:
    events: list[str] = []
    app = app_with_lifespan(events)
    jobs = [await client.enqueue("use"), await client.enqueue("use_in_a_thread")]
    async with pgq.Worker(app, dsn, poll_interval=0.05):
        assert events[0] == "open"
        for job in jobs:
            done = await client.wait(job, timeout=30)
            assert done.state is pgq.JobState.COMPLETED and done.result == "shared"
        assert "close" not in events
    assert events == ["open", f"job {jobs[0].id}", "close"]


async def test_the_lifespan_closes_when_leaving_async_with_on_an_error(dsn: str) -> None:
    events: list[str] = []
    with pytest.raises(BaseException) as raised:
        async with pgq.Worker(app_with_lifespan(events), dsn):
            raise ValueError("the service failed")
    assert raised.group_contains(ValueError, match="the service failed")
    assert events == ["open", "close"]


async def test_a_start_up_that_fails_after_the_lifespan_closes_it(dsn: str) -> None:
    events: list[str] = []
    # Without TLS: a connect that the failed start-up cuts off during asyncpg's TLS probe
    # leaves a future's error unread, which the event loop reports (and the test runner
    # raises) on a loaded machine. This test is about the lifespan, not about TLS.
    dsn += ("&" if "?" in dsn else "?") + "sslmode=disable"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BaseException) as raised:
            async with pgq.Worker(app_with_lifespan(events), dsn, health_port=port):
                pass
        # The port taken: pgq's error, the bind's OSError on its __cause__.
        assert raised.group_contains(pgq.ConfigError, match="health endpoint", depth=None)
    assert events == ["open", "close"]


async def test_a_lifespan_that_fails_to_open_stops_the_start_up(dsn: str) -> None:
    events: list[str] = []
    with pytest.raises(RuntimeError, match="would not load"):
        async with pgq.Worker(app_with_lifespan(events, fail=True), dsn):
            pass
    assert events == ["open"]


async def test_drain_and_run_task_run_inside_the_lifespan(client: pgq.Client, dsn: str) -> None:
    events: list[str] = []
    app = app_with_lifespan(events)
    job = await client.enqueue("use")
    result = await testing.drain(app, dsn)
    assert [j.result for j in result.completed] == ["shared"]
    assert events == ["open", f"job {job.id}", "close"]
    events.clear()
    assert await testing.run_task(app.get("use_in_a_thread")) == "shared"
    assert events == ["open", "close"]


async def test_ctx_state_says_what_is_wrong() -> None:
    plain = pgq.App()

    @plain.task
    async def reads(ctx: pgq.JobContext) -> None:
        ctx.state(Resources)

    with pytest.raises(pgq.ConfigError, match="register one with @app.lifespan"):
        await testing.run_task(reads)
    other = pgq.App()

    @other.lifespan
    @contextlib.asynccontextmanager
    async def numbers() -> AsyncIterator[int]:
        yield 1

    other.task(name="reads")(reads.fn)
    with pytest.raises(TypeError, match=r"ctx.state\(Resources\): the lifespan yielded a int"):
        await testing.run_task(other.get("reads"))
    with pytest.raises(pgq.ConfigError, match="has a lifespan already"):
        other.lifespan(numbers)


LIFESPAN_APP = textwrap.dedent("""\
    import contextlib
    import os
    from pathlib import Path

    import anyio
    import pgq

    app = pgq.App()
    events = Path(os.environ["EVENTS"])

    @app.lifespan
    @contextlib.asynccontextmanager
    async def resources():
        with events.open("a") as f:
            f.write("open\\n")
        try:
            yield "the engine"
        finally:
            with events.open("a") as f:
                f.write("close\\n")

    @app.task
    async def use(ctx):
        with events.open("a") as f:
            f.write(ctx.state(str) + "\\n")

    @app.task
    async def slow(ctx):
        print("STARTED", flush=True)
        await anyio.sleep(600)
    """)


async def test_pgq_worker_burst_closes_the_lifespan_at_the_end(
    python: str, client: pgq.Client, dsn: str, tmp_path: Path
) -> None:
    (tmp_path / "life_tasks.py").write_text(LIFESPAN_APP)
    events = tmp_path / "events"
    await client.enqueue("use")
    out = await anyio.run_process(
        [python, "-m", "pgq", "worker", "life_tasks:app", "--dsn", dsn, "--burst"],
        cwd=tmp_path,
        env={**os.environ, "EVENTS": str(events)},
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert events.read_text().splitlines() == ["open", "the engine", "close"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_pgq_worker_closes_the_lifespan_on_a_signal(
    python: str, client: pgq.Client, dsn: str, tmp_path: Path, signum: signal.Signals
) -> None:
    (tmp_path / "life_tasks.py").write_text(LIFESPAN_APP)
    events = tmp_path / "events"
    await client.enqueue("slow")
    proc = subprocess.Popen(  # noqa: ASYNC220 - a real process; its pipe is read in a thread
        [python, "-m", "pgq", "worker", "life_tasks:app", "--dsn", dsn, "--shutdown-timeout", "1"],
        cwd=tmp_path,
        env={**os.environ, "EVENTS": str(events)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = await anyio.to_thread.run_sync(proc.stdout.readline)
    assert line.strip() == "STARTED"
    assert events.read_text().splitlines() == ["open"]
    proc.send_signal(signum)
    _, err = await anyio.to_thread.run_sync(proc.communicate, None, 30)
    assert proc.returncode == 0, err
    assert events.read_text().splitlines() == ["open", "close"]
