"""`make demo`: a worker processing a few hundred real jobs of several kinds.

Uses PGQ_DSN when set; otherwise starts an embedded PostgreSQL (the `pgserver` wheel) under
.pgq-embedded/demo. Migrates, enqueues fast, slow, flaky and blocking jobs, and runs a worker
until every one of them is final, printing progress and a summary by state. Exits non-zero
when they did not end as they must (all completed but the doomed ones, discarded); `.ci/run`
runs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import anyio

import pgq
from pgq import migrate

QUEUES = {"demo-fast": 20, "demo-slow": 10}
FLAKY = pgq.Backoff(base_s=0.2, max_s=2.0)

app = pgq.App()


@app.task(queue="demo-fast")
async def fast(ctx: pgq.JobContext, n: int) -> int:
    """A quick job: returns its square."""
    return n * n


@app.task(queue="demo-slow", timeout=10)
async def slow(ctx: pgq.JobContext, seconds: float) -> str:
    """An I/O-bound job: waits, as a call to a slow API would."""
    await anyio.sleep(seconds)
    return f"slept {seconds:.2f}s"


@app.task(queue="demo-fast", max_attempts=5, backoff=FLAKY)
async def flaky(ctx: pgq.JobContext, fail_times: int) -> str:
    """Fails its first `fail_times` attempts, then succeeds: retries with backoff at work."""
    if ctx.attempt <= fail_times:
        raise ConnectionError(f"upstream unavailable (attempt {ctx.attempt})")
    return f"succeeded on attempt {ctx.attempt}"


@app.task(queue="demo-slow")
def checksum(ctx: pgq.JobContext, size: int) -> int:
    """A blocking job (plain def): runs in a worker thread, off the event loop."""
    return sum(random.Random(size).randbytes(size))


@app.task(queue="demo-fast", max_attempts=2, backoff=FLAKY)
async def doomed(ctx: pgq.JobContext) -> None:
    """Always fails: ends discarded after its attempts, every error kept."""
    raise ValueError("this input can never be processed")


@contextlib.contextmanager
def database() -> Iterator[str]:
    """PGQ_DSN when set, else an embedded server for the length of the demo."""
    dsn = os.environ.get("PGQ_DSN")
    if dsn:
        yield dsn
        return
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError:
        sys.exit("PGQ_DSN is not set and pgserver is missing: `pip install 'pgq-async[embedded]'`")
    data = Path(__file__).resolve().parents[2] / ".pgq-embedded" / "demo"
    print(f"PGQ_DSN not set: starting an embedded PostgreSQL in {data}")
    data.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def specs(rng: random.Random) -> list[pgq.JobSpec]:
    # task.spec(...) is checked against the task's signature (and by mypy).
    jobs: list[pgq.JobSpec] = [fast.spec(n=i) for i in range(250)]
    jobs += [slow.spec(seconds=rng.uniform(0.05, 0.5)) for _ in range(60)]
    jobs += [flaky.spec(fail_times=rng.randint(1, 2)) for _ in range(40)]
    jobs += [checksum.spec(size=rng.randint(10_000, 200_000)) for _ in range(30)]
    jobs += [doomed.spec() for _ in range(3)]
    rng.shuffle(jobs)
    return jobs


async def counts(client: pgq.Client, ids: list[int]) -> dict[pgq.JobState, int]:
    """How many of this run's jobs are in each state (a database used before holds older
    runs' jobs too)."""
    total = dict.fromkeys(pgq.JobState, 0)
    rows = await client.pool.fetch(
        "SELECT state::text, count(*) FROM pgq_jobs WHERE id = ANY($1) GROUP BY 1", ids
    )
    for state, n in rows:
        total[pgq.JobState(state)] = n
    return total


async def main(dsn: str) -> None:
    async with pgq.Client(dsn, app=app) as client:
        jobs = await client.enqueue_many(specs(random.Random(7)))
        ids = [job.id for job in jobs]
        print(f"enqueued {len(jobs)} jobs in one round trip")
        started = time.perf_counter()
        async with pgq.Worker(app, dsn, queues=QUEUES, schedule_interval=0.1):
            while True:
                now = await counts(client, ids)
                line = "  ".join(f"{s.value}={n}" for s, n in now.items() if n)
                print(f"[{time.perf_counter() - started:5.1f}s] {line}")
                if not any(n for s, n in now.items() if not s.is_final):
                    break
                await anyio.sleep(1)
        elapsed = time.perf_counter() - started
        final = await counts(client, ids)
        print(f"\nall {sum(final.values())} demo jobs are final after {elapsed:.1f}s:")
        for state, n in final.items():
            if n:
                print(f"  {state.value:<10} {n}")
        one = await client.get_job(next(j.id for j in jobs if j.task == "doomed"))
        if one is not None:
            print(
                f"\na discarded job keeps every attempt's error: {[e['message'] for e in one.errors]}"
            )
        # Every job but the doomed ones completes (flaky fails at most twice of five): any
        # other end is a fault of pgq's, and the demo says so with its exit status.
        doomed = sum(1 for j in jobs if j.task == "doomed")
        expected = {
            pgq.JobState.COMPLETED: len(jobs) - doomed,
            pgq.JobState.DISCARDED: doomed,
        }
        ended = {s: n for s, n in final.items() if n}
        if ended != expected:

            def show(by_state: dict[pgq.JobState, int]) -> str:
                return " ".join(f"{s.value}={n}" for s, n in by_state.items())

            sys.exit(f"the demo's jobs ended {show(ended)}, where {show(expected)} was expected")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with database() as url:
        print("migrating...")
        migrate.upgrade(url)
        anyio.run(main, url)
