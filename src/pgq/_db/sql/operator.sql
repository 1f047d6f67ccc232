-- name: CANCEL_JOBS
-- A job not yet running is cancelled at once; a running one gets a cancel request that its
-- worker obeys (a control NOTIFY now, or its next poll). Final jobs are left alone.
WITH target AS (
    SELECT id FROM pgq_jobs
    WHERE id = ANY($1::bigint[]) AND state NOT IN ('completed', 'discarded', 'cancelled')
    ORDER BY id
    FOR UPDATE
), upd AS (
    UPDATE pgq_jobs j
    SET state = CASE WHEN j.state = 'running' THEN j.state ELSE 'cancelled' END,
        finalized_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        cancel_requested_at = now(),
        errors = CASE WHEN j.state = 'running' THEN j.errors
                      ELSE j.errors || jsonb_build_array(pgq_cancel_entry(j.attempt)) END
    FROM target WHERE j.id = target.id
    RETURNING j.id, j.state::text AS state
)
SELECT id, state,
       CASE WHEN state = 'running'
            THEN pg_notify('pgq_control', json_build_object('kind', 'cancel', 'job_id', id)::text)::text
            ELSE pg_notify('pgq_done', id::text)::text END AS notified
FROM upd;

-- name: RETRY_JOBS
-- Run again: a final or retryable job becomes available now, with one more attempt allowed
-- if it had used them all. A finished job that would take its unique key back is left out
-- when another job holds the key, and of several asked for that share a key only the newest
-- goes (either would hold it twice). The state is checked in the UPDATE itself, so a job
-- that changed meanwhile (claimed, say) is left alone.
WITH taking AS (
    SELECT id, unique_key FROM pgq_jobs
    WHERE id = ANY($1::bigint[]) AND state IN ('completed', 'discarded', 'cancelled')
      AND unique_key IS NOT NULL AND NOT pgq_unique_active(state, unique_states)
      AND pgq_unique_active('available', unique_states)
), refused AS (
    SELECT t.id FROM taking t
    WHERE EXISTS (SELECT 1 FROM pgq_jobs o
                  WHERE o.unique_key = t.unique_key AND o.id <> t.id
                    AND pgq_unique_active(o.state, o.unique_states))
       OR t.id <> (SELECT max(t2.id) FROM taking t2 WHERE t2.unique_key = t.unique_key)
), upd AS (
    UPDATE pgq_jobs
    SET state = 'available', scheduled_at = now(), finalized_at = NULL,
        cancel_requested_at = NULL, producer_id = NULL,
        max_attempts = CASE WHEN max_attempts IS NOT NULL AND attempt >= max_attempts
                            THEN attempt + 1 ELSE max_attempts END
    WHERE id = ANY($1::bigint[])
      AND (state IN ('completed', 'discarded', 'cancelled') OR state IN ('retryable', 'scheduled'))
      AND id NOT IN (SELECT id FROM refused)
    RETURNING id, queue
)
SELECT id, pg_notify('pgq_jobs', queue)::text AS notified FROM upd;

-- name: QUEUE_KNOWN
-- Is queue $1 known: a setting, a job or a producer names it?
SELECT EXISTS (SELECT 1 FROM pgq_queues WHERE name = $1)
    OR EXISTS (SELECT 1 FROM pgq_jobs WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM pgq_producers WHERE queue = $1);

-- name: PAUSE_QUEUE
WITH up AS (
    INSERT INTO pgq_queues (name, paused_at) VALUES ($1, now())
    ON CONFLICT (name) DO UPDATE SET paused_at = COALESCE(pgq_queues.paused_at, now())
    RETURNING name
)
SELECT name,
       pg_notify('pgq_control', json_build_object('kind', 'pause', 'queue', name)::text)::text AS notified
FROM up;

-- name: RESUME_QUEUE
-- Resuming wakes the queue's workers on the jobs channel ('*' wakes all of them).
WITH up AS (
    INSERT INTO pgq_queues (name, paused_at) VALUES ($1, NULL)
    ON CONFLICT (name) DO UPDATE SET paused_at = NULL
    RETURNING name
)
SELECT name, pg_notify('pgq_jobs', name)::text AS notified FROM up;

-- name: JOB_ID_BOUNDS
-- The lowest and highest job id (two probes of the primary key).
SELECT min(id) AS low, max(id) AS high FROM pgq_jobs;

