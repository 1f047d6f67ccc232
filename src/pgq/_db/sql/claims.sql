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

-- name: QUEUE_LIMITS
-- Flow control (docs/flow-control.md): a queue's limits, read by its producers between
-- claims. A limited queue is claimed by CLAIM_LIMITED, which reads them again under the
-- queue's lock.
SELECT concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues WHERE name = $1;

-- name: CLAIM_LIMITED
-- The claim of a queue with limits, in one round trip: pgq_claim_limited (below) locks the
-- queue's row, counts, claims and logs the starts in the call's own transaction. Never run
-- it inside a longer transaction: the queue's row would stay locked until that ends. $3:
-- the producer's free slots; $4: jobs wanted ahead of them; $9: how far to look for jobs
-- without a key (KEYLESS_SEARCH); $10: commit without waiting for the WAL's flush. The
-- jobs come as anonymous records (an array of pgq_claimed_job would have the driver ask
-- the server about that type, whose oid differs from database to database, on every new
-- connection), in claim order; none: an empty array.
SELECT f.held_back, f.concurrency, f.rate_count, f.rate_period_s, f.key_concurrency,
       f.key_rate_count, f.key_rate_period_s,
       ARRAY(SELECT ROW((f.jobs[i]).*) FROM generate_subscripts(f.jobs, 1) AS i ORDER BY i)
           AS jobs
FROM pgq_claim_limited($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) AS f;

-- name: CLAIMED_JOB_TYPE
-- Schema (created by pgq.schema and the migrations, not run by the worker): a claimed job
-- as the limited claim returns it, in the codec's claim columns (CLAIM_JOBS' columns).
CREATE TYPE pgq_claimed_job AS (
    id bigint, task text, args text, priority integer, attempt integer, max_attempts integer,
    scheduled_at timestamptz, attempted_at timestamptz, finalized_at timestamptz,
    created_at timestamptz, errors text, tags text[], metadata text, result text,
    unique_key text, attempt_token uuid, limit_key text, depends_on bigint[]
);

