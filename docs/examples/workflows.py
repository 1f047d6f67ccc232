"""Dependencies, a chain and a group with a callback, and per-customer limits (see
docs/flow-control.md; the test suite runs `main`)."""

from __future__ import annotations

import anyio

import pgq

app = pgq.App()


@app.task
async def fetch(ctx: pgq.JobContext, page: int) -> int:
    """Pretend to fetch a page; its result is its size."""
    await anyio.sleep(0.01)
    return page * 100


@app.task
async def total(ctx: pgq.JobContext) -> int:
    """A group's callback: the sum of its members' results, read from ``ctx.parents``."""
    return sum(p.result or 0 for p in ctx.parents)


@app.task
async def announce(ctx: pgq.JobContext) -> str:
    """The last link of a chain: what the link before it produced."""
    (before,) = ctx.parents
    return f"{before.result} bytes in all"


@app.task(queue="billing", limit_key_arg="customer")
async def charge(ctx: pgq.JobContext, customer: str, cents: int) -> int:
    """At most one charge per customer at a time, whatever the number of workers."""
    await anyio.sleep(0.01)
    return cents


async def main(dsn: str) -> dict[str, object]:
    """Run a group, a chain and per-customer charges; returns what they produced."""
    async with pgq.Client(dsn, app=app) as client:
        await client.set_queue_limits("billing", key_concurrency=1)
        members, summed = await client.enqueue_group(
            [fetch.spec(page=p) for p in (1, 2, 3)], total.spec()
        )
        chain = await client.enqueue_chain([fetch.spec(page=4), announce.spec()])
        charges = await client.enqueue_many(
            [charge.spec(customer=c, cents=n) for c, n in (("acme", 1), ("acme", 2), ("globex", 3))]
        )
        async with pgq.Worker(app, dsn, queues={"default": 5, "billing": 5}):
            group_done = await client.wait(summed, timeout=30)
            chain_done = await client.wait(chain[-1], timeout=30)
            paid = [await client.wait(j, timeout=30) for j in charges]
    return {
        "callback_waited": summed.state is pgq.JobState.PENDING,
        "group_total": group_done.result,
        "members": len(members),
        "announced": chain_done.result,
        "charged": sorted((j.limit_key, j.result) for j in paid),
    }
