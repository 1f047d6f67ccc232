-- The outcome writes. A lock held elsewhere never holds up a batch of outcomes (an application
-- transaction that enqueued a dependent of a job, or cancels it, holds its row until it ends).
-- The batch writes take, after their arrays, whether to skip locked rows, whether to commit
-- without waiting for the WAL's flush, and how long they may wait for a row lock (a
-- lock_timeout such as '50ms', set for the statement's own transaction; NULL leaves the
-- setting as it is). The worker writes a batch as it is with a short wait first (the common
-- case pays nothing); a batch that gave up is written again skipping: it first locks its
-- rows, passing over those locked now, and returns their ids apart from those the fence
-- rejected. Each passed over is then written on its own, after waiting for its row (LOCK_JOB
-- in the same transaction), so that it, not a rescue, gets the row when it frees.
--
-- The fence's test of a job's state in every write or read of jobs by id: a running job,
-- in a form the planner cannot match to the partial index of running jobs. It proves an
-- index's predicate from comparisons with constants, not from a sub-select's value; given
-- the index, a statement fenced by id, token and state = 'running' reads every running job
-- (and hashes them) instead of its own rows by primary key whenever the statistics were
-- taken while fewer jobs ran: 134 ms against 2 ms for 100 outcomes with 100,000 jobs
-- running, 84 ms against 0.3 ms for one.
-- It is written (SELECT 'running'::pgq_job_state) below. The async-commit test is as in claims.sql.

-- name: COMPLETE_JOBS
-- Writes a batch of outcomes. Each row is fenced by (id, attempt_token, 'running'): an
-- attempt whose job was rescued or re-claimed since changes nothing. The transition is the
-- one every statement that ends an attempt makes (pgq_outcome_state and its siblings, in
-- pgq.schema): a job whose cancellation was requested while it ran never runs again, so an
-- outcome that would make it retryable or available (a failure, a snooze, a shutdown
-- hand-back) ends it cancelled instead; one that ends it stands. Jobs made available again
-- wake their queue; finished ones are announced for client.wait(). A row per
-- job written, then one per job passed over (locked), with a NULL state.
--
-- $8: skip locked rows; $9: commit without waiting for the WAL's flush (set for the
-- statement's own transaction only); $10: the lock wait.
WITH locked AS MATERIALIZED (
    SELECT l.id FROM unnest($1::bigint[]) AS l(id)
    WHERE $8::bool
      AND (SELECT j.id FROM pgq_jobs j WHERE j.id = l.id FOR NO KEY UPDATE SKIP LOCKED)
          IS NOT NULL
), u AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[]::pgq_job_state[], $4::float8[],
                         $5::text[], $6::text[], $7::int[])
         AS u(id, token, state, delay_s, error, result, attempt_delta)
), upd AS (
    UPDATE pgq_jobs j
    SET state = pgq_outcome_state(u.state, j.cancel_requested_at IS NOT NULL),
        finalized_at = pgq_outcome_finalized_at(u.state, j.cancel_requested_at IS NOT NULL),
        scheduled_at = CASE WHEN u.delay_s IS NULL THEN j.scheduled_at
                            ELSE now() + make_interval(secs => u.delay_s) END,
        attempt = j.attempt + u.attempt_delta,
        errors = pgq_outcome_errors(
            j.errors, pgq_attempt_error(u.error::jsonb, j.attempted_at, j.producer_id, j.attempted_by),
            u.state, j.cancel_requested_at IS NOT NULL, j.attempt),
        result = u.result::jsonb,
        deadline_at = NULL
    FROM u
    WHERE j.id = u.id AND j.attempt_token = u.token AND (NOT $8::bool OR j.id IN (SELECT id FROM locked))
      AND (SELECT set_config('lock_timeout', COALESCE($10::text, current_setting('lock_timeout')), true)) IS NOT NULL
      AND j.state = (SELECT 'running'::pgq_job_state)
      AND (SELECT set_config('synchronous_commit', CASE WHEN $9::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.id, j.queue, j.state
)
SELECT id,
       (SELECT count(pg_notify('pgq_jobs', q.queue))
        FROM (SELECT DISTINCT queue FROM upd WHERE state = 'available') q) AS notified,
       -- Finished jobs, announced for client.wait(), at most 500 ids per notification.
       (SELECT count(pg_notify('pgq_done', c.ids))
        FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER ()) / 500 AS chunk FROM upd
                    WHERE state IN ('completed', 'discarded', 'cancelled')) f
              GROUP BY chunk) c) AS done,
       state::text AS state
FROM upd
UNION ALL
SELECT i, 0, 0, NULL FROM unnest($1::bigint[]) AS i WHERE $8::bool AND i NOT IN (SELECT id FROM locked)
    AND EXISTS (SELECT 1 FROM pgq_jobs WHERE id = i);

