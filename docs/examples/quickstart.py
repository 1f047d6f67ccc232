"""The README's example: a job enqueued in your transaction, run by a worker."""

import asyncio
import os

import pgq

app = pgq.App()


@app.task(queue="emails", max_attempts=5, timeout=30)
async def send_welcome(ctx: pgq.JobContext, email: str) -> str:
    ctx.log.info("welcoming %s", email)
    return f"welcomed {email}"


async def main(dsn: str) -> str | None:
    async with pgq.Client(dsn, app=app) as client:
        async with client.pool.acquire() as conn, conn.transaction():
            await conn.execute("CREATE TABLE IF NOT EXISTS users (email text)")
            await conn.execute("INSERT INTO users VALUES ($1)", "ada@example.com")
            # The job is written if and only if this transaction commits.
            job = await client.enqueue(send_welcome.spec(email="ada@example.com"), connection=conn)
        async with pgq.Worker(app, dsn, queues={"emails": 10}):
            done = await client.wait(job, timeout=30)
    return done.result


if __name__ == "__main__":
    print(asyncio.run(main(os.environ["PGQ_DSN"])))  # after `pgq migrate`
