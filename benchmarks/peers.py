"""pgq beside every peer that installs here, in interleaved rounds:
`benchmarks/.venv/bin/python benchmarks/peers.py [ROUNDS] [SYSTEM ...]` (default 5 rounds,
every system found).

A system is a table of commands: for each workload, one command per setting tried, each
run from this directory in a process of its own against a fresh database, printing its
result as one JSON object (a line ``RESULT {...}``, as `common.emit` prints, or the last
line that is a JSON object). The best rate of a workload's settings is the system's
figure for the round. Workloads: ``enqueue_many`` (20,000 no-op jobs in batches of
1,000), ``drain`` (20,000 no-op jobs by one worker process; CPU per job in that process
and in the database's backends, from `common.CpuMeter`) and ``io`` (20,000 jobs that
each await 10 ms, at concurrency 1,000). Within a round each workload runs system after
system, the order turning by one each round, so a machine that slows down during the run
slows every column alike. Prints each run, then the medians with their range and the
ratios of pgq to each peer taken round by round; writes results/peers.json and
results/peers.txt (the latest run only).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PY = sys.executable
#: oban-py needs Python 3.12+: its own environment, made by `make bench` when it can be.
OBAN_PY = HERE / ".venv-oban" / "bin" / "python"
WORKLOADS = ("enqueue_many", "drain", "io")

Command = list[str]


def py(script: str, *args: str) -> Command:
    return [PY, script, *args]


# The settings each system's drain runs at in the rounds: the best of a sweep (the drain
# at each setting, taking turns; docs/performance.md gives the figures). pgq and PgQueuer
# keep their two best; awa's max_workers 1,024 beat 256; oban-py's limit 1,000 beat 10
# and 100; procrastinate's concurrency 10 beat 50 (run.py's sweep).
SYSTEMS: dict[str, dict[str, list[Command]]] = {
    "pgq": {
        "enqueue_many": [py("bench_pgq.py", "enqueue_many")],
        "drain": [py("bench_pgq.py", "drain", "1000"), py("bench_pgq.py", "drain", "2000")],
        "io": [py("bench_pgq.py", "io")],
    },
    "pgqueuer": {
        "enqueue_many": [py("bench_pgqueuer.py", "enqueue_many")],
        "drain": [
            py("bench_pgqueuer.py", "drain", "200"),
            py("bench_pgqueuer.py", "drain", "500"),
        ],
        "io": [py("bench_pgqueuer.py", "io")],
    },
    "procrastinate": {
        "enqueue_many": [py("bench_procrastinate.py", "enqueue_many")],
        "drain": [py("bench_procrastinate.py", "drain", "10")],
        # Not `io`: procrastinate ran these jobs at about 70/s here (its worker kept two of
        # the 1,000 slots busy), five minutes a run; `bench_procrastinate.py io` runs it.
    },
    "awa": {
        "enqueue_many": [py("bench_awa.py", "enqueue_many")],
        "drain": [py("bench_awa.py", "drain", "1024")],
        "io": [py("bench_awa.py", "io")],
    },
}
if OBAN_PY.exists():
    SYSTEMS["oban"] = {
        "enqueue_many": [[str(OBAN_PY), "bench_oban.py", "enqueue_many"]],
        "drain": [[str(OBAN_PY), "bench_oban.py", "drain", "1000"]],
        "io": [[str(OBAN_PY), "bench_oban.py", "io"]],
    }
if (HERE / "bench_graphile.py").exists():
    SYSTEMS["graphile"] = {"drain": [py("bench_graphile.py", "drain", "2")]}


def run_command(argv: Command) -> dict[str, Any]:
    """Run one command; its JSON result."""
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, cwd=HERE, env=os.environ.copy()
    )
    found: dict[str, Any] | None = None
    for line in out.stdout.splitlines():
        text = line[len("RESULT ") :] if line.startswith("RESULT ") else line
        if text.startswith("{"):
            try:
                found = json.loads(text)
            except ValueError:
                continue
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return found


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}–{max(values):,.0f}"


def main(rounds: int, chosen: list[str]) -> None:
    unknown = set(chosen) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}: choose from {sorted(SYSTEMS)}")
    names = chosen or list(SYSTEMS)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {w: [] for w in SYSTEMS[s]} for s in names
    }
    for r in range(rounds):
        for workload in WORKLOADS:
            turn = names[r % len(names) :] + names[: r % len(names)]
            for system in turn:
                if workload not in SYSTEMS[system]:
                    continue
                tried = [run_command(argv) for argv in SYSTEMS[system][workload]]
                best = max(tried, key=lambda result: float(result["rate"]))
                runs[system][workload].append(best)
                cpu = ""
                if "cpu_worker_us" in best:
                    cpu = f"  cpu/job {best['cpu_worker_us']:.1f} + {best['cpu_db_us']:.1f} µs"
                print(
                    f"round {r + 1}: {system:<14} {workload:<13} {best['rate']:>10,.0f}/s"
                    f"  {json.dumps(best.get('settings', {}))}{cpu}",
                    flush=True,
                )
    table = summarize(runs)
    lines = render(table, rounds)
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    out = {
        "rounds": rounds,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "summary": table,
        "runs": runs,
    }
    (RESULTS / "peers.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / "peers.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'peers.json'} and peers.txt")


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per system and workload: median rate, range, CPU medians, the settings that won, the
    version the runs reported; and pgq's ratio to each peer, round by round."""
    table: dict[str, Any] = {}
    for system, workloads in runs.items():
        table[system] = {}
        for workload, results in workloads.items():
            if not results:
                continue
            rates = [float(x["rate"]) for x in results]
            entry: dict[str, Any] = {
                "median": statistics.median(rates),
                "rates": rates,
                "settings": [x.get("settings", {}) for x in results],
            }
            for key in ("cpu_worker_us", "cpu_db_us"):
                if all(key in x for x in results):
                    entry[key] = statistics.median(float(x[key]) for x in results)
            pgq = runs.get("pgq", {}).get(workload, [])
            if system != "pgq" and len(pgq) == len(results):
                ratios = [
                    float(a["rate"]) / float(b["rate"]) for a, b in zip(pgq, results, strict=True)
                ]
                entry["pgq_ratio"] = statistics.median(ratios)
                entry["pgq_ratios"] = ratios
            table[system][workload] = entry
    return table


