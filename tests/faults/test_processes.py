"""`pgq worker --processes N`: real supervisors and children against real Postgres. The
children register as NAME-1..N; one killed is restarted under its name and takes its jobs
back; one stop reaches all; the supervisor's /healthz speaks for every child; a child that
cannot start ends the supervisor with its error; --burst ends when every child has."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgq
from pgq._cli.supervisor import STARTING_S
from tests.faults.checks import (
    all_completed,
    assert_exactly_once,
    enqueue,
    health,
    running_under,
)
from tests.faults.proxy import Proxy
from tests.faults.test_stable_names import SETTINGS
from tests.faults.workers import WorkerProcess, free_port, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


#: Recorded by every child a supervisor starts (a ``sitecustomize`` on the children's path):
#: its pid and when it began, on the system-wide monotonic clock.
RECORD_SPAWN = """
import os, time
if "_PGQ_SUPERVISED" in os.environ:
    with open(os.environ["PGQ_TEST_SPAWNS"], "a") as f:
        f.write(f"{os.getpid()} {time.monotonic()}\\n")
"""


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
    sup = WorkerProcess(
        name,
        dsn,
        tmp_path,
        settings,
        concurrency=2,
        health_port=health_port,
        app=app,
        extra_args=extra,
    )
    # Every child it starts is recorded; each test may restart one once, no more.
    site = tmp_path / f"{name}-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(RECORD_SPAWN)
    spawns = tmp_path / f"{name}-spawns.txt"
    spawns.touch()
    sup.path, sup.env = [str(site)], {"PGQ_TEST_SPAWNS": str(spawns)}
    _bounds.append((spawns, processes + 1))
    return sup


#: Each supervisor of the running test: where its children are recorded, and how many it
#: may start.
_bounds: list[tuple[Path, int]] = []


@pytest.fixture(autouse=True)
def _bounded() -> Iterator[None]:
    """Every supervisor a test runs started no more children than its bound."""
    _bounds.clear()
    yield
    for spawns, bound in _bounds:
        started = len(spawns.read_text().splitlines())
        assert started <= bound, f"{started} children started, more than {bound}"


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


class Confined:
    """A `pgq worker --processes` run confined to one CPU (so at most 4 children, one
    starting at a time), each child it starts recorded, and all of them killed at the end.
    ``bound`` is the most children the test lets it start: past it, all are killed."""

    def __init__(self, tmp_path: Path, dsn: str, bound: int, *args: str) -> None:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(RECORD_SPAWN)
        self.spawns = tmp_path / "spawns.txt"
        self.spawns.touch()
        self.log_path = tmp_path / "supervisor.log"
        self.bound = bound
        here = Path(__file__).resolve().parent
        env = {
            **os.environ,
            "PGQ_TEST_SPAWNS": str(self.spawns),
            "PYTHONPATH": os.pathsep.join([str(site), str(here), str(here.parents[1] / "src")]),
        }
        cpu = min(os.sched_getaffinity(0))
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgq", "--log-level", "INFO", "worker", "fault_app:app",
             "--dsn", dsn, *args],
            cwd=here, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )  # fmt: skip

    def spawned(self) -> list[tuple[int, float]]:
        """Each child started so far: its pid and when it began."""
        lines = self.spawns.read_text().split("\n")
        return [(int(p), float(t)) for p, t in (line.split() for line in lines if line)]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait(self, condition: Callable[[], bool], limit_s: float) -> None:
        """Wait for ``condition``, checking the bound all the while."""
        with anyio.fail_after(limit_s):
            while not condition():
                self.check_bound()
                await anyio.sleep(0.02)
        self.check_bound()

    def check_bound(self) -> None:
        if len(self.spawned()) > self.bound:
            self.kill()
            pytest.fail(f"{len(self.spawned())} children started, more than {self.bound}")

    def kill(self) -> None:
        for pid in [self.proc.pid, *(p for p, _ in self.spawned())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def confined(tmp_path: Path) -> Iterator[list[Confined]]:
    runs: list[Confined] = []
    yield runs
    for run in runs:
        run.kill()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie not yet reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextlib.asynccontextmanager
async def never_answering() -> AsyncIterator[tuple[str, Proxy]]:
    """A DSN whose server accepts connections and never answers (a stalled proxy), and the
    proxy, which counts the connections begun."""
    proxy = Proxy("127.0.0.1", 9)
    proxy.stall()
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        # A connect waits a minute: no child gives up while a test watches it start.
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres?connect_timeout=60", proxy
        tg.cancel_scope.cancel()


async def test_more_than_four_processes_per_cpu_are_refused_unless_told(
    tmp_path: Path, confined: list[Confined]
) -> None:
    async with never_answering() as (dsn, proxy):
        refused = Confined(tmp_path, dsn, 0, "--processes", "5")
        confined.append(refused)
        await refused.wait(lambda: refused.proc.poll() is not None, 30)
        assert refused.proc.returncode == 1
        assert (
            "pgq: error: --processes 5 (or PGQ_PROCESSES) is more than 4 per CPU this process "
            "may use (1 CPU: at most 4); give --processes auto (one per CPU) or at most 4, or "
            "add --no-process-limit to start 5 anyway"
        ) in refused.output()
        assert proxy.connections == 0
        told = Confined(tmp_path, dsn, 5, "--processes", "5", "--no-process-limit")
        confined.append(told)
        await told.wait(lambda: proxy.connections >= 1, 60)
        told.proc.send_signal(signal.SIGTERM)
        await told.wait(lambda: told.proc.poll() is not None, 15)
        assert told.proc.returncode == 0, told.output()
        assert "supervising 5 worker processes" in told.output()


async def test_children_start_one_per_cpu_at_a_time_and_a_sigterm_meanwhile_stops_all(
    tmp_path: Path, confined: list[Confined]
) -> None:
    # Children whose database never answers never report their start: each holds the one
    # start-up slot of this one-CPU run until STARTING_S has passed. The SIGTERM comes
    # while the second is connecting: every child stops at once, the rest never start.
    async with never_answering() as (dsn, proxy):
        run = Confined(tmp_path, dsn, 4, "--processes", "4")
        confined.append(run)
        await run.wait(lambda: proxy.connections >= 2, STARTING_S + 60)
        run.proc.send_signal(signal.SIGTERM)
        signalled = anyio.current_time()
        await run.wait(lambda: run.proc.poll() is not None, 30)
        assert anyio.current_time() - signalled < 5.0, run.output()
        assert run.proc.returncode == 0, run.output()
    spawned = run.spawned()
    assert 2 <= len(spawned) < 4, "the SIGTERM came before the last had its turn"
    for (_, earlier), (_, later) in itertools.pairwise(spawned):
        # None started: each waited for the one before to give its slot up.
        assert later - earlier >= STARTING_S - 0.5, spawned
    assert not [pid for pid, _ in spawned if alive(pid)]


async def test_a_worker_stopped_while_it_connects_stops_at_once() -> None:
    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    async with never_answering() as (dsn, proxy):
        worker = pgq.Worker(app, dsn)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await until(lambda: _is(proxy.connections >= 1))  # connecting: 60 s to wait
            began = anyio.current_time()
            worker.stop()
        assert anyio.current_time() - began < 2.0
        assert not worker.started.is_set()
        with pytest.raises(pgq.ConfigError, match="has run already"):
            await worker.run()


async def _is(value: bool) -> bool:
    return value
