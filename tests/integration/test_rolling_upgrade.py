"""Rolling upgrades (docs/migrations.md): a newer release migrates first, and workers of
this release go on running on its additive schema (start, claim, complete, restart); a
schema that no longer serves this release, or one older than it, is refused with advice."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from pgq import migrate
from pgq._db.revision import KNOWN_REVISIONS, SCHEMA_REVISION, check_schema

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
FUTURE = Path(__file__).resolve().parent / "future_migrations"


def apply_future(dsn: str) -> None:
    """`pgq migrate` of a future release: pgq's revisions and the test-only pgq_9999."""
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))  # the repo's environment, given more revisions
    cfg.attributes["pgq_dsn"] = dsn
    cfg.attributes["configure_logger"] = False
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("version_locations", f"{migrate.migrations_dir() / 'versions'} {FUTURE}")
    command.upgrade(cfg, "pgq_9999")


async def pgq_migrate(dsn: str) -> tuple[int, str, str]:
    """`pgq migrate` of this release, as a deploy hook runs it."""
    out = await anyio.run_process(
        [sys.executable, "-m", "pgq", "migrate", "--dsn", dsn], check=False
    )
    return out.returncode, out.stdout.decode(), out.stderr.decode()


async def burst(app: pgq.App, dsn: str) -> None:
    with anyio.fail_after(30):
        await pgq.Worker(app, dsn, queues={"q": 4}).run(burst=True)


def counting_app(done: list[int]) -> pgq.App:
    app = pgq.App()

    @app.task(queue="q")
    async def work(ctx: pgq.JobContext, n: int) -> int:
        done.append(n)
        return n

    return app


async def test_this_release_runs_on_a_newer_additive_schema(
    dsn: str, conn: asyncpg.Connection
) -> None:
    await anyio.to_thread.run_sync(apply_future, dsn)
    assert await conn.fetchval("SELECT version_num FROM pgq_alembic_version") == "pgq_9999"
    # The newer release's code writes what it added; this release's never reads it.
    await conn.execute(
        "INSERT INTO pgq_jobs (queue, task, args, future_note) "
        "VALUES ('q', 'work', '{\"n\": 0}', 'written by the newer release');"
        "INSERT INTO pgq_future (note) VALUES ('kept')"
    )
    await check_schema(conn)
    done: list[int] = []
    app = counting_app(done)
    async with pgq.Client(dsn) as client:
        first = [await client.enqueue("work", {"n": n}, queue="q") for n in (1, 2)]
        await burst(app, dsn)  # start, claim, complete
        assert sorted(done) == [0, 1, 2]
        # A restart: a new worker, embedded this time, takes the next job.
        finished = anyio.Event()

        @app.task(queue="q", name="signal")
        async def signal(ctx: pgq.JobContext) -> None:
            finished.set()

        async with pgq.Worker(app, dsn, queues={"q": 4}):
            await client.enqueue("signal", queue="q")
            with anyio.fail_after(30):
                await finished.wait()
        for job in first:
            got = await client.get_job(job.id)
            assert got is not None and got.state is pgq.JobState.COMPLETED
    assert (
        await conn.fetchval(
            "SELECT state::text FROM pgq_jobs WHERE future_note = 'written by the newer release'"
        )
        == "completed"
    )
    assert await conn.fetchval("SELECT note FROM pgq_future") == "kept"
    # The sync client judges the same way.
    with pgq.SyncClient(dsn) as sync_client:
        assert sync_client.enqueue("work", {"n": 3}, queue="q").id > 0
    # This release's `pgq migrate` (a deploy hook of an old pod) leaves the schema as it is.
    code, out, err = await pgq_migrate(dsn)
    assert code == 0, err
    assert "pgq schema at revision pgq_9999" in out and "left as it is" in out
    assert await migrate.upgrade_async(dsn) == "pgq_9999"
    assert await conn.fetchval("SELECT version_num FROM pgq_alembic_version") == "pgq_9999"


async def test_a_newer_schema_that_no_longer_serves_this_release_is_refused(
    dsn: str, conn: asyncpg.Connection
) -> None:
    await anyio.to_thread.run_sync(apply_future, dsn)
    # As a breaking revision of that release records it: its own code, or newer, only.
    await conn.execute("UPDATE pgq_schema_compat SET min_code_revision = 'pgq_9999'")
    advice = "run a pgq release that ships revision pgq_9999 or later"
    with pytest.raises(pgq.SchemaMismatch, match=advice) as info:
        await burst(counting_app([]), dsn)
    assert "run `pgq migrate`" not in str(info.value)
    with pytest.raises(pgq.SchemaMismatch, match=advice):
        async with pgq.Client(dsn):
            pass
    with pytest.raises(pgq.SchemaMismatch, match=advice), pgq.SyncClient(dsn):
        pass
    code, _, err = await pgq_migrate(dsn)
    assert code == 1 and advice in err and "Traceback" not in err
    with pytest.raises(pgq.SchemaMismatch, match="cannot undo a revision it does not have"):
        await migrate.downgrade_async(dsn)


async def test_an_older_schema_is_refused_until_migrated(dsn: str) -> None:
    previous = KNOWN_REVISIONS[KNOWN_REVISIONS.index(SCHEMA_REVISION) - 1]
    await migrate.downgrade_async(dsn, previous)
    done: list[int] = []
    app = counting_app(done)
    with pytest.raises(
        pgq.SchemaMismatch,
        match=rf"schema at revision {previous}, this pgq needs {SCHEMA_REVISION}: run `pgq migrate`",
    ):
        await burst(app, dsn)
    code, out, err = await pgq_migrate(dsn)
    assert code == 0, err
    assert out.strip() == f"pgq schema at revision {SCHEMA_REVISION}"
    async with pgq.Client(dsn) as client:
        await client.enqueue("work", {"n": 1}, queue="q")
    await burst(app, dsn)
    assert done == [1]


async def test_upgrade_on_leaves_a_newer_schema_that_serves_this_release(
    dsn: str, conn: asyncpg.Connection
) -> None:
    """A project's env.py of the older release (pgq.migrate.upgrade_on) after the newer
    release migrated: nothing to do while the schema serves it, the advice once it does
    not."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from pgq._core.dsn import sqlalchemy_url

    await anyio.to_thread.run_sync(apply_future, dsn)
    engine = create_async_engine(sqlalchemy_url(dsn))
    try:
        async with engine.connect() as connection:
            await connection.run_sync(migrate.upgrade_on)
        assert await conn.fetchval("SELECT version_num FROM pgq_alembic_version") == "pgq_9999"
        await conn.execute("UPDATE pgq_schema_compat SET min_code_revision = 'pgq_9999'")
        async with engine.connect() as connection:
            with pytest.raises(pgq.SchemaMismatch, match="ships revision pgq_9999 or later"):
                await connection.run_sync(migrate.upgrade_on)
    finally:
        await engine.dispose()
