-- name: DATABASE_NOW
SELECT now();

-- name: PROMOTE_DUE
-- Makes due scheduled and retryable jobs available, in batches, and wakes their queues.
WITH due AS (
    SELECT id FROM pgq_jobs
    WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE pgq_jobs j SET state = 'available' FROM due WHERE j.id = due.id RETURNING j.queue
)
SELECT g.queue, g.n, pg_notify('pgq_jobs', g.queue)::text AS notified
FROM (SELECT queue, count(*)::int AS n FROM upd GROUP BY queue) g;

-- name: RESCUE_JOBS
-- The rescue, judged in SQL on the database clock so any leader can judge any peer, each by
-- the bounds it recorded (a leader's own settings may be shorter: a rolling deploy, a fleet
-- of mixed workers). A running job is rescued when its producer's heartbeat is older than
-- that producer's own stale_after, when its producer's row is gone and the job started more
-- than $2 seconds (the leader's stale_after) ago, or when it overran its own deadline by
-- more than its producer's rescue_grace (hung under a live producer). A row of older code,
-- without recorded bounds, is judged by the leader's $2 and $3. The leader's lease is
-- checked in the same statement: a deposed leader rescues nothing. SKIP LOCKED passes over a
-- job whose outcome is being written right now; re-checking the locked row's state keeps a
-- job that just completed out. Attempts run out -> discarded, so a poison job cannot loop.
-- The transition is every outcome's (pgq_outcome_state and its siblings): a job whose
-- cancellation was requested ends cancelled here and never runs again, unless its attempts
-- ran out (it ends discarded, as it would have without the request).
-- The write of a rescue, shared by the leader's and a restarted worker's: the candidates CTE
-- before it names the jobs (id, attempt, rescues, wanted, producer_id, worker_name, cancel,
-- attempted_at, reason, silent_s).
-- A job's rescues so far, as its metadata counts them; a value pgq did not write there (not
-- a number, negative, huge) counts as 0 or is capped, never fails the rescue of every job.
WITH lease AS (
    SELECT 1 FROM pgq_leader
    WHERE name = 'default' AND leader_id = $1 AND expires_at > now()
), candidates AS (
    SELECT j.id, j.attempt, r.rescues,
           CASE WHEN j.attempt >= COALESCE(j.max_attempts, 20) THEN 'discarded'::pgq_job_state
                -- A first rescue applies no backoff: the job is claimable at once, by any
                -- worker, without waiting for a promotion.
                WHEN r.rescues = 0 THEN 'available'::pgq_job_state
                ELSE 'retryable'::pgq_job_state END AS wanted,
           j.producer_id, p.worker_name, j.cancel_requested_at IS NOT NULL AS cancel,
           j.attempted_at,
           CASE WHEN p.id IS NULL THEN 'producer row missing'
                WHEN p.heartbeat_at < now() - make_interval(secs => COALESCE(p.stale_after_s, $2))
                THEN 'producer stale'
                ELSE 'job overran its timeout' END AS reason,
           extract(epoch FROM now() - COALESCE(p.heartbeat_at, j.attempted_at))::float8
               AS silent_s
    FROM pgq_jobs j
    LEFT JOIN pgq_producers p ON p.id = j.producer_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN jsonb_typeof(j.metadata -> 'pgq_rescues') = 'number'
                    THEN least(greatest((j.metadata ->> 'pgq_rescues')::numeric, 0), 1000000)::int
                    ELSE 0 END AS rescues) r
    WHERE j.state = 'running' AND EXISTS (SELECT 1 FROM lease)
      AND ((p.id IS NULL AND j.attempted_at < now() - make_interval(secs => $2))
           OR p.heartbeat_at < now() - make_interval(secs => COALESCE(p.stale_after_s, $2))
           OR j.deadline_at < now() - make_interval(secs => COALESCE(p.rescue_grace_s, $3)))
    ORDER BY j.id
    LIMIT $4
    FOR UPDATE OF j SKIP LOCKED
)

