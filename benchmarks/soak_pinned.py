"""The soak with a pinned horizon: `make soak-pinned [PHASES=4,15,4,5,3] [RATE=N]`, or
`python soak_pinned.py [PHASES] [RATE]`.

The soak (soak.py: a default `pgq worker`, completed jobs kept two minutes, no-op jobs
offered at half the measured maximum rate on a PostgreSQL instance of its own with the
recommended settings) run in phases of the minutes PHASES names: clean, pinned, recovery,
pinned again, recovery again (about 33 minutes with the calibration at the defaults). While
a phase is pinned, a session of its own has run `BEGIN; SELECT txid_current();` and stays
idle in that transaction (the instance's idle_in_transaction_session_timeout is 0, and the
session's too): its transaction id holds back the horizon, so vacuum can remove none of
the row versions that claims, outcomes and retention leave dead from then on. At the end of
the phase it rolls back. The second pin cycle may be shorter than the first: it shows
whether the space vacuum freed after the first is reused (VACUUM does not shrink the files).

Each minute records, beside the soak's own figures (pickup latency: the claim's time minus
the time the job became available, on the database clock, at p50 and p99 over the jobs
enqueued in the minute; jobs not yet claimed SETTLE_S after their second), the jobs the
worker completed in the minute (its producers' counters: a heartbeat's lag, at most five
seconds), the backlog (jobs enqueued and not yet claimed), the age of the oldest
transaction id or snapshot a session holds (the horizon's age), dead tuples
(pg_stat_user_tables.n_dead_tup), the size of the heap and of each index, and for the claim:
how many entries of the fetch index each index scan read (entries of dead rows included:
while the horizon is held they cannot be marked dead in the index) and the claim
statement's mean time (pg_stat_statements).

Targets, against the clean phase's minutes from the second on (its median rate and p99):
  1. each pinned minute completes at least 0.95 of the clean rate;
  2. each pinned minute's p99 pickup is at most 3 times the clean p99 (a minute with more
     than 1 % of its jobs unclaimed SETTLE_S after their second has an unknown p99 counted
     as missed);
  3. from the third minute after the release on, each minute is back: rate at least 0.95
     of the clean rate, p99 at most the clean phase's worst minute's plus 20 %;
  4. sizes stop growing after the release: heap and indexes in each recovery minute at most
     5 % over their size as the pin was released;
  5. the second cycle reuses the space: heap and indexes at the end at most 5 % over their
     size at the end of the first recovery.
The verdicts are printed and written, with every minute, to results/soak_pinned.json,
.txt and .png (the latest run only).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import soak
from common import run

RESULTS = Path(__file__).resolve().parent / "results"
PHASE_NAMES = ("clean", "pinned", "recovery", "pinned again", "recovery again")
DEFAULT_PHASES = "4,15,4,5,3"
RATE_SHARE = 0.95
P99_FACTOR = 3.0
RECOVERY_GRACE_MIN = 2
RECOVERED_P99_SLACK = 1.20
SIZE_SLACK = 1.05
#: A minute with more than this share of its jobs unclaimed when read has no known p99.
UNCLAIMED_SHARE = 0.01
#: On top of the soak's server settings: nothing may end the pinning session, the claim
#: statement's time is counted, and only statements of a second or more are logged (while
#: the horizon is held most claims pass the soak's 10 ms, and every one would be an event).
SERVER = {
    "idle_in_transaction_session_timeout": "0",
    "shared_preload_libraries": "pg_stat_statements",
    "log_min_duration_statement": "1000",
}

READINGS = """
SELECT (SELECT coalesce(sum(completed), 0) FROM pgq_producers)::float8 AS completed,
       (SELECT coalesce(sum(claimed), 0) FROM pgq_producers)::float8 AS claimed,
       (SELECT coalesce(max(id), 0) FROM pgq_jobs)::float8 AS last_id,
       (SELECT max(greatest(age(backend_xid), age(backend_xmin))) FROM pg_stat_activity)
           ::float8 AS horizon_age,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgq_jobs'::regclass)
           ::float8 AS dead,
       (SELECT idx_scan FROM pg_stat_user_indexes
        WHERE indexrelid = 'pgq_jobs_fetch_idx'::regclass)::float8 AS fetch_scans,
       (SELECT idx_tup_read FROM pg_stat_user_indexes
        WHERE indexrelid = 'pgq_jobs_fetch_idx'::regclass)::float8 AS fetch_read,
       (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
        WHERE query LIKE '%attempt_token = gen_random_uuid()%')::float8 AS claims,
       (SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements
        WHERE query LIKE '%attempt_token = gen_random_uuid()%')::float8 AS claim_ms,
       pg_relation_size('pgq_jobs')::float8 AS heap
