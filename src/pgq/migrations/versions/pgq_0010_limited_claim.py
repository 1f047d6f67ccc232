"""The limited claim in one round trip: ``pgq_claim_limited`` locks a limited queue's
row, counts its running jobs and recent starts (each statement of the function takes a
snapshot after the lock), claims and logs the starts in the caller's one statement, instead
of a transaction of six round trips; ``pgq_claimed_job`` is the row type of the jobs it
returns. Additive: code of the revision before runs on it as before (it does not call the
function), so the oldest served code revision stays.

Revision ID: pgq_0010
Revises: pgq_0009
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "pgq_0010"
down_revision: str | None = "pgq_0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLAIMED_JOB_TYPE = """
CREATE TYPE pgq_claimed_job AS (
    id bigint, task text, args text, priority integer, attempt integer, max_attempts integer,
    scheduled_at timestamptz, attempted_at timestamptz, finalized_at timestamptz,
    created_at timestamptz, errors text, tags text[], metadata text, result text,
    unique_key text, attempt_token uuid, limit_key text, depends_on bigint[]
)
"""

LIMITED_CLAIM_FUNCTION = """
CREATE FUNCTION pgq_claim_limited(
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
    v_started integer := 0;
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
    IF concurrency IS NOT NULL THEN
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
    IF rate_count IS NOT NULL THEN
        SELECT count(*)::integer INTO v_started FROM pgq_rate_log l
        WHERE l.queue = p_queue
          AND l.started_at > v_now - make_interval(secs => COALESCE(rate_period_s, 0));
    END IF;
    -- The room the queue's limits leave (NULL: no limit of the whole queue), the free slots'
    -- part of it, and the jobs to start ahead of the free slots: only out of half the room
    -- left beyond the slots' part, so that ahead jobs never take a slot another worker could
    -- start a job in now while the limit binds, and take every one asked for while it does not.
    v_room := LEAST(concurrency - v_running, rate_count - v_started);
    v_budget := GREATEST(LEAST(p_limit, v_room), 0);
    v_ahead := GREATEST(LEAST(p_ahead, (v_room - v_budget) / 2), 0);
    IF v_room IS NULL THEN
        v_ahead := GREATEST(p_ahead, 0);
    END IF;
    IF v_budget + v_ahead = 0 THEN
        held_back := p_limit + p_ahead > 0;
        RETURN;
    END IF;
    IF key_concurrency IS NULL AND key_rate_count IS NULL THEN
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
                   LEAST(v_budget + v_ahead, key_concurrency - u.running,
                         key_rate_count - u.started) AS room
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
                    SELECT id, limit_key FROM pgq_jobs
                    WHERE queue = p_queue AND state = 'available' AND task = ANY(p_tasks)
                      AND id <> ALL(v_candidates)
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
                        LIMIT b.room
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
        -- The starts, with their keys; the log's entries older than the longest window go.
        DELETE FROM pgq_rate_log l
        WHERE l.queue = p_queue
          AND l.started_at <= v_now - make_interval(secs => GREATEST(
                  COALESCE(rate_period_s, 0), COALESCE(key_rate_period_s, 0)));
        INSERT INTO pgq_rate_log (queue, limit_key, started_at)
        SELECT p_queue, k, v_now FROM unnest(v_started_keys) AS k;
    END IF;
    -- Held back: the claim took all the limits allowed, and they allowed less than asked;
    -- or a key had no room, and the claim found fewer jobs than allowed.
    held_back := (v_claimed >= v_budget + v_ahead AND v_budget + v_ahead < p_limit + p_ahead)
                 OR (v_keys_held AND v_claimed < v_budget + v_ahead);
END
$$
"""


def upgrade() -> None:
    op.execute(CLAIMED_JOB_TYPE)
    op.execute(LIMITED_CLAIM_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION pgq_claim_limited")
    op.execute("DROP TYPE pgq_claimed_job")
