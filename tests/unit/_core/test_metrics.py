"""The worker's job metrics, counted by pgq itself, export what prometheus_client's own
Counter and Histogram would: same series, buckets, sums and counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import pgq
from pgq._core.hooks import JobEvent
from pgq._core.metrics import DURATION_BUCKETS, PICKUP_BUCKETS, WorkerMetrics

prometheus_client = pytest.importorskip("prometheus_client")

STATS: dict[str, Any] = {
    "producers": [],
    "heartbeat_failures": 0,
    "leader": False,
    "outcomes_salvaged": 0,
    "outcomes_pending": 0,
}
# Every kind of value a bucket boundary can meet: on a bound, between, below the first,
# above the last, zero.
DURATIONS = [0.0, 0.001, 0.0015, 0.01, 0.3, 1.0, 2.5, 59.9, 3600.0, 7200.0, 0.0004]
PICKUPS = [0.0, 0.001, 0.02, 0.1, 60.0, 61.0, 0.25, -0.5]


def _job(queue: str, task: str, wait_s: float) -> pgq.Job[Any]:
    scheduled = datetime(2026, 1, 1, tzinfo=UTC)
    return pgq.Job(
        1, queue, task, {}, pgq.JobState.RUNNING,
        scheduled_at=scheduled, attempted_at=scheduled + timedelta(seconds=wait_s),
    )  # fmt: skip


def _series(text: bytes) -> list[str]:
    """The job series' lines, with the ``_created`` times (when each series began) masked."""
    lines = [
        line
        for line in text.decode().splitlines()
        if line.startswith(("pgq_jobs_total", "pgq_jobs_created", "pgq_job_duration", "pgq_pickup"))
        or line.startswith(("# HELP pgq_jobs ", "# TYPE pgq_jobs ", "# HELP pgq_job_dur"))
        or line.startswith(("# TYPE pgq_job_dur", "# HELP pgq_pickup", "# TYPE pgq_pickup"))
    ]
    return sorted(re.sub(r"(_created\{.*\}) .*", r"\1 <time>", line) for line in lines)


def test_job_series_export_as_prometheus_clients_own_would() -> None:
    ours = WorkerMetrics(lambda: STATS, prometheus_client.CollectorRegistry())
    reference = prometheus_client.CollectorRegistry()
    jobs = prometheus_client.Counter(
        "pgq_jobs", "Attempts by their outcome (the state the job went to)",
        ["queue", "task", "outcome"], registry=reference,
    )  # fmt: skip
    duration = prometheus_client.Histogram(
        "pgq_job_duration_seconds", "How long attempts ran", ["queue", "task"],
        buckets=DURATION_BUCKETS, registry=reference,
    )  # fmt: skip
    pickup = prometheus_client.Histogram(
        "pgq_pickup_latency_seconds", "From a job's scheduled time to its attempt's start",
        ["queue"], buckets=PICKUP_BUCKETS, registry=reference,
    )  # fmt: skip
    states = [pgq.JobState.COMPLETED, pgq.JobState.RETRYABLE, pgq.JobState.DISCARDED]
    for i, (queue, task) in enumerate([("mail", "send"), ("mail", "bounce"), ("sms", "send")]):
        for n, seconds in enumerate(DURATIONS[i:]):
            state = states[n % 3]
            job = _job(queue, task, PICKUPS[n % len(PICKUPS)])
            ours._started(JobEvent("job_started", job))
            ours._finished(JobEvent("job_finished", job, state, None, seconds))
            pickup.labels(queue).observe(max(PICKUPS[n % len(PICKUPS)], 0.0))
            jobs.labels(queue, task, state.value).inc()
            duration.labels(queue, task).observe(seconds)
        # An outcome without a duration (stopped before it started) counts, times nothing.
        ours._finished(JobEvent("job_finished", _job(queue, task, 0), pgq.JobState.AVAILABLE))
        jobs.labels(queue, task, "available").inc()

    expected = _series(prometheus_client.generate_latest(reference))
    assert len(expected) > 100
    assert _series(ours.render()) == expected


def test_a_series_name_taken_in_the_callers_registry_is_refused() -> None:
    # As with prometheus_client's own metrics: exporting through an app's registry that
    # already has a pgq_jobs would silently mix two meanings.
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("pgq_jobs", "someone else's", registry=registry)
    with pytest.raises(ValueError, match="pgq_jobs"):
        WorkerMetrics(lambda: STATS, registry)


def test_created_series_follow_prometheus_clients_own_switch() -> None:
    # PROMETHEUS_DISABLE_CREATED_SERIES or disable_created_metrics() turn them off for
    # prometheus_client's own metrics; pgq's job series follow.
    ours = WorkerMetrics(lambda: STATS, prometheus_client.CollectorRegistry())
    job = _job("mail", "send", 0.5)
    ours._started(JobEvent("job_started", job))
    ours._finished(JobEvent("job_finished", job, pgq.JobState.COMPLETED, None, 0.2))
    assert "pgq_jobs_created{" in ours.render().decode()
    prometheus_client.disable_created_metrics()
    try:
        text = ours.render().decode()
    finally:
        prometheus_client.enable_created_metrics()
    assert "pgq_jobs_total{" in text and "_created" not in text


MULTIPROCESS = """
import sys
from datetime import UTC, datetime, timedelta
import prometheus_client
from prometheus_client import multiprocess
import pgq
from pgq._core.hooks import JobEvent
from pgq._core.metrics import WorkerMetrics

stats = {"producers": [], "heartbeat_failures": 0, "leader": False,
         "outcomes_salvaged": 0, "outcomes_pending": 0}
metrics = WorkerMetrics(lambda: stats, prometheus_client.CollectorRegistry())
at = datetime(2026, 1, 1, tzinfo=UTC)
job = pgq.Job(1, "mail", "send", {}, pgq.JobState.RUNNING, scheduled_at=at,
              attempted_at=at + timedelta(seconds=0.3))
for _ in range(3):
    metrics._started(JobEvent("job_started", job))
    metrics._finished(JobEvent("job_finished", job, pgq.JobState.COMPLETED, None, 0.02))
aggregate = prometheus_client.CollectorRegistry()
multiprocess.MultiProcessCollector(aggregate)
sys.stdout.write(prometheus_client.generate_latest(aggregate).decode())
"""


def test_in_prometheus_clients_multiprocess_mode_the_job_series_are_aggregated(
    tmp_path: Path,
) -> None:
    # That mode aggregates only the values prometheus_client's own metrics keep in files: a
    # process in it (an embedded worker under a multi-process server) must still show its jobs.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", MULTIPROCESS], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert 'pgq_jobs_total{outcome="completed",queue="mail",task="send"} 3.0' in text
    assert 'pgq_job_duration_seconds_count{queue="mail",task="send"} 3.0' in text
    assert 'pgq_pickup_latency_seconds_bucket{le="0.5",queue="mail"} 3.0' in text
