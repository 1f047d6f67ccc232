-- name: ENQUEUE_KEYED
-- One statement for one job or thousands: rows arrive as parallel arrays. Jobs due now are
-- 'available' and wake the workers of their queue with a NOTIFY, delivered on commit only.
WITH ins AS (
    INSERT INTO pgq_jobs (queue, task, args, state, priority, max_attempts, scheduled_at,
                          tags, metadata, unique_key, unique_states, limit_key)
    SELECT r.queue, r.task, r.args::jsonb,
           CASE WHEN r.sched > now() THEN 'scheduled' ELSE 'available' END::pgq_job_state,
           r.priority, r.max_attempts, r.sched,
           CASE WHEN r.tags = '[]' THEN '{}'::text[]
                ELSE ARRAY(SELECT jsonb_array_elements_text(r.tags::jsonb)) END,
           r.metadata::jsonb, r.unique_key, r.unique_states, r.limit_key
    FROM (
        SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => COALESCE(u.delay_s, 0)))
                    AS sched
        FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[],
                    $6::timestamptz[], $7::float8[], $8::text[], $9::text[], $10::text[],
                    $11::int[], $12::text[])
             WITH ORDINALITY
             AS u(queue, task, args, priority, max_attempts, run_at, delay_s, tags, metadata,
                  unique_key, unique_states, limit_key, ord)
        ORDER BY u.ord
    ) r

    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND pgq_unique_active(state, unique_states)
        DO NOTHING

    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT id, state::text AS state, scheduled_at, created_at, unique_key,
       (SELECT count(pg_notify('pgq_jobs', q.queue))
        FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available') q) AS notified
FROM ins
ORDER BY id;

-- name: ENQUEUE_PLAIN
-- Without the arbiter, for batches that carry no key: ON CONFLICT makes every row a
-- speculative insertion, which costs WAL and time.
WITH ins AS (
    INSERT INTO pgq_jobs (queue, task, args, state, priority, max_attempts, scheduled_at,
                          tags, metadata, unique_key, unique_states, limit_key)
    SELECT r.queue, r.task, r.args::jsonb,
           CASE WHEN r.sched > now() THEN 'scheduled' ELSE 'available' END::pgq_job_state,
           r.priority, r.max_attempts, r.sched,
           CASE WHEN r.tags = '[]' THEN '{}'::text[]
                ELSE ARRAY(SELECT jsonb_array_elements_text(r.tags::jsonb)) END,
           r.metadata::jsonb, r.unique_key, r.unique_states, r.limit_key
    FROM (
        SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => COALESCE(u.delay_s, 0)))
                    AS sched
        FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[],
                    $6::timestamptz[], $7::float8[], $8::text[], $9::text[], $10::text[],
                    $11::int[], $12::text[])
             WITH ORDINALITY
             AS u(queue, task, args, priority, max_attempts, run_at, delay_s, tags, metadata,
                  unique_key, unique_states, limit_key, ord)
        ORDER BY u.ord
    ) r

    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT id, state::text AS state, scheduled_at, created_at, unique_key,
       (SELECT count(pg_notify('pgq_jobs', q.queue))
        FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available') q) AS notified
FROM ins
ORDER BY id;

-- name: ENQUEUE_ONE
-- The same for a single job, with scalar parameters: cheaper to plan and to run.
WITH ins AS (
    INSERT INTO pgq_jobs (queue, task, args, state, priority, max_attempts, scheduled_at,
                          tags, metadata, unique_key, unique_states, limit_key)
    SELECT $1, $2, $3::jsonb,
           CASE WHEN s.sched > now() THEN 'scheduled' ELSE 'available' END::pgq_job_state,
           $4, $5, s.sched,
           CASE WHEN $8 = '[]' THEN '{}'::text[]
                ELSE ARRAY(SELECT jsonb_array_elements_text($8::jsonb)) END,
           $9::jsonb, $10, $11, $12
    FROM (SELECT COALESCE($6::timestamptz, now() + make_interval(secs => COALESCE($7::float8, 0)))
                 AS sched) s

    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND pgq_unique_active(state, unique_states)
        DO NOTHING

    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT id, state::text AS state, scheduled_at, created_at, unique_key,
       CASE WHEN state = 'available' THEN pg_notify('pgq_jobs', queue)::text END AS notified
FROM ins;

-- name: ENQUEUE_DEPENDENT
-- One job that depends on others ($13: the parents' ids, distinct; $14: 'cancel' or 'run',
-- what a parent that fails means). Marking each unfinished parent as having dependents
-- (a finished one is only locked: it will not be waited for) locks its row
-- until this transaction ends, so a parent cannot finish unseen between this read of its
-- state and the commit: one finishing first is read as finished, one finishing after fires
-- the release trigger, which then sees this job. The job waits ('pending') for the parents
-- not yet finished; a parent already discarded or cancelled cancels it at once (unless it
-- runs anyway). No row is written when a parent does not exist (found < the ids given).
WITH parents AS (
    UPDATE pgq_jobs SET has_dependents = has_dependents OR state NOT IN ('completed', 'discarded', 'cancelled')
    WHERE id = ANY($13::bigint[])
    RETURNING id, state
), verdict AS (
    SELECT count(*) AS found,
           count(*) FILTER (WHERE state NOT IN ('completed', 'discarded', 'cancelled')) AS waiting,
           count(*) FILTER (WHERE state IN ('discarded', 'cancelled')) AS failed,
           min(id) FILTER (WHERE state IN ('discarded', 'cancelled')) AS failed_id
    FROM parents
), ins AS (
    INSERT INTO pgq_jobs (queue, task, args, state, priority, max_attempts, scheduled_at,
                          tags, metadata, unique_key, unique_states, limit_key, depends_on,
                          deps_left, on_parent_failure, finalized_at, errors)
    SELECT $1, $2, $3::jsonb,
           CASE WHEN v.failed > 0 AND $14 = 'cancel' THEN 'cancelled'
                WHEN v.waiting > 0 THEN 'pending'
                WHEN s.sched > now() THEN 'scheduled'
                ELSE 'available' END::pgq_job_state,
           $4, $5, s.sched,
           CASE WHEN $8 = '[]' THEN '{}'::text[]
                ELSE ARRAY(SELECT jsonb_array_elements_text($8::jsonb)) END,
           $9::jsonb, $10, $11, $12, $13::bigint[],
           CASE WHEN v.failed > 0 AND $14 = 'cancel' THEN 0 ELSE v.waiting END, $14,
           CASE WHEN v.failed > 0 AND $14 = 'cancel' THEN now() END,
           CASE WHEN v.failed > 0 AND $14 = 'cancel'
                THEN jsonb_build_array(jsonb_build_object(
                    'attempt', 0, 'kind', 'dependency',
                    'message', 'parent job ' || v.failed_id || ' had failed before it was enqueued',
                    'traceback', NULL, 'at', now()))
                ELSE '[]'::jsonb END
    FROM (SELECT COALESCE($6::timestamptz, now() + make_interval(secs => COALESCE($7::float8, 0)))
                 AS sched) s,
         verdict v
    WHERE v.found = cardinality($13::bigint[])

    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND pgq_unique_active(state, unique_states)
        DO NOTHING

    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT v.found, ins.id, ins.state::text AS state, ins.scheduled_at, ins.created_at,
       ins.unique_key,
       CASE WHEN ins.state = 'available' THEN pg_notify('pgq_jobs', ins.queue)::text END AS notified
FROM verdict v LEFT JOIN ins ON true;

-- name: PARENT_JOBS
-- The parents of a job, in the order it gave them (what a group's callback reads).
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

FROM pgq_jobs JOIN unnest($1::bigint[]) WITH ORDINALITY AS p(parent_id, ord)
     ON pgq_jobs.id = p.parent_id
ORDER BY p.ord;

-- name: ALLOCATE_JOBS
-- Bulk enqueue on pgq's own connections: COPY writes the rows (far cheaper per row than an
-- INSERT), so this statement first takes their ids in order from the table's sequence, reads
-- the transaction's clock (the rows' created_at, and what the client compares run_at to), and
-- queues a NOTIFY for each queue that gets a job due now ($2, $3: a queue and its earliest
-- run_at, NULL for "now"). All three belong to the caller's transaction: the NOTIFY is
-- delivered with the COPY's commit, or not at all.
SELECT ARRAY(SELECT nextval('pgq_jobs_id_seq') FROM generate_series(1, $1::int)) AS ids,
       now() AS now,
       (SELECT count(pg_notify('pgq_jobs', d.queue))
        FROM unnest($2::text[], $3::timestamptz[]) AS d(queue, due)
        WHERE d.due IS NULL OR d.due <= now()) AS notified;

-- name: COPY_JOBS_PLAIN
-- The same COPY for synchronous code (psycopg writes the rows in COPY's text format).
COPY pgq_jobs (id, queue, task, args, priority, max_attempts) FROM STDIN;

-- name: COPY_JOBS_FULL
COPY pgq_jobs (id, queue, task, args, priority, max_attempts, state, scheduled_at, tags, metadata, limit_key) FROM STDIN;

-- name: EXISTING_UNIQUE
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
WHERE unique_key = ANY($1::text[]) AND pgq_unique_active(state, unique_states);
