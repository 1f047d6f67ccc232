"""What does flow control cost a drain?

Answer: with no-op jobs, a concurrency limit that never binds drains at 0.90 of the
unlimited rate, a concurrency and a rate limit at 0.77, per-key limits at 0.87, chains of 10
at 0.21 (docs/flow-control.md, results/limits.txt).

Drains of a queue with limits beside the same queue without, in interleaved rounds of one
run, each cell's rate compared with its reference's in the same round.

`python benchmarks/experiments/bench_limits.py [ROUNDS] [--old SRC] [CELL ...]` (default 5
rounds, every cell). Each drain runs in worker processes of their own (started, then told to
go: their start-up is not timed) from a table of exactly its jobs with fresh statistics. With
`--old SRC` (another checkout's `src`), every cell but the references also runs on that code,
in the same rounds, interleaved, on a database of its own that the old code migrated (its
schema, its functions); each process fills its own drain's table, with its own code.

Cells, and the reference each is compared with:

- `unlimited`: one worker at concurrency 10 draining 10,000 no-op jobs (the reference of
  the no-op cells);
- `limited`: the same under a concurrency limit of 10,000 and a rate of 1,000,000 a second,
  limits that never bind: the limited claim's own cost;
- `concurrency-10000`: the concurrency limit alone (no rate, so no log of starts);
- `concurrency-5`: a concurrency limit of 5, below the worker's 10 slots;
- `keyed-100`: jobs spread over 100 limit keys, a per-key limit that never binds;
- `keyed-1000-1`: 1,000 keys, at most 1 running per key;
- `chained`: 2,000 chains of 10 jobs, each waiting for the one before (no limits: the
  dependencies' cost);
- `unlimited-50`: one worker with 50 slots draining 20,000 jobs that each await 10 ms (the
  reference of the binding cells: at most 5,000 a second);
- `binding-50`: the same jobs under a concurrency limit of 50, one worker with 100 slots;
- `binding-50x3`: the same limit, three worker processes with 100 slots each;
- `unlimited-50-async`, `binding-50-async`: `unlimited-50` and `binding-50` with the
  workers' `async_commit` on (claims and outcomes commit without waiting for the disk).

Prints each round, then per cell and code the median jobs/s with its range, and the
median (with range) of its ratio to its reference's rate in the same round; writes them to
`results/limits.json` and `results/limits.txt` (the latest run only).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import anyio
import asyncpg
from common import fresh_database, pgq_migrate, reset_jobs

import pgq

N_NOOP = 10_000
N_SLEEP = 20_000
HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Nothing: the queue's own cost."""


@app.task
async def sleep10(ctx: pgq.JobContext, i: int) -> None:
    """10 ms of waiting: a job that does I/O."""
    await anyio.sleep(0.01)


@dataclass(frozen=True)
class Cell:
    """A drain: its jobs, its limits, its workers and the cell it is compared with."""

    task: str
    concurrency: int
    workers: int = 1
    limits: tuple[tuple[str, object], ...] = ()
    keys: int = 0
    chains: bool = False
    reference: str = "unlimited"
    async_commit: bool = False

    @property
    def n(self) -> int:
        return N_NOOP if self.task == "noop" else N_SLEEP

    @property
    def limited(self) -> bool:
        return bool(self.limits)


CELLS = {
    "unlimited": Cell("noop", 10),
    "limited": Cell("noop", 10, limits=(("concurrency", 10_000), ("rate", (1_000_000, 1.0)))),
    "concurrency-10000": Cell("noop", 10, limits=(("concurrency", 10_000),)),
    "concurrency-5": Cell("noop", 10, limits=(("concurrency", 5),)),
    "keyed-100": Cell("noop", 10, limits=(("key_concurrency", 10_000),), keys=100),
    "keyed-1000-1": Cell("noop", 10, limits=(("key_concurrency", 1),), keys=1_000),
    "chained": Cell("noop", 10, chains=True),
    "unlimited-50": Cell("sleep10", 50, reference="unlimited-50"),
    "binding-50": Cell("sleep10", 100, limits=(("concurrency", 50),), reference="unlimited-50"),
    "binding-50x3": Cell(
        "sleep10",
        100,
        workers=3,
        limits=(("concurrency", 50),),
        reference="unlimited-50",
    ),
    "unlimited-50-async": Cell("sleep10", 50, reference="unlimited-50-async", async_commit=True),
    "binding-50-async": Cell(
        "sleep10",
        100,
        limits=(("concurrency", 50),),
        reference="unlimited-50-async",
        async_commit=True,
    ),
}


async def fill(dsn: str, cell: Cell) -> None:
    """An empty table and log of starts, the cell's limits, then its N jobs, analyzed."""
    await reset_jobs(dsn)
    conn = await asyncpg.connect(dsn)
    try:  # the previous drain's starts: each claim would trim them (the sums: not on old code)
        await conn.execute("TRUNCATE pgq_rate_log")
        if await conn.fetchval("SELECT to_regclass('pgq_rate_sums') IS NOT NULL"):
            await conn.execute("TRUNCATE pgq_rate_sums")
    finally:
        await conn.close()
    async with pgq.Client(dsn, app=app) as client:
        await client.set_queue_limits("default", **dict(cell.limits))  # type: ignore[arg-type]
        if cell.chains:
            for start in range(0, cell.n, 10):
                await client.enqueue_chain(
                    [pgq.JobSpec(cell.task, {"i": i}) for i in range(start, start + 10)]
                )
        else:
            for start in range(0, cell.n, 5_000):
                await client.enqueue_many(
                    [
                        pgq.JobSpec(
                            cell.task,
                            {"i": i},
                            limit_key=str(i % cell.keys) if cell.keys else None,
                        )
                        for i in range(start, start + 5_000)
                    ]
                )
    await reset_jobs(dsn, analyze=True)


