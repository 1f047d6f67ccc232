"""Does `pgq worker --processes 2` drain faster than one process on one host?

Answer: on a shared two-core machine, 1.71 times for jobs of 2 ms of pure Python and 1.61
times for no-op jobs, on the database clock (results/processes.txt).

`pgq worker --processes 2` beside one `pgq worker` process, on CPU-bound and no-op jobs.

`python benchmarks/experiments/bench_processes.py [ROUNDS]` (default 5). Each round drains, by
`pgq worker --burst` started from the CLI, a backlog of CPU_JOBS jobs of about 2 ms of pure
Python each (a fixed amount of work, calibrated once on this machine), then NOOP_JOBS no-op
jobs, with one process and with `--processes 2`; the two are interleaved and their order
alternates from round to round. A drain is timed on the wall clock from the command's start
to its exit (start-up included) and on the database clock from the first attempt to the
last finish; `vmstat 1` runs beside each drain (us, sy, id, wa: the mean of its samples).
Prints and writes `results/processes.json` and `results/processes.txt` (the latest run):
per workload the median jobs/s of each side with its spread (min..max), and the median of
the per-round ratios (2 processes / 1), which is what the claim is judged by; and the
CPU time the worker processes spent per job (user + system, from ``RUSAGE_CHILDREN``),
which the machine's other load does not change.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import cli_environment, fresh_database, pgq_migrate, reset_jobs
from processes_app import spin

import pgq

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
CPU_JOBS, NOOP_JOBS = 2_000, 20_000
CPU_JOB_S = 0.002
SIDES = {"1 process": [], "--processes 2": ["--processes", "2"]}


def calibrate() -> int:
    """The rounds of ``spin`` that take CPU_JOB_S on this machine (the fastest of a few
    tries, so that the other users of its cores count as little as they can)."""
    n, best = 20_000, float("inf")
    for _ in range(7):
        began = time.process_time()
        spin(n)
        best = min(best, time.process_time() - began)
    return max(1, round(n * CPU_JOB_S / best))


async def backlog(dsn: str, task: str, n: int, args: dict[str, Any]) -> None:
    await reset_jobs(dsn)
    async with pgq.Client(dsn) as client:
        for start in range(0, n, 5_000):
            specs = [pgq.JobSpec(task, dict(args)) for _ in range(start, min(n, start + 5_000))]
            await client.enqueue_many(specs)
    await reset_jobs(dsn, analyze=True)


class Vmstat:
    """``vmstat 1`` beside a drain: the mean us/sy/id/wa of the samples taken meanwhile."""

    def __enter__(self) -> Vmstat:
        self.proc = subprocess.Popen(
            ["vmstat", "-n", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate()
        lines = out.splitlines()
        header = lines[1].split()
        # The first sample averages since boot: left out.
        rows = [dict(zip(header, map(int, line.split()), strict=True)) for line in lines[3:]]
        self.means = {
            k: round(statistics.fmean(r[k] for r in rows), 1) if rows else float("nan")
            for k in ("us", "sy", "id", "wa")
        }


async def drain(dsn: str, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    argv = [sys.executable, "-m", "pgq", "worker", "processes_app:app", "--burst", "--dsn", dsn]
    cpu_before = _children_cpu()
    with Vmstat() as vm:
        began = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            *extra,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # scheduled apart from this harness (autogroup)
        )
        _, err = await proc.communicate()
        wall = time.perf_counter() - began
    cpu_s = _children_cpu() - cpu_before
    assert proc.returncode == 0, err.decode()[-2000:]
    conn = await asyncpg.connect(dsn)
    try:
        done, span = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE state = 'completed'),"
            " extract(epoch FROM max(finalized_at) - min(attempted_at))::float8 FROM pgq_jobs"
        )
    finally:
        await conn.close()
    return {"completed": done, "wall_s": wall, "db_s": span, "cpu_s": cpu_s, "vmstat": vm.means}


def _children_cpu() -> float:
    """User and system CPU seconds of every worker process this run has waited for (the
    supervisor waits for its children: theirs count too)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def ratio(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


async def main(rounds: int) -> None:
    dsn = await fresh_database("bench_processes")
    await pgq_migrate(dsn)
    env = cli_environment(str(HERE))
    n = calibrate()
    workloads = {
        "cpu": ("cpu", CPU_JOBS, {"n": n}),
        "noop": ("noop", NOOP_JOBS, {"i": 0}),
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {side: [] for side in SIDES} for w in workloads
    }
    for r in range(rounds):
        order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        for workload, (task, count, args) in workloads.items():
            for side in order:
                await backlog(dsn, task, count, args)
                result = await drain(dsn, SIDES[side], env)
                assert result["completed"] == count, result
                runs[workload][side].append(result)
                print(
                    f"round {r + 1} {workload:4} {side:14} {count / result['db_s']:8.0f} jobs/s"
                    f" (db clock; wall {result['wall_s']:.1f}s) vmstat {result['vmstat']}",
                    flush=True,
                )
    report(runs, workloads, n, rounds)


def report(runs: dict[str, Any], workloads: dict[str, Any], n: int, rounds: int) -> None:
    summary: dict[str, Any] = {
        "rounds": rounds,
        "cpu_job_spin_rounds": n,
        "cpus": os.cpu_count(),
        "workloads": {},
    }
    lines = [
        f"bench_processes.py: {rounds} interleaved rounds; CPU jobs of {CPU_JOB_S * 1000:g} ms"
        f" ({n} spin rounds), {CPU_JOBS} of them; {NOOP_JOBS} no-op jobs; {os.cpu_count()} CPUs",
        "",
        f"{'workload':8} {'side':14} {'jobs/s (db clock)':>26} {'jobs/s (wall)':>22}"
        "  vmstat us/sy/id/wa (median)  worker CPU per job",
    ]
    for workload, (_, count, _) in workloads.items():
        entry: dict[str, Any] = {}
        for side, results in runs[workload].items():
            db = spread([count / x["db_s"] for x in results])
            wall = spread([count / x["wall_s"] for x in results])
            vm = {
                k: statistics.median(x["vmstat"][k] for x in results)
                for k in ("us", "sy", "id", "wa")
            }
            per_job = statistics.median(x["cpu_s"] / count * 1e6 for x in results)
            entry[side] = {
                "db_jobs_per_s": db,
                "wall_jobs_per_s": wall,
                "worker_cpu_us_per_job": round(per_job),
                "vmstat": vm,
            }
            lines.append(
                f"{workload:8} {side:14} {db['median']:>8} ({db['min']}..{db['max']})"
                f"{wall['median']:>10} ({wall['min']}..{wall['max']})"
                f"  {vm['us']:g}/{vm['sy']:g}/{vm['id']:g}/{vm['wa']:g}"
                f"  {round(per_job)} us"
            )
        one, two = runs[workload]["1 process"], runs[workload]["--processes 2"]
        ratios_db = [a["db_s"] / b["db_s"] for a, b in zip(one, two, strict=True)]
        ratios_wall = [a["wall_s"] / b["wall_s"] for a, b in zip(one, two, strict=True)]
        entry["ratio_db"], entry["ratio_wall"] = ratio(ratios_db), ratio(ratios_wall)
        summary["workloads"][workload] = entry
        lines.append(
            f"{workload:8} --processes 2 / 1 process: {entry['ratio_db']['median']}x db clock"
            f" ({entry['ratio_db']['min']}..{entry['ratio_db']['max']}),"
            f" {entry['ratio_wall']['median']}x wall"
            f" ({entry['ratio_wall']['min']}..{entry['ratio_wall']['max']})"
        )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "processes.json").write_text(json.dumps(summary, indent=2) + "\n")
    (RESULTS / "processes.txt").write_text(text)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
