"""The figures of performance round 2, side by side in one run: `make bench` runs it after
the peers' table, or `benchmarks/.venv/bin/python benchmarks/round2.py [ROUNDS]` (default 5).

Each round runs, one after another and each in its own process against a fresh database:
enqueue_many (20,000 in batches of 1,000) for pgq and PgQueuer; the no-op drain of 20,000
at each system's defaults (pgq: concurrency 10; PgQueuer: batch_size 10) and at their best
settings (pgq 1,000 and 2,000; PgQueuer 200 and 500, the best of each kept per round), the
best settings also with each process's garbage collector tuned as `pgq worker` tunes its
own (BENCH_GC=tuned: start-up objects frozen, first generation at 10,000; the same for both);
pgq's drain of 100,000 by `pgq worker` processes started by the CLI (1 process at the
defaults and at concurrency 1,000; 4 at the defaults and at 1,000; 8 at the defaults); and
the bare-asyncpg ceiling (claims of 100, the targets' reference) and the stricter bare loop
of claims of 500 through the primary key (recorded beside it); and 10 ms jobs at concurrency
1,000 (bench_io.py, in process with the collector as Python sets it and tuned, and by a
`pgq worker` process), right before the ceiling they are held to.
Before the rounds, once: 10 ms jobs at concurrency 10, 100 and 1,000 (bench_io.py, 3
rounds; then again with the collector tuned as `pgq worker` tunes it; then by `pgq worker`
processes started by the CLI; concurrency 1,000 is recorded from these, and judged from the
rounds), WAL and index writes per job (bench_wal.py), and the big-backlog figures
(bench_backlog.py). Prints
every run, the medians, and each target with its verdict; writes results/round2.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from run import run_one

TUNED = {"BENCH_GC": "tuned"}
RUNS: list[tuple[str, str, list[list[str]], dict[str, str]]] = [
    ("pgq enqueue_many", "bench_pgq.py", [["enqueue_many"]], {}),
    ("pgqueuer enqueue_many", "bench_pgqueuer.py", [["enqueue_many"]], {}),
    ("pgq drain, defaults", "bench_pgq.py", [["drain", "10"]], {}),
    ("pgqueuer drain, defaults", "bench_pgqueuer.py", [["drain", "10"]], {}),
    ("pgq drain, best", "bench_pgq.py", [["drain", "1000"], ["drain", "2000"]], {}),
    ("pgqueuer drain, best", "bench_pgqueuer.py", [["drain", "200"], ["drain", "500"]], {}),
    ("pgq drain, best, gc tuned", "bench_pgq.py", [["drain", "1000"], ["drain", "2000"]], TUNED),
    (
        "pgqueuer drain, best, gc tuned",
        "bench_pgqueuer.py",
        [["drain", "200"], ["drain", "500"]],
        TUNED,
    ),
    ("pgq worker CLI x1, defaults", "bench_pgq.py", [["drain-cli", "default", "1"]], {}),
    ("pgq worker CLI x1, concurrency 1000", "bench_pgq.py", [["drain-cli", "1000", "1"]], {}),
    ("pgq worker CLI x4, defaults", "bench_pgq.py", [["drain-cli", "default", "4"]], {}),
    ("pgq worker CLI x4, concurrency 1000", "bench_pgq.py", [["drain-cli", "1000", "4"]], {}),
    ("pgq worker CLI x8, defaults", "bench_pgq.py", [["drain-cli", "default", "8"]], {}),
    # 10 ms jobs at concurrency 1,000 are held to the ceiling: measured in each round, next
    # to it, rather than once before the rounds (the ceiling moves by a third within a run).
    ("pgq 10 ms jobs, concurrency 1000", "bench_io.py", [["1", "1000", "--auto-only"]], {}),
    (
        "pgq 10 ms jobs, concurrency 1000, gc tuned",
        "bench_io.py",
        [["1", "1000", "--auto-only"]],
        TUNED,
    ),
    ("pgq 10 ms jobs, concurrency 1000, CLI", "bench_io.py", [["--cli", "1", "1000"]], {}),
    ("bare asyncpg ceiling", "bench_ceiling.py", [["drain"]], {}),
    ("bare asyncpg, claims of 500 by id", "bench_ceiling.py", [["drain-500"]], {}),
]

RESULTS = Path(__file__).resolve().parent / "results"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(rounds: int) -> None:
    print("10 ms jobs (bench_io.py, 3 rounds)", flush=True)
    io = run_one("bench_io.py", "3", [])["medians"]
    print("10 ms jobs, gc tuned (bench_io.py, 3 rounds)", flush=True)
    io_tuned = run_one("bench_io.py", "3", [], TUNED)["medians"]
    print("10 ms jobs, `pgq worker` CLI (bench_io.py --cli, 3 rounds)", flush=True)
    io_cli = run_one("bench_io.py", "--cli", ["3"])["medians"]
    print("WAL per job (bench_wal.py)", flush=True)
    wal = run_one("bench_wal.py", "plain", ["keyed", "chained", "pgqueuer"])["modes"]
    print("big backlogs (bench_backlog.py)", flush=True)
    backlog_claim = run_one("bench_backlog.py", "claim", [])
    backlog_enqueue = run_one("bench_backlog.py", "enqueue", ["3"])
    figures: dict[str, list[float]] = {name: [] for name, _, _, _ in RUNS}
    for r in range(rounds):
        for name, script, variants, env in RUNS:
            results = [run_one(script, argv[0], argv[1:], env) for argv in variants]
            best = max(float(result["rate"]) for result in results)
            figures[name].append(best)
            if "rate_db_clock" in results[0]:
                # The CLI runs: also from the first claim to the last outcome on the
                # database's clock, without the processes' start-up and exit.
                clock = max(float(result["rate_db_clock"]) for result in results)
                figures.setdefault(f"{name} (db clock)", []).append(clock)
            print(f"round {r + 1}: {name:<38} {best:>10,.0f}/s", flush=True)
    med = {name: statistics.median(values) for name, values in figures.items()}
    print(f"\nmedians of {rounds} interleaved rounds (jobs/s)")
    for name, value in med.items():
        print(f"  {name:<38} {value:>10,.0f}")

    def m(name: str) -> float:
        return med[name]

    ceiling = m("bare asyncpg ceiling")
    single = max(m("pgq worker CLI x1, defaults"), m("pgq worker CLI x1, concurrency 1000"))
    enq = [
        a / b
        for a, b in zip(figures["pgq enqueue_many"], figures["pgqueuer enqueue_many"], strict=True)
    ]
    targets: list[tuple[str, float, str, bool]] = []

    def target(name: str, value: float, goal: str, ok: bool) -> None:
        targets.append((name, value, goal, ok))

    for c in (10, 100):
        eff = io[f"{c} ahead auto"] / (c / 0.010)
        target(f"10 ms jobs, concurrency {c} / ideal", eff, ">= 0.90", eff >= 0.9)
    bound = min(1000 / 0.010, ceiling)
    eff = m("pgq 10 ms jobs, concurrency 1000") / bound
    target("10 ms jobs, concurrency 1000 / min(ideal, ceiling)", eff, ">= 0.80", eff >= 0.8)
    eff = io["1000 ahead auto"] / bound
    target("  the same, measured once before the rounds", eff, "recorded", True)
    for c in (10, 100):
        eff = io_tuned[f"{c} ahead auto"] / (c / 0.010)
        target(f"  gc tuned: concurrency {c} / ideal", eff, ">= 0.90", eff >= 0.9)
    eff = m("pgq 10 ms jobs, concurrency 1000, gc tuned") / bound
    target("  gc tuned: concurrency 1000 / min(ideal, ceiling)", eff, ">= 0.80", eff >= 0.8)
    eff = io_tuned["1000 ahead auto"] / bound
    target("  the same, measured once before the rounds", eff, "recorded", True)
    for c in (10, 100):
        eff = io_cli[f"{c} cli"] / (c / 0.010)
        target(f"  `pgq worker` CLI: concurrency {c} / ideal", eff, ">= 0.90", eff >= 0.9)
    eff = m("pgq 10 ms jobs, concurrency 1000, CLI") / bound
    target("  `pgq worker` CLI: concurrency 1000 / min(ideal, ceiling)", eff, ">= 0.80", eff >= 0.8)
    eff = io_cli["1000 cli"] / bound
    target("  the same, measured once before the rounds", eff, "recorded", True)
    x = m("pgq drain, defaults") / m("pgqueuer drain, defaults")
    target("drain at defaults, pgq / PgQueuer", x, ">= 1.5", x >= 1.5)
    x = m("pgq drain, best") / m("pgqueuer drain, best")
    target("drain at best settings, pgq / PgQueuer", x, ">= 2.0", x >= 2.0)
    x = m("pgq drain, best, gc tuned") / m("pgqueuer drain, best, gc tuned")
    target("  the same, both processes' gc tuned", x, ">= 2.0", x >= 2.0)
    x = m("pgq drain, best") / ceiling
    target("pgq best drain / bare-asyncpg ceiling", x, ">= 0.85", x >= 0.85)
    x = m("pgq drain, best, gc tuned") / ceiling
    target("  the same, pgq's process gc tuned", x, ">= 0.85", x >= 0.85)
    strict = m("bare asyncpg, claims of 500 by id")
    x = m("pgq drain, best") / strict
    target("pgq best drain / bare loop of 500 by id", x, "recorded", True)
    x = m("pgq drain, best, gc tuned") / strict
    target("  pgq's process gc tuned / bare loop of 500 by id", x, "recorded", True)
    x = m("pgq drain, defaults") / m("pgq drain, best")
    target("pgq at defaults / pgq at best (in-process)", x, "recorded", True)
    x = m("pgq enqueue_many") / m("pgqueuer enqueue_many")
    target(f"enqueue_many pgq / PgQueuer (median of {rounds})", x, ">= 1.5", x >= 1.5)
    x = m("pgq worker CLI x1, defaults") / single
    target("pgq worker CLI at defaults / best single CLI process", x, "recorded", True)
    x = m("pgq worker CLI x4, concurrency 1000") / single
    target("4 CLI processes at 1000 / best single CLI process", x, ">= 0.9", x >= 0.9)
    clock_single = max(
        m("pgq worker CLI x1, defaults (db clock)"),
        m("pgq worker CLI x1, concurrency 1000 (db clock)"),
    )
    x = m("pgq worker CLI x4, concurrency 1000 (db clock)") / clock_single
    target("  the same on the database's clock (no start-up)", x, "recorded", True)
    x = m("pgq worker CLI x4, defaults") / single
    target("4 CLI processes at defaults / best single CLI process", x, "recorded", True)
    x = m("pgq worker CLI x8, defaults") / single
    target("8 CLI processes / best single CLI process", x, "recorded", True)
    x = backlog_claim["p99_ratio"]
    target("claim p99, 1M available + 5M finished / small table", x, "<= 1.5", x <= 1.5)
    x = backlog_enqueue["ratio"]
    target("enqueue_many of 1M in 10k batches, pgq / PgQueuer", x, ">= 1.5", x >= 1.5)
    x = wal["plain"]["bytes"]
    # 1,169-1,170 on the code before round 2, in every run: 1 % is well beyond its noise.
    target("WAL bytes per job, plain queue", x, "<= 1,182 (1,170 +1 %)", x <= 1_170 * 1.01)

    print(f"\n  per-round enqueue_many ratios: {', '.join(f'{x:.2f}' for x in enq)}")
    for name in (
        "pgq 10 ms jobs, concurrency 1000",
        "pgq 10 ms jobs, concurrency 1000, gc tuned",
        "pgq 10 ms jobs, concurrency 1000, CLI",
    ):
        each = zip(figures[name], figures["bare asyncpg ceiling"], strict=True)
        print(f"  per-round {name[4:]} / ceiling: {', '.join(f'{a / b:.2f}' for a, b in each)}")
    print(f"  10 ms jobs: {', '.join(f'{k} {v:,.0f}/s' for k, v in io.items())}")
    print(f"  10 ms jobs, gc tuned: {', '.join(f'{k} {v:,.0f}/s' for k, v in io_tuned.items())}")
    print(f"  10 ms jobs, `pgq worker`: {', '.join(f'{k} {v:,.0f}/s' for k, v in io_cli.items())}")
    for mode, w in wal.items():
        print(
            f"  WAL per job, {mode}: {w['bytes']:,.0f} B, index records {w['index_records']:.2f}"
            f" ({w['index_bytes']:,.0f} B), heap records {w['heap_records']:.2f}"
        )
    print(f"\n{'target':<58} {'measured':>10}  {'goal':<20} verdict")
    for name, value, goal, ok in targets:
        shown = f"{value:,.0f}" if value > 100 else f"{value:.2f}"
        print(f"{name:<58} {shown:>10}  {goal:<20} {verdict(ok) if goal != 'recorded' else ''}")
    out: dict[str, Any] = {
        "rounds": rounds,
        "figures": figures,
        "medians": med,
        "io_10ms": io,
        "io_10ms_gc_tuned": io_tuned,
        "io_10ms_cli": io_cli,
        "wal_per_job": wal,
        "backlog_claim": backlog_claim,
        "backlog_enqueue": backlog_enqueue,
        "targets": [{"target": n, "measured": v, "goal": g, "met": ok} for n, v, g, ok in targets],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "round2.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'round2.json'}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
