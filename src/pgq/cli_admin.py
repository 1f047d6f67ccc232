"""The operator's commands: `pgq stats`, `pgq jobs ...`, `pgq queues ...`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pgq.client import Client
from pgq.errors import ConfigError
from pgq.job import Job, JobState


def add_parsers(sub: Any, add_dsn: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register the operator commands on the `pgq` parser."""

    def command(name: str, help: str, parent: Any = sub) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        add_dsn(p)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    command("stats", "jobs by queue and state, oldest available job, last minute's throughput")

    jobs = sub.add_parser(
        "jobs",
        help="list, show, retry or cancel jobs",
        description="List, show, retry or cancel jobs.",
    )
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    p = command("list", "the newest jobs, filtered", jobs_sub)
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--queue")
    p.add_argument("--task")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p = command("show", "one job: args, attempts, errors with tracebacks, producer", jobs_sub)
    p.add_argument("id", type=int)
    p = command("retry", "run finished, retryable or scheduled jobs again now", jobs_sub)
    p.add_argument("ids", type=int, nargs="+", metavar="ID")
    p = command("cancel", "cancel jobs (running ones are stopped by their worker)", jobs_sub)
    p.add_argument("ids", type=int, nargs="+", metavar="ID")

    queues = sub.add_parser(
        "queues", help="list, pause or resume queues", description="List, pause or resume queues."
    )
    queues_sub = queues.add_subparsers(dest="queues_command", metavar="ACTION", required=True)
    command("list", "every queue with its backlog, producers and pause state", queues_sub)
    for action in ("pause", "resume"):
        p = command(action, f"{action} claiming from a queue ('*': every queue)", queues_sub)
        p.add_argument("name", metavar="QUEUE")


async def run(args: argparse.Namespace) -> int:
    """Run an operator command."""
    async with Client(args.dsn) as client:
        if args.command == "stats":
            return await _stats(client, args)
        if args.command == "jobs":
            return await _jobs(client, args)
        return await _queues(client, args)


def _emit(args: argparse.Namespace, data: Any, table: Callable[[], str]) -> int:
    print(json.dumps(data, indent=2, default=_json_default) if args.json else table())
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


async def _stats(client: Client, args: argparse.Namespace) -> int:
    stats = await client.stats()
    shown = list(JobState)
    data = [
        {
            "queue": s.queue,
            "counts": {k.value: v for k, v in s.counts.items()},
            "oldest_available_s": s.oldest_available_s,
            "completed_last_minute": s.completed_last_minute,
            "finished_last_minute": s.finished_last_minute,
        }
        for s in stats
    ]

    def table() -> str:
        if not stats:
            return "no jobs"
        headers = ["QUEUE", *(st.value.upper() for st in shown), "OLDEST AVAILABLE", "DONE/MIN"]
        rows = [
            [
                s.queue,
                *(str(s.counts[st]) for st in shown),
                "-" if s.oldest_available_s is None else f"{s.oldest_available_s:.1f}s",
                str(s.completed_last_minute),
            ]
            for s in stats
        ]
        return render_table(headers, rows)

    return _emit(args, data, table)


def _job_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "state": job.state.value,
        "args": job.args,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "scheduled_at": job.scheduled_at,
        "attempted_at": job.attempted_at,
        "finalized_at": job.finalized_at,
        "created_at": job.created_at,
        "producer_id": job.producer_id,
        "tags": job.tags,
        "metadata": job.metadata,
        "result": job.result,
        "errors": job.errors,
    }


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