-- name: COMPLETE_SUCCESSES
-- The common outcome, lean: completed, with an optional result, fenced like the others. The
-- ids of finished jobs are announced for client.wait() ($4: comma-joined
-- chunks built by the caller; a spurious id is harmless, waiters re-read the job). One row:
-- the ids written in one array, and those passed over (locked) in another; nothing is
-- announced when none was written.
--
-- $5: skip locked rows; $6: commit without waiting for the WAL's flush (set for the
-- statement's own transaction only); $7: the lock wait.
WITH locked AS MATERIALIZED (
    SELECT l.id FROM unnest($1::bigint[]) AS l(id)
    WHERE $5::bool
      AND (SELECT j.id FROM pgq_jobs j WHERE j.id = l.id FOR NO KEY UPDATE SKIP LOCKED)
          IS NOT NULL
), upd AS (
    UPDATE pgq_jobs j
    SET state = 'completed', finalized_at = now(), deadline_at = NULL, result = u.result::jsonb
    FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS u(id, token, result)
    WHERE j.id = u.id AND j.attempt_token = u.token AND (NOT $5::bool OR j.id IN (SELECT id FROM locked))
      AND (SELECT set_config('lock_timeout', COALESCE($7::text, current_setting('lock_timeout')), true)) IS NOT NULL
      AND j.state = (SELECT 'running'::pgq_job_state)
      AND (SELECT set_config('synchronous_commit', CASE WHEN $6::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.id
)
SELECT w.ids, ARRAY(SELECT i FROM unnest($1::bigint[]) AS i WHERE $5::bool AND i NOT IN (SELECT id FROM locked)
    AND EXISTS (SELECT 1 FROM pgq_jobs WHERE id = i)) AS passed_over,
       CASE WHEN cardinality(w.ids) > 0 THEN (SELECT count(pg_notify('pgq_done', c)) FROM unnest($4::text[]) c) END AS done
FROM (SELECT ARRAY(SELECT id FROM upd) AS ids) w;

-- name: COMPLETE_SUCCESSES_NO_RESULT
-- The same when no job of the batch returned a result (most): no array of NULLs to send.
--
-- $4: skip locked rows; $5: commit without waiting for the WAL's flush (set for the
-- statement's own transaction only); $6: the lock wait.
WITH locked AS MATERIALIZED (
    SELECT l.id FROM unnest($1::bigint[]) AS l(id)
    WHERE $4::bool
      AND (SELECT j.id FROM pgq_jobs j WHERE j.id = l.id FOR NO KEY UPDATE SKIP LOCKED)
          IS NOT NULL
), upd AS (
    UPDATE pgq_jobs j
    SET state = 'completed', finalized_at = now(), deadline_at = NULL, result = NULL
    FROM unnest($1::bigint[], $2::uuid[]) AS u(id, token)
    WHERE j.id = u.id AND j.attempt_token = u.token AND (NOT $4::bool OR j.id IN (SELECT id FROM locked))
      AND (SELECT set_config('lock_timeout', COALESCE($6::text, current_setting('lock_timeout')), true)) IS NOT NULL
      AND j.state = (SELECT 'running'::pgq_job_state)
      AND (SELECT set_config('synchronous_commit', CASE WHEN $5::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.id
)
SELECT w.ids, ARRAY(SELECT i FROM unnest($1::bigint[]) AS i WHERE $4::bool AND i NOT IN (SELECT id FROM locked)
    AND EXISTS (SELECT 1 FROM pgq_jobs WHERE id = i)) AS passed_over,
       CASE WHEN cardinality(w.ids) > 0 THEN (SELECT count(pg_notify('pgq_done', c)) FROM unnest($3::text[]) c) END AS done
FROM (SELECT ARRAY(SELECT id FROM upd) AS ids) w;

-- name: FAIL_ATTEMPT
-- The last resort for an outcome the database refused in every other form: the attempt
-- failed, with $3 (an error entry) saying why; retried with backoff (cancelled instead when
-- that was requested), or discarded when it was the last attempt. Fenced like the others.
--
-- $4: commit without waiting for the WAL's flush (set for the statement's own
-- transaction only).
WITH upd AS (
    UPDATE pgq_jobs j
    SET state = pgq_outcome_state(pgq_failed_state(j.attempt, j.max_attempts),
                                  j.cancel_requested_at IS NOT NULL),
        finalized_at = pgq_outcome_finalized_at(pgq_failed_state(j.attempt, j.max_attempts),
                                                j.cancel_requested_at IS NOT NULL),
        scheduled_at = now() + make_interval(secs => least(3600, 2 ^ greatest(j.attempt - 1, 0))),
        errors = pgq_outcome_errors(
            j.errors, pgq_attempt_error($3::jsonb, j.attempted_at, j.producer_id, j.attempted_by),
            pgq_failed_state(j.attempt, j.max_attempts), j.cancel_requested_at IS NOT NULL,
            j.attempt),
        result = NULL,
        deadline_at = NULL
    WHERE j.id = $1 AND j.attempt_token = $2 AND j.state = (SELECT 'running'::pgq_job_state)
      AND (SELECT set_config('synchronous_commit', CASE WHEN $4::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.id, j.state
)
SELECT id, CASE WHEN state <> 'retryable' THEN pg_notify('pgq_done', id::text)::text END AS done
FROM upd;

-- name: SETTLE_ATTEMPT
-- An outcome the task writes in its own transaction (ctx.complete(connection=...) and its
-- siblings): fenced like the worker's, and replacing the attempt's token with one only the
-- task knows ($3), so the worker can tell afterwards whether that transaction committed
-- (SETTLED_BY). The row stays locked until the caller's transaction ends. The transition is
-- COMPLETE_JOBS's.
WITH upd AS (
    UPDATE pgq_jobs j
    SET state = pgq_outcome_state($4::text::pgq_job_state, j.cancel_requested_at IS NOT NULL),
        finalized_at = pgq_outcome_finalized_at($4::text::pgq_job_state, j.cancel_requested_at IS NOT NULL),
        scheduled_at = CASE WHEN $5::float8 IS NULL THEN j.scheduled_at
                            ELSE now() + make_interval(secs => $5::float8) END,
        attempt = j.attempt + $8::int,
        errors = pgq_outcome_errors(
            j.errors, pgq_attempt_error($6::text::jsonb, j.attempted_at, j.producer_id, j.attempted_by),
            $4::text::pgq_job_state, j.cancel_requested_at IS NOT NULL, j.attempt),
        result = $7::jsonb,
        deadline_at = NULL,
        attempt_token = $3::uuid
    WHERE j.id = $1 AND j.attempt_token = $2::uuid AND j.state = (SELECT 'running'::pgq_job_state)
    RETURNING j.id, j.queue, j.state
)
SELECT state::text AS state,
       CASE WHEN state IN ('completed', 'discarded', 'cancelled') THEN pg_notify('pgq_done', id::text)::text
            WHEN state = 'available' THEN pg_notify('pgq_jobs', queue)::text END AS notified
FROM upd;

-- name: LOCK_JOB
-- Waits for job $1's row, locked elsewhere, and holds it for the outcome written next in the
-- same transaction.
SELECT id FROM pgq_jobs WHERE id = $1 FOR NO KEY UPDATE;

-- name: SETTLED_BY
-- Which of the tokens $2 (those a task settled its attempt with) job $1 holds: a transaction
-- that settled it committed.
SELECT attempt_token FROM pgq_jobs WHERE id = $1 AND attempt_token = ANY($2::uuid[]);

-- name: RUNNABLE_LEFT
-- Burst mode: is anything left that this producer could claim now (a paused queue's jobs
-- cannot be claimed: a burst worker does not wait for its resumption), and is anything of
-- its queue running under a producer that is gone, or silent past its own fencing bound ($3
-- seconds for a row that recorded none)? Such jobs will be rescued and become claimable: a burst worker waits for them.
-- Each question reads one partial index in its order (LIMIT 1 sub-selects, not EXISTS, which
-- would drop the ORDER BY): one OR over the states matches no partial index, and right
-- after a drain the statistics still count the jobs as available, so the planner chose a
-- scan of the whole table, finished jobs included (24 ms at 100,000 rows, growing with them).
SELECT ((SELECT 1 FROM pgq_jobs
         WHERE state = 'available' AND queue = $1 AND task = ANY($2::text[])
         ORDER BY priority DESC, scheduled_at, id LIMIT 1) IS NOT NULL
        OR (SELECT 1 FROM pgq_jobs
            WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
              AND queue = $1 AND task = ANY($2::text[])
            ORDER BY scheduled_at LIMIT 1) IS NOT NULL
       ) AND NOT p.paused AS runnable,
       EXISTS (
           SELECT 1 FROM pgq_jobs j LEFT JOIN pgq_producers pr ON pr.id = j.producer_id
           WHERE j.state = 'running' AND j.queue = $1 AND j.task = ANY($2::text[])
             AND (pr.id IS NULL
                  OR pr.heartbeat_at < now() - make_interval(secs => COALESCE(pr.fence_after_s, $3))
                  OR (pr.worker_name = $4 AND pr.id <> ALL($5::uuid[])
                      AND pr.heartbeat_at < $6))
       ) AND NOT p.paused AS orphaned
FROM (SELECT EXISTS (SELECT 1 FROM pgq_queues
                     WHERE name IN ($1, '*') AND paused_at IS NOT NULL) AS paused) p;

-- name: CANCEL_REQUESTED
-- Running jobs (of this worker) whose cancellation was requested: the poll fallback.
SELECT id FROM pgq_jobs
WHERE id = ANY($1::bigint[]) AND cancel_requested_at IS NOT NULL AND state = (SELECT 'running'::pgq_job_state);