-- name: JOBS_PAGE
-- One page of a listing, newest first, among ids in [$8, $7): a bounded slice of the primary
-- key, so a filter that matches few jobs of a large table still answers in bounded time (the
-- page then offers to search the next slice). No index beyond the primary key is needed.
SELECT
       id, queue, task, args::text AS args, state::text AS state, priority, attempt,
       max_attempts,
       CASE WHEN scheduled_at IS NOT NULL
            THEN LEAST(GREATEST(scheduled_at, '0001-01-02Z'), '9999-12-30Z') END AS scheduled_at,
       CASE WHEN attempted_at IS NOT NULL
            THEN LEAST(GREATEST(attempted_at, '0001-01-02Z'), '9999-12-30Z') END AS attempted_at,
       CASE WHEN finalized_at IS NOT NULL
            THEN LEAST(GREATEST(finalized_at, '0001-01-02Z'), '9999-12-30Z') END AS finalized_at,
       CASE WHEN created_at IS NOT NULL
            THEN LEAST(GREATEST(created_at, '0001-01-02Z'), '9999-12-30Z') END AS created_at,
       producer_id, errors::text AS errors, tags, metadata::text AS metadata,
       result::text AS result, unique_key, attempt_token, attempted_by, limit_key,
       depends_on

FROM pgq_jobs
WHERE id < $7 AND id >= $8 AND
    ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
    AND ($2::text IS NULL OR queue = $2)
    AND ($3::text IS NULL OR task = $3)
    AND ($4::text IS NULL OR tags @> ARRAY[$4::text])
    AND ($5::jsonb IS NULL OR args @> $5::jsonb)
    AND ($6::bigint IS NULL OR id = $6)

ORDER BY id DESC
LIMIT $9;

-- name: COUNT_MATCHING
-- How many jobs match, among ids up to $7 (a bulk action shows it before it acts).
SELECT count(*)::bigint AS n FROM pgq_jobs WHERE id <= $7 AND
    ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
    AND ($2::text IS NULL OR queue = $2)
    AND ($3::text IS NULL OR task = $3)
    AND ($4::text IS NULL OR tags @> ARRAY[$4::text])
    AND ($5::jsonb IS NULL OR args @> $5::jsonb)
    AND ($6::bigint IS NULL OR id = $6);

-- name: MATCHING_BATCH
-- The next $9 matching ids above $8, up to $7: a bulk action walks the matches in batches.
SELECT id FROM pgq_jobs
WHERE id > $8 AND id <= $7 AND
    ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
    AND ($2::text IS NULL OR queue = $2)
    AND ($3::text IS NULL OR task = $3)
    AND ($4::text IS NULL OR tags @> ARRAY[$4::text])
    AND ($5::jsonb IS NULL OR args @> $5::jsonb)
    AND ($6::bigint IS NULL OR id = $6)

ORDER BY id
LIMIT $9;

-- name: DELETE_JOBS
-- Delete jobs that are not running (cancel a running job first); wakes anyone waiting on
-- them, who then finds them gone.
WITH del AS (
    DELETE FROM pgq_jobs WHERE id = ANY($1::bigint[]) AND state <> 'running' RETURNING id
)
SELECT id, pg_notify('pgq_done', id::text)::text AS notified FROM del;

-- name: LOCAL_STATEMENT_TIMEOUT
-- Limits the statements of the current transaction to $1 milliseconds.
SELECT set_config('statement_timeout', $1::text, true);

-- name: ACTIVE_BY_QUEUE
-- Jobs by queue in the states that are not final: each branch matches a partial index of
-- the claim, the scheduler or the rescuer, so this stays cheap on a table of finished jobs.
SELECT queue, 'available' AS state, count(*)::bigint AS n
FROM pgq_jobs WHERE state = 'available' GROUP BY queue
UNION ALL
SELECT queue, state::text, count(*)::bigint
FROM pgq_jobs WHERE state IN ('scheduled', 'retryable') GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*)::bigint
FROM pgq_jobs WHERE state = 'running' GROUP BY queue;

-- name: STATE_ESTIMATES
-- The planner's estimate of jobs per state (table rows times the state's frequency in the
-- last ANALYZE): what a dashboard shows when counting exactly would take too long.
SELECT v.state, (v.freq * greatest(c.reltuples, 0))::bigint AS n
FROM pg_class c
JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = c.relname
                AND s.attname = 'state'
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
    AS v(state, freq)
WHERE c.oid = to_regclass('pgq_jobs');

-- name: THROUGHPUT
-- Finished jobs per minute and queue over the current minute and the $1 - 1 before it,
-- from the leader's rollup.
SELECT minute, queue, completed, discarded, cancelled
FROM pgq_throughput
WHERE minute > date_trunc('minute', now()) - make_interval(mins => $1)
ORDER BY minute, queue;

-- name: CURRENT_MINUTE
-- The current minute on the database clock (the chart's right edge).
SELECT date_trunc('minute', now()) AS minute;
