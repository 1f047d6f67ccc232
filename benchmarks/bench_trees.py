"""Two versions of pgq side by side on one workload of bench_pgq.py, in interleaved rounds.

`python benchmarks/bench_trees.py WORKLOAD ROUNDS TREE_A TREE_B` (each TREE a checkout of
pgq, run with `PYTHONPATH=TREE/src`) runs `bench_pgq.py WORKLOAD` ROUNDS times per tree,
in the order A B B A A B ..., so that a machine slowing down or speeding up meets both
alike, against a PostgreSQL instance of its own (`common.private_server`), so that no
one else's benchmark drops its database. It prints each tree's median rate with its range, and the median of the rounds'
B/A ratios (each B against the A run beside it) with their range: a change is shown only
where that ratio's range leaves 1.00 out.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import private_server

HERE = Path(__file__).resolve().parent


def rate(tree: Path, workload: str, dsn: str) -> float:
    """The jobs per second one run of ``workload`` on ``tree`` reports."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{tree / 'src'}", "PGQ_BENCH_DSN": dsn}
    proc = subprocess.run(
        [sys.executable, str(HERE / "bench_pgq.py"), workload],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: {workload} failed:\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(json.loads(line.removeprefix("RESULT "))["rate"])
    raise RuntimeError(f"{tree}: {workload} printed no result")


async def main(workload: str, rounds: int, a: Path, b: Path) -> None:
    async with private_server({}) as dsn:
        await asyncio.to_thread(compare, workload, rounds, a, b, dsn)


def compare(workload: str, rounds: int, a: Path, b: Path, dsn: str) -> None:
    """Run the rounds and print the figures."""
    rates: dict[str, list[float]] = {"A": [], "B": []}
    ratios = []
    for i in range(rounds):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        got = {name: rate(a if name == "A" else b, workload, dsn) for name in order}
        for name, value in got.items():
            rates[name].append(value)
        ratios.append(got["B"] / got["A"])
        print(f"round {i + 1}: A {got['A']:,.0f}/s  B {got['B']:,.0f}/s", flush=True)
    for name, tree in (("A", a), ("B", b)):
        values = rates[name]
        print(
            f"{name} {tree}: median {statistics.median(values):,.0f}/s "
            f"(rounds {min(values):,.0f}-{max(values):,.0f})"
        )
    print(
        f"B/A: median of the rounds' ratios {statistics.median(ratios):.3f} "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f}), {workload}, {rounds} rounds"
    )


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    trees = Path(sys.argv[3]).resolve(), Path(sys.argv[4]).resolve()
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), *trees))
