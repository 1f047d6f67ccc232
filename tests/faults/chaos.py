"""A chaos harness ("total queue", after Jepsen): worker processes run jobs whose effect is
written in the job's own transaction (``ctx.complete(connection=...)``), a nemesis injects
faults on a schedule, and a checker reads what the database holds once the run settles.

Faults here: ``kill`` (kill -9, then a new process under the next name) and ``stop``
(SIGSTOP, then SIGCONT after a while: a zombie that wakes up). ``python -m
tests.faults.chaos_run`` (`make chaos`) adds connections terminated, a network partition, a
server restart and a failover through the same :class:`Nemesis`, on a cluster of its own.

The checker's violations: a job never final (lost), a job whose effect exists other than
exactly once, an effect of an attempt that is not the one that completed the job, a job left
``running``, a producer row left behind by a worker that stopped cleanly.
"""

from __future__ import annotations

import json
import random
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg

import pgq
from pgq._db.connections import CONNECTION_ERRORS
from tests.faults.workers import SHORT, WorkerProcess, wait_registered

#: Liveness settings for chaos runs: short, so rescues happen within a bounded run.
CHAOS_SETTINGS: dict[str, float] = {**SHORT, "reap_after": 30.0}

#: Idle-in-transaction sessions die after this long: a stopped (or cut-off) worker's open
#: transaction, which keeps its job locked from the rescuer, cannot outlive it.
IDLE_IN_TRANSACTION_S = 2.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS starts (job_id bigint, attempt int, worker text,
                                   at timestamptz DEFAULT now());
CREATE TABLE IF NOT EXISTS effects (job_id bigint, attempt int, worker text,
                                    at timestamptz DEFAULT now());
"""


@dataclass
class Fault:
    """One fault the nemesis injected: what, on whom, when (seconds into the run)."""

    kind: str
    worker: str
    at_s: float
    healed_at_s: float | None = None
    #: Seconds from the heal to the next job completed anywhere (None: none was left to run).
    recovery_s: float | None = None


@dataclass
class Report:
    """What the checker found, and what the nemesis did."""

    jobs: int
    completed: int
    faults: list[Fault] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    missing_effect: list[int] = field(default_factory=list)
    stray_effects: list[int] = field(default_factory=list)
    left_running: list[int] = field(default_factory=list)
    leftover_producers: list[str] = field(default_factory=list)
    rescued: int = 0
    settle_s: float = 0.0
    seed: int = 0

    @property
    def checks(self) -> dict[str, list[Any]]:
        """Every check, with the jobs (or producers) it failed on (empty: it held)."""
        return {
            "lost (never final)": self.lost,
            "effect more than once (two accepted outcomes)": self.duplicated,
            "completed without its effect": self.missing_effect,
            "effect of a rejected attempt": self.stray_effects,
            "left running": self.left_running,
            "producer rows left behind": self.leftover_producers,
        }

    @property
    def violations(self) -> dict[str, list[Any]]:
        """Every check that failed, with the jobs (or producers) it failed on."""
        return {name: found for name, found in self.checks.items() if found}

    def summary(self) -> str:
        """A short table of the run: the faults by kind with their recovery times, then the
        checks."""
        kinds: dict[str, list[Fault]] = {}
        for f in self.faults:
            kinds.setdefault(f.kind, []).append(f)
        lines = [
            f"seed {self.seed}: jobs {self.jobs}, completed {self.completed}, rescued "
            f"{self.rescued}, settled {self.settle_s:.1f}s after the last fault",
            "",
            f"{'fault':<11} {'count':>5} {'recovery median':>16} {'recovery max':>13}",
        ]
        for kind, faults in sorted(kinds.items()):
            times = sorted(f.recovery_s for f in faults if f.recovery_s is not None)
            median = f"{statistics.median(times):.2f} s" if times else "-"
            worst = f"{times[-1]:.2f} s" if times else "-"
            lines.append(f"{kind:<11} {len(faults):>5} {median:>16} {worst:>13}")
        if not kinds:
            lines.append("(no fault)")
        lines.append("")
        lines.append(f"{'check':<52} {'violations':>10}")
        for name, found in self.checks.items():
            shown = f"{len(found)}" + (f"  e.g. {found[:5]}" if found else "")
            lines.append(f"{name:<52} {shown:>10}")
        lines.append("no violation" if not self.violations else "VIOLATIONS FOUND")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report for a file."""
        return json.dumps(
            {
                "seed": self.seed,
                "jobs": self.jobs,
                "completed": self.completed,
                "rescued": self.rescued,
                "settle_s": self.settle_s,
                "faults": [f.__dict__ for f in self.faults],
                "recovery_s_by_kind": {
                    kind: [f.recovery_s for f in self.faults if f.kind == kind]
                    for kind in sorted({f.kind for f in self.faults})
                },
                "violations": self.violations,
            },
            indent=2,
        )


