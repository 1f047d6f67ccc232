-- name: ACQUIRE_LEADERSHIP
-- Take the lease if it is free or expired, or renew it if it is ours. A row comes back
-- only when we hold it; its expiry is on the database clock.
INSERT INTO pgq_leader AS l (name, leader_id, worker_name, elected_at, expires_at)
VALUES ('default', $1, $2, now(), now() + make_interval(secs => $3))
ON CONFLICT (name) DO UPDATE
SET leader_id = EXCLUDED.leader_id,
    worker_name = EXCLUDED.worker_name,
    elected_at = CASE WHEN l.leader_id = EXCLUDED.leader_id THEN l.elected_at
                      ELSE now() END,
    expires_at = EXCLUDED.expires_at
WHERE l.leader_id = EXCLUDED.leader_id OR l.expires_at < now()
RETURNING leader_id;

-- name: RESIGN_LEADERSHIP
WITH gone AS (
    DELETE FROM pgq_leader WHERE name = 'default' AND leader_id = $1 RETURNING leader_id
)
SELECT pg_notify('pgq_leader', 'resigned') FROM gone;
