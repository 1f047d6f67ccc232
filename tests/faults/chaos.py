"""A chaos harness ("total queue", after Jepsen): worker processes run jobs whose effect is
written in the job's own transaction (``ctx.complete(connection=...)``), a nemesis injects
faults on a schedule, and a checker reads what the database holds once the run settles.

Faults here: ``kill`` (kill -9, then a new process under the same name) and ``stop``
(SIGSTOP, then SIGCONT after a while: a zombie that wakes up). The scale-out work adds more
(connections terminated, a partition, a server restart, a failover) through the same
:class:`Nemesis`.

The checker's violations: a job never final (lost), a job whose effect exists other than
exactly once, an effect of an attempt that is not the one that completed the job, a job left
``running``, a producer row left behind by a worker that stopped cleanly.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg

import pgq
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
    def violations(self) -> dict[str, list[Any]]:
        """Every check that failed, with the jobs (or producers) it failed on."""
        checks: dict[str, list[Any]] = {
            "lost": self.lost,
            "effect more than once": self.duplicated,
            "completed without its effect": self.missing_effect,
            "effect of an attempt that did not complete the job": self.stray_effects,
            "left running": self.left_running,
            "producer rows left behind": self.leftover_producers,
        }
        return {name: found for name, found in checks.items() if found}

    def summary(self) -> str:
        """A short table of the run."""
        kinds: dict[str, int] = {}
        for f in self.faults:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        lines = [
            f"seed {self.seed}: jobs {self.jobs}, completed {self.completed}, rescued "
            f"{self.rescued}, settled {self.settle_s:.1f}s after the last fault",
            "faults: " + (", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"),
        ]
        lines += [f"VIOLATION {name}: {found[:10]}" for name, found in self.violations.items()]
        lines.append("no violation" if not self.violations else "")
        return "\n".join(line for line in lines if line)

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
                "violations": self.violations,
            },
            indent=2,
        )


class Nemesis:
    """Injects faults into worker processes on a random schedule (seeded: a run can be
    replayed), one at a time, each healed before the next. A killed worker comes back as a
    new process under a new name (``chaos-0.1``): the dead one's rows are its own."""

    def __init__(self, workers: list[WorkerProcess], rng: random.Random, kinds: list[str]):
        self.workers = workers
        self.rng = rng
        self.kinds = kinds
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
            await self._actions[kind](i)
            fault.healed_at_s = time.monotonic() - self._started

    async def _kill(self, i: int) -> None:
        old = self.workers[i]
        old.kill9()
        self.dead.append(old)
        base, _, gen = old.name.partition(".")
        new = WorkerProcess(
            f"{base}.{int(gen or 0) + 1}", old.dsn, old.log_path.parent, CHAOS_SETTINGS,
            concurrency=old.concurrency,
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


async def _feed(
    client: pgq.Client, rng: random.Random, jobs: int, seconds: float, ids: list[int]
) -> None:
    batches = 10
    for b in range(batches):
        n = jobs // batches + (1 if b < jobs % batches else 0)
        specs = [
            pgq.JobSpec(
                "tx_effect",
                {"work_s": rng.uniform(0.1, 1.0), "before_commit_s": rng.uniform(0, 0.2)},
            )
            for _ in range(n)
        ]
        ids.extend(j.id for j in await client.enqueue_many(specs))
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
) -> Report:
    """One chaos run: start the workers, enqueue the jobs, let the nemesis loose for
    ``seconds``, wait for every job to be final (or ``settle_limit_s``), stop the workers
    cleanly, check."""
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    await prepare(dsn)
    names = [f"chaos-{i}" for i in range(workers)]
    procs = [WorkerProcess(n, dsn, log_dir, CHAOS_SETTINGS, concurrency=10) for n in names]
    nemesis = Nemesis(procs, rng, list(kinds))
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
        for p in procs:
            p.stop()
    names = [p.name for p in procs]
    report = await check(dsn, ids, names)
    report.faults = nemesis.faults
    report.settle_s = settle_s
    report.seed = seed
    return report