class Nemesis:
    """Injects faults into worker processes on a random schedule (seeded: a run can be
    replayed), one at a time, each healed before the next. A killed worker comes back as a
    new process under a new name (``chaos-0.1``): the dead one's rows are its own."""

    def __init__(
        self,
        workers: list[WorkerProcess],
        rng: random.Random,
        kinds: list[str],
        completed: Callable[[], Awaitable[int]] | None = None,
    ):
        self.workers = workers
        self.rng = rng
        self.kinds = kinds
        self._completed = completed
        self.faults: list[Fault] = []
        self.dead: list[WorkerProcess] = []
        self._started = time.monotonic()
        self._actions: dict[str, Callable[[int], Awaitable[None]]] = {
            "kill": self._kill,
            "stop": self._stop,
        }

    def add(self, kind: str, action: Callable[[int], Awaitable[None]]) -> None:
        """A fault of another kind, acting on ``workers[i]`` (the scale-out harness adds its
        own)."""
        self._actions[kind] = action
        if kind not in self.kinds:
            self.kinds.append(kind)

    async def run(self, seconds: float, pause_s: tuple[float, float] = (0.5, 2.0)) -> None:
        """Inject faults for ``seconds``, with a random pause between them."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await anyio.sleep(self.rng.uniform(*pause_s))
            kind = self.rng.choice(self.kinds)
            i = self.rng.randrange(len(self.workers))
            fault = Fault(kind, self.workers[i].name, time.monotonic() - self._started)
            self.faults.append(fault)
            before = await self._count()
            await self._actions[kind](i)
            fault.healed_at_s = time.monotonic() - self._started
            fault.recovery_s = await self._recovery(before)

    async def _count(self) -> int | None:
        if self._completed is None:
            return None
        with anyio.move_on_after(10):
            while True:
                try:
                    return await self._completed()
                except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    await anyio.sleep(0.2)  # the server is restarting or failing over
        return None

    async def _recovery(self, before: int | None) -> float | None:
        """Seconds from now (the heal) until a job completes that had not before the fault;
        None when nothing was left to complete within 60 s."""
        if before is None:
            return None
        healed = time.monotonic()
        with anyio.move_on_after(60):
            while True:
                now = await self._count()
                if now is not None and now > before:
                    return time.monotonic() - healed
                await anyio.sleep(0.05)
        return None

    async def _kill(self, i: int) -> None:
        old = self.workers[i]
        await anyio.to_thread.run_sync(old.kill9)
        self.dead.append(old)
        base, _, gen = old.name.partition(".")
        new = WorkerProcess(
            f"{base}.{int(gen or 0) + 1}", old.dsn, old.log_path.parent, CHAOS_SETTINGS,
            concurrency=old.concurrency, effects_dsn=old.effects_dsn, prefix=old.prefix,
        )  # fmt: skip
        self.workers[i] = new
        new.start()

    async def _stop(self, i: int) -> None:
        worker = self.workers[i]
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGSTOP)
        # Past stale_after at times: its jobs are rescued while it sleeps, and it wakes up a
        # zombie whose completions must be refused.
        await anyio.sleep(self.rng.uniform(1.0, CHAOS_SETTINGS["stale_after"] * 2))
        worker.proc.send_signal(signal.SIGCONT)


class Completions:
    """Counts completed jobs, over one connection made again when it breaks (a restart, a
    failover: the DSN may list several hosts)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None

    async def __call__(self) -> int:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn, timeout=5)
        try:
            with anyio.fail_after(5):
                n = await self._conn.fetchval(
                    "SELECT count(*) FROM pgq_jobs WHERE state = 'completed'"
                )
        except BaseException:
            self._conn.terminate()
            self._conn = None
            raise
        return int(n)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None