async def drain(dsn: str, cell: Cell, src: str | None) -> float:
    """Jobs/s of the cell's workers, processes running the code under ``src`` (None: this
    tree's), from the moment they are told to go until the last one finds nothing left.
    The first fills the table, with its own code, before it says it is ready."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    pipe = asyncio.subprocess.PIPE
    procs = []
    for i in range(cell.workers):
        command = (sys.executable, __file__, "--worker", dsn, name_of(cell), str(i == 0))
        procs.append(
            await asyncio.create_subprocess_exec(
                *command, stdin=pipe, stdout=pipe, env=env, cwd=HERE
            )
        )
    for p in procs:
        assert p.stdout is not None
        line = await p.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"a worker did not start: {line!r}")
    started = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        await p.stdin.drain()
    ends = []
    for p in procs:
        assert p.stdout is not None
        ends.append(float((await p.stdout.readline()).decode()))
        if await p.wait() != 0:
            raise RuntimeError("a worker failed")
    left = await _left(dsn)
    if left:
        raise RuntimeError(f"{left} jobs were not completed")
    return cell.n / (max(ends) - started)


async def _left(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state <> 'completed'"))
    finally:
        await conn.close()


def name_of(cell: Cell) -> str:
    return next(name for name, c in CELLS.items() if c is cell)


async def worker(dsn: str, name: str, fills: bool) -> None:
    """One worker process of cell ``name``: fills the table if ``fills``, says it is ready,
    waits to be told to go, drains in burst mode, prints the time it finished (the clock of
    the machine the parent shares)."""
    cell = CELLS[name]
    if fills:
        await fill(dsn, cell)
    w = pgq.Worker(
        app, dsn, concurrency=cell.concurrency, metrics=False, async_commit=cell.async_commit
    )
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    await w.run(burst=True)
    print(time.time(), flush=True)


def spread(values: list[float]) -> str:
    return f"{min(values):,.2f}-{max(values):,.2f}" if values else "-"


async def main(rounds: int, names: list[str], old: str | None) -> None:
    dsn = await fresh_database("pgq_bench_limits")
    await pgq_migrate(dsn)  # in a process of its own: alembic is not the worker's
    dsns = {None: dsn}
    runs = [(name, None) for name in names]
    if old is not None:
        dsns[old] = await fresh_database("pgq_bench_limits_old")
        await pgq_migrate(dsns[old], src=old)
        runs += [(name, old) for name in names if CELLS[name].reference != name]
    runs.sort(key=lambda r: names.index(r[0]))
    rates: dict[tuple[str, str | None], list[float]] = {r: [] for r in runs}
    refs = {CELLS[n].reference for n in names}
    missing = refs - set(names)
    if missing:
        raise SystemExit(f"cells need their references too: {', '.join(sorted(missing))}")
    for r in range(rounds):
        for name, src in runs:
            rates[name, src].append(await drain(dsns[src], CELLS[name], src))
        print(
            f"round {r + 1}: "
            + ", ".join(f"{_label(n, s)}: {v[-1]:,.0f}" for (n, s), v in rates.items()),
            flush=True,
        )
        report(r + 1, rates)


def report(rounds: int, rates: dict[tuple[str, str | None], list[float]]) -> None:
    """The table of the rounds so far, printed and written to results/limits.*."""
    rows = []
    for (name, src), values in rates.items():
        ref = rates[CELLS[name].reference, None]
        ratios = [v / b for v, b in zip(values, ref, strict=True)]
        rows.append(
            {
                "cell": name,
                "code": "old" if src else "new",
                "jobs_per_s": values,
                "median": statistics.median(values),
                "ratio_to_reference": ratios,
                "median_ratio": statistics.median(ratios),
                "reference": CELLS[name].reference,
            }
        )
    lines = [
        f"bench_limits.py: {rounds} interleaved rounds, {N_NOOP:,} no-op or {N_SLEEP:,} "
        "10 ms jobs a drain, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "",
        f"{'cell':18} {'code':4} {'jobs/s':>8} {'range':>15}  {'vs reference':>12} "
        f"{'range':>11}  reference",
    ]
    for row in rows:
        values, ratios = row["jobs_per_s"], row["ratio_to_reference"]
        lines.append(
            f"{row['cell']:18} {row['code']:4} {row['median']:8,.0f} "
            f"{min(values):7,.0f}-{max(values):<7,.0f}  {row['median_ratio']:12.2f} "
            f"{spread(ratios):>11}  {row['reference']}"
        )
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "limits.txt").write_text(text + "\n")
    (RESULTS / "limits.json").write_text(json.dumps({"rounds": rounds, "rows": rows}, indent=1))


def _label(name: str, src: str | None) -> str:
    return f"{name}{' (old)' if src else ''}"


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--worker":
        anyio.run(worker, args[1], args[2], args[3] == "True")
        sys.exit(0)
    n = int(args.pop(0)) if args and args[0].isdigit() else 5
    old_src = None
    if "--old" in args:
        i = args.index("--old")
        old_src = str(Path(args[i + 1]).resolve())
        del args[i : i + 2]
    anyio.run(main, n, args or list(CELLS), old_src)
