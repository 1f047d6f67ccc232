"""The App `bench_processes.py` runs: a CPU-bound task of a fixed amount of pure-Python work
(calibrated by the benchmark to about 2 ms on an idle core) and a no-op task."""

from __future__ import annotations

import pgq

app = pgq.App()


def spin(n: int) -> int:
    """``n`` rounds of pure-Python arithmetic: work that holds the GIL throughout."""
    total = 0
    for i in range(n):
        total = (total + i * i) % 1_000_003
    return total


@app.task
async def cpu(ctx: pgq.JobContext, n: int) -> None:
    """A CPU-bound job: ``spin(n)`` on the worker's event loop."""
    spin(n)


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """A job that does nothing: what the worker itself costs per job."""
