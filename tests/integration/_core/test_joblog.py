"""The logs an operator reads: failures at WARNING, discards at ERROR, rate-limited per task
with a summary; successes only when asked; JSON lines with the job's fields."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import anyio
import pytest

import pgq
import pgq.testing
from pgq._core.joblog import JobLog
from pgq.logs import JsonFormatter
from tests.integration._worker.test_liveness import FAST

pytestmark = pytest.mark.anyio


def failing_app(max_attempts: int = 2) -> pgq.App:
    app = pgq.App()
    backoff = pgq.Backoff(base_s=0, max_s=0, jitter=0)

    @app.task(max_attempts=max_attempts, backoff=backoff)
    async def charge(ctx: pgq.JobContext, n: int) -> None:
        raise ConnectionError(f"payment gateway down ({n})")

    @app.task
    async def ok(ctx: pgq.JobContext) -> None: ...

    return app


def job_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pgq.jobs"]


async def test_a_retry_warns_a_discard_errs_a_success_is_quiet(
    dsn: str, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "pgq")
    failing = await client.enqueue("charge", {"n": 1})
    await client.enqueue("ok")
    async with pgq.Worker(failing_app(), dsn, **FAST) as worker:
        await worker_idle(worker, 3)
    lines = [(r.levelname, r.getMessage()) for r in job_lines(caplog)]
    assert lines == [
        ("WARNING", f"job {failing.id} (charge, queue default) attempt 1 of 2 failed, will "
                    "retry: ConnectionError: payment gateway down (1)"),
        ("ERROR", f"job {failing.id} (charge, queue default) attempt 2 of 2 discarded: "
                  "ConnectionError: payment gateway down (1)"),
    ]  # fmt: skip
    record = job_lines(caplog)[1]
    fields = record.pgq  # type: ignore[attr-defined]
    assert fields["job_id"] == failing.id and fields["task"] == "charge"
    assert fields["queue"] == "default" and fields["attempt"] == 2
    assert fields["worker"] == worker.name and fields["producer"] is not None
    assert fields["outcome"] == "discarded"
    said = [r.getMessage() for r in caplog.records if r.name == "pgq.worker"]
    assert any(m.startswith(f"worker {worker.name} started") for m in said)
    assert f"worker {worker.name} stopped" in said
    assert any("is now the leader" in r.getMessage() for r in caplog.records)


async def test_log_jobs_logs_successes_too(
    dsn: str, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "pgq.jobs")
    job = await client.enqueue("ok")
    async with pgq.Worker(failing_app(), dsn, log_jobs=True, **FAST) as worker:
        await worker_idle(worker, 1)
    (line,) = job_lines(caplog)
    assert line.levelname == "INFO"
    assert line.getMessage().startswith(
        f"job {job.id} (ok, queue default) attempt 1 of 20 completed in "
    )


async def test_a_flood_of_failures_is_summed_up(
    dsn: str, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pgq.jobs")
    await client.enqueue_many([pgq.JobSpec("charge", {"n": i}) for i in range(25)])
    async with pgq.Worker(failing_app(max_attempts=1), dsn, **FAST) as worker:
        await worker_idle(worker, 25)
        assert worker.stats()["job_log_suppressed"] == 15
    errors = [r for r in job_lines(caplog) if r.levelname == "ERROR"]
    assert len(errors) == 10  # the burst allowed in a window, per task
    (summary,) = [r for r in job_lines(caplog) if "were not logged one by one" in r.getMessage()]
    assert summary.getMessage().startswith("task charge: 15 more failed attempts in the last 60s")
    assert "(15 discarded)" in summary.getMessage()
    assert "see pgq jobs list --task charge --state discarded" in summary.getMessage()


FORGED = "\x1b[2J\x1b[31mboom\r\n2026-01-01 00:00:00,000 INFO    pgq.worker: forged line"


async def test_a_tasks_exception_text_cannot_forge_a_log_line_or_drive_a_terminal(
    dsn: str, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Control characters in what a task raised are escaped in its log line: one line,
    no escape sequence, the text still readable."""
    app = pgq.App()

    @app.task(max_attempts=1)
    async def loud(ctx: pgq.JobContext) -> None:
        raise ValueError(FORGED)

    caplog.set_level(logging.WARNING, "pgq.jobs")
    await client.enqueue("loud")
    async with pgq.Worker(app, dsn, **FAST) as worker:
        await worker_idle(worker, 1)
    (line,) = job_lines(caplog)
    text = line.getMessage()
    assert "\n" not in text and "\r" not in text and "\x1b" not in text, repr(text)
    assert "ValueError: \\x1b[2J\\x1b[31mboom\\r\\n2026-01-01" in text, text


