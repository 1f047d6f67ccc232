"""`pgq worker --processes N`: real supervisors and children against real Postgres. The
children register as NAME-1..N; one killed is restarted under its name and takes its jobs
back; one stop reaches all; the supervisor's /healthz speaks for every child; a child that
cannot start ends the supervisor with its error; --burst ends when every child has."""

from __future__ import annotations

import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.faults.test_faults import (
    all_completed,
    assert_exactly_once,
    enqueue,
    health,
    running_under,
)
from tests.faults.test_stable_names import SETTINGS
from tests.faults.workers import WorkerProcess, free_port, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


def supervisor(
    name: str,
    dsn: str,
    tmp_path: Path,
    *,
    processes: int = 2,
    health_port: int | None = None,
    app: str = "fault_app:app",
    burst: bool = False,
    settings: dict[str, float] = SETTINGS,
) -> WorkerProcess:
    extra = ("--processes", str(processes), *(("--burst",) if burst else ()))
    return WorkerProcess(
        name,
        dsn,
        tmp_path,
        settings,
        concurrency=2,
        health_port=health_port,
        app=app,
        extra_args=extra,
    )


async def fleet(port: int) -> tuple[int, dict[str, Any]]:
    """The supervisor's /healthz: its status and body."""
    return await anyio.to_thread.run_sync(health, port)


async def pids(port: int) -> dict[str, int | None]:
    """Each child's pid, as the supervisor's /healthz reports it (None while down)."""
    _, body = await fleet(port)
    return {w["name"]: w.get("pid") for w in body["workers"]}


async def scrape(port: int) -> str:
    """The supervisor's /metrics."""

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    return await anyio.to_thread.run_sync(get)


def wait_exit(w: WorkerProcess, limit_s: float) -> int:
    assert w.proc is not None
    return w.proc.wait(limit_s)


async def test_children_register_as_name_1_to_n_and_one_sigterm_stops_them_gracefully(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    sup = supervisor("fleet", dsn, tmp_path, processes=3)
    workers.append(sup)
    sup.start()
    await wait_registered(db, "fleet-1", "fleet-2", "fleet-3")
    names = await db.fetch("SELECT DISTINCT worker_name FROM pgq_producers ORDER BY 1")
    assert [r[0] for r in names] == ["fleet-1", "fleet-2", "fleet-3"]
    ids = await enqueue(dsn, 3, 2.0)

    async def all_started() -> bool:  # in a slot, not merely claimed ahead
        n = await db.fetchval("SELECT count(*) FROM starts WHERE job_id = ANY($1)", ids)
        return bool(n == 3)

    await until(all_started, limit_s=30)
    assert sup.proc is not None
    sup.proc.send_signal(signal.SIGTERM)
    # Graceful: every running job finishes (2 s < shutdown_timeout 5 s), none is handed back.
    assert await anyio.to_thread.run_sync(wait_exit, sup, 30) == 0
    assert await all_completed(db, ids)
    assert await db.fetchval("SELECT max(attempt) FROM pgq_jobs WHERE id = ANY($1)", ids) == 1
    assert await db.fetchval("SELECT count(*) FROM pgq_producers") == 0
    out = sup.output()
    assert "SIGTERM: stopping gracefully" not in out, "the children were told over the link"
    assert out.count("stopping gracefully, as its supervisor asks") == 3


async def test_a_killed_child_is_restarted_under_its_name_and_takes_its_jobs_back(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    port = free_port()
    sup = supervisor("phoenix", dsn, tmp_path, health_port=port)
    workers.append(sup)
    sup.start()
    await wait_registered(db, "phoenix-1", "phoenix-2")
    ids = await enqueue(dsn, 4, 3.0)

    async def first_holds_some() -> bool:
        return await running_under(db, "phoenix-1") >= 1

    await until(first_holds_some, limit_s=30)
    held = [
        r[0]
        for r in await db.fetch(
            "SELECT j.id FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
            " WHERE j.state = 'running' AND p.worker_name = 'phoenix-1'"
        )
    ]
    victim = (await pids(port))["phoenix-1"]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)

    async def restarted() -> bool:
        pid = (await pids(port))["phoenix-1"]
        return pid is not None and pid != victim

    await until(restarted, limit_s=30)

    # Taken back by the restarted child as its predecessor's (stable name), long before
    # the leader's stale_after (20 s) would have rescued them.
    async def taken_back() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1)"
            ' AND errors @> \'[{"kind": "rescued", "reason": "worker restarted"}]\'',
            held,
        )
        return bool(n == len(held))

    await until(taken_back, limit_s=15)
    await until(lambda: all_completed(db, ids), limit_s=30)
    await assert_exactly_once(db, ids)
    _, body = await fleet(port)
    assert [w["restarts"] for w in body["workers"]] == [1, 0]
    assert "worker phoenix-1 exited (killed by SIGKILL)" in sup.output()


