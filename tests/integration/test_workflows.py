"""Job dependencies (``depends_on``, the ``pending`` state, what a failed parent means),
chains and groups, and per-key limits, on one worker in this process. The same under
several worker processes and kills: tests/faults/test_flow_control.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgq
from tests.integration.test_lifecycle import QUICK
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


def workflow_app() -> tuple[pgq.App, list[tuple[str, Any]]]:
    """Tasks that record what they ran (name, what they saw) in the returned list."""
    app = pgq.App()
    ran: list[tuple[str, Any]] = []

    @app.task
    async def step(ctx: pgq.JobContext, n: int) -> int:
        ran.append(("step", n))
        return n * 10

    @app.task(max_attempts=1)
    async def broken(ctx: pgq.JobContext) -> None:
        ran.append(("broken", ctx.id))
        raise RuntimeError("it broke")

    @app.task
    async def collect(ctx: pgq.JobContext) -> list[Any]:
        seen = [(p.id, p.state.value, p.result) for p in ctx.parents]
        ran.append(("collect", seen))
        return [p.result for p in ctx.parents]

    @app.task
    def collect_sync(ctx: pgq.JobContext) -> list[Any]:
        seen = [p.result for p in ctx.parents]
        ran.append(("collect_sync", seen))
        return seen

    return app, ran


async def state_of(conn: Conn, job_id: int) -> str:
    return str(await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", job_id))


async def test_a_dependent_waits_pending_until_its_parent_completes(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    app, ran = workflow_app()
    parent = await client.enqueue("step", {"n": 1}, delay=3600)  # not due: the child waits
    child = await client.enqueue("step", {"n": 2}, depends_on=[parent])
    assert child.state is pgq.JobState.PENDING
    assert child.depends_on == [parent.id]
    assert (await client.get_job(child.id)).depends_on == [parent.id]  # type: ignore[union-attr]
    async with pgq.Worker(app, dsn, **QUICK):
        await client.retry([parent.id])  # due now
        done = await client.wait(child, timeout=20)
    assert done.state is pgq.JobState.COMPLETED
    assert ran == [("step", 1), ("step", 2)]  # the child ran after its parent


async def test_a_failed_parent_cancels_its_dependents_down_the_line(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    app, ran = workflow_app()
    parent = await client.enqueue("broken")
    child = await client.enqueue("step", {"n": 1}, depends_on=[parent])
    grandchild = await client.enqueue("step", {"n": 2}, depends_on=[child.id])
    anyway = await client.enqueue("step", {"n": 3}, depends_on=[parent], on_parent_failure="run")
    async with pgq.Worker(app, dsn, **QUICK):
        assert (await client.wait(grandchild, timeout=20)).state is pgq.JobState.CANCELLED
        assert (await client.wait(anyway, timeout=20)).state is pgq.JobState.COMPLETED
    cancelled = await client.get_job(child.id)
    assert cancelled is not None and cancelled.state is pgq.JobState.CANCELLED
    assert cancelled.errors[-1]["kind"] == "dependency"
    assert f"parent job {parent.id} was discarded" in cancelled.errors[-1]["message"]
    assert [r for r in ran if r[0] == "step"] == [("step", 3)]  # only the one that runs anyway


async def test_a_job_waits_for_every_parent(dsn: str, client: pgq.Client, conn: Conn) -> None:
    app, _ran = workflow_app()
    a = await client.enqueue("step", {"n": 1}, delay=3600)
    b = await client.enqueue("step", {"n": 2}, delay=3600)
    child = await client.enqueue("collect", depends_on=[a, b.id, a])  # a twice: one parent
    assert child.depends_on == [a.id, b.id]
    async with pgq.Worker(app, dsn, **QUICK):
        await client.retry([a.id])
        await client.wait(a, timeout=20)
        assert await state_of(conn, child.id) == "pending"  # b is still to come
        await client.retry([b.id])
        done = await client.wait(child, timeout=20)
    assert done.result == [10, 20]


async def test_enqueue_refuses_parents_that_do_not_exist_and_writes_nothing(
    client: pgq.Client, conn: Conn
) -> None:
    parent = await client.enqueue("step", {"n": 1})
    with pytest.raises(pgq.ConfigError, match="do not exist"):
        await client.enqueue("step", {"n": 2}, depends_on=[parent, 999_999])
    with pytest.raises(pgq.ConfigError, match="list of jobs or job ids"):
        await client.enqueue("step", {"n": 2}, depends_on=parent)  # type: ignore[call-overload]
    with pytest.raises(pgq.ConfigError, match="on_parent_failure"):
        await client.enqueue("step", {"n": 2}, depends_on=[parent], on_parent_failure="ignore")
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 1


async def test_a_parent_that_already_failed_cancels_the_new_job_at_once(
    client: pgq.Client,
) -> None:
    parent = await client.enqueue("step", {"n": 1})
    await client.cancel(parent.id)
    child = await client.enqueue("step", {"n": 2}, depends_on=[parent])
    assert child.state is pgq.JobState.CANCELLED
    done = await client.get_job(child.id)
    assert done is not None and "had failed before it was enqueued" in done.errors[0]["message"]
    anyway = await client.enqueue("step", {"n": 3}, depends_on=[parent], on_parent_failure="run")
    assert anyway.state is pgq.JobState.AVAILABLE


async def test_cancelling_a_pending_job_cancels_its_dependents(client: pgq.Client) -> None:
    parent = await client.enqueue("step", {"n": 1}, delay=3600)
    child = await client.enqueue("step", {"n": 2}, depends_on=[parent])
    grandchild = await client.enqueue("step", {"n": 3}, depends_on=[child])
    cancelled = await client.cancel(child.id)
    assert cancelled is not None and cancelled.state is pgq.JobState.CANCELLED
    after = await client.get_job(grandchild.id)
    assert after is not None and after.state is pgq.JobState.CANCELLED


async def test_a_dependent_enqueued_in_a_rolled_back_transaction_leaves_nothing(
    client: pgq.Client, dsn: str, conn: Conn
) -> None:
    parent = await client.enqueue("step", {"n": 1})
    own = await asyncpg.connect(dsn)
    try:
        tx = own.transaction()
        await tx.start()
        await client.enqueue("step", {"n": 2}, depends_on=[parent], connection=own)
        await tx.rollback()
    finally:
        await own.close()
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 1


async def test_a_chain_runs_in_order_and_passes_results_along(dsn: str, client: pgq.Client) -> None:
    app, ran = workflow_app()
    jobs = await client.enqueue_chain(
        [pgq.JobSpec("step", {"n": 1}), pgq.JobSpec("step", {"n": 2}), pgq.JobSpec("collect")]
    )
    assert [j.state for j in jobs] == [
        pgq.JobState.AVAILABLE, pgq.JobState.PENDING, pgq.JobState.PENDING,
    ]  # fmt: skip
    assert jobs[2].depends_on == [jobs[1].id]
    async with pgq.Worker(app, dsn, **QUICK):
        last = await client.wait(jobs[2], timeout=20)
    assert ran[:2] == [("step", 1), ("step", 2)]
    assert last.result == [20]  # collect saw its predecessor's result


async def test_a_group_callback_sees_every_members_result_in_order(
    dsn: str, client: pgq.Client
) -> None:
    app, _ran = workflow_app()
    members, callback = await client.enqueue_group(
        [pgq.JobSpec("step", {"n": n}) for n in (3, 1, 2)], pgq.JobSpec("collect_sync")
    )
    assert callback.depends_on == [m.id for m in members]
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(callback, timeout=20)
    assert done.result == [30, 10, 20]  # a plain def task reads ctx.parents too


async def test_a_group_callback_that_runs_anyway_sees_failed_members(
    dsn: str, client: pgq.Client
) -> None:
    app, ran = workflow_app()
    _members, callback = await client.enqueue_group(
        [pgq.JobSpec("step", {"n": 1}), pgq.JobSpec("broken")],
        pgq.JobSpec("collect", on_parent_failure="run"),
    )
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(callback, timeout=20)
    assert done.state is pgq.JobState.COMPLETED
    (seen,) = [r[1] for r in ran if r[0] == "collect"]
    assert [(s[1], s[2]) for s in seen] == [("completed", 10), ("discarded", None)]


async def test_pending_jobs_take_a_unique_key(client: pgq.Client) -> None:
    parent = await client.enqueue("step", {"n": 1}, delay=3600)
    first = await client.enqueue("step", {"n": 2}, depends_on=[parent], unique_key="k")
    again = await client.enqueue("step", {"n": 2}, depends_on=[parent], unique_key="k")
    assert first.state is pgq.JobState.PENDING
    assert again.duplicate and again.id == first.id


async def test_the_sync_client_enqueues_chains_and_groups(dsn: str, client: pgq.Client) -> None:
    def build() -> tuple[list[pgq.Job], pgq.Job]:
        with pgq.SyncClient(dsn) as sync:
            chain = sync.enqueue_chain([pgq.JobSpec("step", {"n": 1}), pgq.JobSpec("collect")])
            _, callback = sync.enqueue_group(
                [pgq.JobSpec("step", {"n": 2})], pgq.JobSpec("collect")
            )
        return chain, callback

    chain, callback = await anyio.to_thread.run_sync(build)
    assert chain[1].state is pgq.JobState.PENDING and chain[1].depends_on == [chain[0].id]
    assert callback.state is pgq.JobState.PENDING
    app, _ = workflow_app()
    async with pgq.Worker(app, dsn, **QUICK):
        assert (await client.wait(chain[1], timeout=20)).result == [10]
        assert (await client.wait(callback, timeout=20)).result == [20]


# --------------------------------------------------------------------------- per-key limits


async def test_limit_keys_come_from_enqueue_or_from_the_tasks_argument(
    client: pgq.Client,
) -> None:
    app = pgq.App()

    @app.task(limit_key_arg="customer")
    async def bill(ctx: pgq.JobContext, customer: int) -> None:
        pass

    async with pgq.Client(pool=client.pool, app=app) as own:
        by_arg = await own.enqueue(bill.spec(customer=42))
        given = await own.enqueue(bill.spec(customer=42), limit_key="vip")
    assert by_arg.limit_key == "42" and given.limit_key == "vip"
    stored = await client.get_job(by_arg.id)
    assert stored is not None and stored.limit_key == "42"
    with pytest.raises(pgq.ConfigError, match="limit_key must be a string"):
        await client.enqueue("bill", {"customer": 1}, limit_key=7)  # type: ignore[call-overload]
    with pytest.raises(pgq.ConfigError, match="not one of its parameters"):

        @app.task(limit_key_arg="nope")
        async def other(ctx: pgq.JobContext, customer: int) -> None:
            pass


async def test_a_noisy_key_does_not_starve_the_others(dsn: str, client: pgq.Client) -> None:
    """One key with 40 jobs enqueued first, four keys with 2 each after; a limit of 1 per
    key: the quiet keys' jobs run long before the noisy key's backlog is through."""
    app = pgq.App()
    order: list[str] = []

    @app.task
    async def work(ctx: pgq.JobContext, who: str) -> None:
        order.append(who)
        await anyio.sleep(0.02)

    await client.set_queue_limits("default", key_concurrency=1)
    specs = [pgq.JobSpec("work", {"who": "noisy"}, limit_key="noisy") for _ in range(40)]
    for quiet in ("a", "b", "c", "d"):
        specs += [pgq.JobSpec("work", {"who": quiet}, limit_key=quiet) for _ in range(2)]
    jobs = await client.enqueue_many(specs)
    async with pgq.Worker(app, dsn, concurrency=10, **QUICK):
        for job in jobs[-8:]:
            await client.wait(job, timeout=30)
        quiet_done_at = len(order)
    # All 8 quiet jobs ran while at most a dozen of the 40 noisy ones had (one at a time).
    assert quiet_done_at <= 20, order


async def test_a_per_key_limit_holds_and_keyless_jobs_share_one_key(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    app = pgq.App()
    gate = anyio.Event()

    @app.task
    async def hold(ctx: pgq.JobContext) -> None:
        await gate.wait()

    await client.set_queue_limits("default", key_concurrency=2)
    await client.enqueue_many(
        [pgq.JobSpec("hold", limit_key=k) for k in ("x", "x", "x", "y", "y", "y")]
        + [pgq.JobSpec("hold") for _ in range(3)]
    )

    async def running() -> dict[str | None, int]:
        rows = await conn.fetch(
            "SELECT limit_key, count(*) AS n FROM pgq_jobs WHERE state = 'running'"
            " GROUP BY limit_key"
        )
        return {r["limit_key"]: r["n"] for r in rows}

    async with pgq.Worker(app, dsn, concurrency=20, **QUICK):
        await until(lambda: _equals(running, {"x": 2, "y": 2, None: 2}))
        # Held there: more claims change nothing while the slots are taken.
        for _ in range(5):
            await anyio.sleep(0.1)
            assert await running() == {"x": 2, "y": 2, None: 2}
        gate.set()
        await until(lambda: _no_jobs_left(conn))


async def _equals(read: Any, expected: Any) -> bool:
    return bool(await read() == expected)


async def _no_jobs_left(conn: Conn) -> bool:
    return not await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state <> 'completed'")


async def test_a_per_key_rate_is_counted_per_key(client: pgq.Client, dsn: str, conn: Conn) -> None:
    app = pgq.App()

    @app.task
    async def tick(ctx: pgq.JobContext) -> None:
        pass

    await client.set_queue_limits("default", key_rate=(2, 3600))  # 2 an hour per key
    await client.enqueue_many([pgq.JobSpec("tick", limit_key=k) for k in "aaabbbc"])
    async with pgq.Worker(app, dsn, concurrency=10, **QUICK):
        await until(
            lambda: _equals(
                lambda: conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'"),
                5,
            )
        )
        await anyio.sleep(0.3)  # a few more claim rounds: still nothing more starts
        rows = await conn.fetch(
            "SELECT limit_key, count(*) AS n FROM pgq_jobs WHERE state = 'completed'"
            " GROUP BY limit_key ORDER BY limit_key"
        )
    assert [(r["limit_key"], r["n"]) for r in rows] == [("a", 2), ("b", 2), ("c", 1)]


# --------------------------------------------------------------------------- visibility


async def test_pending_jobs_show_in_the_cli_and_the_dashboard(dsn: str, client: pgq.Client) -> None:
    import html
    import json
    import subprocess
    import sys

    import httpx

    from pgq.dashboard import create_app

    parent = await client.enqueue("step", {"n": 1}, delay=3600)
    child = await client.enqueue("step", {"n": 2}, depends_on=[parent], limit_key="acme")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgq", *args, "--dsn", dsn],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def cli(*args: str) -> str:
        out = run(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    listed = json.loads(
        await anyio.to_thread.run_sync(cli, "jobs", "list", "--state", "pending", "--json")
    )
    assert [j["id"] for j in listed] == [child.id]
    assert listed[0]["depends_on"] == [parent.id] and listed[0]["limit_key"] == "acme"
    shown = await anyio.to_thread.run_sync(cli, "jobs", "show", str(child.id))
    assert "[pending]" in shown and f"depends on    {parent.id}" in shown
    assert "limit key     acme" in shown
    made = json.loads(
        await anyio.to_thread.run_sync(
            cli, "enqueue", "step", "--args", '{"n": 3}', "--depends-on", f"{child.id}", "--json"
        )
    )
    assert made[0]["state"] == "pending"
    bad = await anyio.to_thread.run_sync(run, "enqueue", "step", "--depends-on", "x")
    assert bad.returncode == 1 and "--depends-on takes job ids" in bad.stderr

    dashboard = create_app(dsn)
    transport = httpx.ASGITransport(app=dashboard)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            page = html.unescape((await http.get(f"/jobs/{child.id}")).text)
            listing = (await http.get("/jobs?state=pending")).text
    finally:
        await dashboard.aclose()
    assert f'href="/jobs/{parent.id}">#{parent.id}</a>' in page
    assert f"waits for #{parent.id} to complete" in page and "acme" in page
    assert f'<a href="/jobs/{child.id}">' in listing


async def test_deleting_an_unfinished_parent_cancels_its_dependents(client: pgq.Client) -> None:
    from pgq._db import inspect

    parent = await client.enqueue("step", {"n": 1}, delay=3600)
    child = await client.enqueue("step", {"n": 2}, depends_on=[parent])
    anyway = await client.enqueue("step", {"n": 3}, depends_on=[parent], on_parent_failure="run")
    assert await inspect.delete(client.pool, [parent.id]) == [parent.id]  # the dashboard's
    gone = await client.get_job(child.id)
    assert gone is not None and gone.state is pgq.JobState.CANCELLED
    assert f"parent job {parent.id} was deleted" in gone.errors[-1]["message"]
    ran = await client.get_job(anyway.id)
    assert ran is not None and ran.state is pgq.JobState.AVAILABLE


# --------------------------------------------------------------------------- review findings


async def test_a_long_chain_is_cancelled_whole_when_its_head_fails(
    client: pgq.Client, conn: Conn
) -> None:
    """1,000 links: the cascade is one statement, not one trigger nested per link (which
    overflowed PostgreSQL's stack and left the head's outcome unwritable)."""
    chain = await client.enqueue_chain([pgq.JobSpec("step", {"n": i}) for i in range(1000)])
    anyway = await client.enqueue(
        "step", {"n": -1}, depends_on=[chain[500]], on_parent_failure="run"
    )
    cancelled = await client.cancel(chain[0].id)
    assert cancelled is not None and cancelled.state is pgq.JobState.CANCELLED
    states = await conn.fetch(
        "SELECT state::text, count(*) AS n FROM pgq_jobs WHERE id = ANY($1) GROUP BY 1",
        [j.id for j in chain],
    )
    assert {r["state"]: r["n"] for r in states} == {"cancelled": 1000}
    last = await client.get_job(chain[-1].id)
    assert last is not None
    assert last.errors[-1]["message"] == f"parent job {chain[-2].id} was cancelled"
    ran_anyway = await client.get_job(anyway.id)
    assert ran_anyway is not None and ran_anyway.state is pgq.JobState.AVAILABLE


async def test_a_parent_run_again_is_not_counted_twice(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    app, _ = workflow_app()
    a = await client.enqueue("step", {"n": 1})
    b = await client.enqueue("step", {"n": 2}, delay=3600)
    child = await client.enqueue("collect", depends_on=[a, b])
    async with pgq.Worker(app, dsn, **QUICK):
        await client.wait(a, timeout=20)
        await client.retry([a.id])  # an operator runs it again
        await until(
            lambda: _equals(
                lambda: conn.fetchval(
                    "SELECT state::text FROM pgq_jobs WHERE id = $1 AND attempt = 2", a.id
                ),
                "completed",
            )
        )
        assert await state_of(conn, child.id) == "pending"  # b has not run yet
        # A parent already completed when its dependent is enqueued is not waited for, and
        # running it again later counts for nothing either.
        after = await client.enqueue("collect", depends_on=[a, b])
        await client.retry([a.id])
        await until(
            lambda: _equals(
                lambda: conn.fetchval(
                    "SELECT state::text FROM pgq_jobs WHERE id = $1 AND attempt = 3", a.id
                ),
                "completed",
            )
        )
        assert await state_of(conn, after.id) == "pending"
        await client.retry([b.id])
        assert (await client.wait(child, timeout=20)).result == [10, 20]


async def test_a_per_key_claim_skips_a_job_locked_by_an_open_transaction(
    dsn: str, client: pgq.Client
) -> None:
    app = pgq.App()

    @app.task
    async def work(ctx: pgq.JobContext) -> None:
        pass

    await client.set_queue_limits("default", key_concurrency=5)
    locked = await client.enqueue("work", limit_key="a")
    free = await client.enqueue("work", limit_key="b")
    keyless = await client.enqueue("work")
    own = await asyncpg.connect(dsn)
    try:
        async with own.transaction():
            # A dependent enqueued in a transaction still open holds its parent's row.
            await client.enqueue("work", depends_on=[locked], connection=own)
            async with pgq.Worker(app, dsn, **QUICK):
                assert (await client.wait(free, timeout=20)).state is pgq.JobState.COMPLETED
                assert (await client.wait(keyless, timeout=20)).state is pgq.JobState.COMPLETED
    finally:
        await own.close()