def test_the_rate_limit_is_per_task_and_per_window() -> None:
    log = JobLog("w", burst=2)
    assert [log._allow("a", None) for _ in range(3)] == [True, True, False]
    assert log._allow("b", None)  # one noisy task does not silence another
    log.flush()
    assert log._allow("a", None)  # a new window


async def test_json_lines_from_the_command(dsn: str, client: pgq.Client, tmp_path: Path) -> None:
    (tmp_path / "json_app.py").write_text(
        "import pgq\napp = pgq.App()\n\n"
        "@app.task(max_attempts=1)\nasync def charge(ctx) -> None:\n"
        "    raise ValueError('card declined')\n"
    )
    job = await client.enqueue("charge")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PGQ_LOG_FORMAT": "json"}
    done = await anyio.run_process(
        [sys.executable, "-m", "pgq", "worker", "json_app:app", "--dsn", dsn, "--burst"],
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stderr.decode().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (discard,) = [line for line in lines if line["logger"] == "pgq.jobs"]
    assert discard["level"] == "ERROR" and discard["job_id"] == job.id
    assert discard["task"] == "charge" and discard["queue"] == "default"
    assert discard["attempt"] == 1 and discard["worker"] and discard["producer"]
    assert discard["outcome"] == "discarded" and "card declined" in discard["message"]
    assert any(
        line["message"].startswith("worker ") and "started" in line["message"] for line in lines
    )


def test_the_json_formatter_keeps_exceptions_and_odd_values() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("pgq.x", logging.ERROR, __file__, 1, "failed %s", ("<x>",),
                                   sys.exc_info())  # fmt: skip
    record.pgq = {"job_id": 5, "when": Path("/tmp")}
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "failed <x>" and out["job_id"] == 5 and out["when"] == "/tmp"
    assert "RuntimeError: boom" in out["exception"]


async def test_a_tasks_own_lines_carry_the_jobs_fields_in_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """docs/observability.md: ctx.log's lines are JSON objects with the job's fields."""
    app = pgq.App()

    @app.task(queue="billing")
    async def charge(ctx: pgq.JobContext, amount: int) -> None:
        ctx.log.info("charging %d", amount)

    with caplog.at_level(logging.INFO, logger="pgq.task"):
        await pgq.testing.run_task(charge, 5)
    (record,) = [r for r in caplog.records if r.name == "pgq.task"]
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "[job 0 charge#1] charging 5"
    assert (out["job_id"], out["task"], out["queue"], out["attempt"]) == (0, "charge", "billing", 1)


async def test_a_bad_log_format_is_refused(dsn: str) -> None:
    done = await anyio.run_process(
        [sys.executable, "-m", "pgq", "producers", "--dsn", dsn],
        env={**os.environ, "PGQ_LOG_FORMAT": "xml"},
        check=False,
    )
    assert done.returncode == 2
    assert "log format must be text or json, not 'xml'" in done.stderr.decode()


async def worker_idle(worker: pgq.Worker, attempts: int) -> None:
    """Wait until the worker's producers have finished ``attempts`` attempts."""

    async def finished() -> bool:
        s = worker.stats()["producers"]
        return bool(sum(p["completed"] + p["failed"] for p in s) >= attempts)

    with anyio.fail_after(15):
        while not await finished():  # noqa: ASYNC110 - counters, no event to await
            await anyio.sleep(0.02)
