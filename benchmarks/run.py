"""`make bench`: every system against the same Postgres, each workload in a fresh database.

Runs each (system, workload, setting) in its own process, keeps each peer's best setting,
prints a table and writes benchmarks/results/latest.json. Uses PGQ_BENCH_DSN (default:
the server at 127.0.0.1:5432).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# (system, script, workload, variants): each variant is extra argv; the best rate is kept.
PLAN: list[tuple[str, str, str, list[list[str]]]] = [
    ("pgq", "bench_pgq.py", "enqueue_many", [[]]),
    ("pgqueuer", "bench_pgqueuer.py", "enqueue_many", [[]]),
    ("pgq", "bench_pgq.py", "drain", [["50"], ["100"], ["200"]]),
    ("pgqueuer", "bench_pgqueuer.py", "drain", [["10"], ["50"], ["100"], ["200"]]),
]


def run_one(script: str, workload: str, extra: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / script), workload, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"{script} {workload} {extra} failed:\n{out.stderr[-3000:]}")


def main() -> None:
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for system, script, workload, variants in PLAN:
        for extra in variants:
            result = run_one(script, workload, extra)
            print(
                f"  {system:<9} {workload:<13} {' '.join(extra):<6} {result['rate']:>10,.0f} jobs/s",
                flush=True,
            )
            key = (system, workload)
            if key not in best or result["rate"] > best[key]["rate"]:
                best[key] = result
    print()
    print(f"{'workload':<14}{'pgq':>12}{'pgqueuer':>12}{'ratio':>8}")
    for workload in ("enqueue_many", "drain"):
        a, b = best[("pgq", workload)]["rate"], best[("pgqueuer", workload)]["rate"]
        print(f"{workload:<14}{a:>12,.0f}{b:>12,.0f}{a / b:>8.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {
                    "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count(),
                    "platform": platform.platform(),
                },
                "results": list(best.values()),
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
