"""Multi-host DSNs (as HA setups write them) everywhere pgq connects: pgq migrate (alembic),
the Client, the Worker, the CLI. The first host refuses connections; the second is the
server."""

from __future__ import annotations

import sys
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

import pgq
from pgq._core.dsn import mask_dsn
from tests.faults.workers import free_port

pytestmark = pytest.mark.anyio

PGQ = [sys.executable, "-m", "pgq"]


def several_hosts(dsn: str) -> str:
    """``dsn`` with a host that refuses connections listed first."""
    parts = urlsplit(dsn)
    if "host=/" in parts.query:
        pytest.skip("the embedded server listens on a Unix socket only: no host list to make")
    user, _, host = parts.netloc.rpartition("@")
    hosts = f"127.0.0.1:{free_port()},{host}"
    query = "&".join(q for q in [parts.query, "target_session_attrs=read-write"] if q)
    return urlunsplit(parts._replace(netloc=f"{user}@{hosts}" if user else hosts, query=query))


async def test_migrate_client_and_worker_take_a_dsn_with_several_hosts(empty_dsn: str) -> None:
    dsn = several_hosts(empty_dsn)
    migrated = await anyio.run_process([*PGQ, "migrate", "--dsn", dsn], check=False)
    assert migrated.returncode == 0, migrated.stderr.decode()
    app = pgq.App()
    ran: list[int] = []

    @app.task
    async def note(ctx: pgq.JobContext, n: int) -> None:
        ran.append(n)

    async with pgq.Client(dsn, app=app) as client:
        await client.enqueue_many([note.spec(n=i) for i in range(20)])
    await pgq.Worker(app, dsn).run(burst=True)
    assert sorted(ran) == list(range(20))
    listed = await anyio.run_process([*PGQ, "stats", "--dsn", dsn, "--json"], check=False)
    assert listed.returncode == 0, listed.stderr.decode()


def test_a_password_in_a_host_list_is_masked() -> None:
    dsn = "postgresql://app:s3cret@db1:5432,db2:5432/app?target_session_attrs=read-write"
    assert "s3cret" not in mask_dsn(dsn)
    assert mask_dsn(dsn).startswith("postgresql://app:***@db1:5432,db2:5432/app")