def render(table: dict[str, Any], rounds: int) -> list[str]:
    lines = [f"medians of {rounds} interleaved rounds, jobs/s (range across rounds)"]
    head = f"{'system':<14}" + "".join(f"{w:>28}" for w in WORKLOADS)
    lines += [head + f"{'cpu/job worker + db (drain)':>32}"]
    for system, workloads in table.items():
        row = f"{system:<14}"
        for w in WORKLOADS:
            e = workloads.get(w)
            row += (
                f"{'—':>28}"
                if e is None
                else (f"{e['median']:>10,.0f} ({spread(e['rates'])})".rjust(28))
            )
        d = workloads.get("drain", {})
        if "cpu_worker_us" in d:
            row += f"{d['cpu_worker_us']:>17.1f} + {d['cpu_db_us']:.1f} µs".rjust(32)
        lines.append(row)
    lines.append("\npgq / peer, median of the rounds' ratios (range)")
    for system, workloads in table.items():
        parts = []
        for w in WORKLOADS:
            e = workloads.get(w, {})
            if "pgq_ratio" in e:
                lo, hi = min(e["pgq_ratios"]), max(e["pgq_ratios"])
                parts.append(f"{w} {e['pgq_ratio']:.2f} ({lo:.2f}–{hi:.2f})")
        if parts:
            lines.append(f"  {system:<14} " + ", ".join(parts))
    return lines


if __name__ == "__main__":
    args = sys.argv[1:]
    count = int(args.pop(0)) if args and args[0].isdigit() else 5
    main(count, args)
