"""The ``pgq`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from pgq import cli_admin
from pgq.app import App
from pgq.cli_admin import render_table
from pgq.dsn import resolve_dsn
from pgq.errors import ConfigError, PgqError
from pgq.settings import (
    FOREVER,
    WorkerSettings,
    env_name,
    optional_setting,
    parse_optional_seconds,
    setting_help,
)

log = logging.getLogger("pgq.cli")

_DSN_HELP = (
    "PostgreSQL URL; default: PGQ_DSN, then DATABASE_URL, then the libpq variables "
    "(PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD)"
)


def _add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help=_DSN_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every command."""
    parser = argparse.ArgumentParser(
        prog="pgq",
        description="pgq: a PostgreSQL job queue for asyncio services.",
        epilog="Run `pgq COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("PGQ_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (default: INFO, or PGQ_LOG_LEVEL)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "migrate",
        help="create or upgrade pgq's tables (alembic upgrade head)",
        description="Apply pgq's migrations to the database.",
    )
    _add_dsn(p)
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the DDL instead of applying it (for a DBA to review and run)",
    )

    p = sub.add_parser(
        "worker",
        help="run a worker for an App",
        description="Run the jobs of an App until SIGTERM or SIGINT (graceful: "
        "running jobs get --shutdown-timeout seconds; a second signal stops at "
        "once).",
    )
    p.add_argument("app", metavar="MODULE:APP", help="where the App is, e.g. myproject.tasks:app")
    _add_dsn(p)
    p.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="NAME[:N]",
        help="a queue to work, with its concurrency; repeatable (default: every "
        "queue the App's tasks use)",
    )
    p.add_argument(
        "--burst", action="store_true", help="exit (status 0) once no runnable job is left"
    )
    p.add_argument(
        "--name",
        help="worker name shown in `pgq producers` (default: host:pid, or PGQ_WORKER_NAME)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        metavar="P",
        default=_env_int("PGQ_HEALTH_PORT"),
        help="serve GET /healthz on this port (200, or 503 with a JSON reason); "
        "env PGQ_HEALTH_PORT",
    )
    p.add_argument(
        "--health-host",
        default=os.environ.get("PGQ_HEALTH_HOST", "127.0.0.1"),
        help="address the health endpoint binds (default 127.0.0.1)",
    )
    for name, (default, text) in setting_help().items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(
                flag,
                action="store_const",
                const=True,
                default=None,
                help=f"{text} (env {env_name(name)})",
            )
        elif optional_setting(name):
            p.add_argument(
                flag,
                type=parse_optional_seconds,
                default=None,
                metavar="S|none",
                help=f"{text} (default {default:g}, env {env_name(name)})",
            )
        else:
            p.add_argument(
                flag,
                type=type(default),
                default=None,
                metavar="N",
                help=f"{text} (default {default:g}, env {env_name(name)})",
            )

    p = sub.add_parser(
        "producers",
        help="list producers, their heartbeats and the leader",
        description="List every producer registered in the database with its heartbeat age "
        "and status (alive, unhealthy, stale), and which worker leads.",
    )
    _add_dsn(p)
    p.add_argument(
        "--stale-after",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which a silent producer shows as stale (default: PGQ_STALE_AFTER or 30)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    cli_admin.add_parsers(sub, _add_dsn)

    p = sub.add_parser(
        "enqueue", help="enqueue jobs from the shell", description="Enqueue jobs of a task by name."
    )
    p.add_argument("task", metavar="TASK", help="task name")
    _add_dsn(p)
    p.add_argument(
        "--args",
        default="{}",
        metavar="JSON",
        help='keyword arguments as a JSON object, e.g. \'{"to": "a@b.c"}\'',
    )
    p.add_argument("--queue", default="default", help="queue (default: default)")
    p.add_argument(
        "--delay",
        type=float,
        default=None,
        metavar="S",
        help="run no sooner than S seconds from now",
    )
    p.add_argument("--priority", type=int, default=None, help="higher runs first (default 0)")
    p.add_argument("--max-attempts", type=int, default=None, metavar="N")
    p.add_argument(
        "--count",
        type=int,
        default=1,
        metavar="N",
        help="enqueue N identical jobs in one round trip",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pgq`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    # alembic narrates its plugin set-up at INFO; pgq prints its own one-line summary.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        if args.command == "migrate":
            return _migrate(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "enqueue":
            return anyio.run(_enqueue, args)
        if args.command == "producers":
            return anyio.run(_producers, args)
        if args.command in ("stats", "jobs", "queues"):
            return anyio.run(cli_admin.run, args)
    except PgqError as exc:
        print(f"pgq: error: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        matched, rest = group.split(PgqError)
        if matched is None or rest is not None:
            raise
        print(f"pgq: error: {_first_leaf(matched)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2  # pragma: no cover


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _migrate(args: argparse.Namespace) -> int:
    from pgq import migrate

    if args.sql:
        sys.stdout.write(migrate.sql_script())
        return 0
    dsn = resolve_dsn(args.dsn)
    migrate.upgrade(dsn)
    print(f"pgq schema at revision {migrate.head_revision()}")
    return 0


def load_app(spec: str) -> App:
    """Import ``MODULE:ATTR`` (the current directory is importable) and return the App."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:APP, e.g. myproject.tasks:app, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not a pgq.App (found {type(app).__name__})")
    return app


def parse_queues(values: Sequence[str], default: int | None) -> dict[str, int] | None:
    """``["emails:20", "reports"]`` -> ``{"emails": 20, "reports": default}``."""
    if not values:
        return None
    queues: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition(":")
        if sep:
            if not count.isdigit() or int(count) < 1:
                raise ConfigError(
                    f"--queue {value!r}: the concurrency after ':' must be a whole number >= 1"
                )
            queues[name] = int(count)
        else:
            queues[name] = default or WorkerSettings.resolve().concurrency
    return queues


def _worker(args: argparse.Namespace) -> int:
    from pgq.worker import Worker

    app = load_app(args.app)
    settings = {
        name: None if value == FOREVER else value
        for name in setting_help()
        if (value := getattr(args, name)) is not None
    }
    worker = Worker(
        app,
        args.dsn,
        queues=parse_queues(args.queue, args.concurrency),
        name=args.name,
        health_port=args.health_port,
        health_host=args.health_host,
        **settings,
    )

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_handle_signals, worker)
            await worker.run(burst=args.burst)
            tg.cancel_scope.cancel()

    anyio.run(run)
    return 0


async def _handle_signals(worker: Any) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        seen = 0
        async for signum in signals:
            seen += 1
            if seen == 1:
                log.info(
                    "%s: stopping gracefully (send again to stop at once)",
                    signal.Signals(signum).name,
                )
                worker.stop()
            else:
                log.warning("%s again: stopping now", signal.Signals(signum).name)
                worker.stop(now=True)


async def _enqueue(args: argparse.Namespace) -> int:
    from pgq.client import Client, JobSpec

    try:
        job_args = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(job_args, dict):
        raise ConfigError("--args must be a JSON object of keyword arguments, e.g. '{\"n\": 1}'")
    if args.count < 1:
        raise ConfigError("--count must be at least 1")
    spec = JobSpec(
        args.task,
        job_args,
        queue=args.queue,
        priority=args.priority,
        delay=args.delay,
        max_attempts=args.max_attempts,
    )
    async with Client(args.dsn) as client:
        jobs = await client.enqueue_many([spec] * args.count)
    for job in jobs:
        print(f"{job.id}\t{job.state}\t{job.queue}\t{job.task}")
    return 0


async def _producers(args: argparse.Namespace) -> int:
    from pgq import sql
    from pgq.db import check_schema, connect

    stale_after = args.stale_after or WorkerSettings.resolve().stale_after
    conn = await connect(resolve_dsn(args.dsn))
    try:
        await check_schema(conn)
        rows = await conn.fetch(sql.LIST_PRODUCERS)
        leader = await conn.fetchrow(sql.CURRENT_LEADER)
    finally:
        await conn.close()
    items = []
    for r in rows:
        age = float(r["heartbeat_age_s"])
        status = "stale" if age > stale_after else ("alive" if r["healthy"] else "unhealthy")
        items.append(
            {
                "producer_id": str(r["id"]),
                "worker_name": r["worker_name"],
                "queue": r["queue"],
                "status": status,
                "heartbeat_age_s": round(age, 1),
                "leader": bool(r["is_leader"]),
                "running": r["running"],
                "concurrency": r["concurrency"],
                "claimed": r["claimed"],
                "completed": r["completed"],
                "failed": r["failed"],
                "rejected_outcomes": r["rejected_outcomes"],
                "started_at": r["started_at"].isoformat(),
            }
        )
    leader_info = None
    if leader is not None:
        leader_info = {
            "worker_id": str(leader["leader_id"]),
            "worker_name": leader["worker_name"],
            "elected_at": leader["elected_at"].isoformat(),
            "expires_in_s": round(float(leader["expires_in_s"]), 1),
        }
    if args.json:
        print(json.dumps({"leader": leader_info, "producers": items}, indent=2))
        return 0
    if leader_info:
        print(
            f"leader: {leader_info['worker_name']} (lease expires in {leader_info['expires_in_s']}s)"
        )
    else:
        print("leader: none")
    if not items:
        print("no producers registered")
        return 0
    headers = [
        "WORKER",
        "QUEUE",
        "STATUS",
        "HEARTBEAT",
        "RUNNING",
        "SLOTS",
        "CLAIMED",
        "COMPLETED",
        "FAILED",
        "REJECTED",
    ]
    table = [
        [
            it["worker_name"] + (" *" if it["leader"] else ""),
            it["queue"],
            it["status"],
            f"{it['heartbeat_age_s']}s ago",
            *(
                str(it[c])
                for c in (
                    "running",
                    "concurrency",
                    "claimed",
                    "completed",
                    "failed",
                    "rejected_outcomes",
                )
            ),
        ]
        for it in items
    ]
    print(render_table(headers, table))
    print("(* leader)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