-- name: RATE_STARTED_FUNCTION
-- Schema (created by pgq.schema and the migrations). The starts of queue p_queue after
-- p_since, for its rate limits, in two index probes however many there were: each limited
-- claim adds a row to pgq_rate_sums with its count of starts and the running total
-- (p_total: the newest row's), so the window's starts are the newest total less the total
-- before the window's first row. Plus the starts logged one row each by code of a revision
-- before pgq_0011, which sums nothing (its rows have no mark; a partial index holds them):
-- during a rolling upgrade, old and new workers count each other's starts.
CREATE OR REPLACE FUNCTION pgq_rate_started(p_queue text, p_total bigint, p_since timestamptz)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- plpgsql, not sql: its statements keep their plans from call to call.
    RETURN (COALESCE((SELECT p_total - s.total + s.starts FROM pgq_rate_sums s
                      WHERE s.queue = p_queue AND s.started_at > p_since
                      ORDER BY s.started_at, s.total LIMIT 1), 0)
            + (SELECT count(*) FROM pgq_rate_log l
               WHERE l.queue = p_queue AND l.summed IS NULL AND l.started_at > p_since));
END
$$;

-- name: LIMITED_CLAIM_FUNCTION
-- Schema (created by pgq.schema and the migrations). Flow control (docs/flow-control.md):
-- claims up to p_limit jobs of a limited queue for a producer's free slots (and up to
-- p_ahead more, to start as slots free, out of half the room left beyond those), as
-- CLAIM_JOBS does, and no more than the queue's limits leave. Its first statement locks
-- the queue's row: the serialisation point, one claimer of the queue at a time across all
-- workers. It is VOLATILE, so each later statement takes a snapshot of its own, after the
-- lock: the count sees every claim committed before the lock was granted (a snapshot taken
-- before it, as a single statement's would be, could miss the claim of the transaction it
-- waited for). Its clock is read after the lock too (clock_timestamp(), not the call's
-- statement_timestamp(), which a wait for the lock would leave behind), so logged starts
-- follow the lock's order.
--
-- Running jobs are counted producer by producer through the partial index of running jobs,
-- which is keyed by producer and has no queue (a count by queue would read every running job
-- of every queue, under the queue's lock): a skip scan finds each producer that has running
-- jobs (one index probe each), and the jobs of those that are the queue's, or whose row is
-- gone (a row deleted by hand, or at a worker's stop), are counted with the queue's filter.
-- The sub-select per producer (OFFSET 0 in the per-key count) keeps the planner from
-- joining all running jobs by hash, which statistics taken while few jobs ran would invite.
--
-- Per-key limits: while the queue's running jobs and its starts within the key rate's
-- window, with this claim's, fit within one key's limits, no key can be short of room, and
-- the claim is the queue's next jobs (one index scan, as without per-key limits). Otherwise
-- every key with available jobs is found by a skip scan of the key index
-- (one probe per key, however many jobs each holds), with its running jobs and its starts
-- within the key rate's window; the jobs without a key count as one more key (NULL). For
-- each key with room, its next jobs, at most its room each; for keyless jobs, at most their
-- room among the queue's first p_keyless_search available jobs in claim order (they have no
-- index of their own); of these candidates the first by priority then schedule are locked
-- (a row locked elsewhere, by a dependent's enqueue say, is skipped, as in every claim).
--
-- Returns the limits as read under the lock, the claimed jobs in claim order (NULL: none),
-- and held_back: a limit kept jobs back (of the free slots' part or the ahead part).
CREATE OR REPLACE FUNCTION pgq_claim_limited(
    p_queue text, p_tasks text[], p_limit integer, p_ahead integer, p_producer uuid,
    p_timeouts float8[],
    p_max_attempts integer[], p_worker text, p_keyless_search integer, p_async_commit boolean,
    OUT held_back boolean, OUT concurrency integer, OUT rate_count integer,
    OUT rate_period_s float8, OUT key_concurrency integer, OUT key_rate_count integer,
    OUT key_rate_period_s float8, OUT jobs pgq_claimed_job[]
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_running integer := 0;
    v_started bigint := 0;
    v_key_started bigint := 0;
    v_total bigint := 0;
    v_last_at timestamptz;
    v_room integer;
    v_budget integer;
    v_ahead integer;
    v_take integer;
    v_candidates bigint[] := '{}';
    v_found bigint[];
    v_found_keys text[];
    v_keys text[];
    v_rooms integer[];
    v_keyless integer := 0;
    v_keys_held boolean := false;
    v_least_room integer;
    v_plain boolean;
    v_ids bigint[];
    v_started_keys text[];
    v_claimed integer;
BEGIN
    held_back := false;
    IF p_async_commit THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT q.concurrency, q.rate_count, q.rate_period_s, q.key_concurrency,
           q.key_rate_count, q.key_rate_period_s
    INTO concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count,
         key_rate_period_s
    FROM pgq_queues q WHERE q.name = p_queue FOR UPDATE;
    v_now := clock_timestamp();
    IF EXISTS (SELECT 1 FROM pgq_queues q
               WHERE q.name IN (p_queue, '*') AND q.paused_at IS NOT NULL) THEN
        RETURN;
    END IF;
    IF concurrency IS NOT NULL OR key_concurrency IS NOT NULL THEN
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
            WHERE r.id IS NOT NULL AND (p.id IS NULL OR p.queue = p_queue)
        )
        SELECT COALESCE(sum((SELECT count(*) FROM pgq_jobs j
                             WHERE j.producer_id = c.id AND j.state = 'running'
                               AND j.queue = p_queue)), 0)::integer
        INTO v_running FROM counted c;
    END IF;
    IF rate_count IS NOT NULL OR key_rate_count IS NOT NULL THEN
        SELECT s.started_at, s.total INTO v_last_at, v_total FROM pgq_rate_sums s
        WHERE s.queue = p_queue ORDER BY s.started_at DESC, s.total DESC LIMIT 1;
        v_total := COALESCE(v_total, 0);
    END IF;
    IF rate_count IS NOT NULL THEN
        v_started := pgq_rate_started(p_queue, v_total,
                                      v_now - make_interval(secs => COALESCE(rate_period_s, 0)));
    END IF;
    -- The room the queue's limits leave (NULL: no limit of the whole queue), the free slots'
    -- part of it, and the jobs to start ahead of the free slots: only out of half the room
    -- left beyond the slots' part, so that ahead jobs never take a slot another worker could
    -- start a job in now while the limit binds, and take every one asked for while it does not.
    v_room := LEAST(concurrency - v_running, rate_count - LEAST(v_started, rate_count));
    v_budget := GREATEST(LEAST(p_limit, v_room), 0);
    v_ahead := GREATEST(LEAST(p_ahead, (v_room - v_budget) / 2), 0);
    IF v_room IS NULL THEN
        v_ahead := GREATEST(p_ahead, 0);
    END IF;
    IF v_budget + v_ahead = 0 THEN
        held_back := p_limit + p_ahead > 0;
        RETURN;
    END IF;
    IF key_rate_count IS NOT NULL THEN
        v_key_started := pgq_rate_started(
            p_queue, v_total, v_now - make_interval(secs => COALESCE(key_rate_period_s, 0)));
    END IF;
    -- No key can be short of room while the whole queue's usage and this claim fit within
    -- one key's limits: then the claim is the queue's next jobs, as without per-key limits.
    IF (key_concurrency IS NULL OR v_running + v_budget + v_ahead <= key_concurrency)
       AND (key_rate_count IS NULL OR v_key_started + v_budget + v_ahead <= key_rate_count)
    THEN
        SELECT array_agg(s.id) INTO v_ids FROM (
            SELECT j.id FROM pgq_jobs j
            WHERE j.state = 'available' AND j.queue = p_queue AND j.task = ANY(p_tasks)
            ORDER BY j.priority DESC, j.scheduled_at, j.id
            LIMIT v_budget + v_ahead
            FOR UPDATE SKIP LOCKED
        ) s;
    ELSE
        WITH RECURSIVE keys(k) AS (
            (SELECT limit_key FROM pgq_jobs
             WHERE queue = p_queue AND state = 'available' AND limit_key IS NOT NULL
             ORDER BY limit_key LIMIT 1)
            UNION ALL
            SELECT (SELECT limit_key FROM pgq_jobs
                    WHERE queue = p_queue AND state = 'available' AND limit_key > keys.k
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
            WHERE r.id IS NOT NULL AND (p.id IS NULL OR p.queue = p_queue)
        ), running AS (
            SELECT j.limit_key, count(*)::integer AS n
            FROM counted c,
                 LATERAL (SELECT j.limit_key FROM pgq_jobs j
                          WHERE j.producer_id = c.id AND j.state = 'running'
                            AND j.queue = p_queue
                          OFFSET 0) j
            GROUP BY j.limit_key
        ), usage(key, running, started) AS (
            SELECT k.k, COALESCE(r.n, 0),
                   CASE WHEN key_rate_count IS NOT NULL THEN
                       (SELECT count(*) FROM pgq_rate_log l
                        WHERE l.queue = p_queue AND l.limit_key = k.k
                          AND l.started_at > v_now
                              - make_interval(secs => COALESCE(key_rate_period_s, 0)))::integer
                   ELSE 0 END
            FROM keys k
            LEFT JOIN running r ON r.limit_key = k.k
            WHERE k.k IS NOT NULL
            UNION ALL
            SELECT NULL,
                   COALESCE((SELECT n FROM running WHERE limit_key IS NULL), 0),
                   CASE WHEN key_rate_count IS NOT NULL THEN
                       (SELECT count(*) FROM pgq_rate_log l
                        WHERE l.queue = p_queue AND l.limit_key IS NULL
                          AND l.started_at > v_now
                              - make_interval(secs => COALESCE(key_rate_period_s, 0)))::integer
                   ELSE 0 END
        ), rooms AS (
            SELECT u.key, u.running, u.started,
                   LEAST(key_concurrency - u.running, key_rate_count - u.started) AS room
            FROM usage u
        )
        -- Whether keyless jobs wait is unknown here; if some run or started, they may.
        SELECT array_agg(r.key ORDER BY r.key) FILTER (WHERE r.key IS NOT NULL AND r.room > 0),
               array_agg(r.room ORDER BY r.key) FILTER (WHERE r.key IS NOT NULL AND r.room > 0),
               COALESCE(max(GREATEST(r.room, 0)) FILTER (WHERE r.key IS NULL), 0),
               COALESCE(bool_or(r.room <= 0
                                AND (r.key IS NOT NULL OR r.running > 0 OR r.started > 0)), false),
               min(r.room)
        INTO v_keys, v_rooms, v_keyless, v_keys_held, v_least_room
        FROM rooms r;
        -- First the free slots' part (each key up to its room), then the ahead part, with
        -- each key and the keyless jobs held to half the room the first part left them.
        -- Where every key (and the keyless jobs) has room for all a part takes, the part is
        -- the queue's next jobs, one scan of the fetch index: no key can be exceeded, and
        -- reading each key's next jobs (keys times jobs) is for limits that bind.
        v_take := v_budget;
        v_plain := v_least_room > 0;
        FOR v_phase IN 1..2 LOOP
            IF v_plain AND v_least_room >= v_take THEN
                SELECT array_agg(s.id), array_agg(s.limit_key) INTO v_found, v_found_keys FROM (
                    -- Of the keys counted: a job of another key, enqueued since, is not.
                    SELECT id, limit_key FROM pgq_jobs
                    WHERE queue = p_queue AND state = 'available' AND task = ANY(p_tasks)
                      AND id <> ALL(v_candidates)
                      AND (limit_key IS NULL OR limit_key = ANY(v_keys))
                    ORDER BY priority DESC, scheduled_at, id
                    LIMIT v_take
                ) s;
            ELSE
                SELECT array_agg(c.id), array_agg(c.limit_key) INTO v_found, v_found_keys FROM (
                    SELECT j.id, j.priority, j.scheduled_at, j.limit_key
                    FROM unnest(v_keys, v_rooms) AS b(key, room)
                    CROSS JOIN LATERAL (
                        SELECT id, priority, scheduled_at, limit_key FROM pgq_jobs
                        WHERE queue = p_queue AND state = 'available' AND limit_key = b.key
                          AND task = ANY(p_tasks) AND id <> ALL(v_candidates)
                        ORDER BY priority DESC, scheduled_at, id
                        LIMIT LEAST(b.room, v_take)
                    ) j
                    UNION ALL
                    SELECT n.id, n.priority, n.scheduled_at, NULL FROM (
                        SELECT h.id, h.priority, h.scheduled_at FROM (
                            SELECT id, priority, scheduled_at, limit_key, task FROM pgq_jobs
                            WHERE queue = p_queue AND state = 'available' AND v_keyless > 0
                            ORDER BY priority DESC, scheduled_at, id
                            LIMIT p_keyless_search
                        ) h
                        WHERE h.limit_key IS NULL AND h.task = ANY(p_tasks)
                          AND h.id <> ALL(v_candidates)
                        ORDER BY h.priority DESC, h.scheduled_at, h.id
                        LIMIT v_keyless
                    ) n
                    ORDER BY 2 DESC, 3, 1
                    LIMIT v_take
                ) c;
            END IF;
            v_candidates := v_candidates || COALESCE(v_found, '{}');
            EXIT WHEN v_phase = 2 OR v_ahead = 0;
            SELECT array_agg(b.key ORDER BY b.key) FILTER (WHERE b.half > 0),
                   array_agg(b.half ORDER BY b.key) FILTER (WHERE b.half > 0),
                   min(b.half)
            INTO v_keys, v_rooms, v_least_room
            FROM (SELECT u.key, (u.room - (SELECT count(*)::integer FROM unnest(v_found_keys) AS k
                                           WHERE k = u.key)) / 2 AS half
                  FROM unnest(v_keys, v_rooms) AS u(key, room)) b;
            v_keyless := (v_keyless - (SELECT count(*)::integer FROM unnest(v_found_keys) AS k
                                       WHERE k IS NULL)) / 2;
            v_least_room := LEAST(v_least_room, v_keyless);
            v_take := v_ahead;
        END LOOP;
        SELECT array_agg(l.id) INTO v_ids FROM (
            SELECT id FROM pgq_jobs
            WHERE id = ANY(v_candidates) AND state = 'available'
            FOR UPDATE SKIP LOCKED
        ) l;
    END IF;
    -- The locked rows are updated through the primary key (= ANY of an array, as in
    -- CLAIM_JOBS), and returned in claim order.
    WITH claimed AS (
        UPDATE pgq_jobs j
        SET state = 'running', attempt = j.attempt + 1, attempted_at = v_now,
            producer_id = p_producer, attempt_token = gen_random_uuid(), attempted_by = p_worker,
            deadline_at = v_now + make_interval(
                secs => p_timeouts[array_position(p_tasks, j.task)]),
            max_attempts = COALESCE(j.max_attempts, p_max_attempts[array_position(p_tasks, j.task)])
        WHERE j.id = ANY(v_ids)
        RETURNING j.*
    ), ordered AS (
        SELECT c.*,
               row_number() OVER claim_order AS n,
               c.created_at IS DISTINCT FROM lag(c.created_at) OVER claim_order AS new_created
        FROM claimed c
        WINDOW claim_order AS (ORDER BY c.priority DESC, c.scheduled_at, c.id)
    )
    SELECT array_agg(ROW(
               o.id, o.task, o.args::text, o.priority, o.attempt, o.max_attempts,
               CASE WHEN o.scheduled_at <> o.created_at
                    THEN LEAST(GREATEST(o.scheduled_at, '0001-01-02Z'), '9999-12-30Z') END,
               CASE WHEN o.n = 1
                    THEN LEAST(GREATEST(o.attempted_at, '0001-01-02Z'), '9999-12-30Z') END,
               CASE WHEN o.finalized_at IS NOT NULL
                    THEN LEAST(GREATEST(o.finalized_at, '0001-01-02Z'), '9999-12-30Z') END,
               CASE WHEN o.new_created
                    THEN LEAST(GREATEST(o.created_at, '0001-01-02Z'), '9999-12-30Z') END,
               CASE WHEN o.errors <> '[]' THEN o.errors::text END,
               CASE WHEN o.tags <> '{}' THEN o.tags END,
               CASE WHEN o.metadata <> '{}' THEN o.metadata::text END,
               o.result::text, o.unique_key, o.attempt_token, o.limit_key, o.depends_on
           )::pgq_claimed_job ORDER BY o.n),
           array_agg(o.limit_key), count(*)
    INTO jobs, v_started_keys, v_claimed
    FROM ordered o;
    IF v_claimed > 0 AND (rate_count IS NOT NULL OR key_rate_count IS NOT NULL) THEN
        -- The starts: their sum, and each with its key (marked summed); the entries older
        -- than the longest window go. A sum's time never goes back (a clock stepped back
        -- would misplace the window's first sum).
        DELETE FROM pgq_rate_log l
        WHERE l.queue = p_queue
          AND l.started_at <= v_now - make_interval(secs => GREATEST(
                  COALESCE(rate_period_s, 0), COALESCE(key_rate_period_s, 0)));
        DELETE FROM pgq_rate_sums s
        WHERE s.queue = p_queue
          AND s.started_at <= v_now - make_interval(secs => GREATEST(
                  COALESCE(rate_period_s, 0), COALESCE(key_rate_period_s, 0)));
        INSERT INTO pgq_rate_sums (queue, started_at, starts, total)
        VALUES (p_queue, GREATEST(v_now, v_last_at), v_claimed, v_total + v_claimed);
        INSERT INTO pgq_rate_log (queue, limit_key, started_at, summed)
        SELECT p_queue, k, v_now, true FROM unnest(v_started_keys) AS k;
    END IF;
    -- Held back: the claim took all the limits allowed, and they allowed less than asked;
    -- or a key had no room, and the claim found fewer jobs than allowed.
    held_back := (v_claimed >= v_budget + v_ahead AND v_budget + v_ahead < p_limit + p_ahead)
                 OR (v_keys_held AND v_claimed < v_budget + v_ahead);
END
$$;

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
