"""Instructions the client and the worker execute per job, counted by valgrind: a figure that
a busy or throttled machine does not move, for comparing two versions of the hot paths where
CPU-time figures drift by 10-30 % from one run to the next.

`python benchmarks/bench_instructions.py TREE [TREE ...]` (each TREE a checkout of pgq; the
default is this one) runs, for each tree in turn, with `PYTHONPATH=TREE/src`:

- enqueue: a client process that enqueues 1 and then, in a second run, 6 batches of 1,000
  no-op jobs with `enqueue_many` (specs built in the loop, as in bench_pgq.py), under
  `valgrind --tool=callgrind`; instructions per job = the difference / 5,000;
- worker: a worker process that drains 2,000 and then 12,000 no-op jobs at concurrency
  1,000 (`run(burst=True)`, metrics off); per job = the difference / 10,000;
- the same with jobs that await 10 ms: many more jobs are in flight at once, so this one
  also counts what the garbage collector spends walking them (Python's collector
  settings, as an embedded worker has).

The workers run with metrics off; with ``BENCH_METRICS=1`` they run with Prometheus metrics
on, as `pgq worker` does by default once the `metrics` extra is installed (this script then
needs `prometheus_client` in its environment, which benchmarks/requirements.txt leaves
out, so that the other benchmarks' CLI workers run without metrics, as before).

Only the measured process is counted, not PostgreSQL's. Under valgrind the worker runs ~50
times slower against a database that does not, so its claims come back fuller than they
would: the worker figure counts the per-job path well and the per-claim path a little
less. Two runs of one tree agreed within 0.7 % (enqueue 43,598 and 43,900; worker 149,046
and 150,148), on a day when CPU-time figures moved by 20 %; on another, within 0.5 %
(enqueue 38,594 and 38,398; no-op 110,675 and 110,718; 10 ms 132,558 and 132,767) while
CPU time per 10 ms job moved between 18 and 25 us. Needs valgrind (Debian's `valgrind`
package); a minute or two per tree.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from common import emit, fresh_database, pgq_backlog, run

HERE = Path(__file__).resolve().parent


async def _child(kind: str, n: int, dsn: str) -> None:
    """A process of the tree measured: ``n`` batches of enqueue, a drain of what is there,
    or (not measured) a backlog of ``n`` jobs for the drain."""
    import pgq

    app = pgq.App()

    @app.task
    async def noop(ctx: pgq.JobContext, i: int) -> None:
        """A job that does nothing."""

    @app.task
    async def io_job(ctx: pgq.JobContext, i: int) -> None:
        """A job that waits on I/O for 10 ms."""
        await asyncio.sleep(0.010)

    if kind == "enqueue":
        async with pgq.Client(dsn, app=app) as client:
            for start in range(0, n * 1_000, 1_000):
                await client.enqueue_many(
                    [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 1_000)]
                )
    elif kind in ("fill", "fill-io"):
        await pgq_backlog(dsn, app, noop if kind == "fill" else io_job, n)
    else:
        metrics = os.environ.get("BENCH_METRICS") == "1"
        await pgq.Worker(app, dsn, concurrency=1_000, metrics=metrics).run(burst=True)


def _child_process(tree: Path, *args: str, valgrind: bool = True) -> int:
    """Run this script's child on ``tree``; the instructions valgrind counted (0 without)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    command = [sys.executable, str(HERE / "bench_instructions.py"), "--child", *args]
    if valgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    if not valgrind:
        return 0
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no count:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


async def measure(tree: Path) -> dict[str, float]:
    """Instructions per job of ``tree``'s client (enqueue_many) and worker (drain)."""
    dsn = await fresh_database("pgq_bench_instructions")
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pgq", "migrate", "--dsn", dsn],
        env={**os.environ, "PYTHONPATH": str(tree / "src")},
        stdout=subprocess.DEVNULL,
        check=True,
    )
    counts = {}
    for n in (1, 6):
        counts[n] = await asyncio.to_thread(_child_process, tree, "enqueue", str(n), dsn)
    enqueue = (counts[6] - counts[1]) / 5_000
    for n in (2_000, 12_000):
        await asyncio.to_thread(_child_process, tree, "fill", str(n), dsn, valgrind=False)
        counts[n] = await asyncio.to_thread(_child_process, tree, "drain", "0", dsn)
    worker = (counts[12_000] - counts[2_000]) / 10_000
    io = {}
    for n in (2_000, 12_000):
        await asyncio.to_thread(_child_process, tree, "fill-io", str(n), dsn, valgrind=False)
        io[n] = await asyncio.to_thread(_child_process, tree, "drain", "0", dsn)
    worker_io = (io[12_000] - io[2_000]) / 10_000
    return {"enqueue_many": enqueue, "worker_noop": worker, "worker_io_10ms": worker_io}


async def main(trees: list[Path]) -> None:
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions.py needs valgrind: apt-get install valgrind")
    if os.environ.get("BENCH_METRICS") == "1":
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            sys.exit("BENCH_METRICS=1 needs prometheus_client: pip install prometheus_client")
    results = {}
    for tree in trees:
        results[str(tree)] = figures = await measure(tree)
        print(
            f"{tree}: enqueue_many {figures['enqueue_many']:,.0f} instructions per job "
            f"(client), worker {figures['worker_noop']:,.0f} per no-op job, "
            f"{figures['worker_io_10ms']:,.0f} per 10 ms job",
            flush=True,
        )
    emit({"system": "pgq", "workload": "instructions_per_job", "trees": results})


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--child":
        run(lambda: _child(args[1], int(args[2]), args[3]))
    else:
        asyncio.run(main([Path(a).resolve() for a in args] or [HERE.parent]))
