"""The commands that look and act: `pgq migrate`, `enqueue`, `producers`, `stats`,
`jobs ...`, `queues ...`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from pgq._cli.render import emit, job_dict, render_table, show_job, when
from pgq._cli.render import ids as _ids
from pgq._cli.worker_command import load_app
from pgq._core.dsn import resolve_dsn
from pgq._core.names import check_queue_name
from pgq._core.serde import MAX_JSON_DEPTH
from pgq._db import jobs as store_jobs
from pgq._db import producers as store_producers
from pgq._db import queues as store_queues
from pgq._db.claims import QueueLimits
from pgq._db.connections import Target, connect
from pgq._db.revision import check_schema
from pgq.app import JobSpec
from pgq.client import Client
from pgq.errors import ConfigError
from pgq.job import JobState
from pgq.logs import printable
from pgq.settings import WorkerSettings


def migrate(args: argparse.Namespace) -> int:
    """`pgq migrate [--sql | --rename-shared-ids]`."""
    from pgq import migrate as migrations

    if args.sql:
        sys.stdout.write(migrations.sql_script())
        return 0
    if args.rename_shared_ids:
        renamed = migrations.rename_shared_ids(resolve_dsn(args.dsn))
        return emit(
            args,
            {"renamed": renamed},
            lambda: (
                f"renamed {renamed} of pgq's revision ids in alembic_version; now run "
                "`alembic upgrade heads` in your project"
            ),
        )
    at = migrations.upgrade(resolve_dsn(args.dsn))
    head = migrations.head_revision()
    newer = (
        "" if at == head else f" (a newer pgq's, which serves this pgq at {head}: left as it is)"
    )
    return emit(args, {"revision": at}, lambda: f"pgq schema at revision {at}{newer}")


async def enqueue(args: argparse.Namespace) -> int:
    """`pgq enqueue TASK ...`: with ``--app`` the task's own options and signature apply;
    a warning says when no live worker serves the target queue."""
    try:
        job_args = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--args is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"--args is nested too deeply to read: pgq stores at most {MAX_JSON_DEPTH} levels "
            "of lists and objects; flatten it"
        ) from None
    if not isinstance(job_args, dict):
        raise ConfigError("--args must be a JSON object of keyword arguments, e.g. '{\"n\": 1}'")
    if args.count < 1:
        raise ConfigError("--count must be at least 1")
    app = load_app(args.app) if args.app else None
    depends_on = None
    if args.depends_on is not None:
        try:
            depends_on = [int(i) for i in args.depends_on.split(",")]
        except ValueError:
            raise ConfigError(
                f"--depends-on takes job ids separated by commas, e.g. 12,15, not "
                f"{args.depends_on!r}"
            ) from None
    spec = JobSpec(
        args.task,
        job_args,
        queue=args.queue,
        priority=args.priority,
        delay=args.delay,
        max_attempts=args.max_attempts,
        limit_key=args.limit_key,
        tags=args.tag or (),
        depends_on=depends_on,
        on_parent_failure=args.on_parent_failure,
    )
    async with Client(args.dsn, app=app) as client:
        jobs = await client.enqueue_many([spec] * args.count)
        stale_after = WorkerSettings.from_env("stale_after")
        served = {
            q: await store_producers.live_count(client.pool, q, stale_after)
            for q in {j.queue for j in jobs}
        }
    for queue, n in served.items():
        if not n:
            print(
                f"pgq: warning: no live worker serves queue {queue!r} (see `pgq producers`); "
                "the jobs wait until one does",
                file=sys.stderr,
            )
    return emit(
        args,
        [{"id": j.id, "state": j.state.value, "queue": j.queue, "task": j.task} for j in jobs],
        lambda: render_table(
            ("id", "state", "queue", "task"),
            [(str(j.id), j.state.value, j.queue, printable(j.task)) for j in jobs],
        ),
    )


async def producers(args: argparse.Namespace) -> int:
    """`pgq producers`: every producer, its heartbeat age and status, and the leader."""
    stale_after = args.stale_after or WorkerSettings.from_env("stale_after")
    target = Target.resolve(args.dsn)
    conn = await connect(target.dsn, **target.options("pgq producers"))
    try:
        await check_schema(conn)
        rows = await store_producers.list_producers(conn)
        leader = await store_producers.current_leader(conn)
    finally:
        await conn.close()
    items: list[dict[str, Any]] = [
        {
            "producer_id": str(r.id),
            "worker_name": r.worker_name,
            "queue": r.queue,
            "status": r.status(args.stale_after, stale_after),
            "heartbeat_age_s": round(r.heartbeat_age_s, 1),
            "leader": r.is_leader,
            "running": r.running,
            "concurrency": r.concurrency,
            "claimed": r.claimed,
            "completed": r.completed,
            "failed": r.failed,
            "rejected_outcomes": r.rejected_outcomes,
            "started_at": r.started_at.isoformat(),
        }
        for r in rows
    ]
    leader_info = None
    if leader is not None:
        leader_info = {
            "worker_id": str(leader.worker_id),
            "worker_name": leader.worker_name,
            "elected_at": leader.elected_at.isoformat(),
            "expires_in_s": round(leader.expires_in_s, 1),
        }
    return emit(
        args, {"leader": leader_info, "producers": items}, lambda: _producers(leader_info, items)
    )


def _producers(leader: dict[str, Any] | None, items: list[dict[str, Any]]) -> str:
    lines = [
        f"leader: {leader['worker_name']} (lease expires in {leader['expires_in_s']}s)"
        if leader
        else "leader: none"
    ]
    if not items:
        return "\n".join([*lines, "no producers registered"])
    counters = ("running", "concurrency", "claimed", "completed", "failed", "rejected_outcomes")
    headers = ["WORKER", "QUEUE", "STATUS", "HEARTBEAT", "RUNNING", "SLOTS", "CLAIMED"]
    headers += ["COMPLETED", "FAILED", "REJECTED"]
    table = [
        [
            f"{it['worker_name']}{' *' if it['leader'] else ''}",
            str(it["queue"]),
            str(it["status"]),
            f"{it['heartbeat_age_s']}s ago",
            *(str(it[c]) for c in counters),
        ]
        for it in items
    ]
    return "\n".join([*lines, render_table(headers, table), "(* leader)"])


async def operate(args: argparse.Namespace) -> int:
    """`pgq stats`, `pgq jobs ...`, `pgq queues ...`."""
    async with Client(args.dsn) as client:
        if args.command == "stats":
            return await _stats(client, args)
        if args.command == "jobs":
            return await _jobs(client, args)
        return await _queues(client, args)


async def _stats(client: Client, args: argparse.Namespace) -> int:
    stats = await client.stats()
    data = [
        {
            "queue": s.queue,
            "counts": {k.value: v for k, v in s.counts.items()},
            "oldest_available_s": s.oldest_available_s,
            "completed_last_minute": s.completed_last_minute,
            "finished_last_minute": s.finished_last_minute,
            "unrunnable": s.unrunnable,
        }
        for s in stats
    ]
    for s in stats:
        for task, n in sorted(s.unrunnable.items()):
            print(
                f"pgq: warning: {n} job(s) of task {task!r} on queue {s.queue!r}: no live worker "
                "of that queue serves the task (deploy it, or `pgq jobs cancel --task "
                f"{task} --queue {s.queue} --state available`)",
                file=sys.stderr,
            )

    def table() -> str:
        if not stats:
            return "no queues: no jobs, no live worker, no limits or pauses"
        headers = ["QUEUE", *(st.value.upper() for st in JobState), "OLDEST AVAILABLE"]
        rows = [
            [
                s.queue,
                *(str(s.counts[st]) for st in JobState),
                "-" if s.oldest_available_s is None else f"{s.oldest_available_s:.1f}s",
                str(s.completed_last_minute),
                str(sum(s.unrunnable.values())),
            ]
            for s in stats
        ]
        return render_table([*headers, "DONE/MIN", "UNRUNNABLE"], rows)

    return emit(args, data, table)


async def _jobs(client: Client, args: argparse.Namespace) -> int:
    action = args.jobs_command
    if action == "list":
        jobs = await client.list_jobs(
            state=args.state, queue=args.queue, task=args.task, limit=args.limit
        )
        headers = ["ID", "QUEUE", "TASK", "STATE", "ATTEMPT", "SCHEDULED", "FINALIZED"]
        rows = [
            [
                str(j.id), j.queue, j.task, j.state.value, f"{j.attempt}/{j.max_attempts or '-'}",
                when(j.scheduled_at), when(j.finalized_at),
            ]
            for j in jobs
        ]  # fmt: skip
        return emit(
            args,
            [job_dict(j) for j in jobs],
            lambda: render_table(headers, rows) if jobs else "no jobs",
        )
    if action == "show":
        job = await client.get_job(args.id)
        if job is None:
            raise ConfigError(f"no job {args.id}")
        return emit(args, job_dict(job), lambda: show_job(job))
    ids = await _chosen_jobs(client, args)
    if action == "retry":
        done = await client.retry(ids)
        skipped = sorted(set(ids) - set(done))
        return emit(
            args,
            {"retried": done, "skipped": skipped},
            lambda: (
                f"retried: {_ids(done)}\nskipped (not found, waiting or running already, or "
                f"its unique key taken by another job): {_ids(skipped)}"
            ),
        )
    states = await client.cancel_many(ids)
    data = {
        "cancelled": sorted(i for i, s in states.items() if s is JobState.CANCELLED),
        "cancelling": sorted(i for i, s in states.items() if s is JobState.RUNNING),
        "skipped": sorted(set(ids) - set(states)),
    }
    return emit(
        args,
        data,
        lambda: (
            f"cancelled: {_ids(data['cancelled'])}\n"
            f"cancel requested (running): {_ids(data['cancelling'])}\n"
            f"skipped (not found or already final): {_ids(data['skipped'])}"
        ),
    )


async def _chosen_jobs(client: Client, args: argparse.Namespace) -> list[int]:
    """The ids a retry or cancel acts on: those given, or (asking first, unless --yes) every
    job the filters match."""
    filters = args.state or args.queue or args.task
    if args.ids and filters:
        raise ConfigError("give job ids or filters (--state, --queue, --task), not both")
    if args.ids:
        return list(args.ids)
    if not filters:
        raise ConfigError("give job ids, or filters (--state, --queue, --task) to match jobs")
    ids = await store_jobs.ids_matching(
        client.pool,
        states=[JobState(s) for s in args.state] if args.state else None,
        queue=args.queue,
        task=args.task,
    )
    verb = args.jobs_command
    if ids and not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"{len(ids)} jobs match: add --yes to {verb} them")
        answer = await anyio.to_thread.run_sync(
            input, f"{len(ids)} jobs match; {verb} them? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            raise ConfigError(f"nothing done ({len(ids)} jobs match)")
    return ids


async def _limit(client: Client, args: argparse.Namespace) -> int:
    name = check_queue_name(args.name)
    given = {
        "concurrency": args.concurrency,
        "rate": _rate("--rate", args.rate) if args.rate is not None else None,
        "key_concurrency": args.key_concurrency,
        "key_rate": _rate("--key-rate", args.key_rate) if args.key_rate is not None else None,
    }
    changed = {k: v for k, v in given.items() if v is not None}
    if args.clear and changed:
        raise ConfigError("--clear removes every limit: give it alone")
    if args.clear:
        await client.set_queue_limits(name)
    elif changed:
        # A limit not given keeps its stored value: --rate alone leaves --concurrency be.
        now = await client.queue_limits(name)
        kept: dict[str, Any] = {
            "concurrency": now.concurrency,
            "rate": (now.rate_count, now.rate_period_s) if now.rate_count is not None else None,
            "key_concurrency": now.key_concurrency,
            "key_rate": (now.key_rate_count, now.key_rate_period_s)
            if now.key_rate_count is not None
            else None,
        }
        await client.set_queue_limits(name, **(kept | changed))
    limits = await client.queue_limits(name)
    text = f"queue {name}: {limits.describe() if limits.limited else 'no limits'}"
    return emit(args, {"queue": name, **_limits_data(limits)}, lambda: text)


def _limits_data(limits: QueueLimits) -> dict[str, Any]:
    return {
        "concurrency": limits.concurrency,
        "rate_count": limits.rate_count,
        "rate_period_s": limits.rate_period_s,
        "key_concurrency": limits.key_concurrency,
        "key_rate_count": limits.key_rate_count,
        "key_rate_period_s": limits.key_rate_period_s,
    }


def _rate(option: str, text: str) -> tuple[int, float]:
    count, slash, seconds = text.partition("/")
    try:
        if not slash:
            raise ValueError(text)
        return int(count), float(seconds)
    except ValueError:
        raise ConfigError(
            f"{option} takes COUNT/SECONDS, e.g. 100/60 (100 jobs a minute), not {text!r}"
        ) from None


async def _queues(client: Client, args: argparse.Namespace) -> int:
    action = args.queues_command
    if action == "limit":
        return await _limit(client, args)
    if action in ("pause", "resume"):
        if args.name != "*":
            check_queue_name(args.name)
        if (
            args.name != "*"
            and not args.force
            and not await store_queues.known(client.pool, args.name)
        ):
            known = ", ".join(q.name for q in await client.list_queues()) or "none"
            raise ConfigError(
                f"unknown queue {args.name!r}: no job, worker or setting names it (known: "
                f"{known}); check the name, or pass --force to {action} it before it exists"
            )
        if action == "pause":
            await client.pause_queue(args.name)
        else:
            await client.resume_queue(args.name)
        done = f"{action}d"
        return emit(args, {done: args.name}, lambda: f"{done} {args.name}")
    queues = await client.list_queues()
    data = [
        {
            "name": q.name,
            "paused": q.paused,
            "paused_at": q.paused_at,
            "available": q.available,
            "running": q.running,
            "producers": q.producers,
            **_limits_data(q.limits),
        }
        for q in queues
    ]
    rows = [
        [
            q.name,
            "paused" if q.paused else "active",
            str(q.available),
            str(q.running),
            str(q.producers),
            q.limits.describe(),
        ]
        for q in queues
    ]
    headers = ["QUEUE", "STATUS", "AVAILABLE", "RUNNING", "PRODUCERS", "LIMITS"]
    return emit(args, data, lambda: render_table(headers, rows) if queues else "no queues")
