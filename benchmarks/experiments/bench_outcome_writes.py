"""Are this tree's outcome statements, and its drain, as fast as another tree's?

Written to check FAIL_ATTEMPT as one fenced UPDATE again; no doc quotes its figures.

The outcome writes of two trees side by side: `python benchmarks/experiments/bench_outcome_writes.py
writes OTHER_SRC [ROUNDS]`, and the drain of both: `... drain OTHER_SRC [ROUNDS]`.

``writes`` times the statements that end attempts as this tree writes them against the
same statements read from the tree whose ``src`` directory is OTHER_SRC, on one database
migrated by this tree (a revision that only adds to the schema runs the older statements
too). Each round measures both trees, in alternating order (A B, then B A): one
``COMPLETE_JOBS`` of 1,000 outcomes (retryable, discarded or handed back, each with an error
entry) and 1,000 ``FAIL_ATTEMPT`` sent in one pipeline, every other job with a cancel
request. Before each measurement the same 1,000 jobs are made running again with fresh
tokens (untimed). ``drain`` runs `bench_pgq.py drain 100` (20,000 jobs at concurrency 100)
under each tree in turn, on a database of its own. Both print each tree's median, the
median of the per-round ratios (this tree / OTHER_SRC) with their range, and a ``RESULT``
line.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import dispatch, drop_database, emit, fresh_database, pgq_migrate

from pgq._db import sql
from pgq._worker.attempt import error_entry

BATCH = 1_000
HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
THIS_SRC = HERE.parents[1] / "src"
PRODUCER = uuid.uuid4()
#: Makes the benchmark's jobs running again: a fresh token each, max_attempts 1 for a
#: quarter (FAIL_ATTEMPT discards them), a cancel request on every other one.
RESET = """
UPDATE pgq_jobs
SET state = 'running', attempt = 1, max_attempts = CASE WHEN id % 4 = 3 THEN 1 ELSE 3 END,
    attempt_token = gen_random_uuid(), finalized_at = NULL, errors = '[]', result = NULL,
    cancel_requested_at = CASE WHEN id % 2 = 0 THEN now() END, attempted_at = now(),
    producer_id = $1, attempted_by = 'bench', deadline_at = NULL
RETURNING id, attempt_token
"""
#: What the outcome batch wants for a job, by its id modulo 4.
WANTED = ("retryable", "available", "retryable", "discarded")


def statements(src: Path) -> dict[str, str]:
    """The outcome statements as the tree at ``src`` writes them."""
    return sql.parse((src / "pgq" / "_db" / "sql" / "outcomes.sql").read_text())


async def complete_jobs(conn: asyncpg.Connection, statement: str) -> float:
    rows = await conn.fetch(RESET, PRODUCER)
    ids = [r["id"] for r in rows]
    wanted = [WANTED[i % 4] for i in ids]
    args = (
        ids,
        [r["attempt_token"] for r in rows],
        wanted,
        [None] * len(ids),
        [error_entry(1, "shutdown" if w == "available" else "exception", "bench") for w in wanted],
        [None] * len(ids),
        [-1 if w == "available" else 0 for w in wanted],
        False,
        False,
        None,
    )
    started = time.perf_counter()
    written = await conn.fetch(statement, *args)
    seconds = time.perf_counter() - started
    assert len(written) == len(ids), "the fence refused a running attempt"
    return seconds


async def fail_attempts(conn: asyncpg.Connection, statement: str) -> float:
    rows = await conn.fetch(RESET, PRODUCER)
    entry = error_entry(1, "internal", "bench")
    args = [(r["id"], r["attempt_token"], entry, False) for r in rows]
    started = time.perf_counter()
    await conn.executemany(statement, args)
    seconds = time.perf_counter() - started
    assert not await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'")
    return seconds


def report(workload: str, other: Path, samples: dict[str, list[float]]) -> None:
    ratios = [a / b for a, b in zip(samples["this"], samples["other"], strict=True)]
    result = {
        "workload": workload,
        "other": str(other),
        "rounds": len(ratios),
        "this_median": statistics.median(samples["this"]),
        "other_median": statistics.median(samples["other"]),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(
        f"{workload}: this {result['this_median']:.4g}, other {result['other_median']:.4g}; "
        f"this/other median {result['ratio_median']:.3f} "
        f"(range {result['ratio_min']:.3f}..{result['ratio_max']:.3f}, {len(ratios)} rounds)"
    )
    emit(result)


async def writes(other_src: str, rounds: str = "15") -> None:
    other = Path(other_src).resolve()
    trees = {"this": dict(sql.STATEMENTS), "other": statements(other)}
    dsn = await fresh_database("bench_outcome_writes")
    await pgq_migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, $1::int)",
            BATCH,
        )
        samples: dict[str, list[float]] = {
            f"{w}/{t}": [] for w in ("COMPLETE_JOBS", "FAIL_ATTEMPT") for t in trees
        }
        order = list(trees)
        for tree in order:  # warm-up, untimed: plans, caches
            await complete_jobs(conn, trees[tree]["COMPLETE_JOBS"])
            await fail_attempts(conn, trees[tree]["FAIL_ATTEMPT"])
        for _ in range(int(rounds)):
            await conn.execute("VACUUM pgq_jobs")
            for tree in order:
                samples[f"COMPLETE_JOBS/{tree}"].append(
                    await complete_jobs(conn, trees[tree]["COMPLETE_JOBS"])
                )
                samples[f"FAIL_ATTEMPT/{tree}"].append(
                    await fail_attempts(conn, trees[tree]["FAIL_ATTEMPT"])
                )
            order.reverse()
    finally:
        await conn.close()
        await drop_database("bench_outcome_writes")
    for workload in ("COMPLETE_JOBS", "FAIL_ATTEMPT"):
        report(
            f"{workload} x{BATCH} (s)",
            other,
            {t: samples[f"{workload}/{t}"] for t in trees},
        )


def drain_rate(src: Path) -> float:
    """Jobs per second of `bench_pgq.py drain 100` under the tree at ``src``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(src), str(SUITE)))}
    out = subprocess.run(
        [sys.executable, "bench_pgq.py", "drain", "100", "bench_outcome_writes_drain"],
        cwd=SUITE,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    rate: float = json.loads(line.removeprefix("RESULT "))["rate"]
    return rate


async def drain(other_src: str, rounds: str = "5") -> None:
    trees = {"this": THIS_SRC, "other": Path(other_src).resolve()}
    samples: dict[str, list[float]] = {t: [] for t in trees}
    order = list(trees)
    for _ in range(int(rounds)):
        for tree in order:
            samples[tree].append(drain_rate(trees[tree]))
        order.reverse()
    # Rates: a ratio above 1 is this tree draining faster.
    report("drain 100 (jobs/s)", trees["other"], samples)


if __name__ == "__main__":
    dispatch({"writes": writes, "drain": drain})
