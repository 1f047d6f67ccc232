-- name: REGISTER_PRODUCERS
INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency, fence_after_s,
                           stale_after_s, rescue_grace_s, tasks)
SELECT u.id, $2, $3, u.queue, u.concurrency, $6, $7, $8, $9::text[]
FROM unnest($1::uuid[], $4::text[], $5::int[]) AS u(id, queue, concurrency);

-- name: HEARTBEAT
-- One heartbeat for every producer of a worker, on the database clock. Rows that come back
-- are alive; a producer whose row is missing was judged dead (or deleted) by someone else.
-- Returns each row still there, with the seconds since its previous stamp on the database
-- clock (read from the row as it was before this update: the same row, self-joined).
UPDATE pgq_producers p
SET heartbeat_at = now(), running = u.running, healthy = u.healthy, claimed = u.claimed,
    completed = u.completed, failed = u.failed, rejected_outcomes = u.rejected
FROM unnest($1::uuid[], $2::int[], $3::bool[], $4::bigint[], $5::bigint[], $6::bigint[],
            $7::bigint[]) AS u(id, running, healthy, claimed, completed, failed, rejected)
JOIN pgq_producers o ON o.id = u.id
WHERE p.id = u.id
RETURNING p.id, extract(epoch FROM now() - o.heartbeat_at)::float8 AS silent_s;

-- name: REREGISTER_PRODUCER
-- A producer whose row vanished comes back under a new id $1 and adopts every job still
-- running under the old one ($2: the old id, the ids it still holds from earlier
-- re-registrations, and the new one) when its row was deleted by hand: those
-- it runs, those whose outcome is still on its way, and those of a claim committed before
-- this statement whose rows it has not read yet. Jobs that peers already rescued are not
-- 'running' under the old id any more and stay theirs. Adoption changes the producer
-- (liveness), never the attempt's token (fencing). A producer tries again under the same
-- new id (a try that timed out may yet have committed), so the row may exist already, and
-- the jobs that try moved are reported adopted again. The old ids get a row again too
-- (concurrency 0), beaten with the new one's until nothing is left under them: without it,
-- a job passed over here (locked) or claimed under an old id later would be the job of a
-- missing producer, which the rescuer takes once it started stale_after ago.
WITH ins AS (
    INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency, claimed,
                               completed, failed, rejected_outcomes, fence_after_s,
                               stale_after_s, rescue_grace_s, tasks)
    VALUES ($1, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14::text[])
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
    RETURNING id
), former AS (
    INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency, fence_after_s,
                               stale_after_s, rescue_grace_s)
    SELECT f.id, $3, $4, $5, 0, $11, $12, $13 FROM unnest($2::uuid[]) AS f(id) WHERE f.id <> $1
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
), moved AS (
    UPDATE pgq_jobs SET producer_id = (SELECT id FROM ins)
    WHERE id IN (SELECT id FROM pgq_jobs
                 WHERE producer_id = ANY($2::uuid[]) AND state = 'running'
                 FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING id
)
SELECT id, true AS adopted FROM moved
UNION ALL
SELECT id, false FROM pgq_jobs
WHERE producer_id = ANY($2::uuid[]) AND state = 'running' AND id NOT IN (SELECT id FROM moved);

-- name: ADOPT_JOBS
-- Moves the jobs still running under a re-registered producer's former ids $2 to its id $1:
-- those of a claim that was in flight under a former id when the producer re-registered,
-- and those passed over then.
WITH moved AS (
    UPDATE pgq_jobs SET producer_id = $1
    WHERE id IN (SELECT id FROM pgq_jobs
                 WHERE producer_id = ANY($2::uuid[]) AND state = 'running'
                 FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING id
)
SELECT id, true AS adopted FROM moved
UNION ALL
SELECT id, false FROM pgq_jobs
WHERE producer_id = ANY($2::uuid[]) AND state = 'running' AND id NOT IN (SELECT id FROM moved);

-- name: RUNNING_UNDER
-- The jobs running under producers $1, as a worker checks them against the jobs it runs
-- (a claim whose reply was lost leaves jobs there that nobody runs). One probe each of the
-- partial index of running jobs; no wide column read.
SELECT id, attempt_token, attempt, queue, task, producer_id,
       COALESCE(max_attempts, 20) AS max_attempts
FROM pgq_jobs
WHERE producer_id = ANY($1::uuid[]) AND state = 'running';

-- name: LOST_REPLIES
-- How often each of the jobs $1 was handed back before because its claim's reply was lost
-- (its error entries of that kind): read for the strays found, not for every running job.
SELECT id, jsonb_array_length(jsonb_path_query_array(
           errors, '$[*] ? (@.kind == "lost_reply")')) AS n
FROM pgq_jobs WHERE id = ANY($1::bigint[]);

-- name: DELETE_PRODUCERS
DELETE FROM pgq_producers WHERE id = ANY($1::uuid[]);

-- name: RELEASE_PRODUCERS
-- A re-registered producer lets its former ids $1 go: their rows, once no job runs under
-- them (one that does keeps its row, which then goes stale, and the rescuer takes the job).
DELETE FROM pgq_producers p
WHERE p.id = ANY($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM pgq_jobs j WHERE j.producer_id = p.id AND j.state = 'running');

-- name: LIST_PRODUCERS
SELECT p.id, p.worker_name, p.queue, p.started_at, p.heartbeat_at,
       extract(epoch FROM now() - p.heartbeat_at)::float8 AS heartbeat_age_s,
       p.concurrency, p.running, p.healthy, p.claimed, p.completed, p.failed,
       p.rejected_outcomes, p.fence_after_s, p.stale_after_s,
       (l.leader_id IS NOT NULL) AS is_leader, p.worker_id
FROM pgq_producers p
LEFT JOIN pgq_leader l ON l.name = 'default' AND l.leader_id = p.worker_id
     AND l.expires_at > now()
ORDER BY p.worker_name, p.queue;

-- name: LIVE_PRODUCERS
-- Producers of queue $1 that are live, each judged by its own stale_after ($2 seconds for a
-- row that recorded none): does anyone serve it now? (Not the rows a re-registered producer
-- keeps for its former ids, of concurrency 0.)
SELECT count(*)::int AS n FROM pgq_producers
WHERE (queue = $1 OR $1 = '*') AND concurrency > 0
  AND heartbeat_at > now() - make_interval(secs => COALESCE(stale_after_s, $2));

-- name: CURRENT_LEADER
SELECT leader_id, worker_name, elected_at, expires_at,
       extract(epoch FROM expires_at - now())::float8 AS expires_in_s
FROM pgq_leader WHERE name = 'default' AND expires_at > now();