"""

INDEX_SIZES = """
SELECT c.relname AS name, pg_relation_size(i.indexrelid)::float8 AS size
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'pgq_jobs'::regclass ORDER BY c.relname
"""

PIN_STATE = "SELECT state FROM pg_stat_activity WHERE pid = $1"


def parse_phases(text: str) -> list[int]:
    """PHASES as minutes: clean, pinned, recovery, and optionally a second pinned and
    recovery phase."""
    try:
        phases = [int(p) for p in text.split(",")]
    except ValueError:
        raise SystemExit(f"PHASES: {text!r} is not minutes separated by commas") from None
    if len(phases) not in (3, 5) or min(phases) < 1:
        raise SystemExit("PHASES: 3 or 5 numbers of minutes, each at least 1")
    if phases[2] <= RECOVERY_GRACE_MIN or (len(phases) == 5 and phases[4] <= RECOVERY_GRACE_MIN):
        raise SystemExit(f"PHASES: a recovery phase needs more than {RECOVERY_GRACE_MIN} minutes")
    return phases


class Pinner:
    """The soak's minute hook: opens and releases the pinning transaction at the phases'
    ends, and reads each minute's figures as it ends."""

    def __init__(self, phases: list[int]) -> None:
        self.phase_of: dict[int, str] = {}
        minute = 0
        for name, length in zip(PHASE_NAMES, phases, strict=False):
            for _ in range(length):
                minute += 1
                self.phase_of[minute] = name
        self.readings: list[dict[str, Any]] = []
        self.conn: asyncpg.Connection[asyncpg.Record] | None = None
        self.pin: asyncpg.Connection[asyncpg.Record] | None = None
        self.pin_pid = 0

    async def __call__(self, dsn: str, minute: int) -> None:
        if self.conn is None:
            self.conn = await asyncpg.connect(dsn)
            await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        reading = await self.read(minute)
        self.readings.append(reading)
        pinned_next = self.phase_of.get(minute + 1, "").startswith("pinned")
        if pinned_next and self.pin is None:
            await self.hold(dsn)
        elif not pinned_next and self.pin is not None:
            await self.release()

    async def read(self, minute: int) -> dict[str, Any]:
        assert self.conn is not None
        row = await self.conn.fetchrow(READINGS)
        assert row is not None
        indexes = {r["name"]: r["size"] / 2**20 for r in await self.conn.fetch(INDEX_SIZES)}
        pin_state = None
        if self.pin is not None:
            pin_state = await self.conn.fetchval(PIN_STATE, self.pin_pid)
        return {
            "minute": minute,
            "at": time.perf_counter(),
            **{k: float(v or 0) for k, v in row.items()},
            "heap_mb": float(row["heap"]) / 2**20,
            "index_mb": indexes,
            "pin_state": pin_state,
        }

    async def hold(self, dsn: str) -> None:
        self.pin = await asyncpg.connect(dsn)
        await self.pin.execute("SET idle_in_transaction_session_timeout = 0")
        await self.pin.execute("BEGIN")
        xid = await self.pin.fetchval("SELECT txid_current()")
        self.pin_pid = self.pin.get_server_pid()
        print(f"pinned the horizon: transaction {xid} held idle by backend {self.pin_pid}")

    async def release(self) -> None:
        assert self.pin is not None
        # A session the server had ended would fail here: the pin must have held throughout.
        await self.pin.fetchval("SELECT 1")
        await self.pin.execute("ROLLBACK")
        await self.pin.close()
        self.pin = None
        print("released the horizon")

    async def close(self) -> None:
        for conn in (self.pin, self.conn):
            if conn is not None:
                await conn.close()


