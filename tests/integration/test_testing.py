"""pgq.testing and the pytest plugin, as a user's suite uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from pgq import testing

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def flaky_app() -> tuple[pgq.App, list[str]]:
    app = pgq.App()
    ran: list[str] = []

    @app.task(max_attempts=3, backoff=pgq.Backoff(base_s=3600))
    async def flaky(ctx: pgq.JobContext, fail: int) -> int:
        ran.append(f"flaky#{ctx.attempt}")
        if ctx.attempt <= fail:
            raise ValueError(f"failure {ctx.attempt}")
        return ctx.attempt

    @app.task
    def later(ctx: pgq.JobContext) -> str:
        ran.append("later")
        return "late"

    return app, ran


async def test_drain_runs_retries_and_delayed_jobs_without_waiting(
    client: pgq.Client, dsn: str
) -> None:
    app, ran = flaky_app()
    ok = await client.enqueue("flaky", {"fail": 1})
    doomed = await client.enqueue("flaky", {"fail": 9})
    delayed = await client.enqueue("later", delay=86400)
    other_app = await client.enqueue("not_this_apps_task")
    started = time.monotonic()
    result = await testing.drain(app, dsn)
    assert time.monotonic() - started < 20, "no hour of backoff, no day of delay waited"
    by_id = {j.id: j for j in result.jobs}
    assert set(by_id) == {ok.id, doomed.id, delayed.id}
    assert by_id[ok.id].state is pgq.JobState.COMPLETED and by_id[ok.id].result == 2
    assert by_id[doomed.id].state is pgq.JobState.DISCARDED and by_id[doomed.id].attempt == 3
    assert by_id[delayed.id].result == "late"
    assert [j.id for j in result.completed] == [ok.id, delayed.id]
    assert [j.id for j in result.discarded] == [doomed.id]
    assert sorted(ran) == sorted(["flaky#1", "flaky#2", "flaky#1", "flaky#2", "flaky#3", "later"])
    untouched = await client.get_job(other_app.id)
    assert untouched is not None and untouched.state is pgq.JobState.AVAILABLE


async def test_drain_without_time_travel_leaves_what_is_not_due(
    client: pgq.Client, dsn: str
) -> None:
    app, _ = flaky_app()
    job = await client.enqueue("flaky", {"fail": 1})
    result = await testing.drain(app, dsn, time_travel=False)
    (ran,) = result.jobs
    assert ran.id == job.id and ran.state is pgq.JobState.RETRYABLE, "its retry is an hour away"


async def test_drain_stops_a_job_that_would_never_end(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()

    @app.task
    async def forever(ctx: pgq.JobContext) -> None:
        raise pgq.Snooze(60)

    await client.enqueue("forever")
    with pytest.raises(pgq.PgqError, match="still waiting after 5 rounds"):
        await testing.drain(app, dsn, max_rounds=5)


async def test_assert_enqueued_finds_jobs_and_says_what_waits_instead(
    client: pgq.Client,
) -> None:
    app, _ = flaky_app()
    task = app.get("flaky")
    await client.enqueue(task.spec(fail=1), queue="slow")
    await client.enqueue(task.spec(fail=2), delay=60)
    (job,) = await testing.assert_enqueued(client, task, {"fail": 1}, queue="slow")
    assert job.args == {"fail": 1}
    assert len(await testing.assert_enqueued(client, "flaky", count=2)) == 2
    with pytest.raises(AssertionError) as info:
        await testing.assert_enqueued(client, task, {"fail": 3})
    message = str(info.value)
    assert "expected a job of 'flaky' with args containing {'fail': 3}, found 0" in message
    assert 'flaky({"fail":1}) in queue slow' in message and 'flaky({"fail":2})' in message
    with pytest.raises(AssertionError, match="expected exactly 1 job of 'flaky'"):
        await testing.assert_enqueued(client, task, count=1)


async def test_run_task_calls_a_task_with_a_real_context() -> None:
    app = pgq.App()

    @app.task
    async def greet(ctx: pgq.JobContext, name: str) -> str:
        return f"hello {name} (job {ctx.id}, attempt {ctx.attempt})"

    @app.task
    def shout(ctx: pgq.JobContext, word: str) -> str:
        ctx.log.info("shouting")
        return word.upper()

    @app.task
    async def retrying(ctx: pgq.JobContext) -> None:
        raise pgq.Retry(5, reason="later")

    assert await testing.run_task(greet, "ada") == "hello ada (job 0, attempt 1)"
    assert await testing.run_task(shout, word="hey") == "HEY"
    with pytest.raises(pgq.Retry, match="later"):
        await testing.run_task(retrying)


async def test_run_task_cannot_run_a_task_that_completes_in_its_own_transaction(
    client: pgq.Client, dsn: str
) -> None:
    """docs/testing.md: run_task has no worker behind its context, so ctx.complete says
    so; drain, a real worker, runs the same task."""
    app = pgq.App()

    @app.task
    async def settles(ctx: pgq.JobContext) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await ctx.complete(connection=conn, result="in my transaction")
        finally:
            await conn.close()

    with pytest.raises(pgq.ConfigError, match="pgq.testing.drain runs one"):
        await testing.run_task(settles)
    await client.enqueue(settles.spec())
    (job,) = (await testing.drain(app, dsn)).completed
    assert job.result == "in my transaction"


def test_an_applications_suite_runs_with_the_plugin(server_dsn: str, tmp_path: Path) -> None:
    """docs/examples/testing, run by pytest as the application's own suite would be: the
    plugin arrives through its entry point and finds the server from PGQ_TEST_DSN."""
    env = {**os.environ, "PGQ_TEST_DSN": server_dsn}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "docs/examples/testing"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 passed" in out.stdout
    assert "pgq: tests use the server of PGQ_TEST_DSN" in out.stdout


SHARED_SERVER_CONFTEST = """\
import os

