-- name: DROP_DATABASE
-- Databases for tests (pgq.testing). CREATE and DROP DATABASE take no parameters, and run
-- outside any transaction or function: the server writes each statement (format's %I
-- quotes the names), and the caller runs the text it returns.
SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', $1::text);

-- name: CREATE_DATABASE
SELECT CASE WHEN $2::text IS NULL THEN format('CREATE DATABASE %I', $1::text)
            WHEN current_setting('server_version_num')::int >= 150000
            THEN format('CREATE DATABASE %I TEMPLATE %I STRATEGY FILE_COPY', $1::text, $2::text)
            ELSE format('CREATE DATABASE %I TEMPLATE %I', $1::text, $2::text) END;

-- name: GET_JOB
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

FROM pgq_jobs WHERE id = $1;

-- name: LIST_JOBS
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
WHERE ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR task = $3)
  AND ($5::jsonb IS NULL OR args @> $5::jsonb)
ORDER BY id DESC
LIMIT $4;

-- name: JOBS_ATTEMPTED_SINCE
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

FROM pgq_jobs WHERE attempted_at >= $1 ORDER BY id;

-- name: MATCHING_IDS
-- Every job matching the filters, oldest first (bulk retry or cancel by filter).
SELECT id FROM pgq_jobs
WHERE ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR task = $3)
ORDER BY id;

-- name: COUNT_BY_STATE
SELECT state::text AS state, count(*)::bigint AS n FROM pgq_jobs
WHERE $1::text IS NULL OR queue = $1
GROUP BY state;

-- name: STATS_BY_QUEUE
SELECT queue, state::text AS state, count(*)::bigint AS n FROM pgq_jobs GROUP BY queue, state;

-- name: STATS_EXTRA
SELECT queue,
       extract(epoch FROM now() - (min(scheduled_at) FILTER (WHERE state = 'available')))::float8
           AS oldest_available_s,
       (count(*) FILTER (WHERE state = 'completed'
                         AND finalized_at > now() - interval '1 minute'))::bigint
           AS completed_last_minute,
       (count(*) FILTER (WHERE state IN ('completed', 'discarded', 'cancelled')
                         AND finalized_at > now() - interval '1 minute'))::bigint
           AS finished_last_minute
FROM pgq_jobs
WHERE state = 'available' OR finalized_at > now() - interval '1 minute'
GROUP BY queue;

-- name: STATS_QUEUES
-- The queues `pgq stats` shows with no job at all: each a live producer serves (judged by its
-- own stale_after, $1 for a row that recorded none), and each with limits or a pause. '*' (a
-- pause of every queue) is no queue.
SELECT queue AS name FROM pgq_producers
WHERE concurrency > 0
  AND heartbeat_at > now() - make_interval(secs => COALESCE(stale_after_s, $1))
UNION
SELECT name FROM pgq_queues
WHERE name <> '*'
  AND (paused_at IS NOT NULL OR concurrency IS NOT NULL OR rate_count IS NOT NULL
       OR key_concurrency IS NOT NULL OR key_rate_count IS NOT NULL);

-- name: UNRUNNABLE_JOBS
-- Jobs nobody can run: available jobs due for longer than $2 seconds, of a queue whose live
-- producers (each judged by its own stale_after, $1 for a row that recorded none) all
-- recorded the tasks they serve and none serves the job's task (a worker never claims a
-- task it has not registered). A queue with a producer of older code (no task list) is
-- never flagged, nor one no live producer serves (that is a queue without workers).
WITH live AS (
    SELECT queue, tasks FROM pgq_producers
    WHERE concurrency > 0
      AND heartbeat_at > now() - make_interval(secs => COALESCE(stale_after_s, $1))
), listed AS (
    SELECT queue FROM live GROUP BY queue HAVING bool_and(tasks IS NOT NULL)
)
SELECT j.queue, j.task, count(*)::bigint AS n,
       extract(epoch FROM now() - min(j.scheduled_at))::float8 AS oldest_s
FROM pgq_jobs j
JOIN listed q ON q.queue = j.queue
WHERE j.state = 'available' AND j.scheduled_at < now() - make_interval(secs => $2)
  AND NOT EXISTS (SELECT 1 FROM live l WHERE l.queue = j.queue AND j.task = ANY(l.tasks))
GROUP BY j.queue, j.task
ORDER BY j.queue, j.task;

-- name: LIST_QUEUES
WITH names AS (
    SELECT name FROM pgq_queues
    UNION SELECT DISTINCT queue FROM pgq_jobs WHERE state NOT IN ('completed', 'discarded', 'cancelled')
    UNION SELECT DISTINCT queue FROM pgq_producers
)
SELECT n.name, q.paused_at,
       (SELECT count(*) FROM pgq_jobs j WHERE j.queue = n.name AND j.state = 'available')
           AS available,
       (SELECT count(*) FROM pgq_jobs j WHERE j.queue = n.name AND j.state = 'running')
           AS running,
       (SELECT count(*) FROM pgq_producers p
        WHERE p.queue = n.name AND p.concurrency > 0) AS producers,
       q.concurrency, q.rate_count, q.rate_period_s, q.key_concurrency, q.key_rate_count,
       q.key_rate_period_s
FROM names n LEFT JOIN pgq_queues q ON q.name = n.name
ORDER BY n.name;

-- name: LISTEN_DONE
-- A SyncClient wait's own connection: the ids of jobs that became final arrive on it as
-- pgq_done notifications (the async client's asyncpg LISTENs through add_listener).
LISTEN pgq_done;
