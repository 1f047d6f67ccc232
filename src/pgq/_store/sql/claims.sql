-- The worker's claims and outcomes with its ``async_commit`` setting (docs/liveness.md):
-- the statement's transaction commits without waiting for its WAL to reach the disk; only
-- that transaction (heartbeats, rescues and the callers' enqueues still wait). A test of
-- the UPDATE that reads no column of the row: the planner makes it a one-time filter, so
-- set_config runs once, before the first row is written, and its setting lasts until the
-- statement's transaction ends. A statement that writes no row commits nothing to wait for.
-- The test takes its setting as the statement's last parameter: 'off', or the session's own
-- setting unchanged.

-- name: CLAIM_JOBS
-- Claims up to $3 available jobs of queue $1 whose task the producer registered ($2), in
-- priority then schedule order, unless the queue (or '*') is paused. SKIP LOCKED lets many
-- producers claim side by side. Each claim draws the attempt's fencing token. The deadline
-- comes from the task's timeout ($5, parallel to $2) for the rescuer of hung jobs; a job
-- enqueued without max_attempts takes the task's ($6). Times are the statement's clock:
-- after the queue's lock in a limited claim, the same as now() in a claim of its own.
--
-- The locked rows are updated through the primary key (= ANY of an array: a join would let
-- the planner hash the whole table, finished jobs included, once the table holds some tens of
-- thousands of rows: 6 of a 500-job claim's 11 ms at 30,000), and returned in claim order.
--
-- $8: commit without waiting for the WAL's flush (set for the statement's own
-- transaction only).
WITH locked AS (
    SELECT id AS locked_id FROM pgq_jobs
    WHERE state = 'available' AND queue = $1 AND task = ANY($2::text[])
      AND NOT EXISTS (SELECT 1 FROM pgq_queues
                      WHERE name IN ($1, '*')
                        AND (paused_at IS NOT NULL OR concurrency IS NOT NULL OR rate_count IS NOT NULL OR key_concurrency IS NOT NULL OR key_rate_count IS NOT NULL))
    ORDER BY priority DESC, scheduled_at, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
, claimed AS (
    UPDATE pgq_jobs j
    SET state = 'running', attempt = j.attempt + 1, attempted_at = statement_timestamp(),
        producer_id = $4, attempt_token = gen_random_uuid(), attempted_by = $7,
        deadline_at = statement_timestamp() + make_interval(
            secs => ($5::float8[])[array_position($2::text[], j.task)]),
        max_attempts = COALESCE(j.max_attempts, ($6::int[])[array_position($2::text[], j.task)])
    WHERE j.id = ANY(ARRAY(SELECT locked_id FROM locked))
      AND (SELECT set_config('synchronous_commit', CASE WHEN $8::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.*
)
SELECT
       id, task, args::text AS args, priority, attempt, max_attempts,
       CASE WHEN scheduled_at <> created_at
            THEN LEAST(GREATEST(scheduled_at, '0001-01-02Z'), '9999-12-30Z') END AS scheduled_at,
       CASE WHEN row_number() OVER claim_order = 1
            THEN LEAST(GREATEST(attempted_at, '0001-01-02Z'), '9999-12-30Z') END AS attempted_at,
       CASE WHEN finalized_at IS NOT NULL
            THEN LEAST(GREATEST(finalized_at, '0001-01-02Z'), '9999-12-30Z') END AS finalized_at,
       CASE WHEN created_at IS DISTINCT FROM lag(created_at) OVER claim_order
            THEN LEAST(GREATEST(created_at, '0001-01-02Z'), '9999-12-30Z') END AS created_at,
       CASE WHEN errors <> '[]' THEN errors::text END AS errors,
       CASE WHEN tags <> '{}' THEN tags END AS tags,
       CASE WHEN metadata <> '{}' THEN metadata::text END AS metadata,
       result::text AS result, unique_key, attempt_token, limit_key, depends_on
FROM claimed
WINDOW claim_order AS (ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id)
ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id;

-- name: CLAIM_LIMITED
-- The locked rows are updated through the primary key (= ANY of an array: a join would let
-- the planner hash the whole table, finished jobs included, once the table holds some tens of
-- thousands of rows: 6 of a 500-job claim's 11 ms at 30,000), and returned in claim order.
--
-- $8: commit without waiting for the WAL's flush (set for the statement's own
-- transaction only).
WITH locked AS (
    SELECT id AS locked_id FROM pgq_jobs
    WHERE state = 'available' AND queue = $1 AND task = ANY($2::text[])
      AND NOT EXISTS (SELECT 1 FROM pgq_queues
                      WHERE name IN ($1, '*')
                        AND paused_at IS NOT NULL)
    ORDER BY priority DESC, scheduled_at, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
, claimed AS (
    UPDATE pgq_jobs j
    SET state = 'running', attempt = j.attempt + 1, attempted_at = statement_timestamp(),
        producer_id = $4, attempt_token = gen_random_uuid(), attempted_by = $7,
        deadline_at = statement_timestamp() + make_interval(
            secs => ($5::float8[])[array_position($2::text[], j.task)]),
        max_attempts = COALESCE(j.max_attempts, ($6::int[])[array_position($2::text[], j.task)])
    WHERE j.id = ANY(ARRAY(SELECT locked_id FROM locked))
      AND (SELECT set_config('synchronous_commit', CASE WHEN $8::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.*
)
SELECT
       id, task, args::text AS args, priority, attempt, max_attempts,
       CASE WHEN scheduled_at <> created_at
            THEN LEAST(GREATEST(scheduled_at, '0001-01-02Z'), '9999-12-30Z') END AS scheduled_at,
       CASE WHEN row_number() OVER claim_order = 1
            THEN LEAST(GREATEST(attempted_at, '0001-01-02Z'), '9999-12-30Z') END AS attempted_at,
       CASE WHEN finalized_at IS NOT NULL
            THEN LEAST(GREATEST(finalized_at, '0001-01-02Z'), '9999-12-30Z') END AS finalized_at,
       CASE WHEN created_at IS DISTINCT FROM lag(created_at) OVER claim_order
            THEN LEAST(GREATEST(created_at, '0001-01-02Z'), '9999-12-30Z') END AS created_at,
       CASE WHEN errors <> '[]' THEN errors::text END AS errors,
       CASE WHEN tags <> '{}' THEN tags END AS tags,
       CASE WHEN metadata <> '{}' THEN metadata::text END AS metadata,
       result::text AS result, unique_key, attempt_token, limit_key, depends_on
FROM claimed
WINDOW claim_order AS (ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id)
ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id;

-- name: QUEUE_LIMITS
-- Flow control (docs/flow-control.md). A limited queue is claimed in one transaction that
-- first locks the queue's row (the serialisation point: one claimer of that queue at a
-- time, across all workers), then reads, in a statement of its own and so with a snapshot
-- taken after the lock, how many of its jobs run and how many started within the rate's
-- window, then claims at most what both leave (CLAIM_LIMITED) and logs the starts.
SELECT concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues WHERE name = $1;

-- name: LOCK_LIMITED_QUEUE
SELECT concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues WHERE name = $1 FOR UPDATE;

-- name: LIMIT_USAGE
-- Running jobs are counted producer by producer through the partial index of running jobs,
-- which is keyed by producer and has no queue (a count by queue would read every running job
-- of every queue, under the queue's lock): a skip scan finds each producer that has running
-- jobs (one index probe each), and the jobs of those that are the queue's, or whose row is
-- gone (a row deleted by hand, or at a worker's stop), are counted with the queue's filter.
-- The same jobs as a count by queue, without reading the other queues' producers' jobs. The
-- sub-select per producer keeps the planner from joining all running jobs by hash, which
-- statistics taken while few jobs ran would invite.
WITH RECURSIVE producers_running(id) AS (
    (SELECT producer_id FROM pgq_jobs WHERE state = 'running' AND producer_id IS NOT NULL
     ORDER BY producer_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.producer_id FROM pgq_jobs j
            WHERE j.state = 'running' AND j.producer_id > r.id
            ORDER BY j.producer_id LIMIT 1)
    FROM producers_running r WHERE r.id IS NOT NULL
), counted(id) AS (
    SELECT r.id FROM producers_running r LEFT JOIN pgq_producers p ON p.id = r.id
    WHERE r.id IS NOT NULL AND (p.id IS NULL OR p.queue = $1)
)
SELECT (SELECT COALESCE(sum((SELECT count(*) FROM pgq_jobs j
                             WHERE j.producer_id = c.id AND j.state = 'running'
                               AND j.queue = $1)), 0)
        FROM counted c)::int AS running,
       (SELECT count(*) FROM pgq_rate_log
        WHERE queue = $1 AND started_at > statement_timestamp() - make_interval(secs => $2)
       )::int AS started;

-- name: KEY_USAGE
-- Per-key limits: every key with available jobs, found by a skip scan of the key index
-- (one index probe per key, however many jobs each holds), with its running jobs and its
-- starts within the key rate's window ($2 seconds; counted per key through the log's key
-- index, for the waiting keys only); then the jobs without a key, as one more key (NULL).
WITH RECURSIVE keys(k) AS (
    (SELECT limit_key FROM pgq_jobs
     WHERE queue = $1 AND state = 'available' AND limit_key IS NOT NULL
     ORDER BY limit_key LIMIT 1)
    UNION ALL
    SELECT (SELECT limit_key FROM pgq_jobs
            WHERE queue = $1 AND state = 'available' AND limit_key > keys.k
            ORDER BY limit_key LIMIT 1)
    FROM keys WHERE keys.k IS NOT NULL
), producers_running(id) AS (
    (SELECT producer_id FROM pgq_jobs WHERE state = 'running' AND producer_id IS NOT NULL
     ORDER BY producer_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.producer_id FROM pgq_jobs j
            WHERE j.state = 'running' AND j.producer_id > r.id
            ORDER BY j.producer_id LIMIT 1)
    FROM producers_running r WHERE r.id IS NOT NULL
), counted(id) AS (
    SELECT r.id FROM producers_running r LEFT JOIN pgq_producers p ON p.id = r.id
    WHERE r.id IS NOT NULL AND (p.id IS NULL OR p.queue = $1)
), running AS (
    -- counted producer by producer, as in LIMIT_USAGE (OFFSET 0 keeps each producer's
    -- jobs a lookup of its own, not a join the planner may do by hash)
    SELECT j.limit_key, count(*)::int AS n
    FROM counted c,
         LATERAL (SELECT j.limit_key FROM pgq_jobs j
                  WHERE j.producer_id = c.id AND j.state = 'running' AND j.queue = $1
                  OFFSET 0) j
    GROUP BY j.limit_key
)
SELECT k.k AS key, COALESCE(r.n, 0) AS running,
       CASE WHEN $2 > 0 THEN
           (SELECT count(*) FROM pgq_rate_log l
            WHERE l.queue = $1 AND l.limit_key = k.k
              AND l.started_at > statement_timestamp() - make_interval(secs => $2))::int
       ELSE 0 END AS started
FROM keys k
LEFT JOIN running r ON r.limit_key = k.k
WHERE k.k IS NOT NULL
UNION ALL
SELECT NULL,
       COALESCE((SELECT n FROM running WHERE limit_key IS NULL), 0),
       CASE WHEN $2 > 0 THEN
           (SELECT count(*) FROM pgq_rate_log l
            WHERE l.queue = $1 AND l.limit_key IS NULL
              AND l.started_at > statement_timestamp() - make_interval(secs => $2))::int
       ELSE 0 END;

-- name: CLAIM_KEYED
-- The claim of a queue with per-key limits, under the queue's row lock: for each key with
-- room ($8, its room $9, in the same order) its next jobs, at most its room each (through
-- the key index); for the jobs without a key, at most $10, looked for among the queue's
-- first $11 available jobs in claim order (the fetch index: keyless jobs have no index of
-- their own, and an unbounded search would read a whole keyed backlog); of all these
-- candidates, the first $3 by priority then schedule are locked and claimed. Only those
-- are locked (a row lock writes WAL), and a row locked by someone else (a dependent's
-- enqueue still open, an operator) is skipped, as in every claim.
--
-- $12: commit without waiting for the WAL's flush (set for the statement's own
-- transaction only).
WITH candidates AS (
    SELECT c.id FROM (
        SELECT j.id, j.priority, j.scheduled_at
        FROM unnest($8::text[], $9::int[]) AS b(key, room)
        CROSS JOIN LATERAL (
            SELECT id, priority, scheduled_at FROM pgq_jobs
            WHERE queue = $1 AND state = 'available' AND limit_key = b.key
              AND task = ANY($2::text[])
            ORDER BY priority DESC, scheduled_at, id
            LIMIT b.room
        ) j
        UNION ALL
        SELECT n.id, n.priority, n.scheduled_at FROM (
            SELECT h.id, h.priority, h.scheduled_at FROM (
                SELECT id, priority, scheduled_at, limit_key, task FROM pgq_jobs
                WHERE queue = $1 AND state = 'available' AND $10::int > 0
                ORDER BY priority DESC, scheduled_at, id
                LIMIT $11
            ) h
            WHERE h.limit_key IS NULL AND h.task = ANY($2::text[])
            ORDER BY h.priority DESC, h.scheduled_at, h.id
            LIMIT $10
        ) n
    ) c
    WHERE NOT EXISTS (SELECT 1 FROM pgq_queues WHERE name IN ($1, '*') AND paused_at IS NOT NULL)
    ORDER BY c.priority DESC, c.scheduled_at, c.id
    LIMIT $3
), locked AS (
    SELECT id AS locked_id FROM pgq_jobs
    WHERE id IN (SELECT id FROM candidates) AND state = 'available'
    FOR UPDATE SKIP LOCKED
)
, claimed AS (
    UPDATE pgq_jobs j
    SET state = 'running', attempt = j.attempt + 1, attempted_at = statement_timestamp(),
        producer_id = $4, attempt_token = gen_random_uuid(), attempted_by = $7,
        deadline_at = statement_timestamp() + make_interval(
            secs => ($5::float8[])[array_position($2::text[], j.task)]),
        max_attempts = COALESCE(j.max_attempts, ($6::int[])[array_position($2::text[], j.task)])
    WHERE j.id = ANY(ARRAY(SELECT locked_id FROM locked))
      AND (SELECT set_config('synchronous_commit', CASE WHEN $12::bool THEN 'off' ELSE current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING j.*
)
SELECT
       id, task, args::text AS args, priority, attempt, max_attempts,
       CASE WHEN scheduled_at <> created_at
            THEN LEAST(GREATEST(scheduled_at, '0001-01-02Z'), '9999-12-30Z') END AS scheduled_at,
       CASE WHEN row_number() OVER claim_order = 1
            THEN LEAST(GREATEST(attempted_at, '0001-01-02Z'), '9999-12-30Z') END AS attempted_at,
       CASE WHEN finalized_at IS NOT NULL
            THEN LEAST(GREATEST(finalized_at, '0001-01-02Z'), '9999-12-30Z') END AS finalized_at,
       CASE WHEN created_at IS DISTINCT FROM lag(created_at) OVER claim_order
            THEN LEAST(GREATEST(created_at, '0001-01-02Z'), '9999-12-30Z') END AS created_at,
       CASE WHEN errors <> '[]' THEN errors::text END AS errors,
       CASE WHEN tags <> '{}' THEN tags END AS tags,
       CASE WHEN metadata <> '{}' THEN metadata::text END AS metadata,
       result::text AS result, unique_key, attempt_token, limit_key, depends_on
FROM claimed
WINDOW claim_order AS (ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id)
ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id;

-- name: LOG_STARTS
-- The claimed starts (with their keys), and the log's entries older than the longest
-- window ($3 seconds) dropped.
WITH gone AS (
    DELETE FROM pgq_rate_log
    WHERE queue = $1 AND started_at <= statement_timestamp() - make_interval(secs => $3)
)
INSERT INTO pgq_rate_log (queue, limit_key, started_at)
SELECT $1, k, statement_timestamp() FROM unnest($2::text[]) AS k;

-- name: SET_QUEUE_LIMITS
-- Limits of a queue (NULL: none), set live; the queue's workers are told.
WITH upsert AS (
    INSERT INTO pgq_queues (name, concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (name) DO UPDATE
    SET concurrency = $2, rate_count = $3, rate_period_s = $4,
        key_concurrency = $5, key_rate_count = $6, key_rate_period_s = $7
    RETURNING name
)
SELECT pg_notify('pgq_control', json_build_object('kind', 'limits', 'queue', name)::text) FROM upsert;
