"""Shared helpers for the benchmark runners: databases, timing, results."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

#: The I/O-bound workload every system runs alike (`io` in each bench_*.py): this many jobs,
#: each awaiting IO_SECONDS, at a concurrency of IO_CONCURRENCY.
IO_JOBS = 20_000
IO_SECONDS = 0.010
IO_CONCURRENCY = 1_000

SERVER_DSN = os.environ.get("PGQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def cli_environment(here: str) -> dict[str, str]:
    """The environment of a `pgq worker` process a benchmark starts, as an installed pgq
    runs: ``here`` (the benchmark's directory, for its app) ahead of the caller's path, which
    may name the pgq tree under test (PYTHONPATH=TREE/src), and that tree and ``here``
    compiled to bytecode first. pip compiles a package when it installs it; without this,
    under PYTHONDONTWRITEBYTECODE (set on some CI machines), every process compiled pgq's
    source as it started: about 70 ms each of CPU, which four processes starting together
    on two cores paid twice over."""
    import compileall

    import pgq

    for tree in (Path(pgq.__file__).parent, Path(here)):
        compileall.compile_dir(str(tree), quiet=1, workers=1)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at ``database``."""
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


#: Appended to every benchmark database's name: runs of several checkouts side by side on
#: one server (latency_rounds.py sets it) do not drop each other's databases.
DB_SUFFIX = os.environ.get("PGQ_BENCH_DB_SUFFIX", "")


async def fresh_database(name: str) -> str:
    """Drop and create database ``name`` (plus ``PGQ_BENCH_DB_SUFFIX``); return its DSN."""
    name += DB_SUFFIX
    conn = await asyncpg.connect(SERVER_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(SERVER_DSN, name)


def _postgres_bindir() -> str:
    """The newest PostgreSQL server binaries on this machine (PGQ_BENCH_PG_BINDIR wins)."""
    if os.environ.get("PGQ_BENCH_PG_BINDIR"):
        return os.environ["PGQ_BENCH_PG_BINDIR"]
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        raise RuntimeError("no PostgreSQL server binaries: set PGQ_BENCH_PG_BINDIR")
    return os.path.dirname(found[-1])


@contextlib.asynccontextmanager
async def private_server(settings: dict[str, str]) -> AsyncIterator[str]:
    """A throwaway PostgreSQL instance of this machine's binaries, listening on a free
    loopback port with server ``settings`` on top of the stock ones; yields its DSN.

    For workloads that compare server settings: the shared server's configuration is never
    touched. Run as the ``postgres`` user when the benchmark runs as root (initdb refuses
    root). The instance and its files are gone when the block ends.
    """
    bindir = _postgres_bindir()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = tempfile.mkdtemp(prefix="pgq-bench-pg-")
    if as_postgres:
        shutil.chown(data, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {
        "port": str(port),
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": data,
        **settings,
    }

    async def run_pg(*args: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *as_postgres, *args, stdout=asyncio.subprocess.DEVNULL
        )
        if await proc.wait() != 0:
            raise RuntimeError(f"{args[0]} failed with exit code {proc.returncode}")

    try:
        await run_pg(
            f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "-N"
        )
        await run_pg(
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-l",
            f"{data}/server.log",
            "-w",
            "-o",
            " ".join(f"-c {k}={v}" for k, v in options.items()),
            "start",
        )
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            await run_pg(f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def reset_jobs(dsn: str, *, analyze: bool = False) -> None:
    """Empty pgq's jobs table (``analyze``: instead, give it fresh statistics). This
    machine's test server runs without autovacuum: a run that starts from a table whose
    statistics are stale can get a claim plan many times slower."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE pgq_jobs" if analyze else "TRUNCATE pgq_jobs")
    finally:
        await conn.close()


async def pgq_backlog(dsn: str, app: Any, task: Any, n: int) -> None:
    """An empty jobs table, then ``n`` jobs of pgq ``task`` (args ``{"i": i}``) enqueued in
    batches of 10,000 and analyzed: what a drain benchmark starts from. pgq is imported
    here, not at the top, so that the peers' runners never load it."""
    import pgq

    await reset_jobs(dsn)
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, n, 10_000):
            await client.enqueue_many(
                [pgq.JobSpec(task, {"i": i}) for i in range(start, min(n, start + 10_000))]
            )
    await reset_jobs(dsn, analyze=True)


async def pgq_migrate(dsn: str, src: str | None = None) -> None:
    """Install pgq's schema with `pgq migrate` in a process of its own, as a deployment
    does: the measuring process then holds what an application's would (asyncpg and pgq,
    not alembic and SQLAlchemy, whose objects would weigh on its garbage collector). With
    ``src`` (another checkout's `src`), that code's migrations."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    # `python -m pgq`: in this environment PgQueuer's console script is named `pgq` too.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pgq", "migrate", "--dsn", dsn,
        stdout=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    if await proc.wait() != 0:
        raise RuntimeError(f"pgq migrate failed with exit code {proc.returncode}")


async def drop_database(name: str) -> None:
    """Drop database ``name`` (plus ``PGQ_BENCH_DB_SUFFIX``) if it exists."""
    name += DB_SUFFIX
    conn = await asyncpg.connect(SERVER_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p99/mean of durations in seconds, reported in milliseconds."""
    return {
        "p50_ms": percentile(samples_s, 50) * 1000,
        "p99_ms": percentile(samples_s, 99) * 1000,
        "mean_ms": statistics.fmean(samples_s) * 1000 if samples_s else float("nan"),
        "n": len(samples_s),
    }


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


class CpuMeter:
    """CPU time spent on a workload, on both sides: this process's (``time.process_time``:
    every thread, a Rust runtime's included) and that of the PostgreSQL backends serving
    database ``database`` (their ``/proc/PID/stat`` user and system time, the server on
    this machine). ``with CpuMeter(db) as cpu: ...`` then ``cpu.per_job_us(n)``.

    Backends are found by the title PostgreSQL gives them (``postgres: ... USER DATABASE
    ...``) and sampled every ``interval`` seconds by a thread, so a backend that exits is
    counted up to its last sample: the pools here live through the workload, and the
    CPU a backend spent before the block (a setup connection's) is left out. Server
    processes of no database (WAL writer, checkpointer, autovacuum) are not counted."""

    def __init__(self, database: str, interval: float = 0.1) -> None:
        self.database = database
        self.interval = interval
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._other: set[int] = set()
        self._started = False  # a backend first seen later started within the block
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")
        self._needle = f" {database} ".encode()

    def _sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in self._other:
                continue
            try:
                if pid not in self._last:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        title = f.read()
                    if not title.startswith(b"postgres:"):
                        # A backend just forked bears the postmaster's command line for
                        # a moment: look again next time.
                        if b"postgres" not in title:
                            self._other.add(pid)
                        continue
                    if self._needle not in title:
                        self._other.add(pid)  # a backend's database never changes
                        continue
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            ticks = int(fields[11]) + int(fields[12])  # utime, stime
            self._first.setdefault(pid, ticks if not self._started else 0)
            self._last[pid] = ticks

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self._sample()
        self._started = True
        self.worker_start = time.process_time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker_seconds = time.process_time() - self.worker_start
        self._stop.set()
        self._thread.join()
        self._sample()
        ticks = sum(last - self._first[pid] for pid, last in self._last.items())
        self.db_seconds = ticks / self._tick

    def per_job_us(self, jobs: int) -> dict[str, float]:
        """CPU µs per job in this process and in the database, as result fields."""
        return {
            "cpu_worker_us": self.worker_seconds / jobs * 1e6,
            "cpu_db_us": self.db_seconds / jobs * 1e6,
        }


def emit(result: dict[str, Any]) -> None:
    """Print one result line (JSON) for the orchestrator."""
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def tune_gc_if_asked() -> bool:
    """With ``BENCH_GC=tuned`` in the environment, set up this process's garbage collector as
    ``pgq.tune_gc()`` does (collect, freeze what lives now, first generation at 10,000), for
    whichever system the process measures: the same for pgq's harness and the peers', which
    never import pgq. Returns whether it did."""
    choice = os.environ.get("BENCH_GC", "default")
    if choice not in ("default", "tuned"):
        raise SystemExit(f"BENCH_GC must be default or tuned, not {choice!r}")
    if choice == "default":
        return False
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    return True


def run(main: Any) -> None:
    """Run an async main with uvloop when installed, else asyncio (after setting up the
    garbage collector when ``BENCH_GC=tuned``)."""
    tune_gc_if_asked()
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def dispatch(workloads: dict[str, Any]) -> None:
    """Run the workload named by argv[1] (its remaining argv are passed as strings)."""
    if len(sys.argv) < 2 or sys.argv[1] not in workloads:
        raise SystemExit(f"usage: {sys.argv[0]} {{{','.join(workloads)}}} [ARGS]")
    run(lambda: workloads[sys.argv[1]](*sys.argv[2:]))
