"""The figures of performance round 2, side by side in one run, as medians of interleaved
rounds: `benchmarks/.venv/bin/python benchmarks/round2.py [ROUNDS]` (default 5).

Each round runs, one after another and each in its own process against a fresh database:
enqueue_many (20,000 in batches of 1,000) for pgq and PgQueuer; the no-op drain of 20,000
at each system's defaults (pgq: concurrency 10; PgQueuer: batch_size 10) and at their best
settings (pgq 1,000 and 2,000; PgQueuer 200 and 500, the best of each kept per round);
pgq's drain by `pgq worker` processes started by the CLI at default settings (1, 4 and 8
processes, and 1 process at concurrency 1,000); and the bare-asyncpg ceiling. Prints every
run, then the median of each figure and the ratios the targets name.
"""

from __future__ import annotations

import statistics
import sys

from run import run_one

RUNS: list[tuple[str, str, list[list[str]]]] = [
    ("pgq enqueue_many", "bench_pgq.py", [["enqueue_many"]]),
    ("pgqueuer enqueue_many", "bench_pgqueuer.py", [["enqueue_many"]]),
    ("pgq drain, defaults", "bench_pgq.py", [["drain", "10"]]),
    ("pgqueuer drain, defaults", "bench_pgqueuer.py", [["drain", "10"]]),
    ("pgq drain, best", "bench_pgq.py", [["drain", "1000"], ["drain", "2000"]]),
    ("pgqueuer drain, best", "bench_pgqueuer.py", [["drain", "200"], ["drain", "500"]]),
    ("pgq worker CLI x1, defaults", "bench_pgq.py", [["drain-cli", "default", "1"]]),
    ("pgq worker CLI x1, concurrency 1000", "bench_pgq.py", [["drain-cli", "1000", "1"]]),
    ("pgq worker CLI x4, concurrency 1000", "bench_pgq.py", [["drain-cli", "1000", "4"]]),
    ("pgq worker CLI x8, concurrency 1000", "bench_pgq.py", [["drain-cli", "1000", "8"]]),
    ("bare asyncpg ceiling", "bench_ceiling.py", [["drain"]]),
]


def main(rounds: int) -> None:
    figures: dict[str, list[float]] = {name: [] for name, _, _ in RUNS}
    for r in range(rounds):
        for name, script, variants in RUNS:
            best = max(float(run_one(script, argv[0], argv[1:])["rate"]) for argv in variants)
            figures[name].append(best)
            print(f"round {r + 1}: {name:<38} {best:>10,.0f}/s", flush=True)
    med = {name: statistics.median(values) for name, values in figures.items()}
    print(f"\nmedians of {rounds} interleaved rounds (jobs/s)")
    for name, value in med.items():
        print(f"  {name:<38} {value:>10,.0f}")

    def ratio(a: str, b: str) -> str:
        return f"{med[a] / med[b]:.2f}"

    print("\nratios")
    print(f"  enqueue_many pgq / PgQueuer: {ratio('pgq enqueue_many', 'pgqueuer enqueue_many')}")
    per_round = [
        a / b
        for a, b in zip(figures["pgq enqueue_many"], figures["pgqueuer enqueue_many"], strict=True)
    ]
    print(f"    per round: {', '.join(f'{x:.2f}' for x in per_round)}")
    print(
        "  drain at defaults pgq / PgQueuer: "
        + ratio("pgq drain, defaults", "pgqueuer drain, defaults")
    )
    print(f"  drain at best pgq / PgQueuer: {ratio('pgq drain, best', 'pgqueuer drain, best')}")
    print(f"  pgq best / bare asyncpg ceiling: {ratio('pgq drain, best', 'bare asyncpg ceiling')}")
    print(
        "  pgq defaults / pgq best (in-process): " + ratio("pgq drain, defaults", "pgq drain, best")
    )
    print(
        "  4 CLI processes / best single CLI process: "
        + ratio("pgq worker CLI x4, concurrency 1000", "pgq worker CLI x1, concurrency 1000")
    )
    print(
        "  8 CLI processes / best single CLI process: "
        + ratio("pgq worker CLI x8, concurrency 1000", "pgq worker CLI x1, concurrency 1000")
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
