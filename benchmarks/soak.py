"""The soak: `make soak MINUTES=20 [RATE=N] [TABLE=name=value,...] [SERVER=name=value,...]`,
or `python soak.py MINUTES [RATE] [TABLE] [SERVER]`. TABLE sets storage parameters of
pgq_jobs on top of the recommended ones, SERVER settings of the soak's own PostgreSQL
instance on top of the recommended ones and of its logging (to try another setting, e.g.
TABLE=autovacuum_analyze_scale_factor=0.2 or SERVER=max_wal_size=4GB,checkpoint_timeout=5min).
soak_pinned.py runs it in phases, with a transaction holding the horizon between some.

A `pgq worker` process, started by the CLI at its default settings (and a completed-job
retention of two minutes, so that the leader deletes as fast as jobs finish), runs no-op
jobs that this process enqueues at a steady RATE per second, for MINUTES minutes, on a
PostgreSQL instance of its own with the server and table settings docs/performance.md
recommends. Without RATE, the run first measures the most the system completes per second
(the same worker, with this process enqueuing as fast as it can beside it: on a small
machine the enqueuer's and the server's share of the cores is part of the cost of a job)
and offers half of it; it also prints what the worker alone drains from a backlog. This
process's garbage collector is tuned as `pgq worker` tunes its own (pgq.tune_gc), unless
PGQ_SOAK_GC=default.

Every minute it records, from the jobs enqueued in that minute (the database's own
timestamps): how many were completed, the pickup latency (claim time minus the time the
job became available, its enqueue transaction's start) at p50, p99 and max; the same
measured from the enqueue call's acknowledged commit (the wall-clock time enqueue_many
returned, as benchmarks/latency.py measures latency: a commit that waited on the disk is
then not counted, since no queue could see the jobs before it); how many were still not
picked up; and the jobs table's heap and index sizes, live rows (the server's estimate) and
dead tuples. The jobs are read as the run goes, those of each SLICE_S seconds SETTLE_S after
it ends (a few thousand rows at a time, on a connection of their own), and each minute's
figures are computed here: reading a minute's jobs all at once, with a few scans of
hundreds of thousands of rows, took cores from what it measured. The counting shares the
event loop with the enqueuer, whose transactions stay open while this process computes
(and whose jobs' clocks start at BEGIN): it counts ADD_CHUNK jobs between turns, and a
minute's quantiles are numpy's, not a sort of its waits in Python. At the
end it prints the table, checks the targets (p99 pickup ≤ 25 ms in every minute, both
ways; the last five minutes' throughput within 10 % of the first five; heap and indexes,
after the first minutes, not growing by more than 10 %), and writes
benchmarks/results/soak.json and soak.png.

At a fixed offered rate, a minute's throughput is the rate offered unless the worker falls
behind; its jobs still unclaimed when their slice is read (SETTLE_S after it ends) are
counted apart and fail the latency target. Pickup latency ends at the claim: a job claimed
ahead of a free slot starts a little later (docs/configuration.md, `claim_ahead`). A job
handed back unstarted (its slot did not free in time) and claimed again counts to its last
claim: each minute counts the jobs with an entry in `errors` (a no-op job fails nothing
else), and the worst job's entries are printed with it.

To find what a slow minute waited on, each minute also names its worst job (the moment it
was enqueued and how long it waited) and every event that overlapped that wait: the
server's checkpoints and autovacuum or autoanalyze runs (from its log; a vacuum that
truncated the table says how many pages), garbage-collector pauses of at least
GC_PAUSE_MIN_S in the worker and in this process, moments when the worker's event loop ran
a timer LOOP_LATE_MIN_S or more late (it was busy, or the process was not given a core),
enqueue calls of this process that took SLOW_ENQUEUE_S or more (a job's clock starts at its
transaction's start, so a slow commit shows as pickup latency), and each HOST_SAMPLE_S in which the machine's cores were
HOST_BUSY_SHARE or more stolen by the hypervisor or waiting for I/O (Linux's /proc/stat),
every statement the server ran for SLOW_STATEMENT_MS or more (its log, without parameters:
the leader's retention batches and throughput rollup, autovacuum's analyze sampling), and the worker's log lines (INFO and above: leadership, the end of each retention
round; its warnings are also printed at the end). A minute whose p99 missed the target is
also read second by second (the jobs that became available in each second, their p99 and
slowest pickup; the seconds at a minute's ends are split between two minutes, by job id),
and each second whose p99 missed is printed with the events that overlapped it: the slow
minute shows whether its slow jobs came in one burst and what ran beside it. Per minute it also counts checkpoints, autovacuums and autoanalyzes of
pgq_jobs, rows deleted (retention), WAL written, and the share of the cores' time stolen and
waiting for I/O.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import asyncpg
import numpy
from bench_pgq_table import RECOMMENDED, RECOMMENDED_SERVER, sizes
from common import cli_environment, pgq_migrate, private_server, run

import pgq

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: Completed jobs are kept this long: long enough that a slice's jobs are still there
#: when it is read, short enough that retention deletes throughout the run.
RETENTION_S = 120
#: Enqueue in a batch this often (the offered rate is kept on average, not per tick).
TICK_S = 0.02
#: The environment variable that, set to "default", leaves this process's garbage collector
#: at Python's settings; otherwise it is tuned as `pgq worker` tunes its own (pgq.tune_gc).
GC_ENV = "PGQ_SOAK_GC"
#: The jobs enqueued in each slice of this many seconds are read together...
SLICE_S = 1.0
#: ...this long after the slice ends, when they have had time to finish, and counted this
#: many at a time between turns of the event loop.
SETTLE_S = 5.0
ADD_CHUNK = 500
CALIBRATION_JOBS = 100_000
SUSTAINED_WARMUP_S = 5.0
SUSTAINED_S = 15.0
P99_TARGET_MS = 25.0
#: Garbage-collector passes at least this long are recorded, in the worker and here.
GC_PAUSE_MIN_S = 0.005
#: The worker's event loop is recorded as late when a timer of LOOP_TICK_S fires this late.
LOOP_LATE_MIN_S = 0.010
LOOP_TICK_S = 0.005
#: The host's CPU time is sampled this often; a sample in which this share of it or more
#: was stolen (a virtual machine whose host gave its cores to others) or waiting for I/O is
#: recorded.
HOST_SAMPLE_S = 0.5
HOST_BUSY_SHARE = 0.25
#: A minute with less than this share of the cores' time stolen counts as quiet.
QUIET_STEAL = 0.01
#: Enqueue calls of this process at least this long are recorded.
SLOW_ENQUEUE_S = 0.02
#: Statements the server runs for at least this long are logged (without their
#: parameters) and compared with each minute's worst job like the other events.
SLOW_STATEMENT_MS = 10
#: What the private server logs, with times, for the events a minute is compared with.
SERVER_LOGGING = {
    "log_checkpoints": "on",
    "log_autovacuum_min_duration": "0",
    "log_min_duration_statement": str(SLOW_STATEMENT_MS),
    "log_parameter_max_length": "0",
    "log_timezone": "UTC",
}
#: The worker appends its garbage-collector pauses and late event-loop timers to the file
#: this variable names, a line each: wall-clock start, seconds, what.
PAUSES_ENV = "PGQ_SOAK_GC_PAUSES"

app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Does nothing: the soak measures the queue (the first job in the soak's worker starts
    the watch on its event loop)."""
    if _pauses_file is not None and not _watch:
        _watch.append(asyncio.get_running_loop().create_task(watch_loop(_pauses_file.write)))


