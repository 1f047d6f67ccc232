"""Do a worker's outcomes keep up with its handlers, and how far is its drain from a bare loop?

Answer: outcomes keep up (the durable rate is 0.98 of the handler rate); the drain is 0.41
of a bare loop of claims of 1,000; two outcome writers write 1.51 times what one does
(results/outcomes.txt, results/outcome_writers.txt).

`python benchmarks/experiments/bench_outcomes.py ROUNDS [TREE ...]` (each TREE a checkout of pgq;
the default is this one).

Each round runs, one after another and each in its own process against a fresh database:
for each TREE in turn, the no-op drain of bench_pgq.py (20,000 jobs, concurrency 1,000,
``PYTHONPATH=TREE/src``); then the bare-asyncpg loop of bench_ceiling.py with claims of
1,000 (two connections, each claiming 1,000 and completing them with one UPDATE). The drain
reports three rates over the time from the worker's start: to its last handler's return
(handler rate), to its last outcome's commit (durable rate, seen as the last completion's
notification arrives) and to its return, and the worker process's CPU time over the drain's
(how busy it was). Prints, per tree, the median of the rounds and
their range for durable / handler rate and for durable rate / the same round's bare loop;
with two trees, also the second's durable rate over the first's, round by round. Writes
results/outcomes.txt and results/outcomes.json (the latest run only).

Rounds interleave the trees and the bare loop so that a machine whose load changes during
the run moves them alike: compare the ratios, not the rates of different runs.

`python benchmarks/experiments/bench_outcomes.py --writers ROUNDS`: the outcome writer's own
capacity, without handlers, claims or a worker around it. Each round, for 1 and then 2 writers
(batches written at once, each on a connection of its own), 20,000 jobs are made running, each
with its own token, all their outcomes (plain successes) are handed to pgq's Completer at once,
and the time until every one is written gives outcomes/s. Prints, per writer count, the median
and range, and the ratio of 2 writers to 1 round by round; writes results/outcome_writers.txt
and .json."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

from run import run_one

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
CONCURRENCY = "1000"
BARE = "drain-1000"


def spread(values: list[float]) -> str:
    """Median and range, as ``0.97 (0.95-0.99)``."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(rounds: int, trees: list[Path]) -> None:
    names = [str(t) for t in trees]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    bare: list[float] = []
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"$ bench_outcomes.py {rounds} {' '.join(names)}")
    for r in range(rounds):
        for name, tree in zip(names, trees, strict=True):
            env = {"PYTHONPATH": str(tree / "src")}
            result = run_one("bench_pgq.py", "drain", [CONCURRENCY], env)
            runs[name].append(result)
            say(
                f"round {r + 1}: {name}: handlers {result['handler_rate']:,.0f}/s, "
                f"durable {result['durable_rate']:,.0f}/s, returned {result['rate']:,.0f}/s, "
                f"worker busy {result['busy']:.0%}"
            )
        bare.append(float(run_one("bench_ceiling.py", BARE, [])["rate"]))
        say(f"round {r + 1}: bare loop, claims of 1,000: {bare[-1]:,.0f}/s")
    summary: dict[str, Any] = {"rounds": rounds, "bare_rates": bare, "trees": {}}
    say(f"\nmedian (range) of {rounds} interleaved rounds")
    for name in names:
        durable = [float(x["durable_rate"]) for x in runs[name]]
        kept_up = [d / float(x["handler_rate"]) for d, x in zip(durable, runs[name], strict=True)]
        of_bare = [d / b for d, b in zip(durable, bare, strict=True)]
        summary["trees"][name] = {
            "runs": runs[name],
            "durable_over_handler": kept_up,
            "durable_over_bare": of_bare,
        }
        say(f"  {name}")
        say(f"    durable rate / handler rate   {spread(kept_up)}  (target >= 0.95)")
        say(f"    durable rate / bare loop      {spread(of_bare)}  (target >= 0.60)")
        say(f"    durable rate                  {statistics.median(durable):,.0f}/s")
        busy = [float(x["busy"]) for x in runs[name]]
        say(f"    worker busy (CPU / wall)      {spread(busy)}")
    say(f"  bare loop                         {statistics.median(bare):,.0f}/s")
    if len(names) == 2:
        a, b = (summary["trees"][n]["runs"] for n in names)
        gain = [
            float(y["durable_rate"]) / float(x["durable_rate"]) for x, y in zip(a, b, strict=True)
        ]
        summary["second_over_first"] = gain
        say(f"  durable rate, second tree / first, round by round: {spread(gain)}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "outcomes.txt").write_text("\n".join(lines) + "\n")
    (RESULTS / "outcomes.json").write_text(json.dumps(summary, indent=2) + "\n")


async def _write_all(dsn: str, writers: int, n: int) -> float:
    """Seconds the Completer with ``writers`` takes to write ``n`` successes at once."""
    import anyio
    import asyncpg

    from pgq._db.connections import WORKER_SESSION_SETTINGS, Target, create_pool
    from pgq._worker.attempt import Outcome
    from pgq._worker.outcomes import Completer

    conn = await asyncpg.connect(dsn)
    rows = await conn.fetch(
        "WITH new AS (INSERT INTO pgq_jobs (task, args, state, attempt, attempt_token)"
        " SELECT 'noop', jsonb_build_object('i', g), 'running', 1, gen_random_uuid()"
        " FROM generate_series(1, $1::int) g RETURNING id, attempt_token)"
        " SELECT id, attempt_token FROM new",
        n,
    )
    await conn.execute("ANALYZE pgq_jobs")
    await conn.close()
    outcomes = [Outcome(r["id"], r["attempt_token"], 1, "default", "completed") for r in rows]
    options = Target.resolve(dsn).options("bench_outcomes", WORKER_SESSION_SETTINGS)
    pool = await create_pool(dsn, min_size=writers, max_size=writers, **options)
    written = [0]

    def report(ok: list[Outcome], rejected: list[Outcome]) -> None:
        assert not rejected
        written[0] += len(ok)

    completer = Completer(pool, report, writers=writers)
    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        started = time.perf_counter()
        for o in outcomes:
            completer.add(o)
        await completer.wait_idle()
        seconds = time.perf_counter() - started
        tg.cancel_scope.cancel()
    await pool.close()
    assert written[0] == n
    return seconds


async def writers_main(rounds: int) -> None:
    from common import drop_database, fresh_database, pgq_migrate

    n = 20_000
    rates: dict[int, list[float]] = {1: [], 2: []}
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"$ bench_outcomes.py --writers {rounds}")
    name = f"bench_outcome_writers_{os.getpid()}"
    dsn = await fresh_database(name)
    await pgq_migrate(dsn)
    for r in range(rounds):
        for writers in (1, 2):
            rates[writers].append(n / await _write_all(dsn, writers, n))
            say(f"round {r + 1}: {writers} writer(s): {rates[writers][-1]:,.0f} outcomes/s")
    await drop_database(name)
    say(f"\nmedian (range) of {rounds} interleaved rounds, {n:,} successes each")
    for writers, values in rates.items():
        say(
            f"  {writers} writer(s): {statistics.median(values):,.0f} outcomes/s "
            f"({min(values):,.0f}-{max(values):,.0f})"
        )
    gain = [b / a for a, b in zip(rates[1], rates[2], strict=True)]
    say(f"  2 writers / 1, round by round: {spread(gain)}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "outcome_writers.txt").write_text("\n".join(lines) + "\n")
    (RESULTS / "outcome_writers.json").write_text(
        json.dumps({"rounds": rounds, "jobs": n, "rates": rates, "ratios": gain}, indent=2) + "\n"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--writers"] and sys.argv[2:3] and sys.argv[2].isdigit():
        from common import run

        run(lambda: writers_main(int(sys.argv[2])))
    elif len(sys.argv) >= 2 and sys.argv[1].isdigit():
        main(int(sys.argv[1]), [Path(a).resolve() for a in sys.argv[2:]] or [HERE.parents[1]])
    else:
        raise SystemExit("usage: bench_outcomes.py ROUNDS [TREE ...] | --writers ROUNDS")
