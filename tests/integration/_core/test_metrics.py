"""Prometheus metrics, scraped over HTTP from a worker's health port and from the dashboard,
with values checked against the jobs that ran."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgq
from pgq.dashboard import create_app
from tests.integration._worker.test_liveness import (
    FAST,
    fake_producer,
    heartbeats_blocked,
    running_job,
)
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scrape: dict[Any, float], name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(port: int) -> dict[Any, float]:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


def counting_app() -> pgq.App:
    app = pgq.App()

    @app.task(queue="mail")
    async def send(ctx: pgq.JobContext, n: int) -> int:
        return n

    @app.task(queue="mail", max_attempts=2, backoff=pgq.Backoff(base_s=0, max_s=0, jitter=0))
    async def bounce(ctx: pgq.JobContext) -> None:
        raise RuntimeError("mailbox full")

    return app


async def test_worker_metrics_match_the_jobs_run(dsn: str, client: pgq.Client) -> None:
    app = counting_app()
    await client.enqueue_many([pgq.JobSpec("send", {"n": i}, queue="mail") for i in range(7)])
    await client.enqueue_many([pgq.JobSpec("bounce", queue="mail") for _ in range(3)])
    await client.enqueue("send", {"n": 0}, queue="later", delay=3600)
    async with pgq.Worker(app, dsn, health_port=0, queue_metrics=True, **FAST) as worker:

        async def drained() -> bool:
            s = worker.stats()["producers"][0]
            return bool(s["completed"] + s["failed"] == 7 + 6)

        await until(drained)
        assert worker.health_port is not None
        m = await scrape(worker.health_port)
    jobs = "pgq_jobs_total"
    assert value(m, jobs, queue="mail", task="send", outcome="completed") == 7
    assert value(m, jobs, queue="mail", task="bounce", outcome="retryable") == 3
    assert value(m, jobs, queue="mail", task="bounce", outcome="discarded") == 3
    assert value(m, "pgq_job_duration_seconds_count", queue="mail", task="send") == 7
    assert value(m, "pgq_job_duration_seconds_count", queue="mail", task="bounce") == 6
    assert value(m, "pgq_pickup_latency_seconds_count", queue="mail") == 13
    assert value(m, "pgq_producer_healthy", queue="mail") == 1
    assert value(m, "pgq_producer_slots", queue="mail") == 10
    assert value(m, "pgq_heartbeat_failures_total") == 0
    assert value(m, "pgq_outcomes_rejected_total") == 0
    assert value(m, "pgq_worker_leader") == 1
    # The queue gauges, read from the database at the scrape.
    assert value(m, "pgq_queue_jobs", queue="mail", state="completed") == 7
    assert value(m, "pgq_queue_jobs", queue="mail", state="discarded") == 3
    assert value(m, "pgq_queue_jobs", queue="later", state="scheduled") == 1
    assert value(m, "pgq_queue_oldest_available_seconds", queue="mail") == 0


async def test_heartbeat_failures_and_fencing_show(dsn: str) -> None:
    async with pgq.Worker(counting_app(), dsn, name="cut", health_port=0, **FAST) as worker:
        assert worker.health_port is not None
        async with heartbeats_blocked(dsn, "cut"):

            async def fenced() -> bool:
                return not worker.stats()["producers"][0]["healthy"]

            await until(fenced)
            m = await scrape(worker.health_port)
    assert value(m, "pgq_heartbeat_failures_total") >= 2
    assert value(m, "pgq_producer_healthy", queue="mail") == 0


async def test_rescues_and_rejected_outcomes_are_counted(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    app = pgq.App()
    started, release = anyio.Event(), anyio.Event()

    @app.task
    async def work(ctx: pgq.JobContext, n: int) -> int:
        if n == 0:
            started.set()
            await release.wait()
        return n

    ghost = await fake_producer(conn, silent_s=3600)
    await running_job(conn, ghost, n=5)
    late = await client.enqueue("work", {"n": 0})
    async with pgq.Worker(app, dsn, health_port=0, **FAST) as worker:
        assert worker.health_port is not None
        with anyio.fail_after(10):
            await started.wait()
        # What a rescue does to a job whose worker was judged dead: its outcome is refused.
        await conn.execute("UPDATE pgq_jobs SET state = 'retryable' WHERE id = $1", late.id)
        release.set()

        async def counted() -> bool:
            m = await scrape(worker.health_port or 0)
            return (
                value(m, "pgq_outcomes_rejected_total") == 1
                and value(m, "pgq_jobs_rescued_total", reason="producer stale") == 1
            )

        await until(counted)


async def test_metrics_off_and_the_dashboard_exports_the_queue_gauges(
    dsn: str, client: pgq.Client
) -> None:
    await client.enqueue("send", {"n": 1}, queue="mail")
    worker = pgq.Worker(counting_app(), dsn, health_port=0, metrics=False)
    assert worker.metrics is None
    dashboard = create_app(dsn)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        r = await http.get("/metrics")
    await dashboard.aclose()
    m = samples(r.text)
    assert value(m, "pgq_queue_jobs", queue="mail", state="available") == 1
    assert value(m, "pgq_queue_oldest_available_seconds", queue="mail") > 0


async def test_a_cli_worker_serves_metrics_and_can_turn_them_off(dsn: str, tmp_path: Any) -> None:
    """Port 0 takes a free port, which the start-up log names (no race for a port the test
    picked and freed)."""
    (tmp_path / "metrics_app.py").write_text(
        "import pgq\napp = pgq.App()\n\n@app.task\nasync def noop(ctx) -> None: ...\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for extra, expect in (([], 200), (["--no-metrics"], 404)):
        cmd = [sys.executable, "-m", "pgq", "worker", "metrics_app:app", "--dsn", dsn,
               "--health-port", "0", *extra]  # fmt: skip
        async with await anyio.open_process(cmd, env=env) as process:
            try:
                url = await _logged_health_url(process)
                assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/healthz")
                async with httpx.AsyncClient() as http:
                    r = await http.get(url.replace("/healthz", "/metrics"))
                assert r.status_code == expect, r.text
                if expect == 200:
                    assert "pgq_producer_healthy" in r.text
                else:
                    assert "pip install 'pgq-async[metrics]'" in r.text
            finally:
                process.terminate()


async def _logged_health_url(process: anyio.abc.Process) -> str:
    """The /healthz address a starting `pgq worker` logs, read from its stderr."""
    assert process.stderr is not None
    seen = ""
    with anyio.fail_after(30):
        async for chunk in process.stderr:
            seen += chunk.decode(errors="replace")
            match = re.search(r"health endpoint on (http://\S+/healthz)", seen)
            if match:
                return match.group(1)
    raise AssertionError(f"the worker exited without naming its health endpoint:\n{seen}")


def starved_app() -> pgq.App:
    import errno

    app = pgq.App()
    no_retry = pgq.Backoff(base_s=0, max_s=0, jitter=0)

    @app.task(queue="work", max_attempts=1, backoff=no_retry)
    async def hog(ctx: pgq.JobContext) -> None:
        bytearray(1 << 62)  # more memory than any machine has: a real MemoryError

    @app.task(queue="work", max_attempts=1, backoff=no_retry)
    def writer(ctx: pgq.JobContext) -> None:  # in a thread
        raise OSError(errno.ENOSPC, "No space left on device")

    @app.task(queue="work", max_attempts=1, backoff=no_retry)
    async def opener(ctx: pgq.JobContext) -> None:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as exc:
            raise RuntimeError("could not open the report") from exc

    @app.task(queue="work", max_attempts=1, backoff=no_retry)
    async def wrong(ctx: pgq.JobContext) -> None:
        raise OSError(errno.ENOENT, "No such file")  # the task's own failure, not the machine's

    return app


async def test_attempts_that_fail_for_want_of_a_resource_are_counted_and_warned_about(
    dsn: str, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    counts = {"hog": 20, "writer": 3, "opener": 2, "wrong": 4}
    await client.enqueue_many(
        [pgq.JobSpec(t, queue="work") for t, n in counts.items() for _ in range(n)]
    )
    caplog.set_level("WARNING", "pgq.worker")
    async with pgq.Worker(starved_app(), dsn, health_port=0, **FAST) as worker:

        async def drained() -> bool:
            return bool(worker.stats()["producers"][0]["failed"] == sum(counts.values()))

        await until(drained)
        assert worker.health_port is not None
        m = await scrape(worker.health_port)
        async with httpx.AsyncClient() as http:
            health = await http.get(f"http://127.0.0.1:{worker.health_port}/healthz")
        stats = worker.stats()
    assert stats["resource_failures"] == 25
    assert stats["producers"][0]["resource_failures"] == {"hog": 20, "writer": 3, "opener": 2}
    for task in ("hog", "writer", "opener"):
        assert value(m, "pgq_resource_failures_total", queue="work", task=task) == counts[task]
    assert value(m, "pgq_resource_failures_total", queue="work", task="wrong") == 0
    # The liveness probe is not where this shows: a restart would not add memory.
    assert health.status_code == 200
    warned = [r.getMessage() for r in caplog.records if "want of a resource" in r.getMessage()]
    assert len(warned) == 3, warned  # once per task within the window, however many failed
    (hog,) = [w for w in warned if w.startswith("task hog ")]
    assert "MemoryError" in hog and "queue work" in hog
    assert any("OSError ENOSPC" in w for w in warned)
    assert any("OSError EMFILE" in w for w in warned)
