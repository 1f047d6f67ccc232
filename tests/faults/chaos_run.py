"""`make chaos`: the chaos harness on a cluster of its own, with every fault.

    python -m tests.faults.chaos_run --seconds 90 [--workers 4] [--jobs 400] [--seed N]
                                     [--report chaos-report.json] [--log-dir DIR]

A primary and a synchronous standby (tests.faults.cluster) on loopback; N `pgq worker`
processes, each in a network namespace of its own (tests.faults.netns) reaching both servers
through forwarders on its link, on a multi-host DSN; jobs whose effect is written in the
job's own transaction fed throughout. The nemesis mixes kill -9, SIGSTOP/SIGCONT,
pg_terminate_backend of a worker's connections, a namespace cut off, a server restart and
one failover to the standby. Then the checker (tests.faults.chaos): lost jobs, effects more
than once, effects of rejected attempts, jobs left running, producer rows left behind. It
prints a summary table with each fault kind's recovery time, writes the JSON report, and
exits 1 on any violation (2 when the run itself could not be set up).

Without root (no namespaces) the workers run here, and the partition fault is left out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import random
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg

from tests.faults import chaos, netns
from tests.faults.cluster import Cluster, primary_and_standby, run_as_postgres
from tests.faults.proxy import Proxy


class ClusterFaults:
    """The faults that act on the cluster, or on a worker's connections or network."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.primary = "primary"  # the data directory now primary
        self.failed_over = False
        self.namespaces: list[netns.Namespace] = []

    @property
    def primary_dsn(self) -> str:
        return self.cluster.primary_dsn if self.primary == "primary" else self.cluster.standby_dsn

    async def terminate(self, nemesis: chaos.Nemesis, i: int) -> None:
        """pg_terminate_backend on every connection of worker i (pool, heartbeat, LISTEN)."""
        name = nemesis.workers[i].name
        conn = await asyncpg.connect(self.primary_dsn)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = ANY($1::text[])",
                [f"pgq worker {name}", f"pgq heartbeat {name}", f"pgq listen {name}"],
            )
        finally:
            await conn.close()

    async def partition(self, nemesis: chaos.Nemesis, i: int) -> None:
        """Worker i's namespace loses its link, sometimes past stale_after, then heals."""
        ns = self.namespaces[i]
        ns.cut()
        try:
            await anyio.sleep(self.rng.uniform(1.0, chaos.CHAOS_SETTINGS["stale_after"] * 2))
        finally:
            ns.heal()

    async def restart(self, nemesis: chaos.Nemesis, i: int) -> None:
        """The primary restarts (fast: clients cut off, a checkpoint)."""
        data = self.cluster.root / self.primary
        log = str(self.cluster.root / f"{self.primary}.log")  # postgres must not hold our pipe
        await anyio.to_thread.run_sync(
            run_as_postgres,
            [
                f"{self.cluster.bin}/pg_ctl",
                "-D",
                str(data),
                "-l",
                log,
                "-m",
                "fast",
                "-w",
                "restart",
            ],
        )

    async def failover(self, nemesis: chaos.Nemesis, i: int) -> None:
        """The primary dies (immediate stop) and the standby is promoted; once per run (no
        standby is left after it)."""
        if self.failed_over:  # not drawn again, but a run's schedule may have it queued
            return await self.restart(nemesis, i)
        await anyio.to_thread.run_sync(self.cluster.stop_primary_immediately)
        await anyio.to_thread.run_sync(self.cluster.promote_standby)
        self.primary, self.failed_over = "standby", True
        nemesis.kinds.remove("failover")
        return None


@contextlib.asynccontextmanager
async def placed(
    cluster: Cluster, faults: ClusterFaults, workers: int
) -> AsyncIterator[tuple[list[str], list[tuple[str, ...]]]]:
    """Each worker's DSN and command prefix: in its own namespace through forwarders to both
    servers when namespaces can be made here, else here on the cluster's DSN."""
    if netns.available() is not None:
        yield [cluster.dsn] * workers, [()] * workers
        return
    with contextlib.ExitStack() as stack:
        async with anyio.create_task_group() as tg:
            dsns, prefixes = [], []
            for i in range(workers):
                ns = stack.enter_context(netns.namespace(i))
                faults.namespaces.append(ns)
                ports = []
                for port in (cluster.primary_port, cluster.standby_port):
                    ports.append(await tg.start(Proxy("127.0.0.1", port, ns.host_ip).run))
                dsns.append(
                    f"postgresql://postgres@{ns.host_ip}:{ports[0]},{ns.host_ip}:{ports[1]}"
                    "/postgres?target_session_attrs=read-write"
                )
                prefixes.append(tuple(ns.exec_prefix()))
            yield dsns, prefixes
            tg.cancel_scope.cancel()


async def main(args: argparse.Namespace) -> int:
    # asyncpg logs a traceback each time a pool cannot reconnect: expected here, by design
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="pgq-chaos-"))
    await anyio.Path(log_dir).mkdir(parents=True, exist_ok=True)
    with primary_and_standby() as cluster:
        migrated = await anyio.run_process(
            [sys.executable, "-m", "pgq", "migrate", "--dsn", cluster.dsn], check=False
        )
        if migrated.returncode != 0:
            print(migrated.stderr.decode(), file=sys.stderr)
            return 2
        faults = ClusterFaults(cluster, random.Random(seed + 1))
        async with placed(cluster, faults, args.workers) as (dsns, prefixes):
            kinds = ["kill", "stop", "terminate", "restart", "failover"]
            if faults.namespaces:
                kinds.append("partition")

            def extra(nemesis: chaos.Nemesis) -> None:
                for kind in kinds[2:]:
                    nemesis.add(kind, functools.partial(getattr(faults, kind), nemesis))

            report = await chaos.run(
                cluster.dsn,
                log_dir,
                workers=args.workers,
                jobs=args.jobs,
                seconds=args.seconds,
                seed=seed,
                kinds=("kill", "stop"),
                extra=extra,
                settle_limit_s=args.settle_limit,
                placement=lambda i: (dsns[i], prefixes[i]),
            )
    print(report.summary())
    where = "network namespaces" if faults.namespaces else "this host (no namespaces: not root)"
    print(f"workers in {where}; logs in {log_dir}")
    await anyio.Path(args.report).write_text(report.to_json())
    print(f"report written to {args.report}")
    return 1 if report.violations else 0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.faults.chaos_run", description=__doc__)
    p.add_argument("--seconds", type=float, default=90.0, help="how long faults are injected")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--seed", type=int, default=None, help="replay a run's fault schedule")
    p.add_argument(
        "--settle-limit", type=float, default=180.0, help="seconds to wait for every job to end"
    )
    p.add_argument("--report", default="chaos-report.json")
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse(sys.argv[1:])))