async def watch_loop(write: Callable[[str], object]) -> None:
    """Record each time a timer of LOOP_TICK_S fires LOOP_LATE_MIN_S or more late."""
    while True:
        at, began = time.time(), time.perf_counter()
        await asyncio.sleep(LOOP_TICK_S)
        late = time.perf_counter() - began - LOOP_TICK_S
        if late >= LOOP_LATE_MIN_S:
            write(f"{at + LOOP_TICK_S} {late} event loop late in the worker\n")


def record_gc_pauses(sink: Callable[[float, float, int], None]) -> None:
    """Call ``sink(wall-clock start, seconds, generation)`` for every garbage-collector
    pass of this process lasting GC_PAUSE_MIN_S or more."""
    began = [0.0, 0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[:] = [time.time(), time.perf_counter()]
            return
        took = time.perf_counter() - began[1]
        if took >= GC_PAUSE_MIN_S:
            sink(began[0], took, info["generation"])

    gc.callbacks.append(callback)


_pauses_file: TextIO | None = None
_watch: list[asyncio.Task[None]] = []  # the event-loop watch, once started
if os.environ.get(PAUSES_ENV):  # imported by the soak's `pgq worker` (soak:app)
    _pauses_file = open(os.environ[PAUSES_ENV], "a", buffering=1)  # noqa: SIM115

    def _log_pause(at: float, took: float, generation: int) -> None:
        assert _pauses_file is not None
        _pauses_file.write(f"{at} {took} GC gen {generation} in the worker\n")

    record_gc_pauses(_log_pause)


#: Events of this process, as (wall-clock start, seconds, what).
EVENTS: list[tuple[float, float, str]] = []
#: Each enqueue call's first job id and the wall-clock time its commit was acknowledged
#: (enqueue_many returned), in order: the start of the latency its jobs' pickup is also
#: measured from, as benchmarks/latency.py measures it (the commit's acknowledgement to the
#: claim), beside the transaction's start.
ACKS: list[tuple[int, float]] = []


# The jobs enqueued between two marks, as the soak reads them SETTLE_S after the later mark:
# when each became available, when it was claimed (NULL: not yet), whether it completed and
# whether it has an error entry. Read every SLICE_S, a few thousand rows at a time, instead
# of scanning each minute's jobs at once.
SLICE = """
SELECT id, extract(epoch FROM scheduled_at)::float8 AS due,
       extract(epoch FROM attempted_at)::float8 AS claimed,
       state = 'completed' AS completed, errors <> '[]'::jsonb AS with_errors
FROM pgq_jobs WHERE id > $1 AND id <= $2 ORDER BY id
"""

WORST_ERRORS = """
SELECT jsonb_array_length(errors) AS entries, errors -> -1 ->> 'message' AS last_error
FROM pgq_jobs WHERE id = $1
"""

# The table's sizes, from the server's statistics (no count of its rows: n_live_tup).
SIZES = """
SELECT pg_relation_size('pgq_jobs') AS heap, pg_indexes_size('pgq_jobs') AS indexes,
       n_dead_tup AS dead, autovacuum_count AS vacuums, n_live_tup AS live
FROM pg_stat_user_tables WHERE relname = 'pgq_jobs'
"""


def worker_argv(dsn: str, *extra: str, level: str = "WARNING") -> list[str]:
    return [
        sys.executable, "-m", "pgq", "--log-level", level, "--log-format", "json", "worker",
        "soak:app", "--dsn", dsn, "--retention-completed", str(RETENTION_S), *extra,
    ]  # fmt: skip


def start_worker(
    dsn: str, *extra: str, pauses: Path | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """A `pgq worker` of the soak's app; with ``log``, its INFO lines (JSON) go to that
    file, for worker_log() to read as events."""
    env = cli_environment(str(HERE))
    if pauses is not None:
        env[PAUSES_ENV] = str(pauses)
    if log is None:
        return subprocess.Popen(worker_argv(dsn, *extra), cwd=HERE, env=env)
    with log.open("ab") as sink:
        return subprocess.Popen(
            worker_argv(dsn, *extra, level="INFO"), cwd=HERE, env=env, stderr=sink
        )


async def drain_rate(dsn: str) -> float:
    """The most one default `pgq worker` drains per second from a backlog, with nothing
    enqueued meanwhile: first claim to last completion on the database clock."""
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, CALIBRATION_JOBS, 5_000):
            await client.enqueue_many([pgq.JobSpec(noop, {"i": start + i}) for i in range(5_000)])
    proc = start_worker(dsn, "--burst")
    code = await asyncio.to_thread(proc.wait)
    if code != 0:
        raise RuntimeError(f"the calibration worker exited with {code}")
    conn = await asyncpg.connect(dsn)
    span = await conn.fetchval(
        "SELECT extract(epoch FROM max(finalized_at) - min(attempted_at)) FROM pgq_jobs"
    )
    await empty(conn)
    await conn.close()
    return CALIBRATION_JOBS / float(span)


async def sustained_rate(dsn: str) -> float:
    """The most the same worker completes per second while this process enqueues as fast as
    it can beside it: the maximum of the whole system (enqueuer, worker and server share
    the machine's cores), measured over SUSTAINED_S after a warm-up."""
    conn = await asyncpg.connect(dsn)
    worker = start_worker(dsn)
    stop = asyncio.Event()

    async def flat_out(client: pgq.Client) -> None:
        while not stop.is_set():
            await client.enqueue_many([pgq.JobSpec(noop, {"i": i}) for i in range(500)])

    completed = "SELECT count(*) FROM pgq_jobs WHERE state = 'completed'"
    try:
        await wait_for_producer(conn, worker)
        async with pgq.Client(dsn, app=app) as client:
            sending = asyncio.create_task(flat_out(client))
            await asyncio.sleep(SUSTAINED_WARMUP_S)
            before, t0 = await conn.fetchval(completed), time.perf_counter()
            await asyncio.sleep(SUSTAINED_S)
            after, t1 = await conn.fetchval(completed), time.perf_counter()
            stop.set()
            await sending
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait, 60)
    await empty(conn)
    await conn.close()
    return float(after - before) / (t1 - t0)


