"""How the CLI shows things: aligned tables, JSON, one job in full."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pgq._core import serde
from pgq.job import Job, JobState
from pgq.logs import printable


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain, aligned text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def emit(args: argparse.Namespace, data: Any, table: Callable[[], str]) -> int:
    """Print ``data`` as JSON with ``--json``, else the text ``table()`` makes."""
    print(json.dumps(data, indent=2, default=_json_default) if args.json else table())
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def job_dict(job: Job) -> dict[str, Any]:
    """A job as the CLI's JSON shows it (arguments Python could not decode are null, with
    ``args_problem`` saying why)."""
    problem = serde.unreadable(job.args)
    shown = {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "state": job.state.value,
        "args": None if problem is not None else job.args,
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
        "limit_key": job.limit_key,
        "depends_on": job.depends_on,
    }
    if problem is not None:
        shown["args_problem"] = problem
    return shown


def _args_shown(args: dict[str, Any]) -> str:
    problem = serde.unreadable(args)
    return json.dumps(args) if problem is None else f"(not shown: {problem})"


def when(value: datetime | None) -> str:
    """A timestamp for a table cell."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def ids(values: Sequence[int]) -> str:
    """A list of job ids, or "none"."""
    return ", ".join(map(str, values)) or "none"


def attempts_line(job: Job) -> str:
    """The attempts counted, and the last one when it was handed back uncounted (a
    shutdown interrupted it): in the words of the worker's log line."""
    line = f"{job.attempt} of {job.max_attempts or 'the task default'} counted"
    last = job.errors[-1] if job.errors else None
    if (
        job.state is JobState.AVAILABLE
        and last is not None
        and isinstance(last.get("attempt"), int)
        and last["attempt"] > job.attempt
    ):
        line += f"; attempt {last['attempt']} not counted: {last.get('message')}"
    return printable(line)


def show_job(job: Job) -> str:
    """One job in full: options, times, result, every error with its traceback."""
    lines = [
        f"job {job.id}  {job.task}  [{job.state.value}]",
        f"  queue         {job.queue} (priority {job.priority})",
        f"  attempts      {attempts_line(job)}",
        f"  args          {_args_shown(job.args)}",
        f"  created       {when(job.created_at)}",
        f"  scheduled     {when(job.scheduled_at)}",
        f"  attempted     {when(job.attempted_at)}",
        f"  finalized     {when(job.finalized_at)}",
        f"  producer      {job.producer_id or '-'}",
    ]
    if job.depends_on:
        lines.append(f"  depends on    {ids(job.depends_on)}")
    if job.limit_key is not None:
        lines.append(f"  limit key     {printable(job.limit_key)}")
    if job.tags:
        lines.append(f"  tags          {printable(', '.join(job.tags))}")
    if job.metadata:
        lines.append(f"  metadata      {json.dumps(job.metadata)}")
    if job.result is not None:
        lines.append(f"  result        {json.dumps(job.result)}")
    for error in job.errors:
        # What a task raised, as it said it: control characters shown, not obeyed.
        lines.append(
            printable(
                f"  error (attempt {error.get('attempt')}, {error.get('kind')}, "
                f"{error.get('at')}): {error.get('message')}"
            )
        )
        if error.get("traceback"):
            traceback = printable(str(error["traceback"]).rstrip(), newlines=True)
            lines += ["      " + line for line in traceback.split("\n")]
    return "\n".join(lines)