def per_minute(soak_rows: list[dict[str, Any]], pinner: Pinner) -> list[dict[str, Any]]:
    """The soak's rows with each minute's own readings: rates from the counters' change."""
    by_minute = {r["minute"]: r for r in pinner.readings}
    rows = []
    for row in soak_rows:
        m = row["minute"]
        now, before = by_minute[m], by_minute[m - 1]
        seconds = now["at"] - before["at"]
        scans = now["fetch_scans"] - before["fetch_scans"]
        claims = now["claims"] - before["claims"]
        unclaimed = row["not_picked_up"] > UNCLAIMED_SHARE * max(row["jobs"], 1)
        rows.append({
            **row,
            "phase": pinner.phase_of[m],
            "rate": (now["completed"] - before["completed"]) / seconds,
            "p99_known_ms": None if unclaimed else row["p99_ms"],
            "backlog": (now["last_id"] - by_minute[0]["last_id"])
            - (now["claimed"] - by_minute[0]["claimed"]),
            "horizon_age": now["horizon_age"],
            "dead_at_end": now["dead"],
            "heap_at_end_mb": now["heap_mb"],
            "index_mb": now["index_mb"],
            "total_mb": now["heap_mb"] + sum(now["index_mb"].values()),
            "fetch_entries_per_scan": (now["fetch_read"] - before["fetch_read"]) / scans
            if scans else None,
            "claim_mean_ms": (now["claim_ms"] - before["claim_ms"]) / claims if claims else None,
            "pin_state": now["pin_state"],
        })  # fmt: skip
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target: what it compares, the figure, the bound, met or not."""

    def phase(name: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["phase"] == name]

    clean = phase("clean")[1:] or phase("clean")
    clean_rate = statistics.median(r["rate"] for r in clean)
    clean_p99 = statistics.median(r["p99_known_ms"] or float("inf") for r in clean)
    clean_worst = max(r["p99_known_ms"] or float("inf") for r in clean)
    out = []

    def is_back(r: dict[str, Any]) -> bool:
        p99 = r["p99_known_ms"] if r["p99_known_ms"] is not None else float("inf")
        return r["rate"] >= RATE_SHARE * clean_rate and p99 <= RECOVERED_P99_SLACK * clean_worst

    def target(name: str, figure: float, bound: float, met: bool, detail: str) -> None:
        out.append({"target": name, "figure": figure, "bound": bound, "met": met,
                    "detail": detail})  # fmt: skip

    pinned = phase("pinned")
    low = min(r["rate"] for r in pinned)
    target("pinned: rate ≥ 0.95 of clean", low / clean_rate, RATE_SHARE,
           low / clean_rate >= RATE_SHARE,
           f"lowest pinned minute {low:,.0f}/s, clean median {clean_rate:,.0f}/s")  # fmt: skip
    worst = max(r["p99_known_ms"] or float("inf") for r in pinned)
    target("pinned: p99 ≤ 3 × clean", worst / clean_p99, P99_FACTOR,
           worst <= P99_FACTOR * clean_p99,
           f"worst pinned minute {worst:,.1f} ms, clean median {clean_p99:.1f} ms")  # fmt: skip
    for name, pin_name in (("recovery", "pinned"), ("recovery again", "pinned again")):
        after = phase(name)
        if not after:
            continue
        checked = after[RECOVERY_GRACE_MIN:]
        back = [is_back(r) for r in after]
        first_back = next((r["minute"] for r, ok in zip(after, back, strict=True) if ok), None)
        target(
            f"{name}: back within {RECOVERY_GRACE_MIN} min",
            sum(back[RECOVERY_GRACE_MIN:]) / len(checked),
            1.0,
            all(back[RECOVERY_GRACE_MIN:]),
            f"minutes {checked[0]['minute']}-{checked[-1]['minute']}: rate "
            + ", ".join(f"{r['rate']:,.0f}" for r in checked)
            + "/s; p99 "
            + ", ".join(f"{r['p99_known_ms'] or float('inf'):.1f}" for r in checked)
            + f" ms (bounds {RATE_SHARE * clean_rate:,.0f}/s, "
            f"{RECOVERED_P99_SLACK * clean_worst:.1f} ms); first minute back: {first_back}",
        )
        at_release = phase(pin_name)[-1]["total_mb"]
        most = max(r["total_mb"] for r in after)
        target(f"{name}: sizes stop growing", most / at_release, SIZE_SLACK,
               most <= SIZE_SLACK * at_release,
               f"largest {most:,.1f} MB against {at_release:,.1f} MB at the release")  # fmt: skip
    if phase("recovery again"):
        first_end, last = phase("recovery")[-1], rows[-1]
        ratio = last["total_mb"] / first_end["total_mb"]
        grown = [
            f"{n} {last['index_mb'][n] / v:.2f}"
            for n, v in first_end["index_mb"].items() if v
        ]  # fmt: skip
        target(
            "second cycle reuses the space",
            ratio,
            SIZE_SLACK,
            ratio <= SIZE_SLACK,
            f"{last['total_mb']:,.1f} MB at the end against {first_end['total_mb']:,.1f} MB"
            f" after the first recovery (heap "
            f"{last['heap_at_end_mb'] / first_end['heap_at_end_mb']:.2f}, "
            + ", ".join(grown)
            + ")",
        )
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    names = list(rows[0]["index_mb"])
    short = [n.removeprefix("pgq_jobs_").removesuffix("_idx") for n in names]
    lines = [
        "min phase           rate/s  in-5s/s  p50 ms   p99 ms  backlog  horizon   dead       "
        "heap MB " + " ".join(f"{s[:9]:>9}" for s in short) + "  fetch/scan  claim ms  pin"
    ]
    for r in rows:
        p99 = f"{r['p99_known_ms']:8.1f}" if r["p99_known_ms"] is not None else "  >5 s  "
        per_scan = r["fetch_entries_per_scan"]
        claim = r["claim_mean_ms"]
        lines.append(
            f"{r['minute']:>3} {r['phase']:<15} {r['rate']:>6,.0f}  {r['completed'] / 60:>7,.0f}"
            f"  {r['p50_ms'] or 0:6.1f} {p99} {r['backlog']:>8,.0f} {r['horizon_age']:>8,.0f}"
            f" {r['dead_at_end']:>10,.0f} {r['heap_at_end_mb']:>9,.1f} "
            + " ".join(f"{r['index_mb'][n]:>9,.1f}" for n in names)
            + f"  {per_scan if per_scan is not None else float('nan'):>10,.0f}"
            f"  {claim if claim is not None else float('nan'):>8.2f}  {r['pin_state'] or '-'}"
        )
    return lines


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = [r["minute"] for r in rows]
    fig, panels = plt.subplots(5, 1, figsize=(9, 13), sharex=True)
    lat, rate, size, dead, scan = panels
    lat.plot(x, [r["p99_known_ms"] for r in rows], marker="o", label="p99")
    lat.plot(x, [r["p50_ms"] for r in rows], marker=".", label="p50")
    unknown = [r["minute"] for r in rows if r["p99_known_ms"] is None]
    if unknown:
        lat.plot(unknown, [soak.SETTLE_S * 1000] * len(unknown), "rx", linestyle="none",
                 label=f"p99 over {soak.SETTLE_S:g} s (jobs unclaimed when read)")  # fmt: skip
    lat.legend(loc="best", fontsize="small")
    lat.set_ylabel("pickup latency (ms)")
    lat.set_yscale("log")
    lat.set_title(
        f"pgq soak with the horizon pinned: {result['offered_rate']:,.0f} jobs/s offered"
        f" (half of {result['sustained_rate']:,.0f}/s)"
    )
    rate.plot(x, [r["rate"] for r in rows], marker="o", color="green")
    rate.set_ylabel("completed jobs/s")
    rate.set_ylim(0, max(r["rate"] for r in rows) * 1.2)
    backlog = rate.twinx()
    backlog.plot(x, [max(r["backlog"], 0) for r in rows], marker=".", color="purple",
                 label="backlog (jobs, right)")  # fmt: skip
    backlog.set_ylim(bottom=0)
    backlog.legend(loc="upper right", fontsize="small")
    size.plot(x, [r["heap_at_end_mb"] for r in rows], marker="o", label="heap")
    for name in rows[0]["index_mb"]:
        size.plot(x, [r["index_mb"][name] for r in rows], marker=".", label=name)
    size.set_ylabel("size (MB)")
    size.set_yscale("log")
    size.legend(loc="upper left", fontsize="x-small")
    dead.plot(x, [r["dead_at_end"] for r in rows], marker="o", label="dead tuples")
    dead.plot(x, [r["horizon_age"] for r in rows], marker=".", label="horizon age (xids)")
    dead.set_yscale("symlog")
    dead.legend(loc="upper left", fontsize="small")
    scan.plot(x, [r["fetch_entries_per_scan"] for r in rows], marker="o",
              label="fetch index entries read per scan")  # fmt: skip
    scan.set_yscale("symlog")
    scan.set_xlabel("minute")
    twin = scan.twinx()
    twin.plot(x, [r["claim_mean_ms"] for r in rows], marker=".", color="red",
              label="claim statement, mean ms")  # fmt: skip
    twin.set_yscale("symlog")
    scan.legend(loc="upper left", fontsize="small")
    twin.legend(loc="upper right", fontsize="small")
    for panel in panels:
        for r in rows:
            if r["phase"].startswith("pinned"):
                panel.axvspan(r["minute"] - 1, r["minute"], color="grey", alpha=0.15, lw=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def main() -> None:
    phases = parse_phases(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else DEFAULT_PHASES)
    rate = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    pinner = Pinner(phases)
    try:
        result = await soak.soak(sum(phases), rate, {}, SERVER, on_minute=pinner)
    finally:
        await pinner.close()
    rows = per_minute(result["rows"], pinner)
    result = {**result, "phases": dict(zip(PHASE_NAMES, phases, strict=False)), "rows": rows}
    result["verdicts"] = verdicts(rows)
    lines = [
        f"soak_pinned.py {','.join(map(str, phases))}: drain {result['drain_rate']:,.0f}/s, "
        f"sustained {result['sustained_rate']:,.0f}/s, offered {result['offered_rate']:,.0f}/s",
        "p50/p99: pickup latency of the minute's jobs (claim minus available); rate/s: "
        "completions by the worker's counters; in-5s/s: the minute's jobs completed 5 s after "
        "their second; horizon: age in xids; fetch/scan: fetch index entries read per scan",
        *table(rows),
        "",
        *(
            f"{v['target']}: {v['figure']:.3g} (bound {v['bound']:g}): "
            f"{'met' if v['met'] else 'NOT met'}; {v['detail']}"
            for v in result["verdicts"]
        ),
    ]
    print("\n" + "\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak_pinned.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "soak_pinned.txt").write_text("\n".join(lines) + "\n")
    chart(result, RESULTS / "soak_pinned.png")
    print(f"wrote {RESULTS / 'soak_pinned.json'}, .txt and .png")


if __name__ == "__main__":
    run(lambda: main())