UPDATE pgq_jobs j
SET state = pgq_outcome_state(c.wanted, c.cancel),
    finalized_at = pgq_outcome_finalized_at(c.wanted, c.cancel),
    -- The first rescue retries at once (the job did not fail, its worker did); repeated
    -- rescues of the same job back off: 0, 1, 3, 7 ... seconds, capped at an hour. Counted
    -- by its rescues so far, not its attempts: earlier attempts that failed on their own
    -- say nothing about workers dying under it.
    scheduled_at = now() + make_interval(
        secs => least(3600, 2 ^ least(c.rescues, 12) - 1)
                * (0.9 + random() * 0.2)),
    deadline_at = NULL,
    errors = pgq_outcome_errors(j.errors, jsonb_build_object(
        'attempt', c.attempt,
        'kind', 'rescued',
        'reason', c.reason,
        'message', format('rescued: %s (producer %s, worker %s, silent for %ss)', c.reason,
                          c.producer_id, COALESCE(c.worker_name, 'unknown'),
                          round(c.silent_s::numeric, 1)),
        'producer_id', c.producer_id,
        'worker_name', c.worker_name,
        'silent_s', round(c.silent_s::numeric, 3),
        'traceback', NULL,
        'started_at', c.attempted_at,
        'rescue', current_setting('pgq.rescue', true),
        'at', now()), c.wanted, c.cancel, c.attempt),
    metadata = jsonb_set(j.metadata, '{pgq_rescues}', to_jsonb(c.rescues + 1))
FROM candidates c
WHERE j.id = c.id
RETURNING j.id, j.state::text AS state, c.reason, c.worker_name, c.silent_s, j.queue, j.task,
          j.attempt, pg_current_xact_id()::text AS xact,
          CASE WHEN j.state = 'available' THEN pg_notify('pgq_jobs', j.queue)::text
               WHEN j.state <> 'retryable' THEN pg_notify('pgq_done', j.id::text)::text END AS done;

