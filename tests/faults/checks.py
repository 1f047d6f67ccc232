"""What the fault tests check on the jobs' recorded side effects (no job lost, none
completed twice), and the helpers several of them share."""

from __future__ import annotations

import json
import urllib.request

import asyncpg

import pgq


async def enqueue(dsn: str, n: int, seconds: float) -> list[int]:
    async with pgq.Client(dsn) as client:
        jobs = await client.enqueue_many(
            [pgq.JobSpec("effect", {"seconds": seconds}) for _ in range(n)]
        )
    return [j.id for j in jobs]


async def all_completed(conn: asyncpg.Connection[asyncpg.Record], ids: list[int]) -> bool:
    done = await conn.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND state = 'completed'", ids
    )
    return bool(done == len(ids))


async def assert_exactly_once(conn: asyncpg.Connection[asyncpg.Record], ids: list[int]) -> None:
    """No job lost, none completed twice: one fenced effect per job, every job completed."""
    rows = await conn.fetch(
        "SELECT j.id, j.state::text, count(e.job_id) AS effects FROM pgq_jobs j"
        " LEFT JOIN effects e ON e.job_id = j.id WHERE j.id = ANY($1) GROUP BY j.id, j.state",
        ids,
    )
    assert len(rows) == len(ids)
    bad = [dict(r) for r in rows if r["state"] != "completed" or r["effects"] != 1]
    assert bad == []


async def running_under(conn: asyncpg.Connection[asyncpg.Record], name: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
            " WHERE j.state = 'running' AND p.worker_name = $1",
            name,
        )
    )


def health(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# Holds each claim inside the server, past its parse and plan, while the test holds the
# advisory lock: a claim's row update waits for it.
HOLD_CLAIMS = """
CREATE FUNCTION hold_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'available' AND NEW.state = 'running' THEN
        PERFORM pg_advisory_xact_lock_shared(4242);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_claims BEFORE UPDATE ON pgq_jobs
    FOR EACH ROW EXECUTE FUNCTION hold_claims();
"""


CLAIM_WAITS = """
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()
  AND query LIKE '%attempt_token = gen_random_uuid()%'
"""
