"""`pgq stats`, `pgq jobs ...`, `pgq queues ...` against a real database."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

import pgq

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


def pgq_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgq", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_json(dsn: str, *args: str) -> Any:
    out = pgq_cli(dsn, *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_operator_commands(dsn: str, client: pgq.Client, conn: Conn) -> None:
    jobs = await client.enqueue_many(
        [pgq.JobSpec("send", {"i": i}, queue="mail") for i in range(3)]
        + [pgq.JobSpec("report", queue="reports")]
    )
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'discarded', attempt = 3, max_attempts = 3,"
        ' finalized_at = now(), errors = \'[{"attempt": 3, "kind": "exception",'
        ' "message": "ValueError: boom", "traceback": "Traceback: line 1"}]\''
        " WHERE id = $1",
        jobs[0].id,
    )

    stats = {s["queue"]: s for s in as_json(dsn, "stats")}
    assert stats["mail"]["counts"]["available"] == 2 and stats["mail"]["counts"]["discarded"] == 1
    assert stats["reports"]["oldest_available_s"] >= 0
    table = pgq_cli(dsn, "stats").stdout
    assert "QUEUE" in table and "mail" in table and "OLDEST AVAILABLE" in table

    listed = as_json(dsn, "jobs", "list", "--queue", "mail", "--state", "available")
    assert sorted(j["id"] for j in listed) == [jobs[1].id, jobs[2].id]
    assert len(as_json(dsn, "jobs", "list", "--limit", "1")) == 1
    assert {j["task"] for j in as_json(dsn, "jobs", "list", "--task", "report")} == {"report"}

    shown = pgq_cli(dsn, "jobs", "show", str(jobs[0].id)).stdout
    assert "[discarded]" in shown and "ValueError: boom" in shown and "Traceback: line 1" in shown
    assert as_json(dsn, "jobs", "show", str(jobs[0].id))["errors"][0]["attempt"] == 3
    missing = pgq_cli(dsn, "jobs", "show", "999999")
    assert missing.returncode == 1 and "no job 999999" in missing.stderr

    retried = as_json(dsn, "jobs", "retry", str(jobs[0].id), "999999")
    assert retried == {"retried": [jobs[0].id], "skipped": [999999]}
    row = await conn.fetchrow(
        "SELECT state::text, max_attempts FROM pgq_jobs WHERE id = $1", jobs[0].id
    )
    assert row is not None and tuple(row) == ("available", 4), "one more attempt allowed"

    cancelled = as_json(dsn, "jobs", "cancel", str(jobs[1].id))
    assert cancelled["cancelled"] == [jobs[1].id]

    assert as_json(dsn, "queues", "pause", "mail") == {"paused": "mail"}
    queues = {q["name"]: q for q in as_json(dsn, "queues", "list")}
    assert queues["mail"]["paused"] and not queues["reports"]["paused"]
    assert "paused" in pgq_cli(dsn, "queues", "list").stdout
    pgq_cli(dsn, "queues", "resume", "mail")
    assert not {q["name"]: q for q in as_json(dsn, "queues", "list")}["mail"]["paused"]
    bad = pgq_cli(dsn, "queues", "pause", "bad name")
    assert bad.returncode == 1 and "invalid queue name" in bad.stderr


async def test_the_cli_refuses_an_out_of_range_delay_and_lists_any_row(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    for delay in ("1e12", "inf", "nan"):
        out = pgq_cli(dsn, "enqueue", "send", "--delay", delay)
        assert out.returncode == 1 and "out of range" in out.stderr, delay
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 0
    # A row dated past what Python can hold (written by an older pgq, or by hand).
    far = await conn.fetchval(
        "INSERT INTO pgq_jobs (task, state, scheduled_at) VALUES ('send', 'scheduled',"
        " '33715-06-01 00:00:00+00') RETURNING id"
    )
    listed = pgq_cli(dsn, "jobs", "list")
    assert listed.returncode == 0 and str(far) in listed.stdout, listed.stderr
    assert as_json(dsn, "jobs", "list")[0]["scheduled_at"].startswith("9999-12-30")
    shown = pgq_cli(dsn, "jobs", "show", str(far))
    assert shown.returncode == 0 and "9999-12-30" in shown.stdout
