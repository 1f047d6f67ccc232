"""Every SQL statement pgq runs, named, in one place.

Runtime code refers to ``sql.FETCH_JOBS`` and never builds SQL from strings. Values travel as
parameters; JSON travels as ``text`` and is cast in SQL, so a caller's connection works whatever
type codecs it has registered.
"""

from __future__ import annotations

from typing import Final

#: Notification channels. Payloads: a queue name; a leader id; a control message.
CHANNEL_JOBS: Final = "pgq_jobs"
CHANNEL_LEADER: Final = "pgq_leader"
CHANNEL_CONTROL: Final = "pgq_control"

# --------------------------------------------------------------------------- schema check

SCHEMA_VERSION_TABLES: Final = """
SELECT to_regclass('pgq_alembic_version') IS NOT NULL,
       to_regclass('alembic_version') IS NOT NULL,
       to_regclass('pgq_jobs') IS NOT NULL
"""
PGQ_VERSION: Final = "SELECT version_num FROM pgq_alembic_version"
# When the user runs pgq's migrations inside their own alembic environment (branch "pgq").
SHARED_VERSION: Final = (
    "SELECT version_num FROM alembic_version WHERE version_num = ANY($1::text[])"
)

# --------------------------------------------------------------------------- enqueue

# One statement for one job or thousands: rows arrive as parallel arrays. Jobs due now are
# 'available' and wake the workers of their queue with a NOTIFY, delivered on commit only.
ENQUEUE: Final = """
WITH ins AS (
    INSERT INTO pgq_jobs (queue, task, args, state, priority, max_attempts, scheduled_at,
                          tags, metadata)
    SELECT r.queue, r.task, r.args::jsonb,
           CASE WHEN r.sched > now() THEN 'scheduled' ELSE 'available' END::pgq_job_state,
           r.priority, r.max_attempts, r.sched,
           ARRAY(SELECT jsonb_array_elements_text(r.tags::jsonb)), r.metadata::jsonb
    FROM (
        SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => COALESCE(u.delay_s, 0)))
                    AS sched
        FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[],
                    $6::timestamptz[], $7::float8[], $8::text[], $9::text[])
             WITH ORDINALITY
             AS u(queue, task, args, priority, max_attempts, run_at, delay_s, tags, metadata, ord)
        ORDER BY u.ord
    ) r
    RETURNING id, queue, state, scheduled_at, created_at
)
SELECT id, state::text, scheduled_at, created_at,
       (SELECT count(pg_notify('pgq_jobs', q.queue))
        FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available') q) AS notified
FROM ins
ORDER BY id
"""

# --------------------------------------------------------------------------- worker hot path

# Claims up to $3 available jobs of queue $1 whose task the producer registered ($2), in
# priority then schedule order. SKIP LOCKED lets many producers claim side by side; the
# deadline comes from the task's timeout ($5, parallel to $2) for the rescuer of hung jobs;
# a job enqueued without max_attempts takes the task's ($6).
FETCH_JOBS: Final = """
WITH locked AS (
    SELECT id FROM pgq_jobs
    WHERE state = 'available' AND queue = $1 AND task = ANY($2::text[])
    ORDER BY priority DESC, scheduled_at, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE pgq_jobs j
SET state = 'running', attempt = j.attempt + 1, attempted_at = now(), producer_id = $4,
    deadline_at = now() + make_interval(secs => t.timeout_s),
    max_attempts = COALESCE(j.max_attempts, t.max_attempts)
FROM locked, unnest($2::text[], $5::float8[], $6::int[]) AS t(task, timeout_s, max_attempts)
WHERE j.id = locked.id AND t.task = j.task
RETURNING j.id, j.queue, j.task, j.args::text, j.priority, j.attempt, j.max_attempts,
          j.scheduled_at, j.attempted_at, j.created_at, j.tags, j.metadata::text
"""

# Writes a batch of outcomes. Each row is fenced by (id, attempt, producer_id, 'running'):
# a producer whose job was rescued or re-claimed changes nothing. Jobs made available again
# (a retry with no delay, a snooze of zero) wake their queue.
COMPLETE_JOBS: Final = """
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::uuid[], $4::text[], $5::float8[],
                         $6::text[], $7::text[], $8::int[])
         AS u(id, attempt, producer_id, state, delay_s, error, result, attempt_delta)
), upd AS (
    UPDATE pgq_jobs j
    SET state = u.state::pgq_job_state,
        finalized_at = CASE WHEN u.state IN ('completed', 'discarded', 'cancelled')
                            THEN now() END,
        scheduled_at = CASE WHEN u.delay_s IS NULL THEN j.scheduled_at
                            ELSE now() + make_interval(secs => u.delay_s) END,
        attempt = j.attempt + u.attempt_delta,
        errors = CASE WHEN u.error IS NULL THEN j.errors
                      ELSE j.errors || jsonb_build_array(
                               u.error::jsonb || jsonb_build_object('at', now())) END,
        result = u.result::jsonb,
        deadline_at = NULL
    FROM u
    WHERE j.id = u.id AND j.attempt = u.attempt AND j.producer_id = u.producer_id
      AND j.state = 'running'
    RETURNING j.id, j.queue, j.state
)
SELECT id,
       (SELECT count(pg_notify('pgq_jobs', q.queue))
        FROM (SELECT DISTINCT queue FROM upd WHERE state = 'available') q) AS notified
FROM upd
"""

# Makes due scheduled and retryable jobs available, in batches, and wakes their queues.
PROMOTE_DUE: Final = """
WITH due AS (
    SELECT id FROM pgq_jobs
    WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE pgq_jobs j SET state = 'available' FROM due WHERE j.id = due.id RETURNING j.queue
)
SELECT g.queue, g.n, pg_notify('pgq_jobs', g.queue)::text
FROM (SELECT queue, count(*)::int AS n FROM upd GROUP BY queue) g
"""

# Burst mode: is anything left that this producer could run, now or later?
RUNNABLE_LEFT: Final = """
SELECT EXISTS (
    SELECT 1 FROM pgq_jobs
    WHERE queue = $1 AND task = ANY($2::text[])
      AND (state = 'available' OR (state IN ('scheduled', 'retryable') AND scheduled_at <= now()))
)
"""

# --------------------------------------------------------------------------- producers

REGISTER_PRODUCER: Final = """
INSERT INTO pgq_producers (id, worker_name, queue, concurrency)
VALUES ($1, $2, $3, $4)
"""

DELETE_PRODUCERS: Final = "DELETE FROM pgq_producers WHERE id = ANY($1::uuid[])"

# --------------------------------------------------------------------------- reads

GET_JOB: Final = """
SELECT id, queue, task, args::text, state::text, priority, attempt, max_attempts,
       scheduled_at, attempted_at, finalized_at, created_at, producer_id, errors::text, tags,
       metadata::text, result::text
FROM pgq_jobs WHERE id = $1
"""

COUNT_BY_STATE: Final = """
SELECT state::text, count(*)::bigint FROM pgq_jobs
WHERE $1::text IS NULL OR queue = $1
GROUP BY state
"""