async def _jobs(client: Client, args: argparse.Namespace) -> int:
    action = args.jobs_command
    if action == "list":
        jobs = await client.list_jobs(
            state=args.state, queue=args.queue, task=args.task, limit=args.limit
        )

        def table() -> str:
            if not jobs:
                return "no jobs"
            headers = ["ID", "QUEUE", "TASK", "STATE", "ATTEMPT", "SCHEDULED", "FINALIZED"]
            rows = [
                [
                    str(j.id),
                    j.queue,
                    j.task,
                    j.state.value,
                    f"{j.attempt}/{j.max_attempts or '-'}",
                    _when(j.scheduled_at),
                    _when(j.finalized_at),
                ]
                for j in jobs
            ]
            return render_table(headers, rows)

        return _emit(args, [_job_dict(j) for j in jobs], table)
    if action == "show":
        job = await client.get_job(args.id)
        if job is None:
            raise ConfigError(f"no job {args.id}")
        return _emit(args, _job_dict(job), lambda: _show(job))
    if action == "retry":
        done = await client.retry(args.ids)
        skipped = sorted(set(args.ids) - set(done))
        return _emit(
            args,
            {"retried": done, "skipped": skipped},
            lambda: _summary("retried", done, skipped, "not found or running"),
        )
    states = await client.cancel_many(args.ids)
    skipped = sorted(set(args.ids) - set(states))
    data = {
        "cancelled": sorted(i for i, s in states.items() if s is JobState.CANCELLED),
        "cancelling": sorted(i for i, s in states.items() if s is JobState.RUNNING),
        "skipped": skipped,
    }
    return _emit(
        args,
        data,
        lambda: "\n".join(
            [
                f"cancelled: {_ids(data['cancelled'])}",
                f"cancel requested (running): {_ids(data['cancelling'])}",
                f"skipped (not found or already final): {_ids(skipped)}",
            ]
        ),
    )


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids)) or "none"


def _summary(verb: str, done: Sequence[int], skipped: Sequence[int], why: str) -> str:
    return f"{verb}: {_ids(done)}\nskipped ({why}): {_ids(skipped)}"


def _show(job: Job) -> str:
    lines = [
        f"job {job.id}  {job.task}  [{job.state.value}]",
        f"  queue         {job.queue} (priority {job.priority})",
        f"  attempt       {job.attempt} of {job.max_attempts or 'the task default'}",
        f"  args          {json.dumps(job.args)}",
        f"  created       {_when(job.created_at)}",
        f"  scheduled     {_when(job.scheduled_at)}",
        f"  attempted     {_when(job.attempted_at)}",
        f"  finalized     {_when(job.finalized_at)}",
        f"  producer      {job.producer_id or '-'}",
    ]
    if job.tags:
        lines.append(f"  tags          {', '.join(job.tags)}")
    if job.metadata:
        lines.append(f"  metadata      {json.dumps(job.metadata)}")
    if job.result is not None:
        lines.append(f"  result        {json.dumps(job.result)}")
    for error in job.errors:
        lines.append(
            f"  error (attempt {error.get('attempt')}, {error.get('kind')}, "
            f"{error.get('at')}): {error.get('message')}"
        )
        if error.get("traceback"):
            lines += ["      " + line for line in str(error["traceback"]).rstrip().splitlines()]
    return "\n".join(lines)


async def _queues(client: Client, args: argparse.Namespace) -> int:
    action = args.queues_command
    if action == "pause":
        await client.pause_queue(args.name)
        return _emit(args, {"paused": args.name}, lambda: f"paused {args.name}")
    if action == "resume":
        await client.resume_queue(args.name)
        return _emit(args, {"resumed": args.name}, lambda: f"resumed {args.name}")
    queues = await client.list_queues()
    data = [
        {
            "name": q.name,
            "paused": q.paused,
            "paused_at": q.paused_at,
            "available": q.available,
            "running": q.running,
            "producers": q.producers,
        }
        for q in queues
    ]

    def table() -> str:
        if not queues:
            return "no queues"
        rows = [
            [
                q.name,
                "paused" if q.paused else "active",
                str(q.available),
                str(q.running),
                str(q.producers),
            ]
            for q in queues
        ]
        return render_table(["QUEUE", "STATUS", "AVAILABLE", "RUNNING", "PRODUCERS"], rows)

    return _emit(args, data, table)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain, aligned text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
