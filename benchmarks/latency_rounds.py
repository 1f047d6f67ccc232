"""pgq beside Graphile Worker in interleaved rounds: latency (commit to task start, the
shared driver in latency.py) and the no-op drain of 20,000 jobs.

`python benchmarks/latency_rounds.py [ROUNDS] [TREE ...]`: ROUNDS (default 5) rounds, each
running in turn, every one in a process of its own against a fresh database: the latency
of pgq from each TREE (a checkout of pgq, run with `PYTHONPATH=TREE/src`; default this
one) and Graphile Worker's, each round starting with the next of them; then pgq's drain
(the last TREE, concurrency 2,000, as in `make bench`) and Graphile Worker's (two Node.js
processes at the settings of its performance page). Prints each round and the medians with their range across rounds, and
writes results/latency_rounds.json and .txt. Ratios are taken within the run: compare
them, not single figures, on a shared machine.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def run_one(script: str, workload: str, *extra: str, tree: Path | None = None) -> dict[str, Any]:
    # Databases of their own: other runs on this server may use the default names.
    env = {"PGQ_BENCH_DB_SUFFIX": f"_rounds{os.getpid()}", **os.environ}
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "src")
    out = subprocess.run(
        [sys.executable, str(HERE / script), workload, *extra],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=HERE,
        env=env,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"{script} {workload} {extra} failed:\n{out.stderr[-3000:]}")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(rounds: int, trees: list[Path]) -> None:
    names = [f"pgq@{t.name}" for t in trees]
    latency: dict[str, list[dict[str, Any]]] = {n: [] for n in [*names, "graphile"]}
    drain: dict[str, list[float]] = {"pgq": [], "graphile": []}
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    runs: list[tuple[str, str, Path | None]] = [
        *((name, "bench_pgq.py", tree) for name, tree in zip(names, trees, strict=True)),
        ("graphile", "bench_graphile.py", None),
    ]
    for r in range(1, rounds + 1):
        # Each round starts with the next system: none always runs first or last.
        for name, script, tree in runs[r - 1 :] + runs[: r - 1]:
            latency[name].append(run_one(script, "latency", tree=tree))
        drain["pgq"].append(run_one("bench_pgq.py", "drain", "2000", tree=trees[-1])["rate"])
        drain["graphile"].append(run_one("bench_graphile.py", "drain", "2")["rate"])
        cells = "  ".join(
            f"{n} {v[-1]['p50_ms']:.2f}/{v[-1]['p99_ms']:.2f}" for n, v in latency.items()
        )
        say(
            f"round {r}: latency p50/p99 ms: {cells}; drain jobs/s: pgq "
            f"{drain['pgq'][-1]:,.0f} graphile {drain['graphile'][-1]:,.0f}"
        )
    say("")
    say(f"medians of {rounds} rounds (range across rounds):")
    for name, results in latency.items():
        p50 = [x["p50_ms"] for x in results]
        p99 = [x["p99_ms"] for x in results]
        say(f"  latency {name:<24} p50 {spread(p50)} ms   p99 {spread(p99)} ms")
    graphile_p50 = [x["p50_ms"] for x in latency["graphile"]]
    for name in names:
        ratios = [x["p50_ms"] / g for x, g in zip(latency[name], graphile_p50, strict=True)]
        say(f"  p50 {name} / graphile, per round: {spread(ratios)}")
    for name in ("pgq", "graphile"):
        say(f"  drain {name:<9} {statistics.median(drain[name]):,.0f} jobs/s "
            f"({min(drain[name]):,.0f}-{max(drain[name]):,.0f})")  # fmt: skip
    ratios = [p / g for p, g in zip(drain["pgq"], drain["graphile"], strict=True)]
    say(f"  drain pgq / graphile, per round: {spread(ratios)}")
    RESULTS.mkdir(exist_ok=True)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = " ".join(["benchmarks/latency_rounds.py", str(rounds), *map(str, trees)])
    (RESULTS / "latency_rounds.txt").write_text(f"{command}   # {when}\n" + "\n".join(lines) + "\n")
    (RESULTS / "latency_rounds.json").write_text(
        json.dumps(
            {
                "when": when,
                "command": command,
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
                "latency": latency,
                "drain": drain,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args.pop(0)) if args and args[0].isdigit() else 5
    main(n, [Path(a).resolve() for a in args] or [HERE.parent])