async def test_health_is_503_naming_a_stopped_or_dead_child_and_200_when_all_are_well(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    port = free_port()
    sup = supervisor("probe", dsn, tmp_path, health_port=port)
    workers.append(sup)
    sup.start()
    await wait_registered(db, "probe-1", "probe-2")

    async def status_is(code: int, naming: str | None = None) -> bool:
        status, body = await fleet(port)
        return status == code and (naming is None or naming in body.get("reason", ""))

    async def all_ok() -> bool:  # started and answering, not merely in their grace
        status, body = await fleet(port)
        return status == 200 and all(w["status"] == "ok" for w in body["workers"])

    await until(all_ok, limit_s=30)
    # One scrape holds both children's series, each labelled with its worker, and parses.
    families = {f.name: f for f in text_string_to_metric_families(await scrape(port))}
    up = {s.labels["worker"]: s.value for s in families["pgq_worker_up"].samples}
    assert up == {"probe-1": 1, "probe-2": 1}
    healthy = families["pgq_producer_healthy"].samples
    assert sorted(s.labels["worker"] for s in healthy) == ["probe-1", "probe-2"]
    child = (await pids(port))["probe-2"]
    assert child is not None
    os.kill(child, signal.SIGSTOP)
    try:
        await until(lambda: status_is(503, "probe-2: its health endpoint has not answered"), 30)
        _, body = await fleet(port)
        assert "probe-1" not in body["reason"]
    finally:
        os.kill(child, signal.SIGCONT)
    await until(lambda: status_is(200), limit_s=30)

    os.kill(child, signal.SIGKILL)
    await until(lambda: status_is(503, "probe-2: down (killed by SIGKILL)"), limit_s=30)
    await until(lambda: status_is(200), limit_s=60)
    assert (await pids(port))["probe-2"] != child


async def test_a_child_that_cannot_import_its_app_ends_the_supervisor_with_its_error(
    dsn: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    sup = supervisor("broken", dsn, tmp_path, app="no_such_module:app")
    workers.append(sup)
    sup.start()
    assert await anyio.to_thread.run_sync(wait_exit, sup, 60) == 1
    out = sup.output()
    assert "pgq: error: worker broken-" in out
    assert "could not start, exit status 1: cannot import 'no_such_module'" in out
    assert "restarting" not in out


async def test_burst_ends_once_every_child_has_with_a_combined_status(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    ids = await enqueue(dsn, 20, 0.05)
    sup = supervisor("burst", dsn, tmp_path, burst=True)
    workers.append(sup)
    sup.start()
    assert await anyio.to_thread.run_sync(wait_exit, sup, 90) == 0
    assert await all_completed(db, ids)
    out = sup.output()
    assert "worker burst-1 stopped" in out and "worker burst-2 stopped" in out


async def test_a_second_signal_stops_every_child_at_once(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    patient = {**SETTINGS, "shutdown_timeout": 120.0}
    sup = supervisor("hasty", dsn, tmp_path, settings=patient)
    workers.append(sup)
    sup.start()
    await wait_registered(db, "hasty-1", "hasty-2")
    ids = await enqueue(dsn, 4, 60.0)

    async def all_running() -> bool:
        return await running_under(db, "hasty-1") + await running_under(db, "hasty-2") == 4

    await until(all_running, limit_s=30)
    assert sup.proc is not None
    sup.proc.send_signal(signal.SIGTERM)

    async def told() -> bool:
        return "stopping 2 workers gracefully" in sup.output()

    await until(told, limit_s=10)
    sup.proc.send_signal(signal.SIGTERM)
    # Far sooner than the jobs (60 s) or the shutdown timeout (120 s): stopped at once,
    # their jobs handed back for another worker, the attempt not counted.
    assert await anyio.to_thread.run_sync(wait_exit, sup, 30) == 0
    rows = await db.fetch("SELECT state::text, attempt FROM pgq_jobs WHERE id = ANY($1)", ids)
    assert {r["state"] for r in rows} <= {"available", "retryable"}, rows


async def test_children_stop_gracefully_when_their_supervisor_is_killed(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    sup = supervisor("orphan", dsn, tmp_path)
    workers.append(sup)
    sup.start()
    await wait_registered(db, "orphan-1", "orphan-2")
    assert sup.proc is not None
    sup.proc.send_signal(signal.SIGKILL)

    async def gone() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM pgq_producers") == 0)

    await until(gone, limit_s=30)
    out = sup.output()
    assert out.count("its supervisor has gone; stopping") == 2