async def empty(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    await conn.execute("TRUNCATE pgq_jobs CASCADE")
    await conn.execute("DELETE FROM pgq_producers")
    await conn.execute("VACUUM ANALYZE pgq_jobs")


async def wait_for_producer(
    conn: asyncpg.Connection[asyncpg.Record], worker: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 60
    while not await conn.fetchval("SELECT count(*) FROM pgq_producers"):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker did not start")
        await asyncio.sleep(0.1)


async def enqueuer(client: pgq.Client, rate: float, stop: asyncio.Event) -> int:
    """Enqueue ``rate`` jobs a second in batches every TICK_S until ``stop``; returns how
    many. A late tick is made up by the next batch, so the rate holds on average."""
    sent, started = 0, time.perf_counter()
    while not stop.is_set():
        due = int(rate * (time.perf_counter() - started)) - sent
        if due > 0:
            at, t0 = time.time(), time.perf_counter()
            jobs = await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": sent + k}) for k in range(due)]
            )
            ACKS.append((jobs[0].id, time.time()))
            took = time.perf_counter() - t0
            if took >= SLOW_ENQUEUE_S:
                EVENTS.append((at, took, f"enqueue of {due} jobs took {took * 1000:.0f} ms"))
            sent += due
        await asyncio.sleep(TICK_S)
    return sent


def host_cpu() -> dict[str, float]:
    """The machine's CPU time so far, in seconds: all of it, stolen, and waiting for I/O
    (zeros where /proc/stat is not there)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return {"cpu_s": 0.0, "steal_s": 0.0, "iowait_s": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal (guest time is counted in user)
    return {
        "cpu_s": sum(fields[:8]) / tick,
        "steal_s": fields[7] / tick if len(fields) > 7 else 0.0,
        "iowait_s": fields[4] / tick,
    }


async def watch_host(stop: asyncio.Event) -> None:
    """Record each HOST_SAMPLE_S in which HOST_BUSY_SHARE or more of the cores' time was
    stolen or waiting for I/O."""
    before, at = host_cpu(), time.time()
    while not stop.is_set():
        await asyncio.sleep(HOST_SAMPLE_S)
        now, now_at = host_cpu(), time.time()
        total = now["cpu_s"] - before["cpu_s"]
        for key, what in (("steal_s", "stolen by the host"), ("iowait_s", "waiting for I/O")):
            share = (now[key] - before[key]) / total if total > 0 else 0.0
            if share >= HOST_BUSY_SHARE:
                EVENTS.append((at, now_at - at, f"{share:.0%} of the cores' time {what}"))
        before, at = now, now_at


#: The server's log is read in pieces of this many bytes (a value read whole is limited
#: to 1 GB, and held in the server's memory).
LOG_CHUNK = 64 * 2**20


async def server_log(conn: asyncpg.Connection[asyncpg.Record]) -> str:
    """The private server's log, as text (a multibyte character cut between two pieces
    is replaced: the log's events are ASCII)."""
    size = int(await conn.fetchval("SELECT size FROM pg_stat_file('server.log')"))
    pieces = []
    for offset in range(0, size, LOG_CHUNK):
        pieces.append(
            await conn.fetchval(
                "SELECT pg_read_binary_file('server.log', $1, $2)", offset, LOG_CHUNK
            )
        )
    return b"".join(pieces).decode("utf-8", errors="replace")


async def last_id(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    return int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM pgq_jobs"))


#: A table setting's value is written into SQL: a number or a boolean only.
_TABLE_SETTING = re.compile(r"([a-z_]+)=([0-9.]+|on|off|true|false)")
#: A server setting's value goes on the server's command line: a number with an optional
#: unit (4GB, 5min), or a word (off, lz4).
_SERVER_SETTING = re.compile(r"([a-z_]+)=([0-9.]+[a-zA-Z]*|[a-z][a-z0-9]*)")


def parse_settings(text: str, option: str, pattern: re.Pattern[str], values: str) -> dict[str, str]:
    """``name=value,...`` as a dict; a name of lower-case letters and underscores, a value
    that ``pattern`` accepts (``values`` says which, for the error)."""
    settings = {}
    for item in filter(None, text.split(",")):
        m = pattern.fullmatch(item.strip())
        if m is None:
            raise SystemExit(f"{option}: {item!r} is not name=value ({values})")
        settings[m[1]] = m[2]
    return settings


#: Called as the run starts (minute 0) and at the end of each minute (1 to MINUTES) with the
#: run's DSN and the minute: what a variant of the soak does between minutes (soak_pinned.py holds the
#: horizon), and its own per-minute readings.
MinuteHook = Callable[[str, int], Awaitable[None]]


async def soak(
    minutes: int,
    rate: float | None,
    table: dict[str, str],
    server: dict[str, str],
    on_minute: MinuteHook | None = None,
) -> dict[str, Any]:
    tuned = os.environ.get(GC_ENV) != "default"
    if tuned:
        # The enqueuer stands in for an application that enqueues; its collector's full
        # passes (14-39 ms each, every few seconds, in the runs of the twenty-fourth
        # session) fell inside enqueue transactions and counted as pickup latency.
        frozen = pgq.tune_gc()
        print(f"this process's garbage collector: tuned ({frozen:,} objects frozen)")
    else:
        print("this process's garbage collector: Python's settings")
    scratch = Path(tempfile.mkdtemp(prefix="pgq-soak-"))
    pauses, worker_log_path = scratch / "worker-pauses.txt", scratch / "worker-log.jsonl"
    server = {**RECOMMENDED_SERVER, **server}
    async with private_server({**SERVER_LOGGING, **server}) as dsn:
        await pgq_migrate(dsn)
        conn = await asyncpg.connect(dsn)
        await conn.execute(RECOMMENDED)
        for name, value in table.items():
            # Storage parameters cannot be bound as parameters; both were checked by
            # parse_settings().
            await conn.execute(f"ALTER TABLE pgq_jobs SET ({name} = {value})")
        drain = await drain_rate(dsn)
        print(f"one default worker drains a backlog at {drain:,.0f}/s", flush=True)
        most = await sustained_rate(dsn)
        offered = rate if rate is not None else most / 2
        print(f"with this process enqueuing beside it: {most:,.0f}/s; offering {offered:,.0f}/s")
        record_gc_pauses(lambda at, took, gen: EVENTS.append((at, took, f"GC gen {gen} here")))
        print(f"the worker's log: {worker_log_path}")
        worker = start_worker(dsn, pauses=pauses, log=worker_log_path)
        try:
            await wait_for_producer(conn, worker)
            rows = await run_minutes(conn, dsn, minutes, offered, on_minute)
        finally:
            worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 60)
            log = await server_log(conn)
            await conn.close()
    events = sorted(
        [*server_events(log), *worker_pauses(pauses), *worker_log(worker_log_path), *EVENTS]
    )
    for row in rows:
        explain(row, events)
    return {
        "minutes": minutes,
        "drain_rate": drain,
        "sustained_rate": most,
        "offered_rate": offered,
        "server_settings": server,
        "table_settings": table,
        "enqueuer_gc": {
            "tuned": tuned,
            "threshold": gc.get_threshold()[0],
            "tracked_at_end": len(gc.get_objects()),  # frozen ones not counted
            "frozen": gc.get_freeze_count(),
            "collections": [g["collections"] for g in gc.get_stats()],
        },
        "rows": rows,
    }


async def run_minutes(
    conn: asyncpg.Connection[asyncpg.Record],
    dsn: str,
    minutes: int,
    rate: float,
    on_minute: MinuteHook | None = None,
) -> list[dict[str, Any]]:
    """Offer ``rate`` jobs a second for ``minutes``; every SLICE_S, mark the last job id, and
    read the jobs up to it SETTLE_S later (on a connection of its own, in order), so that no
    read scans more than a slice; each minute's row is computed when its last slice is in.
    ``on_minute`` runs as the first minute starts and as each minute ends, after its last
    mark."""
    stop = asyncio.Event()
    rows: list[dict[str, Any]] = []
    reads: asyncio.Queue[tuple[float, int, int, tuple[int, dict[str, float]] | None] | None]
    reads = asyncio.Queue()
    reader = await asyncpg.connect(dsn)

    async def read_slices() -> None:
        minute = Minute()
        while (item := await reads.get()) is not None:
            at, first, last, ends = item
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            jobs = await reader.fetch(SLICE, first, last)
            for at_job in range(0, len(jobs), ADD_CHUNK):
                # Counted a chunk at a time, the enqueuer taking turns: its transactions
                # stay open while this process runs anything else, and their jobs' clocks
                # start at BEGIN.
                minute.add(jobs[at_job : at_job + ADD_CHUNK])
                await asyncio.sleep(0)
            if ends is not None:
                rows.append(await minute.row(reader, *ends))
                minute = Minute()

    slices = int(60 / SLICE_S)
    async with pgq.Client(dsn, app=app) as client:
        sending = asyncio.create_task(enqueuer(client, rate, stop))
        watching = asyncio.create_task(watch_host(stop))
        reading = asyncio.create_task(read_slices())
        start = time.perf_counter()
        mark = await last_id(conn)
        counters = [await server_counters(conn)]
        if on_minute is not None:
            await on_minute(dsn, 0)
        for m in range(1, minutes + 1):
            for k in range(1, slices + 1):
                await asyncio.sleep(
                    max(0.0, start + 60 * (m - 1) + SLICE_S * k - time.perf_counter())
                )
                new, ends = await last_id(conn), None
                if k == slices:
                    counters.append(await server_counters(conn))
                    if m == minutes:
                        stop.set()
                    ends = (m, {key: counters[-1][key] - counters[-2][key] for key in counters[-1]})
                reads.put_nowait((time.perf_counter() + SETTLE_S, mark, new, ends))
                mark = new
            if on_minute is not None:
                await on_minute(dsn, m)
        await sending
        await watching
        reads.put_nowait(None)
        await reading
    await reader.close()
    return rows


def quantiles(values: array[float]) -> tuple[float | None, float | None, float | None]:
    """The median, the 99th percentile and the largest of ``values``, in any order (the
    quantiles interpolated between neighbours as PostgreSQL's percentile_cont does); Nones
    for none."""
    if not values:
        return None, None, None
    data = numpy.frombuffer(values, dtype=numpy.float64)
    p50, p99 = numpy.percentile(data, [50, 99], method="linear")
    return float(p50), float(p99), float(data.max())


class Minute:
    """One minute's jobs, as its slices are read: counts, each picked-up job's pickup
    latency from its transaction's start and from its enqueue call's acknowledged commit
    (ACKS), by second, and the slowest job."""

    def __init__(self) -> None:
        self.jobs = self.completed = self.not_picked_up = self.with_errors = 0
        # Arrays, so that the minute's quantiles are numpy's work, not a sort of a few
        # hundred thousand Python floats in the event loop the enqueuer runs in.
        self.waits: array[float] = array("d")
        self.ack_waits: array[float] = array("d")
        self.by_second: dict[int, list[float]] = {}
        self.worst: tuple[float, int, float, float] | None = None  # (wait, id, due, claimed)

    def add(self, jobs: list[asyncpg.Record]) -> None:
        if not jobs:
            return
        # The enqueue call of each job: this process alone enqueues, so a call's jobs are
        # the ids from its first to the next call's (jobs before the first call: none).
        call = max(bisect.bisect_right(ACKS, (jobs[0]["id"], math.inf)) - 1, 0)
        for job in jobs:
            self.jobs += 1
            self.completed += job["completed"]
            self.with_errors += job["with_errors"]
            due, claimed = job["due"], job["claimed"]
            if claimed is None:
                self.not_picked_up += 1
                continue
            wait = claimed - due
            self.waits.append(wait)
            self.by_second.setdefault(math.floor(due), []).append(wait)
            if self.worst is None or wait > self.worst[0]:
                self.worst = (wait, job["id"], due, claimed)
            while call + 1 < len(ACKS) and ACKS[call + 1][0] <= job["id"]:
                call += 1
            if ACKS and ACKS[call][0] <= job["id"]:
                # Claimed before the enqueuer saw the acknowledgement: waited 0.
                self.ack_waits.append(max(0.0, claimed - ACKS[call][1]))

    async def row(
        self, conn: asyncpg.Connection[asyncpg.Record], minute: int, during: dict[str, float]
    ) -> dict[str, Any]:
        sizes = await table_sizes(conn)
        p50, p99, most = quantiles(self.waits)
        ack_p50, ack_p99, ack_most = quantiles(self.ack_waits)
        seconds = []
        if p99 is not None and p99 * 1000 > P99_TARGET_MS:
            for second, those in sorted(self.by_second.items()):
                _, top, slowest = quantiles(array("d", those))
                assert top is not None and slowest is not None
                seconds.append([second, len(those), top * 1000, slowest * 1000])
        entries, last_error = None, None
        if self.worst is not None:
            errors = await conn.fetchrow(WORST_ERRORS, self.worst[1])
            if errors is not None:
                entries, last_error = errors["entries"], errors["last_error"]

        def ms(value: float | None) -> float | None:
            return None if value is None else value * 1000

        row = {
            "minute": minute,
            "jobs": self.jobs,
            "completed": self.completed,
            "not_picked_up": self.not_picked_up,
            "with_errors": self.with_errors,
            "p50_ms": ms(p50),
            "p99_ms": ms(p99),
            "max_ms": ms(most),
            "ack_p50_ms": ms(ack_p50),
            "ack_p99_ms": ms(ack_p99),
            "ack_max_ms": ms(ack_most),
            "worst_due": None if self.worst is None else self.worst[2],
            "worst_claimed": None if self.worst is None else self.worst[3],
            "worst_errors": entries,
            "worst_last_error": last_error,
            # [epoch second, jobs, p99 ms, max ms] for each second of a minute that missed
            "seconds": seconds,
            **sizes,
            **during,  # per minute (sizes' own "autovacuums" is the running total)
        }
        print(
            f"minute {minute:>3}: {row['completed'] / 60:>8,.0f} jobs/s"
            f"  pickup p50 {row['p50_ms'] or 0:6.1f} ms  p99 {row['p99_ms'] or 0:6.1f} ms"
            f"  max {row['max_ms'] or 0:7.1f} ms  from the commit's ack: p99"
            f" {row['ack_p99_ms'] or 0:6.1f} ms  max {row['ack_max_ms'] or 0:7.1f} ms"
            f"  heap {sizes['heap_mb']:7.1f} MB"
            f"  indexes {sizes['indexes_mb']:6.1f} MB  dead {sizes['dead_tuples']:>9,.0f}"
            f"  checkpoints {during['checkpoints']:.0f}  autovacuums {during['autovacuums']:.0f}"
            f"  autoanalyzes {during['autoanalyzes']:.0f}  deleted {during['deleted']:,.0f}"
            f"  WAL {during['wal_bytes'] / 2**20:,.0f} MB"
            f"  stolen {share(during['steal_s'], during['cpu_s'])}"
            f"  iowait {share(during['iowait_s'], during['cpu_s'])}",
            flush=True,
        )
        return row


async def table_sizes(conn: asyncpg.Connection[asyncpg.Record]) -> dict[str, float]:
    row = await conn.fetchrow(SIZES)
    assert row is not None
    return sizes(row)


COUNTERS = """
SELECT (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter) AS checkpoints,
       s.autovacuum_count AS autovacuums, s.autoanalyze_count AS autoanalyzes,
       s.n_tup_del AS deleted, pg_current_wal_lsn() - '0/0'::pg_lsn AS wal_bytes
FROM pg_stat_user_tables s WHERE s.relname = 'pgq_jobs'
"""


async def server_counters(conn: asyncpg.Connection[asyncpg.Record]) -> dict[str, float]:
    """The server's running totals a minute's row shows the change of (statistics are
    flushed by each backend about once a second, so a minute's figure may lag a little),
    and the machine's CPU time (host_cpu())."""
    r = await conn.fetchrow(COUNTERS)
    assert r is not None
    return {**{k: float(v) for k, v in r.items()}, **host_cpu()}


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC \[\d+\] (\w+):  (.*)$")
_ELAPSED = re.compile(r"elapsed: ([\d.]+) s")
#: A statement logged by log_min_duration_statement: its duration, then what ran (asyncpg's
#: extended protocol logs its parse, bind and execute steps apart).
_DURATION = re.compile(r"duration: ([\d.]+) ms  (?:statement|(parse|bind|execute) [^:]*): (.*)")
_TRUNCATED = re.compile(r"pages: (\d+) removed")


def server_events(log: str) -> list[tuple[float, float, str]]:
    """Checkpoints and autovacuum/autoanalyze runs from the server's log, as (start,
    seconds, what). A vacuum is logged when it ends, with its elapsed time; a checkpoint
    when it starts and when it completes."""
    entries: list[tuple[float, str]] = []
    for line in log.splitlines():
        m = _LOG_LINE.match(line)
        if m:
            at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
            entries.append((at.timestamp(), m[3]))
        elif entries:  # a continuation line of the entry before
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    events: list[tuple[float, float, str]] = []
    checkpoint: tuple[float, str] | None = None
    for at, text in entries:
        if text.startswith("checkpoint starting"):
            checkpoint = (at, text.removeprefix("checkpoint starting: "))
        elif text.startswith("checkpoint complete") and checkpoint is not None:
            events.append((checkpoint[0], at - checkpoint[0], f"checkpoint ({checkpoint[1]})"))
            checkpoint = None
        elif text.startswith(("automatic vacuum", "automatic analyze")):
            elapsed = _ELAPSED.search(text)
            took = float(elapsed[1]) if elapsed else 0.0
            table = text.split('"')[1] if '"' in text else "?"
            what = f"{text.split()[1]} of {table.rsplit('.', 1)[-1]}"
            truncated = _TRUNCATED.search(text)
            if truncated and int(truncated[1]):
                what += f", {truncated[1]} pages truncated"
            events.append((at - took, took, what))
        elif (d := _DURATION.match(text)) is not None:
            took = float(d[1]) / 1000
            sql = " ".join(d[3].split())
            sql = sql if len(sql) <= 70 else sql[:67] + "..."
            events.append((at - took, took, f"statement{f' ({d[2]})' if d[2] else ''}: {sql}"))
    return events


def worker_log(path: Path) -> list[tuple[float, float, str]]:
    """The soak's worker's log lines (INFO and above, JSON), as instants; its warnings and
    errors, and any line that is not pgq's (a traceback), are also printed."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
            at = datetime.fromisoformat(entry["time"]).timestamp()
            what = f"worker {entry['level']} {entry['logger']}: {entry['message']}"
        except (ValueError, KeyError, TypeError):
            print(f"worker: {line}")  # not one of pgq's lines: Python's own output
            continue
        if entry["level"] not in ("DEBUG", "INFO"):
            print(what)
        events.append((at, 0.0, what))
    return events


def worker_pauses(path: Path) -> list[tuple[float, float, str]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        at, took, what = line.split(maxsplit=2)
        events.append((float(at), float(took), what))
    return events


def explain(row: dict[str, Any], events: list[tuple[float, float, str]]) -> None:
    """Name, in ``row``, the events that overlapped its worst job's wait, and those that
    overlapped each second whose p99 missed the target (from the second's start, less half
    a second, to its end plus its slowest wait)."""

    def overlapping(start: float, end: float) -> list[str]:
        return [
            f"{datetime.fromtimestamp(at, UTC):%H:%M:%S.%f}"[:-3] + f" +{took * 1000:.0f} ms {what}"
            for at, took, what in events
            if at <= end and at + took >= start
        ]

    row["slow_seconds"] = [
        {"second": second, "jobs": jobs, "p99_ms": p99, "max_ms": top,
         "events": overlapping(second - 0.5, second + 1 + top / 1000)}
        for second, jobs, p99, top in row.get("seconds", [])
        if p99 > P99_TARGET_MS
    ]  # fmt: skip
    if row["worst_due"] is None:
        row["worst_events"] = []
        return
    row["worst_events"] = overlapping(row["worst_due"] - 0.5, row["worst_claimed"])


def share(part: float, total: float) -> str:
    return f"{part / total:.1%}" if total > 0 else "-"


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    span = min(5, len(rows) // 2) or 1
    first = statistics.fmean(r["completed"] for r in rows[:span])
    last = statistics.fmean(r["completed"] for r in rows[-span:])
    worst = max((r["p99_ms"] if r["p99_ms"] is not None else float("inf")) for r in rows)
    worst_ack = max(
        (r["ack_p99_ms"] if r.get("ack_p99_ms") is not None else float("inf")) for r in rows
    )
    settled = rows[min(span, len(rows) - 1)]
    size = [r["heap_mb"] + r["indexes_mb"] for r in rows]
    growth = size[-1] / (settled["heap_mb"] + settled["indexes_mb"])
    quiet = [r for r in rows if r.get("cpu_s") and r["steal_s"] / r["cpu_s"] < QUIET_STEAL]
    return {
        "worst_minute_p99_ms": worst,
        "p99_met": worst <= P99_TARGET_MS and all(r["not_picked_up"] == 0 for r in rows),
        "worst_minute_ack_p99_ms": worst_ack,
        "ack_p99_met": worst_ack <= P99_TARGET_MS and all(r["not_picked_up"] == 0 for r in rows),
        "first_minutes_rate": first / 60,
        "last_minutes_rate": last / 60,
        "throughput_ratio": last / first,
        "throughput_met": abs(last / first - 1) <= 0.10,
        "size_from_minute": settled["minute"],
        "size_growth": growth,
        "size_met": growth <= 1.10,
        # On a virtual machine: the minutes the hypervisor took (almost) nothing from.
        "quiet_minutes": [r["minute"] for r in quiet],
        "quiet_worst_p99_ms": max((r["p99_ms"] or 0.0 for r in quiet), default=None),
    }


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = [r["minute"] for r in rows]
    fig, (top, mid, low, host) = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    top.plot(x, [r["p99_ms"] for r in rows], marker="o", label="p99")
    top.plot(x, [r["p50_ms"] for r in rows], marker=".", label="p50")
    top.plot(
        x, [r.get("ack_p99_ms") for r in rows], marker="x", linestyle=":",
        label="p99 from the commit's acknowledgement",
    )  # fmt: skip
    top.axhline(P99_TARGET_MS, color="red", linestyle="--", linewidth=1, label="target (p99)")
    top.set_ylabel("pickup latency (ms)")
    top.set_yscale("log")
    top.legend(loc="best", fontsize="small", framealpha=0.8)
    top.set_title(
        f"pgq soak: {result['minutes']} minutes at {result['offered_rate']:,.0f} jobs/s offered"
        f" (half of {result['sustained_rate']:,.0f}/s)"
    )
    mid.plot(x, [r["completed"] / 60 for r in rows], marker="o", color="green")
    mid.set_ylabel("completed jobs/s")
    mid.set_ylim(0, max(r["completed"] / 60 for r in rows) * 1.2)
    low.plot(x, [r["heap_mb"] for r in rows], marker="o", label="heap")
    low.plot(x, [r["indexes_mb"] for r in rows], marker="o", label="indexes")
    low.set_ylabel("pgq_jobs size (MB)")
    low.set_ylim(bottom=0)
    low.legend(loc="upper left")
    for key, label in (("steal_s", "stolen by the hypervisor"), ("iowait_s", "waiting for I/O")):
        host.plot(
            x, [100 * r[key] / r["cpu_s"] if r["cpu_s"] else 0 for r in rows], marker="o",
            label=label,
        )  # fmt: skip
    host.set_ylabel("cores' time (%)")
    host.set_xlabel("minute")
    host.set_ylim(bottom=0)
    host.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def main() -> None:
    minutes = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rate = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    args = [*sys.argv[3:5], "", ""]
    table = parse_settings(args[0], "TABLE", _TABLE_SETTING, "a number, on or off")
    server = parse_settings(args[1], "SERVER", _SERVER_SETTING, "e.g. max_wal_size=4GB")
    if minutes < 1:
        raise SystemExit("MINUTES must be at least 1")
    result = await soak(minutes, rate, table, server)
    result["verdict"] = verdict(result)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    chart(result, RESULTS / "soak.png")
    v = result["verdict"]
    print(
        f"\nworst minute's p99 pickup: {v['worst_minute_p99_ms']:.1f} ms "
        f"(target ≤ {P99_TARGET_MS:g}): {'met' if v['p99_met'] else 'NOT met'}"
    )
    print(
        f"the same from each enqueue's acknowledged commit: {v['worst_minute_ack_p99_ms']:.1f} ms"
        f" (target ≤ {P99_TARGET_MS:g}): {'met' if v['ack_p99_met'] else 'NOT met'}"
    )
    print(
        f"throughput, last minutes / first: {v['last_minutes_rate']:,.0f} / "
        f"{v['first_minutes_rate']:,.0f} = {v['throughput_ratio']:.3f} (within 10 %): "
        f"{'met' if v['throughput_met'] else 'NOT met'}"
    )
    print(
        f"heap + indexes, last minute / minute {v['size_from_minute']}: "
        f"{v['size_growth']:.3f} (at most 1.10): {'met' if v['size_met'] else 'NOT met'}"
    )
    g = result["enqueuer_gc"]
    print(
        f"this process's collector ({'tuned' if g['tuned'] else 'untuned'}, first threshold "
        f"{g['threshold']:,}): collections by generation {g['collections']}, "
        f"{g['tracked_at_end']:,} objects tracked at the end and {g['frozen']:,} frozen"
    )
    if v["quiet_minutes"] and len(v["quiet_minutes"]) < len(result["rows"]):
        print(
            f"minutes with less than {QUIET_STEAL:.0%} of the cores stolen by the hypervisor: "
            f"{len(v['quiet_minutes'])}, their worst p99 pickup "
            f"{v['quiet_worst_p99_ms']:.1f} ms"
        )
    print("\neach minute's worst job: when it was enqueued, its wait, and what overlapped it")
    for row in result["rows"]:
        if row["worst_due"] is None:
            continue
        due = datetime.fromtimestamp(row["worst_due"], UTC)
        wait = (row["worst_claimed"] - row["worst_due"]) * 1000
        print(f"minute {row['minute']:>3}: {due:%H:%M:%S.%f}"[:-3] + f", waited {wait:,.1f} ms")
        if row.get("worst_errors"):
            # Noop jobs fail nothing: an entry means it was claimed before and handed back
            # (or interrupted), and its wait counts to its last claim.
            print(f"    errors before: {row['worst_errors']}, the last: {row['worst_last_error']}")
        if row.get("with_errors"):
            print(f"    jobs of the minute with an error entry: {row['with_errors']:,}")
        for event in row["worst_events"]:
            print(f"    {event}")
        if row.get("slow_seconds"):
            print(f"    seconds with p99 over {P99_TARGET_MS:g} ms, their jobs, p99 and max:")
        for slow in row.get("slow_seconds", []):
            at = datetime.fromtimestamp(slow["second"], UTC)
            print(
                f"      {at:%H:%M:%S}  {slow['jobs']:>6,} jobs  p99 {slow['p99_ms']:7.1f} ms"
                f"  max {slow['max_ms']:7.1f} ms"
            )
            for event in slow["events"]:
                if event not in row["worst_events"]:
                    print(f"        {event}")
    print(f"wrote {RESULTS / 'soak.json'} and {RESULTS / 'soak.png'}")


if __name__ == "__main__":
    run(lambda: main())
