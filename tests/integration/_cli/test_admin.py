"""`pgq stats`, `pgq jobs ...`, `pgq queues ...` against a real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
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


APP = """\
import pgq
app = pgq.App()

@app.task(queue="emails", priority=5, max_attempts=7)
async def send_welcome(ctx, to: str) -> None: ...
"""


async def test_enqueue_with_the_app_uses_the_tasks_options_and_warns_when_nobody_listens(
    dsn: str, tmp_path: Path, conn: Conn
) -> None:
    (tmp_path / "cli_app.py").write_text(APP)
    out = await run_cli(tmp_path, "enqueue", "send_welcome", "--app", "cli_app:app",
                        "--args", '{"to": "a@b.c"}', "--json", "--dsn", dsn)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (job,) = json.loads(out.stdout)
    assert job["queue"] == "emails"
    row = await conn.fetchrow(
        "SELECT priority, max_attempts FROM pgq_jobs WHERE id = $1", job["id"]
    )
    assert row is not None and tuple(row) == (5, 7)
    assert "no live worker serves queue 'emails'" in out.stderr
    bad = await run_cli(tmp_path, "enqueue", "send_welcome", "--app", "cli_app:app",
                        "--args", '{"too": 1}', "--dsn", dsn)  # fmt: skip
    assert bad.returncode == 1 and "takes no argument too" in bad.stderr
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 1


async def test_without_any_dsn_errors_name_the_host_and_database_tried(tmp_path: Path) -> None:
    env = {"PGDATABASE": "pgq_no_such_database", "PGHOST": "127.0.0.1", "PGUSER": "postgres"}
    out = await run_cli(tmp_path, "stats", env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "host 127.0.0.1" in out.stderr and "database pgq_no_such_database" in out.stderr
    assert "no DSN was given" in out.stderr


async def test_retry_and_cancel_by_filter_count_and_ask_first(
    dsn: str, client: pgq.Client, conn: Conn, tmp_path: Path
) -> None:
    jobs = await client.enqueue_many(
        [pgq.JobSpec("send", {"i": i}, queue="mail") for i in range(4)]
        + [pgq.JobSpec("send", {"i": 9}, queue="other")]
    )
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'discarded', finalized_at = now() WHERE id = ANY($1)",
        [j.id for j in jobs[:3]] + [jobs[4].id],
    )
    refused = await run_cli(
        tmp_path, "jobs", "retry", "--state", "discarded", "--queue", "mail", "--dsn", dsn
    )
    assert refused.returncode == 1 and "3 jobs match: add --yes to retry them" in refused.stderr
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'available'") == 1
    done = await run_cli(tmp_path, "jobs", "retry", "--state", "discarded", "--queue", "mail",
                         "--yes", "--json", "--dsn", dsn)  # fmt: skip
    assert json.loads(done.stdout)["retried"] == [j.id for j in jobs[:3]]
    cancelled = await run_cli(tmp_path, "jobs", "cancel", "--queue", "mail", "--task", "send",
                              "--yes", "--json", "--dsn", dsn)  # fmt: skip
    assert json.loads(cancelled.stdout)["cancelled"] == [j.id for j in jobs[:4]]
    both = await run_cli(tmp_path, "jobs", "cancel", "1", "--queue", "mail", "--dsn", dsn)
    assert both.returncode == 1 and "not both" in both.stderr
    other = await client.get_job(jobs[4].id)
    assert other is not None and other.state is pgq.JobState.DISCARDED, "its queue was not named"


async def test_pausing_an_unknown_queue_says_so(
    dsn: str, client: pgq.Client, tmp_path: Path
) -> None:
    await client.enqueue("send", queue="mail")
    typo = await run_cli(tmp_path, "queues", "pause", "mial", "--dsn", dsn)
    assert typo.returncode == 1 and "unknown queue 'mial'" in typo.stderr and "mail" in typo.stderr
    forced = await run_cli(tmp_path, "queues", "pause", "mial", "--force", "--dsn", dsn)
    assert forced.returncode == 0 and "paused mial" in forced.stdout
    assert (await run_cli(tmp_path, "queues", "pause", "mail", "--dsn", dsn)).returncode == 0


def test_every_command_that_prints_takes_json_and_the_log_level_goes_anywhere() -> None:
    from pgq._cli.parser import build_parser

    parser = build_parser()
    printing = [
        ["migrate"], ["enqueue", "t"], ["producers"], ["stats"], ["jobs", "list"],
        ["jobs", "show", "1"], ["jobs", "retry", "1"], ["jobs", "cancel", "1"],
        ["queues", "list"], ["queues", "pause", "q"], ["queues", "resume", "q"],
    ]  # fmt: skip
    for command in printing:
        assert parser.parse_args([*command, "--json"]).json, command
    after = parser.parse_args(["worker", "app:app", "--log-level", "DEBUG"])
    assert after.log_level == "DEBUG"
    before = parser.parse_args(["--log-level", "ERROR", "stats"])
    assert before.log_level == "ERROR", "not reset by the command's own default"


async def run_cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    out = await anyio.run_process(
        [sys.executable, "-m", "pgq", *args], cwd=cwd, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    return subprocess.CompletedProcess(
        out.args, out.returncode, out.stdout.decode(), out.stderr.decode()
    )


async def test_stats_shows_every_queue_a_live_worker_serves_or_that_has_settings(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    """A queue with no job still shows when a live producer serves it, or it has limits or
    a pause; a dead producer's, a cleared setting's and '*' (every queue) do not."""
    import uuid

    await client.enqueue("t", queue="busy")
    for queue, silent_s in (("idle", 0.0), ("dead", 3600.0)):
        await conn.execute(
            "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency,"
            " heartbeat_at) VALUES ($1, $2, 'w:1', $3, 5, now() - make_interval(secs => $4))",
            uuid.uuid4(),
            uuid.uuid4(),
            queue,
            silent_s,
        )
    await client.set_queue_limits("limited", concurrency=2)
    await client.set_queue_limits("keyed", key_rate=(5, 60))
    await client.set_queue_limits("cleared", concurrency=1)
    await client.set_queue_limits("cleared")
    await client.pause_queue("held")
    await client.pause_queue("resumed")
    await client.resume_queue("resumed")
    await client.pause_queue("*")
    stats = as_json(dsn, "stats")
    assert [s["queue"] for s in stats] == ["busy", "held", "idle", "keyed", "limited"]
    (idle,) = [s for s in stats if s["queue"] == "idle"]
    assert set(idle["counts"].values()) == {0} and idle["oldest_available_s"] is None
    assert [s.queue for s in await client.stats()] == [s["queue"] for s in stats]


def test_queue_limits_from_the_shell(dsn: str) -> None:
    shown = as_json(dsn, "queues", "limit", "emails", "--concurrency", "3", "--rate", "100/60")
    assert shown == {
        "queue": "emails", "concurrency": 3, "rate_count": 100, "rate_period_s": 60.0,
        "key_concurrency": None, "key_rate_count": None, "key_rate_period_s": None,
    }  # fmt: skip
    listed = {q["name"]: q for q in as_json(dsn, "queues", "list")}
    assert listed["emails"]["concurrency"] == 3 and listed["emails"]["rate_count"] == 100
    kept = as_json(dsn, "queues", "limit", "emails", "--rate", "50/10")  # concurrency stays
    assert kept["concurrency"] == 3 and kept["rate_count"] == 50
    bad = pgq_cli(dsn, "queues", "limit", "emails", "--rate", "100")
    assert bad.returncode == 1 and "--rate takes COUNT/SECONDS" in bad.stderr
    keyed = as_json(dsn, "queues", "limit", "emails", "--key-concurrency", "2", "--key-rate", "5/1")
    assert (keyed["concurrency"], keyed["rate_count"]) == (3, 50)  # kept
    assert (keyed["key_concurrency"], keyed["key_rate_count"], keyed["key_rate_period_s"]) == (
        2, 5, 1.0,
    )  # fmt: skip
    text = pgq_cli(dsn, "queues", "list")
    assert "3 at once, 50/10s; per key: 2 at once, 5/1s" in text.stdout
    bad_key = pgq_cli(dsn, "queues", "limit", "emails", "--key-rate", "x/1")
    assert bad_key.returncode == 1 and "--key-rate takes COUNT/SECONDS" in bad_key.stderr
    cleared = as_json(dsn, "queues", "limit", "emails", "--clear")
    assert cleared["concurrency"] is None and cleared["rate_count"] is None
    assert cleared["key_concurrency"] is None and cleared["key_rate_count"] is None


async def test_a_job_whose_arguments_python_cannot_decode_is_shown_with_the_reason(
    dsn: str, conn: Conn
) -> None:
    job_id = await conn.fetchval(
        "INSERT INTO pgq_jobs (task, args, state) VALUES ('echo',"
        " jsonb_build_object('n', repeat('9', 5000)::numeric), 'scheduled') RETURNING id"
    )
    text = pgq_cli(dsn, "jobs", "show", str(job_id))
    assert text.returncode == 0, text.stderr
    assert "args          (not shown: its stored arguments" in text.stdout, text.stdout
    shown = as_json(dsn, "jobs", "show", str(job_id))
    assert shown["args"] is None and "could not be decoded" in shown["args_problem"]


async def test_jobs_show_prints_control_characters_of_an_error_escaped(
    dsn: str, conn: Conn
) -> None:
    """An error's message, traceback and the job's tags as a task or caller wrote them: on
    the operator's terminal their escape sequences are shown, not obeyed; the traceback
    keeps its lines."""
    entry = {
        "attempt": 1, "kind": "exception", "at": "2026-12-03T12:00:00+00:00",
        "message": "ValueError: \x1b[2J\rboom",
        "traceback": "Traceback (most recent call last):\n  raise ValueError(\x1b[31m)",
    }  # fmt: skip
    job_id = await conn.fetchval(
        "INSERT INTO pgq_jobs (task, args, state, attempt, errors, tags) VALUES"
        " ('echo', '{}', 'retryable', 1, $1::jsonb, $2) RETURNING id",
        json.dumps([entry]),
        ["t\x1b]0;title\x07"],
    )
    out = pgq_cli(dsn, "jobs", "show", str(job_id))
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\r" not in out.stdout and "\x07" not in out.stdout
    assert "ValueError: \\x1b[2J\\rboom" in out.stdout, out.stdout
    assert "      Traceback (most recent call last):\n        raise ValueError(\\x1b[31m)" in (
        out.stdout
    )
    assert "tags          t\\x1b]0;title\\x07" in out.stdout


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["jobs", "show", "99999999999999999999999"], {}, "argument id: expected a whole number"),
        (["jobs", "cancel", "99999999999999999999999"], {}, "argument ID: expected a whole"),
        (["jobs", "list", "--limit", "-1"], {}, "argument --limit: expected a whole number"),
        (["stats"], {"PGQ_LOG_LEVEL": "bogus"}, "log level must be one of DEBUG"),
        (["dashboard", "--port", "99999"], {}, "argument --port: expected a whole number"),
        (
            ["worker", "x:app", "--health-port", "99999"],
            {},
            "argument --health-port: expected a whole number from 0 to 65,535",
        ),
        (["worker", "x:app"], {"PGQ_HEALTH_PORT": "abc"}, "argument --health-port: expected"),
    ],
)
def test_numbers_out_of_range_are_refused_with_a_message_not_a_traceback(
    dsn: str, args: list[str], env: dict[str, str], says: str
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pgq", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert out.returncode == 2, out
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_lowercase_log_level_is_taken(dsn: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pgq", "--log-level", "debug", "stats", "--dsn", dsn],
        capture_output=True,
        text=True,
        env={**os.environ, "PGQ_LOG_LEVEL": "warning"},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
