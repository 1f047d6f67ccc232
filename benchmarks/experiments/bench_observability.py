"""What do metrics and tracing cost the worker?

Answer: metrics on drained no-op jobs at 0.996 of metrics off (target: at most 5 % lost);
tracing through the API alone at 0.935, with the SDK recording every span at 0.828
(docs/observability.md).

The no-op drain with each on and off.

`python benchmarks/experiments/bench_observability.py [ROUNDS]` drains 20,000 no-op jobs per run, in
interleaved rounds (default 5), in-process: metrics off, metrics on (prometheus_client),
metrics on and a scrape every 100 ms, tracing on (the OpenTelemetry API with no SDK, as in an
app that has not configured one) and tracing on with the SDK recording every span. Prints
the median jobs/s of each and its ratio to metrics off. Target: metrics cost <= 5 %.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import anyio
import httpx
from common import fresh_database, reset_jobs

import pgq
from pgq import migrate

N = 20_000

app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Nothing: the queue's own cost."""


async def fill(dsn: str) -> None:
    """A table of exactly N available jobs with fresh statistics, so that every run starts
    alike (this machine's test server runs without autovacuum)."""
    await reset_jobs(dsn)
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, N, 5_000):
            await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 5_000)]
            )
    await reset_jobs(dsn, analyze=True)


async def drain(dsn: str, scrape: bool = False, **options: Any) -> float:
    await fill(dsn)
    worker = pgq.Worker(app, dsn, health_port=0 if scrape else None, **options)
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        if scrape:
            tg.start_soon(_scrape, worker)
        await worker.run(burst=True)
        tg.cancel_scope.cancel()
    return N / (time.perf_counter() - started)


async def _scrape(worker: pgq.Worker) -> None:
    await worker.started.wait()
    async with httpx.AsyncClient() as http:
        while True:
            try:
                await http.get(f"http://127.0.0.1:{worker.health_port}/metrics")
            except httpx.TransportError:
                return  # the burst ended and the server with it
            await anyio.sleep(0.1)


def _sdk() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)


MODES: dict[str, Callable[[str], Any]] = {
    "metrics off": lambda dsn: drain(dsn, metrics=False),
    "metrics on": lambda dsn: drain(dsn, metrics=True),
    "metrics on, scraped every 100 ms": lambda dsn: drain(dsn, scrape=True, metrics=True),
    "tracing on (API only, no SDK)": lambda dsn: drain(dsn, metrics=False, tracing=True),
}
SDK_MODE = "tracing on (SDK records every span)"


async def main(rounds: int) -> None:
    dsn = await fresh_database("pgq_bench_observability")
    await migrate.upgrade_async(dsn)
    rates: dict[str, list[float]] = {m: [] for m in [*MODES, SDK_MODE]}
    for r in range(rounds):
        for mode, run in MODES.items():
            rates[mode].append(await run(dsn))
        print(f"round {r + 1}: " + ", ".join(f"{m}: {v[-1]:,.0f}" for m, v in rates.items() if v))
    _sdk()  # last: a tracer provider, once set, stays for the process
    for _ in range(rounds):
        rates[SDK_MODE].append(await drain(dsn, metrics=False, tracing=True))
    base = statistics.median(rates["metrics off"])
    print(f"\n{'mode':38} {'jobs/s (median)':>16} {'vs off':>8}")
    for mode, values in rates.items():
        median = statistics.median(values)
        print(f"{mode:38} {median:16,.0f} {median / base:8.3f}")
    cost = 1 - statistics.median(rates["metrics on"]) / base
    print(f"\nmetrics cost: {cost * 100:.1f} % of drain throughput (target <= 5 %)")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5)
