"""Shared latency driver: enqueue single jobs at a steady rate into an idle worker process
and measure, per job, the time from the enqueue's commit to the task's start."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from common import summary_ms

RATE = 200  # jobs per second
SECONDS = 20
N = RATE * SECONDS


async def drive(
    script: Path,
    dsn: str,
    enqueue: Callable[[int], Awaitable[None]],
    out: Path,
    *,
    command: Sequence[str] = (sys.executable,),
) -> dict[str, float]:
    """Start ``script latency-worker DSN OUT N`` (with ``command``: Python, or Node.js for
    Graphile Worker) and enqueue N jobs at RATE per second."""
    worker = subprocess.Popen(
        [*command, str(script), "latency-worker", dsn, str(out), str(N)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = await asyncio.to_thread(worker.stdout.readline)
    if line.strip() != "READY":
        raise RuntimeError(f"worker did not start: {line!r}")
    await asyncio.sleep(1.0)  # idle: whatever start-up work it does is over
    committed: dict[int, float] = {}
    start = time.perf_counter()
    for seq in range(N):
        await asyncio.sleep(max(0.0, start + seq / RATE - time.perf_counter()))
        await enqueue(seq)
        committed[seq] = time.time()
    code = await asyncio.to_thread(worker.wait, 120)
    if code != 0:
        raise RuntimeError(f"latency worker exited {code}")
    started: dict[str, float] = json.loads(out.read_text())
    delays = [started[str(seq)] - committed[seq] for seq in range(N)]
    return summary_ms(delays)
