"""Print results/latest.json as the markdown tables of benchmarks/README.md ("make bench")
and docs/performance.md."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    data = json.loads((HERE / "results" / "latest.json").read_text())
    r = data["results"]
    systems = ("pgq", "pgqueuer", "procrastinate", "graphile")

    def cell(key: str, field: str, fmt: str) -> str:
        return format(r[key][field], fmt) if key in r else "-"

    print("| workload | pgq | PgQueuer | procrastinate | Graphile Worker | |")
    print("|---|---:|---:|---:|---:|---|")
    for workload, label in (
        ("enqueue_many", "`enqueue_many` (20,000 in batches of 1,000)"),
        ("enqueue", "`enqueue` (1,000 single, in sequence)"),
        ("drain", "`drain` (20,000 no-op jobs, one worker process)"),
    ):
        cells = " | ".join(cell(f"{s}/{workload}", "rate", ",.0f") for s in systems)
        print(f"| {label} | {cells} | jobs/s |")
    for q, label in (
        ("p50_ms", "latency p50 (200 jobs/s for 20 s, commit → task start)"),
        ("p99_ms", "latency p99"),
    ):
        cells = " | ".join(cell(f"{s}/latency", q, ".2f") for s in systems)
        print(f"| {label} | {cells} | ms |")
    print(
        f"| `ceiling` (bare asyncpg, 2 connections, claim 100 / complete 100) | "
        f"{r['ceiling/drain']['rate']:,.0f} | | | | jobs/s |"
    )
    print()
    print("| figure | target | this run | |")
    print("|---|---|---:|---|")
    for t in data["targets"]:
        print(
            f"| {t['figure']} | {t['target']} | {t['value']:.2f} | "
            f"{'met' if t['met'] else 'not met'} |"
        )
    print()
    for key in ("pgq/drain", "pgqueuer/drain", "procrastinate/drain", "graphile/drain"):
        print(key, r[key].get("settings") if key in r else "-")
    for key in ("pgq/steady_default", "pgq/steady_recommended"):
        s = r[key]
        a = s["after"]
        print(
            f"| {key} | {s['rate']:,.0f} jobs/s | {a['heap_mb']:.0f} MB | "
            f"{a['indexes_mb']:.0f} MB | {a['dead_tuples']:,.0f} | {a['rows']:,.0f} | "
            f"{a.get('autovacuums', 0):.0f} |"
        )
    aged = r["pgq/aged_table"]
    print(
        "aged",
        {
            k: (round(v["p50_ms"], 2), round(v["p99_ms"], 2))
            for k, v in aged.items()
            if isinstance(v, dict)
        },
    )


if __name__ == "__main__":
    main()