-- name: RESCUE_BEGIN
-- A rescue runs in a transaction of its own, which first bounds how long it may sit idle
-- (its client frozen between the rows and the commit would otherwise hold up to a batch of
-- jobs, and a predecessor's producer rows, locked indefinitely), and names the rescue with a
-- token $1 its client drew, which each of its error entries records ('rescue').
SELECT set_config('idle_in_transaction_session_timeout', '5s', true),
       set_config('pgq.rescue', $1::text, true);

-- name: XACT_STATUS
-- Whether transaction $1 (as pg_current_xact_id() gave it, in text) committed, aborted, or
-- is still in progress; NULL once too old to tell.
SELECT pg_xact_status($1::text::xid8);

-- name: CURRENT_XACT
-- The id of the transaction open on this connection (given one if it has none yet), in text.
SELECT pg_current_xact_id()::text;

-- name: RESCUE_LANDED
-- Whether the write named $2 (a rescue; with $3 'lost_reply', a stray's hand-back) is in
-- the jobs $1. (Not by its transaction's id: after a crash or a failover the server may
-- give the same id to another transaction, even another rescue of the same job.)
SELECT EXISTS (SELECT 1 FROM pgq_jobs
               WHERE id = ANY($1::bigint[])
                 AND errors @> jsonb_build_array(jsonb_build_object('kind', $3::text,
                                                                    'rescue', $2::text)));

-- name: SAME_NAME_PRODUCERS
-- A worker restarted under its stable name: the rows of its predecessor (same name, another
-- id), with their heartbeat and fencing bound, so it can rescue their jobs as soon as that
-- bound has passed rather than after stale_after.
SELECT id, heartbeat_at, fence_after_s,
       extract(epoch FROM now() - heartbeat_at)::float8 AS age_s
FROM pgq_producers
WHERE worker_name = $1 AND id <> ALL($2::uuid[]);

-- name: RESCUE_PREDECESSOR
-- Rescues the running jobs of the producers $1 whose heartbeat is older than their own fencing
-- bound plus $2 seconds (the heartbeat's round trip: a worker's own clock starts when it
-- sends), judged again here on the database clock with the producer rows locked: a
-- heartbeat that committed first is seen, one that comes later waits for this statement. A
-- live process of the same name, beating, keeps its jobs.
WITH predecessors AS (
    SELECT p.id, p.worker_name, p.heartbeat_at FROM pgq_producers p
    WHERE p.id = ANY($1::uuid[])
      AND p.heartbeat_at < now() - make_interval(secs => p.fence_after_s + $2)
    FOR UPDATE
), candidates AS (
    SELECT j.id, j.attempt, r.rescues,
           CASE WHEN j.attempt >= COALESCE(j.max_attempts, 20) THEN 'discarded'::pgq_job_state
                -- A first rescue applies no backoff: the job is claimable at once, by any
                -- worker, without waiting for a promotion.
                WHEN r.rescues = 0 THEN 'available'::pgq_job_state
                ELSE 'retryable'::pgq_job_state END AS wanted,
           j.producer_id, p.worker_name, j.cancel_requested_at IS NOT NULL AS cancel,
           j.attempted_at, 'worker restarted' AS reason,
           extract(epoch FROM now() - p.heartbeat_at)::float8 AS silent_s
    FROM pgq_jobs j
    JOIN predecessors p ON p.id = j.producer_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN jsonb_typeof(j.metadata -> 'pgq_rescues') = 'number'
                    THEN least(greatest((j.metadata ->> 'pgq_rescues')::numeric, 0), 1000000)::int
                    ELSE 0 END AS rescues) r
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
)

UPDATE pgq_jobs j
SET state = pgq_outcome_state(c.wanted, c.cancel),
    finalized_at = pgq_outcome_finalized_at(c.wanted, c.cancel),
    -- The first rescue retries at once (the job did not fail, its worker did); repeated
    -- rescues of the same job back off: 0, 1, 3, 7 ... seconds, capped at an hour. Counted
    -- by its rescues so far, not its attempts: earlier attempts that failed on their own
    -- say nothing about workers dying under it.
    scheduled_at = now() + make_interval(
        secs => least(3600, 2 ^ least(c.rescues, 12) - 1)
                * (0.9 + random() * 0.2)),
    deadline_at = NULL,
    errors = pgq_outcome_errors(j.errors, jsonb_build_object(
        'attempt', c.attempt,
        'kind', 'rescued',
        'reason', c.reason,
        'message', format('rescued: %s (producer %s, worker %s, silent for %ss)', c.reason,
                          c.producer_id, COALESCE(c.worker_name, 'unknown'),
                          round(c.silent_s::numeric, 1)),
        'producer_id', c.producer_id,
        'worker_name', c.worker_name,
        'silent_s', round(c.silent_s::numeric, 3),
        'traceback', NULL,
        'started_at', c.attempted_at,
        'rescue', current_setting('pgq.rescue', true),
        'at', now()), c.wanted, c.cancel, c.attempt),
    metadata = jsonb_set(j.metadata, '{pgq_rescues}', to_jsonb(c.rescues + 1))
FROM candidates c
WHERE j.id = c.id
RETURNING j.id, j.state::text AS state, c.reason, c.worker_name, c.silent_s, j.queue, j.task,
          j.attempt, pg_current_xact_id()::text AS xact,
          CASE WHEN j.state = 'available' THEN pg_notify('pgq_jobs', j.queue)::text
               WHEN j.state <> 'retryable' THEN pg_notify('pgq_done', j.id::text)::text END AS done;

-- name: DELETE_PREDECESSOR
-- The predecessor's rows once their jobs are rescued.
DELETE FROM pgq_producers p
WHERE p.id = ANY($1::uuid[])
  AND p.heartbeat_at < now() - make_interval(secs => p.fence_after_s + $2)
  AND NOT EXISTS (SELECT 1 FROM pgq_jobs j WHERE j.producer_id = p.id AND j.state = 'running');

-- name: MAKE_DUE_NOW
-- Tests only (pgq.testing.drain): scheduled and retryable jobs of a queue's tasks become due
-- now, as if their time had come.
WITH due AS (
    UPDATE pgq_jobs SET scheduled_at = now()
    WHERE state IN ('scheduled', 'retryable') AND queue = $1 AND task = ANY($2::text[])
      AND scheduled_at > now()
    RETURNING 1
)
SELECT count(*)::int AS n FROM due;

-- name: REAP_PRODUCERS
-- Producer rows silent for longer than both the leader's reap_after ($1) and their own
-- stale_after (by then a live producer has certainly stopped claiming), once none of their
-- jobs is running (the rescuer got to them first), are deleted.
DELETE FROM pgq_producers p
WHERE p.heartbeat_at < now() - make_interval(secs => greatest($1, p.stale_after_s))
  AND NOT EXISTS (SELECT 1 FROM pgq_jobs j WHERE j.producer_id = p.id AND j.state = 'running')
RETURNING p.id, p.worker_name, p.queue;

-- name: DELETE_FINISHED
-- Deletes finished jobs of one state older than $2 seconds, $3 at a time: short
-- transactions that never hold many locks. SKIP LOCKED keeps out of anyone's way.
WITH old AS (
    SELECT id FROM pgq_jobs
    WHERE state = $1::text::pgq_job_state AND finalized_at < now() - make_interval(secs => $2)
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pgq_jobs j USING old WHERE j.id = old.id;

-- name: JOBS_STATISTICS
-- The jobs table as the planner sees it: whether its rows were counted and some were alive
-- (reltuples: -1 until a VACUUM, ANALYZE or CREATE INDEX counted them), whether it was never
-- counted and has grown past $1 pages (planned from its size alone, which misled the claim
-- from about 400,000 rows), and whether its columns have statistics (pg_stats shows what
-- this role may read, which a worker may).
SELECT c.reltuples > 0
           OR (c.reltuples < 0 AND pg_relation_size(c.oid) > $1::bigint * current_setting('block_size')::bigint)
           AS worth_analyzing,
       EXISTS (SELECT 1 FROM pg_stats s
               WHERE s.schemaname = n.nspname AND s.tablename = c.relname) AS analyzed
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = 'pgq_jobs'::regclass;

-- name: ANALYZE_JOBS
ANALYZE pgq_jobs;

-- name: PERIODIC_LOCK
SELECT last_slot FROM pgq_periodic WHERE name = $1 FOR UPDATE;

-- name: PERIODIC_UPSERT
INSERT INTO pgq_periodic (name, last_slot, task, queue, schedule, next_slot, recorded_by)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name) DO UPDATE
SET last_slot = EXCLUDED.last_slot, updated_at = now(), task = EXCLUDED.task,
    queue = EXCLUDED.queue, schedule = EXCLUDED.schedule, next_slot = EXCLUDED.next_slot,
    recorded_by = EXCLUDED.recorded_by;

-- name: PERIODIC_DESCRIBE
-- What a schedule is, refreshed without moving its last slot (another leader moved it).
UPDATE pgq_periodic
SET task = $2, queue = $3, schedule = $4, next_slot = $5, recorded_by = $6
WHERE name = $1;

-- name: LIST_PERIODIC
SELECT name, task, queue, schedule, last_slot, next_slot, recorded_by, updated_at
FROM pgq_periodic ORDER BY name;

-- name: THROUGHPUT_ROLLUP
-- Count the jobs finished since the start of the minute $2 seconds before $1 (the previous
-- round's clock; NULL on a leader's first round) but at most $3 seconds back, into the
-- rollup, by range scans of the finalized index; returns this round's clock. A minute is
-- counted again on the next rounds (it is still filling, or an outcome committed late: a
-- job is finalized in the minute its transaction began); counts only grow, so retention
-- deleting the jobs never lowers them.
WITH counted AS (
    INSERT INTO pgq_throughput AS t (minute, queue, completed, discarded, cancelled)
    SELECT date_trunc('minute', finalized_at), queue,
           count(*) FILTER (WHERE state = 'completed'),
           count(*) FILTER (WHERE state = 'discarded'),
           count(*) FILTER (WHERE state = 'cancelled')
    FROM pgq_jobs
    WHERE state IN ('completed', 'discarded', 'cancelled')
      AND finalized_at >= date_trunc('minute', GREATEST($1::timestamptz - make_interval(secs => $2),
                                                        now() - make_interval(secs => $3)))
    GROUP BY 1, 2
    ON CONFLICT (minute, queue) DO UPDATE
    SET completed = greatest(t.completed, EXCLUDED.completed),
        discarded = greatest(t.discarded, EXCLUDED.discarded),
        cancelled = greatest(t.cancelled, EXCLUDED.cancelled)
)
SELECT now();

-- name: THROUGHPUT_TRIM
-- The rollup keeps $1 seconds of minutes.
DELETE FROM pgq_throughput WHERE minute < now() - make_interval(secs => $1);

-- name: LOCAL_CUSTOM_PLANS
-- Plans each statement of the current transaction for its parameters: the listing filters'
-- "$n IS NULL OR ..." would get a poor generic plan after five runs of a prepared statement.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true);

-- name: OLDEST_AVAILABLE
-- The age of each queue's oldest available job (an index-only scan of the claim's index).
SELECT queue, extract(epoch FROM now() - min(scheduled_at))::float8 AS age_s
FROM pgq_jobs WHERE state = 'available' GROUP BY queue;

-- name: QUEUE_SETTINGS
-- Queues with a setting (paused or not).
SELECT name, paused_at FROM pgq_queues ORDER BY name;

-- name: LIMITED_QUEUES
-- Queues with flow-control limits (docs/flow-control.md).
SELECT name, concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues
WHERE concurrency IS NOT NULL OR rate_count IS NOT NULL
   OR key_concurrency IS NOT NULL OR key_rate_count IS NOT NULL;

-- name: RUNNING_BY_PRODUCER
-- Running jobs per producer id, as the jobs table has them (the rescuer's index); a producer
-- id with no row left is a worker whose jobs wait for a rescue.
SELECT j.producer_id, count(*)::bigint AS n, (p.id IS NULL) AS orphaned
FROM pgq_jobs j LEFT JOIN pgq_producers p ON p.id = j.producer_id
WHERE j.state = 'running'
GROUP BY j.producer_id, p.id;