os.getpid = lambda: 4242  # two CI containers: their own PID namespaces, the same pid
"""

SHARED_SERVER_TEST = """\
import json
import os
import time
from pathlib import Path

import anyio
import asyncpg


async def count_jobs(dsn):
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM pgq_jobs")
    finally:
        await conn.close()


def test_side_by_side(pgq_database, pgq_dsn):
    me, other = Path(os.environ["ME"]), Path(os.environ["OTHER"])
    me.write_text(json.dumps({"dsn": pgq_dsn, "template": pgq_database.template()}))
    deadline = time.monotonic() + 60
    while not other.exists():  # both sessions hold their template at once
        assert time.monotonic() < deadline, "the other session never started"
        time.sleep(0.05)
    later = pgq_database.create()  # from this session's template, still there
    assert anyio.run(count_jobs, pgq_dsn) == anyio.run(count_jobs, later) == 0
    pgq_database.drop(later)
"""


def test_two_sessions_with_the_same_pid_share_a_server(server_dsn: str, tmp_path: Path) -> None:
    """Two suites at once on one server, their process ids alike (two containers): names
    cannot collide, neither drops the other's databases, both pass."""
    runs = []
    for me, other in (("a", "b"), ("b", "a")):
        suite = tmp_path / me
        suite.mkdir()
        (suite / "conftest.py").write_text(SHARED_SERVER_CONFTEST)
        (suite / "test_shared.py").write_text(SHARED_SERVER_TEST)
        if me == "b":
            (suite / "pytest.ini").write_text("[pytest]\npgq_db_prefix = ci_b\n")
        env = {
            **os.environ,
            "PGQ_TEST_DB_PREFIX": "not_this_one",  # the option, then the ini setting, win
            "PGQ_TEST_DSN": server_dsn,
            "ME": str(tmp_path / f"{me}.json"),
            "OTHER": str(tmp_path / f"{other}.json"),
        }
        args = ["--pgq-db-prefix", "ci_a"] if me == "a" else []
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                cwd=suite,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for run in runs:
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0, out
        assert "1 passed" in out
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["template"].startswith("ci_a_") and b["template"].startswith("ci_b_")
    assert a["dsn"] != b["dsn"]


async def test_the_test_database_never_drops_what_it_did_not_make(
    pgq_database: testing.TestDatabase, server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name already taken on the server is an error, not a database dropped and remade."""
    monkeypatch.setenv("PGQ_TEST_DB_PREFIX", "from_env")
    assert testing.TestDatabase(server_dsn).name_base.startswith("from_env_")
    mine = testing.TestDatabase(server_dsn, prefix="pgq_foreign")
    taken = f"{mine.name_base}_0"
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{taken}"')
        try:
            with pytest.raises(asyncpg.DuplicateDatabaseError):
                await anyio.to_thread.run_sync(lambda: mine.create(migrated=False))
            with pytest.raises(pgq.ConfigError, match="not created by this TestDatabase"):
                mine.drop(mine.dsn_of(taken))
            await anyio.to_thread.run_sync(mine.close)
            assert await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", taken)
        finally:
            await conn.execute(f'DROP DATABASE "{taken}"')
    finally:
        await conn.close()
    with pytest.raises(pgq.ConfigError, match="prefix"):
        testing.TestDatabase(server_dsn, prefix="Bad-Prefix")


async def test_the_test_database_makes_databases_of_their_own(
    pgq_database: testing.TestDatabase,
) -> None:
    first = await anyio.to_thread.run_sync(pgq_database.create)
    empty = await anyio.to_thread.run_sync(lambda: pgq_database.create(migrated=False))
    try:
        async with pgq.Client(first) as client:
            assert (await client.enqueue("t")).id == 1
        with pytest.raises(pgq.SchemaMismatch):
            async with pgq.Client(empty):
                pass
    finally:
        await anyio.to_thread.run_sync(pgq_database.drop, first)
        await anyio.to_thread.run_sync(pgq_database.drop, empty)