async def prepare(dsn: str) -> None:
    """The effect tables, and the idle-in-transaction bound on the run's database."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
        database = await conn.fetchval("SELECT current_database()")
        statement = await conn.fetchval(
            "SELECT format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L',"
            " $1::text, $2::text)",
            database,
            f"{int(IDLE_IN_TRANSACTION_S * 1000)}ms",
        )
        await conn.execute(statement)
    finally:
        await conn.close()


async def check(dsn: str, ids: list[int], worker_names: list[str]) -> Report:
    """Read what the run left in the database."""
    conn = await asyncpg.connect(dsn)
    try:
        jobs = {
            r["id"]: r
            for r in await conn.fetch(
                "SELECT id, state::text AS state, attempt, errors::text AS errors"
                " FROM pgq_jobs WHERE id = ANY($1)",
                ids,
            )
        }
        effects: dict[int, list[int]] = {}
        for r in await conn.fetch(
            "SELECT job_id, attempt FROM effects WHERE job_id = ANY($1)", ids
        ):
            effects.setdefault(r["job_id"], []).append(r["attempt"])
        leftovers = await conn.fetch(
            "SELECT worker_name FROM pgq_producers WHERE worker_name = ANY($1)", worker_names
        )
    finally:
        await conn.close()
    report = Report(jobs=len(ids), completed=0)
    for job_id in ids:
        row = jobs.get(job_id)
        done = effects.get(job_id, [])
        if row is None or row["state"] not in ("completed", "discarded", "cancelled"):
            report.lost.append(job_id)
        if row is not None and row["state"] == "running":
            report.left_running.append(job_id)
        if len(done) > 1:
            report.duplicated.append(job_id)
        if row is not None and row["state"] == "completed":
            report.completed += 1
            if not done:
                report.missing_effect.append(job_id)
            elif done != [row["attempt"]]:
                report.stray_effects.append(job_id)
        if row is not None and "rescued" in row["errors"]:
            report.rescued += 1
    report.leftover_producers = [r["worker_name"] for r in leftovers]
    return report


RETRYABLE: tuple[type[Exception], ...] = (
    *CONNECTION_ERRORS,
    asyncpg.PostgresError,
    pgq.DatabaseError,
)


async def _enqueue_through_faults(client: pgq.Client, specs: list[pgq.JobSpec]) -> list[pgq.Job]:
    """Enqueue, trying again while the server restarts or fails over, as an application
    would. A batch whose commit was cut off may have landed anyway: its jobs are then not
    among those the checker follows (it cannot know their ids), which hides nothing."""
    with anyio.fail_after(120):
        while True:
            try:
                return await client.enqueue_many(specs)
            except RETRYABLE:
                await anyio.sleep(0.5)


async def _feed(
    client: pgq.Client, rng: random.Random, jobs: int, seconds: float, ids: list[int]
) -> None:
    batches = max(10, int(seconds * 2))  # a batch every half second: work is always arriving
    for b in range(batches):
        n = jobs // batches + (1 if b < jobs % batches else 0)
        specs = [
            pgq.JobSpec(
                "tx_effect",
                {"work_s": rng.uniform(0.1, 1.0), "before_commit_s": rng.uniform(0, 0.2)},
            )
            for _ in range(n)
        ]
        ids.extend(j.id for j in await _enqueue_through_faults(client, specs))
        await anyio.sleep(seconds / batches)


async def run(
    dsn: str,
    log_dir: Path,
    *,
    workers: int = 3,
    jobs: int = 150,
    seconds: float = 20.0,
    seed: int | None = None,
    kinds: tuple[str, ...] = ("kill", "stop"),
    extra: Callable[[Nemesis], None] | None = None,
    settle_limit_s: float = 120.0,
    placement: Callable[[int], tuple[str, tuple[str, ...]]] | None = None,
) -> Report:
    """One chaos run: start the workers, enqueue the jobs, let the nemesis loose for
    ``seconds``, wait for every job to be final (or ``settle_limit_s``), stop the workers
    cleanly, check. ``placement(i)`` gives worker i's DSN and command prefix (a network
    namespace); by default every worker runs here on ``dsn``."""
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    await prepare(dsn)
    names = [f"chaos-{i}" for i in range(workers)]
    procs = []
    for i, name in enumerate(names):
        where, prefix = placement(i) if placement else (dsn, ())
        procs.append(
            WorkerProcess(name, where, log_dir, CHAOS_SETTINGS, concurrency=10, prefix=prefix)
        )
    completions = Completions(dsn)
    nemesis = Nemesis(procs, rng, list(kinds), completed=completions)
    if extra is not None:
        extra(nemesis)
    try:
        for p in procs:
            p.start()
        conn = await asyncpg.connect(dsn)
        try:
            await wait_registered(conn, *names)
        finally:
            await conn.close()
        async with pgq.Client(dsn) as client:
            ids: list[int] = []
            async with anyio.create_task_group() as tg:
                # Jobs arrive throughout the faults: they always hit work in progress.
                tg.start_soon(_feed, client, rng, jobs, seconds, ids)
                await nemesis.run(seconds)
            last_fault = time.monotonic()
            with anyio.move_on_after(settle_limit_s):
                for job_id in ids:
                    await client.wait(job_id)
            settle_s = time.monotonic() - last_fault
    finally:
        await completions.close()
        # Off the event loop, all at once: it may host the workers' forwarders, which must
        # go on carrying their traffic while they stop.
        async with anyio.create_task_group() as stopping:
            for p in procs:
                stopping.start_soon(anyio.to_thread.run_sync, p.stop)
    names = [p.name for p in procs]
    report = await check(dsn, ids, names)
    report.faults = nemesis.faults
    report.settle_s = settle_s
    report.seed = seed
    return report
