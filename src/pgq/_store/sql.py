"""Every SQL statement pgq runs, named, in one place.

Statements are constants: nothing here or elsewhere builds SQL at run time, and no statement
is derived by editing another. A few facts that live in Python are joined into the text at
import, as named fragments: the notification channels, the final states (from
:class:`~pgq.JobState`), the default ``max_attempts`` and the column list of a whole job.
Values always travel as parameters; JSON travels as ``text`` and is cast in SQL, so a
caller's connection works whatever type codecs it has registered.
"""

from __future__ import annotations

from typing import Final

from pgq.job import DEFAULT_MAX_ATTEMPTS, FINAL_STATES, JobState

#: Notification channels.
CHANNEL_JOBS: Final = "pgq_jobs"  # payload: a queue with new jobs ('*': every queue)
CHANNEL_LEADER: Final = "pgq_leader"  # payload: 'resigned'
CHANNEL_CONTROL: Final = "pgq_control"  # payload: a JSON control message (see _worker.control)
CHANNEL_DONE: Final = "pgq_done"  # payload: comma-separated ids of jobs that became final

# Fragments of statement text, each derived from its one source.
_JOBS = f"'{CHANNEL_JOBS}'"
_LEADER = f"'{CHANNEL_LEADER}'"
_CONTROL = f"'{CHANNEL_CONTROL}'"
_DONE = f"'{CHANNEL_DONE}'"
_FINAL = "(" + ", ".join(f"'{s.value}'" for s in JobState if s in FINAL_STATES) + ")"
_DEFAULT_MAX_ATTEMPTS = str(int(DEFAULT_MAX_ATTEMPTS))

# A whole job, as every read returns it. Timestamps are read within the years Python can
# hold (1 to 9999): PostgreSQL keeps dates far beyond them, and one such row (written by hand,
# or by an older pgq) must not make a listing fail. NULL stays NULL (GREATEST and LEAST
# would skip it and return the bound).
JOB_COLUMNS: Final = """
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
"""

# A claimed job, as the claim returns it: JOB_COLUMNS without what the claiming producer
# already knows (its queue; the state is running; producer_id and attempted_by are its own),
# and as little else to decode as the claim's rows allow, read in claim order (the window,
# over the claimed rows of the CTE below):
# - the attempt's start, the statement's own clock and the same for every row, comes in the
#   first row only;
# - created_at only where it differs from the row before (the jobs of one transaction share
#   it), and scheduled_at only where it differs from created_at (a job run when due, as
#   most are; both columns are NOT NULL);
# - errors, tags and metadata are NULL when empty, as most are (all three are NOT NULL).
# rows.jobs_from_claim reads it by position and fills in the rest; a test holds the job it
# makes equal to a read by id.
CLAIM_COLUMNS: Final = """
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
"""

# --------------------------------------------------------------------------- schema check

SCHEMA_VERSION_TABLES: Final = """
SELECT to_regclass('pgq_alembic_version') IS NOT NULL AS own,
       to_regclass('alembic_version') IS NOT NULL AS shared,
       to_regclass('pgq_jobs') IS NOT NULL AS has_jobs
"""
PGQ_VERSION: Final = "SELECT version_num FROM pgq_alembic_version"
# When the user runs pgq's migrations inside their own alembic environment (branch "pgq").
SHARED_VERSION: Final = (
    "SELECT version_num FROM alembic_version WHERE version_num = ANY($1::text[])"
)

# pgq's revisions had unprefixed ids ('0002') before 'pgq_0002': renamed where a database
# records them. These run through SQLAlchemy in the alembic glue (pgq.migrate), hence the
# named parameters.
OWN_VERSION_TABLE_EXISTS: Final = "SELECT to_regclass('pgq_alembic_version') IS NOT NULL"
RENAME_OWN_REVISION: Final = (
    "UPDATE pgq_alembic_version SET version_num = :new WHERE version_num = :old"
)
RENAME_SHARED_REVISION: Final = (
    "UPDATE alembic_version SET version_num = :new WHERE version_num = :old"
)
# Serializes concurrent migrators (two workers' deploy hooks, say) inside one transaction.
MIGRATION_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtext('pgq migrations'))"

# --------------------------------------------------------------------------- enqueue

# One statement for one job or thousands: rows arrive as parallel arrays. Jobs due now are
# 'available' and wake the workers of their queue with a NOTIFY, delivered on commit only.
_ENQUEUE_ROWS = """
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
"""
# A job whose unique key is taken (in the states its mask names) is skipped by the unique
# index, race-free; the caller then reads the job that holds the key (EXISTING_UNIQUE).
_UNIQUE_ARBITER = """
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND pgq_unique_active(state, unique_states)
        DO NOTHING
"""
_ENQUEUE_RETURNING = (
    """
    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT id, state::text AS state, scheduled_at, created_at, unique_key,
       (SELECT count(pg_notify("""
    + _JOBS
    + """, q.queue))
        FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available') q) AS notified
FROM ins
ORDER BY id
"""
)
ENQUEUE_KEYED: Final = _ENQUEUE_ROWS + _UNIQUE_ARBITER + _ENQUEUE_RETURNING
# Without the arbiter, for batches that carry no key: ON CONFLICT makes every row a
# speculative insertion, which costs WAL and time.
ENQUEUE_PLAIN: Final = _ENQUEUE_ROWS + _ENQUEUE_RETURNING

# The same for a single job, with scalar parameters: cheaper to plan and to run.
ENQUEUE_ONE: Final = (
    """
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
"""
    + _UNIQUE_ARBITER
    + """
    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT id, state::text AS state, scheduled_at, created_at, unique_key,
       CASE WHEN state = 'available' THEN pg_notify("""
    + _JOBS
    + """, queue)::text END AS notified
FROM ins
"""
)

# One job that depends on others ($13: the parents' ids, distinct; $14: 'cancel' or 'run',
# what a parent that fails means). Marking each unfinished parent as having dependents
# (a finished one is only locked: it will not be waited for) locks its row
# until this transaction ends, so a parent cannot finish unseen between this read of its
# state and the commit: one finishing first is read as finished, one finishing after fires
# the release trigger, which then sees this job. The job waits ('pending') for the parents
# not yet finished; a parent already discarded or cancelled cancels it at once (unless it
# runs anyway). No row is written when a parent does not exist (found < the ids given).
ENQUEUE_DEPENDENT: Final = (
    """
WITH parents AS (
    UPDATE pgq_jobs SET has_dependents = has_dependents OR state NOT IN """
    + _FINAL
    + """
    WHERE id = ANY($13::bigint[])
    RETURNING id, state
), verdict AS (
    SELECT count(*) AS found,
           count(*) FILTER (WHERE state NOT IN """
    + _FINAL
    + """) AS waiting,
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
"""
    + _UNIQUE_ARBITER
    + """
    RETURNING id, queue, state, scheduled_at, created_at, unique_key
)
SELECT v.found, ins.id, ins.state::text AS state, ins.scheduled_at, ins.created_at,
       ins.unique_key,
       CASE WHEN ins.state = 'available' THEN pg_notify("""
    + _JOBS
    + """, ins.queue)::text END AS notified
FROM verdict v LEFT JOIN ins ON true
"""
)

# The parents of a job, in the order it gave them (what a group's callback reads).
PARENT_JOBS: Final = (
    """
SELECT """
    + JOB_COLUMNS
    + """
FROM pgq_jobs JOIN unnest($1::bigint[]) WITH ORDINALITY AS p(parent_id, ord)
     ON pgq_jobs.id = p.parent_id
ORDER BY p.ord
"""
)

# Bulk enqueue on pgq's own connections: COPY writes the rows (far cheaper per row than an
# INSERT), so this statement first takes their ids in order from the table's sequence, reads
# the transaction's clock (the rows' created_at, and what the client compares run_at to), and
# queues a NOTIFY for each queue that gets a job due now ($2, $3: a queue and its earliest
# run_at, NULL for "now"). All three belong to the caller's transaction: the NOTIFY is
# delivered with the COPY's commit, or not at all.
ALLOCATE_JOBS: Final = (
    """
SELECT ARRAY(SELECT nextval('pgq_jobs_id_seq') FROM generate_series(1, $1::int)) AS ids,
       now() AS now,
       (SELECT count(pg_notify("""
    + _JOBS
    + """, d.queue))
        FROM unnest($2::text[], $3::timestamptz[]) AS d(queue, due)
        WHERE d.due IS NULL OR d.due <= now()) AS notified
"""
)
COPY_JOBS_TABLE: Final = "pgq_jobs"
# The columns COPY writes; a batch of jobs all due now, without tags or metadata, writes
# the first six only and leaves state, scheduled_at, tags and metadata to their defaults.
# created_at always takes its default, now(): the transaction clock ALLOCATE_JOBS read.
COPY_JOBS_COLUMNS: Final = (
    "id",
    "queue",
    "task",
    "args",
    "priority",
    "max_attempts",
    "state",
    "scheduled_at",
    "tags",
    "metadata",
    "limit_key",
)

# The same COPY for synchronous code (psycopg writes the rows in COPY's text format).
COPY_JOBS_PLAIN: Final = (
    "COPY " + COPY_JOBS_TABLE + " (" + ", ".join(COPY_JOBS_COLUMNS[:6]) + ") FROM STDIN"
)
COPY_JOBS_FULL: Final = (
    "COPY " + COPY_JOBS_TABLE + " (" + ", ".join(COPY_JOBS_COLUMNS) + ") FROM STDIN"
)

EXISTING_UNIQUE: Final = (
    """
SELECT """
    + JOB_COLUMNS
    + """
FROM pgq_jobs
WHERE unique_key = ANY($1::text[]) AND pgq_unique_active(state, unique_states)
"""
)

# --------------------------------------------------------------------------- worker hot path

# The worker's claims and outcomes with its ``async_commit`` setting (docs/liveness.md):
# the statement's transaction commits without waiting for its WAL to reach the disk; only
# that transaction (heartbeats, rescues and the callers' enqueues still wait). A test of
# the UPDATE that reads no column of the row: the planner makes it a one-time filter, so
# set_config runs once, before the first row is written, and its setting lasts until the
# statement's transaction ends. A statement that writes no row commits nothing to wait for.
_ASYNC_COMMIT = "\n      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'"

# Claims up to $3 available jobs of queue $1 whose task the producer registered ($2), in
# priority then schedule order, unless the queue (or '*') is paused. SKIP LOCKED lets many
# producers claim side by side. Each claim draws the attempt's fencing token. The deadline
# comes from the task's timeout ($5, parallel to $2) for the rescuer of hung jobs; a job
# enqueued without max_attempts takes the task's ($6). Times are the statement's clock:
# after the queue's lock in a limited claim, the same as now() in a claim of its own.
_CLAIM_WITH = """
WITH locked AS (
    SELECT id AS locked_id FROM pgq_jobs
    WHERE state = 'available' AND queue = $1 AND task = ANY($2::text[])
      AND NOT EXISTS (SELECT 1 FROM pgq_queues
                      WHERE name IN ($1, '*')
                        AND """


# The locked rows are updated through the primary key (= ANY of an array: a join would let
# the planner hash the whole table, finished jobs included, once the table holds some tens of
# thousands of rows: 6 of a 500-job claim's 11 ms at 30,000), and returned in claim order.
def _claim_set(commit: str) -> str:
    return (
        """, claimed AS (
    UPDATE pgq_jobs j
    SET state = 'running', attempt = j.attempt + 1, attempted_at = statement_timestamp(),
        producer_id = $4, attempt_token = gen_random_uuid(), attempted_by = $7,
        deadline_at = statement_timestamp() + make_interval(
            secs => ($5::float8[])[array_position($2::text[], j.task)]),
        max_attempts = COALESCE(j.max_attempts, ($6::int[])[array_position($2::text[], j.task)])
    WHERE j.id = ANY(ARRAY(SELECT locked_id FROM locked))"""
        + commit
        + """
    RETURNING j.*
)
SELECT"""
        + CLAIM_COLUMNS
        + """FROM claimed
WINDOW claim_order AS (ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id)
ORDER BY claimed.priority DESC, claimed.scheduled_at, claimed.id
"""
    )


_CLAIM_LOCK = """)
    ORDER BY priority DESC, scheduled_at, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
"""

# The claim of a queue without limits. A queue that is paused, or that has limits (which only
# CLAIM_LIMITED, under the queue's lock, may claim from), yields nothing here: a producer
# that has not yet heard of new limits does not claim past them.
_UNLIMITED = (
    "(paused_at IS NOT NULL OR concurrency IS NOT NULL OR rate_count IS NOT NULL"
    " OR key_concurrency IS NOT NULL OR key_rate_count IS NOT NULL)"
)
CLAIM_JOBS: Final = _CLAIM_WITH + _UNLIMITED + _CLAIM_LOCK + _claim_set("")
CLAIM_JOBS_ASYNC: Final = _CLAIM_WITH + _UNLIMITED + _CLAIM_LOCK + _claim_set(_ASYNC_COMMIT)

# The claim of a limited queue, under the queue's row lock (see below): paused stops it.
_PAUSED = "paused_at IS NOT NULL"
CLAIM_LIMITED: Final = _CLAIM_WITH + _PAUSED + _CLAIM_LOCK + _claim_set("")
CLAIM_LIMITED_ASYNC: Final = _CLAIM_WITH + _PAUSED + _CLAIM_LOCK + _claim_set(_ASYNC_COMMIT)

# Flow control (docs/flow-control.md). A limited queue is claimed in one transaction that
# first locks the queue's row (the serialisation point: one claimer of that queue at a
# time, across all workers), then reads, in a statement of its own and so with a snapshot
# taken after the lock, how many of its jobs run and how many started within the rate's
# window, then claims at most what both leave (CLAIM_LIMITED) and logs the starts.
QUEUE_LIMITS: Final = """
SELECT concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues WHERE name = $1
"""

LOCK_LIMITED_QUEUE: Final = """
SELECT concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues WHERE name = $1 FOR UPDATE
"""

# Running jobs are counted producer by producer through the partial index of running jobs,
# which is keyed by producer and has no queue (a count by queue would read every running job
# of every queue, under the queue's lock): a skip scan finds each producer that has running
# jobs (one index probe each), and the jobs of those that are the queue's, or whose row is
# gone (a row deleted by hand, or at a worker's stop), are counted with the queue's filter.
# The same jobs as a count by queue, without reading the other queues' producers' jobs. The
# sub-select per producer keeps the planner from joining all running jobs by hash, which
# statistics taken while few jobs ran would invite.
_PRODUCERS_RUNNING = """producers_running(id) AS (
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
)"""

LIMIT_USAGE: Final = (
    "WITH RECURSIVE "
    + _PRODUCERS_RUNNING
    + """
SELECT (SELECT COALESCE(sum((SELECT count(*) FROM pgq_jobs j
                             WHERE j.producer_id = c.id AND j.state = 'running'
                               AND j.queue = $1)), 0)
        FROM counted c)::int AS running,
       (SELECT count(*) FROM pgq_rate_log
        WHERE queue = $1 AND started_at > statement_timestamp() - make_interval(secs => $2)
       )::int AS started
"""
)

# Per-key limits: every key with available jobs, found by a skip scan of the key index
# (one index probe per key, however many jobs each holds), with its running jobs and its
# starts within the key rate's window ($2 seconds; counted per key through the log's key
# index, for the waiting keys only); then the jobs without a key, as one more key (NULL).
KEY_USAGE: Final = (
    """
WITH RECURSIVE keys(k) AS (
    (SELECT limit_key FROM pgq_jobs
     WHERE queue = $1 AND state = 'available' AND limit_key IS NOT NULL
     ORDER BY limit_key LIMIT 1)
    UNION ALL
    SELECT (SELECT limit_key FROM pgq_jobs
            WHERE queue = $1 AND state = 'available' AND limit_key > keys.k
            ORDER BY limit_key LIMIT 1)
    FROM keys WHERE keys.k IS NOT NULL
), """
    + _PRODUCERS_RUNNING
    + """, running AS (
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
       ELSE 0 END
"""
)

# The claim of a queue with per-key limits, under the queue's row lock: for each key with
# room ($8, its room $9, in the same order) its next jobs, at most its room each (through
# the key index); for the jobs without a key, at most $10, looked for among the queue's
# first $11 available jobs in claim order (the fetch index: keyless jobs have no index of
# their own, and an unbounded search would read a whole keyed backlog); of all these
# candidates, the first $3 by priority then schedule are locked and claimed. Only those
# are locked (a row lock writes WAL), and a row locked by someone else (a dependent's
# enqueue still open, an operator) is skipped, as in every claim.
_CLAIM_KEYED_LOCK = """
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
"""
CLAIM_KEYED: Final = _CLAIM_KEYED_LOCK + _claim_set("")
CLAIM_KEYED_ASYNC: Final = _CLAIM_KEYED_LOCK + _claim_set(_ASYNC_COMMIT)

# The claimed starts (with their keys), and the log's entries older than the longest
# window ($3 seconds) dropped.
LOG_STARTS: Final = """
WITH gone AS (
    DELETE FROM pgq_rate_log
    WHERE queue = $1 AND started_at <= statement_timestamp() - make_interval(secs => $3)
)
INSERT INTO pgq_rate_log (queue, limit_key, started_at)
SELECT $1, k, statement_timestamp() FROM unnest($2::text[]) AS k
"""

# Limits of a queue (NULL: none), set live; the queue's workers are told.
SET_QUEUE_LIMITS: Final = (
    """
WITH upsert AS (
    INSERT INTO pgq_queues (name, concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (name) DO UPDATE
    SET concurrency = $2, rate_count = $3, rate_period_s = $4,
        key_concurrency = $5, key_rate_count = $6, key_rate_period_s = $7
    RETURNING name
)
SELECT pg_notify("""
    + _CONTROL
    + """, json_build_object('kind', 'limits', 'queue', name)::text) FROM upsert
"""
)

# The fence's test of a job's state in every write or read of jobs by id: a running job,
# in a form the planner cannot match to the partial index of running jobs. It proves an
# index's predicate from comparisons with constants, not from a sub-select's value; given
# the index, a statement fenced by id, token and state = 'running' reads every running job
# (and hashes them) instead of its own rows by primary key whenever the statistics were
# taken while fewer jobs ran: 134 ms against 2 ms for 100 outcomes with 100,000 jobs
# running, 84 ms against 0.3 ms for one.
_IS_RUNNING = "state = (SELECT 'running'::pgq_job_state)"


# A lock held elsewhere never holds up a batch of outcomes (an application transaction that
# enqueued a dependent of a job, or cancels it, holds its row until it ends). The outcome
# statements take two last parameters: how long they may wait for a row lock ($w below, a
# lock_timeout such as '50ms' set for the statement's own transaction; NULL leaves the
# setting as it is), and whether to skip locked rows ($k). The worker writes a batch as it
# is with a short wait first (the common case pays nothing); a batch that gave up is
# written again skipping: it first locks its rows, passing over those locked now, and
# returns their ids apart from those the fence rejected. Each passed over is then written
# on its own, after waiting for its row (LOCK_JOB in the same transaction), so that it, not
# a rescue, gets the row when it frees.


def _lock_batch(k: str) -> str:
    return (
        """locked AS MATERIALIZED (
    SELECT l.id FROM unnest($1::bigint[]) AS l(id)
    WHERE """
        + k
        + """
      AND (SELECT j.id FROM pgq_jobs j WHERE j.id = l.id FOR NO KEY UPDATE SKIP LOCKED)
          IS NOT NULL
)"""
    )


def _locked_fence(k: str, w: str) -> str:
    return (
        "(NOT "
        + k
        + """ OR j.id IN (SELECT id FROM locked))
      AND (SELECT set_config('lock_timeout', COALESCE("""
        + w
        + """, current_setting('lock_timeout')), true)) IS NOT NULL"""
    )


def _passed_over_rows(k: str) -> str:
    return (
        """
UNION ALL
SELECT i, 0, 0, NULL FROM unnest($1::bigint[]) AS i WHERE """
        + _not_locked(k)
        + "\n"
    )


def _not_locked(k: str) -> str:
    return (
        k
        + """ AND i NOT IN (SELECT id FROM locked)
    AND EXISTS (SELECT 1 FROM pgq_jobs WHERE id = i)"""
    )


# What the batch of outcomes wrote, a row per job; jobs made available again wake their
# queue, finished ones are announced for client.wait(), at most 500 ids per notification.
_OUTCOME_ROWS = (
    """SELECT id,
       (SELECT count(pg_notify("""
    + _JOBS
    + """, q.queue))
        FROM (SELECT DISTINCT queue FROM upd WHERE state = 'available') q) AS notified,
       (SELECT count(pg_notify("""
    + _DONE
    + """, c.ids))
        FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER ()) / 500 AS chunk FROM upd
                    WHERE state IN """
    + _FINAL
    + """) f
              GROUP BY chunk) c) AS done,
       state::text AS state
FROM upd"""
)


# Writes a batch of outcomes. Each row is fenced by (id, attempt_token, 'running'): an
# attempt whose job was rescued or re-claimed since changes nothing. A job whose cancellation
# was requested while it ran never runs again: an outcome that would make it retryable or
# available (a failure, a snooze, a shutdown hand-back) ends it cancelled instead. Jobs made
# available again wake their queue; finished ones are announced for client.wait(). A row per
# job written, then one per job passed over (locked), with a NULL state.
def _complete_jobs(running: str) -> str:
    return (
        """
WITH """
        + _lock_batch("$8::bool")
        + """, u AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::float8[], $5::text[],
                         $6::text[], $7::int[])
         AS u(id, token, state, delay_s, error, result, attempt_delta)
), upd AS (
    UPDATE pgq_jobs j
    SET state = (CASE WHEN j.cancel_requested_at IS NOT NULL
                           AND u.state IN ('retryable', 'available')
                      THEN 'cancelled' ELSE u.state END)::pgq_job_state,
        finalized_at = CASE WHEN u.state IN """
        + _FINAL
        + """ OR j.cancel_requested_at IS NOT NULL
                            THEN now() END,
        scheduled_at = CASE WHEN u.delay_s IS NULL THEN j.scheduled_at
                            ELSE now() + make_interval(secs => u.delay_s) END,
        attempt = j.attempt + u.attempt_delta,
        errors = j.errors
            || CASE WHEN u.error IS NULL THEN '[]'::jsonb
                    ELSE jsonb_build_array(u.error::jsonb || jsonb_build_object(
                             'at', now(), 'started_at', j.attempted_at,
                             'producer_id', j.producer_id, 'worker_name', j.attempted_by))
               END
            || CASE WHEN j.cancel_requested_at IS NOT NULL
                         AND u.state IN ('retryable', 'available')
                    THEN jsonb_build_array(jsonb_build_object(
                             'attempt', j.attempt, 'kind', 'cancel',
                             'message', 'cancelled by request', 'traceback', NULL,
                             'at', now()))
                    ELSE '[]'::jsonb END,
        result = u.result::jsonb,
        deadline_at = NULL
    FROM u
    WHERE j.id = u.id AND j.attempt_token = u.token AND """
        + _locked_fence("$8::bool", "$9::text")
        + """
      AND j."""
        + running
        + """
    RETURNING j.id, j.queue, j.state
)
"""
        + _OUTCOME_ROWS
        + _passed_over_rows("$8::bool")
    )


COMPLETE_JOBS: Final = _complete_jobs(_IS_RUNNING)
COMPLETE_JOBS_ASYNC: Final = _complete_jobs(_IS_RUNNING + _ASYNC_COMMIT)


# The common outcome, lean: completed, with an optional result, fenced like the others. The
# ids of finished jobs are announced for client.wait() (the last parameter: comma-joined
# chunks built by the caller; a spurious id is harmless, waiters re-read the job). One row:
# the ids written in one array, and those passed over (locked) in another; nothing is
# announced when none was written.
def _successes_set(k: str) -> str:
    return (
        """
WITH """
        + _lock_batch(k)
        + """, upd AS (
    UPDATE pgq_jobs j
    SET state = 'completed', finalized_at = now(), deadline_at = NULL, result = """
    )


def _successes_fence(running: str, k: str, w: str) -> str:
    return (
        """
    WHERE j.id = u.id AND j.attempt_token = u.token AND """
        + _locked_fence(k, w)
        + """
      AND j."""
        + running
        + """
    RETURNING j.id
)
SELECT w.ids, ARRAY(SELECT i FROM unnest($1::bigint[]) AS i WHERE """
        + _not_locked(k)
        + """) AS passed_over,
       CASE WHEN cardinality(w.ids) > 0 THEN (SELECT count(pg_notify("""
        + _DONE
        + """, c)) FROM unnest("""
    )


_SUCCESSES_END = """::text[]) c) END AS done
FROM (SELECT ARRAY(SELECT id FROM upd) AS ids) w
"""


def _complete_successes(running: str) -> str:
    return (
        _successes_set("$5::bool")
        + """u.result::jsonb
    FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS u(id, token, result)"""
        + _successes_fence(running, "$5::bool", "$6::text")
        + "$4"
        + _SUCCESSES_END
    )


COMPLETE_SUCCESSES: Final = _complete_successes(_IS_RUNNING)
COMPLETE_SUCCESSES_ASYNC: Final = _complete_successes(_IS_RUNNING + _ASYNC_COMMIT)


# The same when no job of the batch returned a result (most): no array of NULLs to send.
def _complete_successes_no_result(running: str) -> str:
    return (
        _successes_set("$4::bool")
        + """NULL
    FROM unnest($1::bigint[], $2::uuid[]) AS u(id, token)"""
        + _successes_fence(running, "$4::bool", "$5::text")
        + "$3"
        + _SUCCESSES_END
    )


COMPLETE_SUCCESSES_NO_RESULT: Final = _complete_successes_no_result(_IS_RUNNING)
COMPLETE_SUCCESSES_NO_RESULT_ASYNC: Final = _complete_successes_no_result(
    _IS_RUNNING + _ASYNC_COMMIT
)


# The last resort for an outcome the database refused in every other form: the attempt
# failed, with $3 (an error entry) saying why; retried with backoff, or discarded when it was
# the last attempt, or cancelled when that was requested. Fenced like the others.
def _fail_attempt(running: str) -> str:
    return (
        """
WITH upd AS (
    UPDATE pgq_jobs j
    SET state = (CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN j.attempt >= j.max_attempts THEN 'discarded'
                      ELSE 'retryable' END)::pgq_job_state,
        finalized_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                                 OR j.attempt >= j.max_attempts THEN now() END,
        scheduled_at = now() + make_interval(secs => least(3600, 2 ^ greatest(j.attempt - 1, 0))),
        errors = j.errors || jsonb_build_array($3::jsonb || jsonb_build_object(
            'at', now(), 'started_at', j.attempted_at, 'producer_id', j.producer_id,
            'worker_name', j.attempted_by)),
        result = NULL,
        deadline_at = NULL
    WHERE j.id = $1 AND j.attempt_token = $2 AND j."""
        + running
        + """
    RETURNING j.id, j.state
)
SELECT id, CASE WHEN state <> 'retryable' THEN pg_notify("""
        + _DONE
        + """, id::text)::text END AS done
FROM upd
"""
    )


FAIL_ATTEMPT: Final = _fail_attempt(_IS_RUNNING)
FAIL_ATTEMPT_ASYNC: Final = _fail_attempt(_IS_RUNNING + _ASYNC_COMMIT)

# An outcome the task writes in its own transaction (ctx.complete(connection=...) and its
# siblings): fenced like the worker's, and replacing the attempt's token with one only the
# task knows ($3), so the worker can tell afterwards whether that transaction committed
# (SETTLED_BY). The row stays locked until the caller's transaction ends.
SETTLE_ATTEMPT: Final = (
    """
WITH upd AS (
    UPDATE pgq_jobs j
    SET state = (CASE WHEN j.cancel_requested_at IS NOT NULL
                           AND $4::text IN ('retryable', 'available')
                      THEN 'cancelled' ELSE $4::text END)::pgq_job_state,
        finalized_at = CASE WHEN $4::text IN """
    + _FINAL
    + """ OR j.cancel_requested_at IS NOT NULL
                            THEN now() END,
        scheduled_at = CASE WHEN $5::float8 IS NULL THEN j.scheduled_at
                            ELSE now() + make_interval(secs => $5::float8) END,
        attempt = j.attempt + $8::int,
        errors = j.errors
            || CASE WHEN $6::text IS NULL THEN '[]'::jsonb
                    ELSE jsonb_build_array($6::jsonb || jsonb_build_object(
                             'at', now(), 'started_at', j.attempted_at,
                             'producer_id', j.producer_id, 'worker_name', j.attempted_by)) END,
        result = $7::jsonb,
        deadline_at = NULL,
        attempt_token = $3::uuid
    WHERE j.id = $1 AND j.attempt_token = $2::uuid AND j."""
    + _IS_RUNNING
    + """
    RETURNING j.id, j.queue, j.state
)
SELECT state::text AS state,
       CASE WHEN state IN """
    + _FINAL
    + """ THEN pg_notify("""
    + _DONE
    + """, id::text)::text
            WHEN state = 'available' THEN pg_notify("""
    + _JOBS
    + """, queue)::text END AS notified
FROM upd
"""
)

# Waits for job $1's row, locked elsewhere, and holds it for the outcome written next in the
# same transaction.
LOCK_JOB: Final = "SELECT id FROM pgq_jobs WHERE id = $1 FOR NO KEY UPDATE"

# Which of the tokens $2 (those a task settled its attempt with) job $1 holds: a transaction
# that settled it committed.
SETTLED_BY: Final = """
SELECT attempt_token FROM pgq_jobs WHERE id = $1 AND attempt_token = ANY($2::uuid[])
"""

# Burst mode: is anything left that this producer could claim now (a paused queue's jobs
# cannot be claimed: a burst worker does not wait for its resumption), and is anything of
# its queue running under a producer that is gone, or silent past its own fencing bound ($3
# seconds for a row that recorded none)? Such jobs will be rescued and become claimable: a burst worker waits for them.
# Each question reads one partial index in its order (LIMIT 1 sub-selects, not EXISTS, which
# would drop the ORDER BY): one OR over the states matches no partial index, and right
# after a drain the statistics still count the jobs as available, so the planner chose a
# scan of the whole table, finished jobs included (24 ms at 100,000 rows, growing with them).
RUNNABLE_LEFT: Final = """
SELECT ((SELECT 1 FROM pgq_jobs
         WHERE state = 'available' AND queue = $1 AND task = ANY($2::text[])
         ORDER BY priority DESC, scheduled_at, id LIMIT 1) IS NOT NULL
        OR (SELECT 1 FROM pgq_jobs
            WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
              AND queue = $1 AND task = ANY($2::text[])
            ORDER BY scheduled_at LIMIT 1) IS NOT NULL
       ) AND NOT p.paused AS runnable,
       EXISTS (
           SELECT 1 FROM pgq_jobs j LEFT JOIN pgq_producers pr ON pr.id = j.producer_id
           WHERE j.state = 'running' AND j.queue = $1 AND j.task = ANY($2::text[])
             AND (pr.id IS NULL
                  OR pr.heartbeat_at < now() - make_interval(secs => COALESCE(pr.fence_after_s, $3))
                  OR (pr.worker_name = $4 AND pr.id <> ALL($5::uuid[])
                      AND pr.heartbeat_at < $6))
       ) AND NOT p.paused AS orphaned
FROM (SELECT EXISTS (SELECT 1 FROM pgq_queues
                     WHERE name IN ($1, '*') AND paused_at IS NOT NULL) AS paused) p
"""

# Running jobs (of this worker) whose cancellation was requested: the poll fallback.
CANCEL_REQUESTED: Final = (
    """
SELECT id FROM pgq_jobs
WHERE id = ANY($1::bigint[]) AND cancel_requested_at IS NOT NULL AND """
    + _IS_RUNNING
)

# --------------------------------------------------------------------------- producers

REGISTER_PRODUCERS: Final = """
INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency, fence_after_s,
                           stale_after_s, rescue_grace_s, tasks)
SELECT u.id, $2, $3, u.queue, u.concurrency, $6, $7, $8, $9::text[]
FROM unnest($1::uuid[], $4::text[], $5::int[]) AS u(id, queue, concurrency)
"""

# One heartbeat for every producer of a worker, on the database clock. Rows that come back
# are alive; a producer whose row is missing was judged dead (or deleted) by someone else.
# Returns each row still there, with the seconds since its previous stamp on the database
# clock (read from the row as it was before this update: the same row, self-joined).
HEARTBEAT: Final = """
UPDATE pgq_producers p
SET heartbeat_at = now(), running = u.running, healthy = u.healthy, claimed = u.claimed,
    completed = u.completed, failed = u.failed, rejected_outcomes = u.rejected
FROM unnest($1::uuid[], $2::int[], $3::bool[], $4::bigint[], $5::bigint[], $6::bigint[],
            $7::bigint[]) AS u(id, running, healthy, claimed, completed, failed, rejected)
JOIN pgq_producers o ON o.id = u.id
WHERE p.id = u.id
RETURNING p.id, extract(epoch FROM now() - o.heartbeat_at)::float8 AS silent_s
"""

# Moving the jobs running under producers $2 to another producer, passing over rows locked
# now against an update (a task settling its own job in its transaction, an outcome being
# written; a foreign key's share lock does not count): the
# statement never waits, so it cannot outlive the heartbeat that sent it and commit unseen.
# Returns each job it moved (adopted) and each it passed over, still under $2, to be moved
# later.
_MOVE_RUNNING_TO = """moved AS (
    UPDATE pgq_jobs SET producer_id = """
_MOVE_RUNNING_END = """
    WHERE id IN (SELECT id FROM pgq_jobs
                 WHERE producer_id = ANY($2::uuid[]) AND state = 'running'
                 FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING id
)
SELECT id, true AS adopted FROM moved
UNION ALL
SELECT id, false FROM pgq_jobs
WHERE producer_id = ANY($2::uuid[]) AND state = 'running' AND id NOT IN (SELECT id FROM moved)
"""

# A producer whose row vanished comes back under a new id $1 and adopts every job still
# running under the old one ($2: the old id, the ids it still holds from earlier
# re-registrations, and the new one) when its row was deleted by hand: those
# it runs, those whose outcome is still on its way, and those of a claim committed before
# this statement whose rows it has not read yet. Jobs that peers already rescued are not
# 'running' under the old id any more and stay theirs. Adoption changes the producer
# (liveness), never the attempt's token (fencing). A producer tries again under the same
# new id (a try that timed out may yet have committed), so the row may exist already, and
# the jobs that try moved are reported adopted again. The old ids get a row again too
# (concurrency 0), beaten with the new one's until nothing is left under them: without it,
# a job passed over here (locked) or claimed under an old id later would be the job of a
# missing producer, which the rescuer takes once it started stale_after ago.
REREGISTER_PRODUCER: Final = (
    """
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
), """
    + _MOVE_RUNNING_TO
    + "(SELECT id FROM ins)"
    + _MOVE_RUNNING_END
)

# Moves the jobs still running under a re-registered producer's former ids $2 to its id $1:
# those of a claim that was in flight under a former id when the producer re-registered,
# and those passed over then.
ADOPT_JOBS: Final = "WITH " + _MOVE_RUNNING_TO + "$1" + _MOVE_RUNNING_END

# The jobs running under producers $1, as a worker checks them against the jobs it runs
# (a claim whose reply was lost leaves jobs there that nobody runs). One probe each of the
# partial index of running jobs; no wide column read.
RUNNING_UNDER: Final = (
    """
SELECT id, attempt_token, attempt, queue, task, producer_id,
       COALESCE(max_attempts, """
    + _DEFAULT_MAX_ATTEMPTS
    + """) AS max_attempts
FROM pgq_jobs
WHERE producer_id = ANY($1::uuid[]) AND state = 'running'
"""
)

# How often each of the jobs $1 was handed back before because its claim's reply was lost
# (its error entries of that kind): read for the strays found, not for every running job.
LOST_REPLIES: Final = """
SELECT id, jsonb_array_length(jsonb_path_query_array(
           errors, '$[*] ? (@.kind == "lost_reply")')) AS n
FROM pgq_jobs WHERE id = ANY($1::bigint[])
"""

DELETE_PRODUCERS: Final = "DELETE FROM pgq_producers WHERE id = ANY($1::uuid[])"

# A re-registered producer lets its former ids $1 go: their rows, once no job runs under
# them (one that does keeps its row, which then goes stale, and the rescuer takes the job).
RELEASE_PRODUCERS: Final = """
DELETE FROM pgq_producers p
WHERE p.id = ANY($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM pgq_jobs j WHERE j.producer_id = p.id AND j.state = 'running')
"""

LIST_PRODUCERS: Final = """
SELECT p.id, p.worker_name, p.queue, p.started_at, p.heartbeat_at,
       extract(epoch FROM now() - p.heartbeat_at)::float8 AS heartbeat_age_s,
       p.concurrency, p.running, p.healthy, p.claimed, p.completed, p.failed,
       p.rejected_outcomes, p.fence_after_s, p.stale_after_s,
       (l.leader_id IS NOT NULL) AS is_leader, p.worker_id
FROM pgq_producers p
LEFT JOIN pgq_leader l ON l.name = 'default' AND l.leader_id = p.worker_id
     AND l.expires_at > now()
ORDER BY p.worker_name, p.queue
"""

# Producers of queue $1 that are live, each judged by its own stale_after ($2 seconds for a
# row that recorded none): does anyone serve it now? (Not the rows a re-registered producer
# keeps for its former ids, of concurrency 0.)
LIVE_PRODUCERS: Final = """
SELECT count(*)::int AS n FROM pgq_producers
WHERE (queue = $1 OR $1 = '*') AND concurrency > 0
  AND heartbeat_at > now() - make_interval(secs => COALESCE(stale_after_s, $2))
"""

CURRENT_LEADER: Final = """
SELECT leader_id, worker_name, elected_at, expires_at,
       extract(epoch FROM expires_at - now())::float8 AS expires_in_s
FROM pgq_leader WHERE name = 'default' AND expires_at > now()
"""

# --------------------------------------------------------------------------- leader

# Take the lease if it is free or expired, or renew it if it is ours. A row comes back
# only when we hold it; its expiry is on the database clock.
ACQUIRE_LEADERSHIP: Final = """
INSERT INTO pgq_leader AS l (name, leader_id, worker_name, elected_at, expires_at)
VALUES ('default', $1, $2, now(), now() + make_interval(secs => $3))
ON CONFLICT (name) DO UPDATE
SET leader_id = EXCLUDED.leader_id,
    worker_name = EXCLUDED.worker_name,
    elected_at = CASE WHEN l.leader_id = EXCLUDED.leader_id THEN l.elected_at
                      ELSE now() END,
    expires_at = EXCLUDED.expires_at
WHERE l.leader_id = EXCLUDED.leader_id OR l.expires_at < now()
RETURNING leader_id
"""

RESIGN_LEADERSHIP: Final = (
    """
WITH gone AS (
    DELETE FROM pgq_leader WHERE name = 'default' AND leader_id = $1 RETURNING leader_id
)
SELECT pg_notify("""
    + _LEADER
    + """, 'resigned') FROM gone
"""
)

# --------------------------------------------------------------------------- maintenance

DATABASE_NOW: Final = "SELECT now()"

# Makes due scheduled and retryable jobs available, in batches, and wakes their queues.
PROMOTE_DUE: Final = (
    """
WITH due AS (
    SELECT id FROM pgq_jobs
    WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE pgq_jobs j SET state = 'available' FROM due WHERE j.id = due.id RETURNING j.queue
)
SELECT g.queue, g.n, pg_notify("""
    + _JOBS
    + """, g.queue)::text AS notified
FROM (SELECT queue, count(*)::int AS n FROM upd GROUP BY queue) g
"""
)

# The rescue, judged in SQL on the database clock so any leader can judge any peer, each by
# the bounds it recorded (a leader's own settings may be shorter: a rolling deploy, a fleet
# of mixed workers). A running job is rescued when its producer's heartbeat is older than
# that producer's own stale_after, when its producer's row is gone and the job started more
# than $2 seconds (the leader's stale_after) ago, or when it overran its own deadline by
# more than its producer's rescue_grace (hung under a live producer). A row of older code,
# without recorded bounds, is judged by the leader's $2 and $3. The leader's lease is
# checked in the same statement: a deposed leader rescues nothing. SKIP LOCKED passes over a
# job whose outcome is being written right now; re-checking the locked row's state keeps a
# job that just completed out. Attempts run out -> discarded, so a poison job cannot loop. A
# job whose cancellation was requested ends cancelled here and never runs again.
# The write of a rescue, shared by the leader's and a restarted worker's: the candidates CTE
# before it names the jobs (id, attempt, max_attempts, producer_id, worker_name, cancel,
# attempted_at, reason, silent_s).
# A job's rescues so far, as its metadata counts them; a value pgq did not write there (not
# a number, negative, huge) counts as 0 or is capped, never fails the rescue of every job.
_RESCUES_SO_FAR: Final = (
    "(CASE WHEN jsonb_typeof(j.metadata -> 'pgq_rescues') = 'number'"
    " THEN least(greatest((j.metadata ->> 'pgq_rescues')::numeric, 0), 1000000)::int"
    " ELSE 0 END)"
)
_RESCUE_UPDATE: Final = (
    """
UPDATE pgq_jobs j
SET state = (CASE WHEN c.cancel THEN 'cancelled'
                  WHEN c.attempt >= c.max_attempts THEN 'discarded'
                  -- A first rescue applies no backoff: the job is claimable at once, by any
                  -- worker, without waiting for a promotion.
                  WHEN """
    + _RESCUES_SO_FAR
    + """ = 0 THEN 'available'
                  ELSE 'retryable' END)::pgq_job_state,
    finalized_at = CASE WHEN c.cancel OR c.attempt >= c.max_attempts THEN now() END,
    -- The first rescue retries at once (the job did not fail, its worker did); repeated
    -- rescues of the same job back off: 0, 1, 3, 7 ... seconds, capped at an hour. Counted
    -- by its rescues so far, not its attempts: earlier attempts that failed on their own
    -- say nothing about workers dying under it.
    scheduled_at = now() + make_interval(
        secs => least(3600, 2 ^ least("""
    + _RESCUES_SO_FAR
    + """, 12) - 1)
                * (0.9 + random() * 0.2)),
    deadline_at = NULL,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', c.attempt,
        'kind', 'rescued',
        'reason', c.reason,
        'message', format('rescued: %s (producer %s, worker %s, silent for %ss)%s', c.reason,
                          c.producer_id, COALESCE(c.worker_name, 'unknown'),
                          round(c.silent_s::numeric, 1),
                          CASE WHEN c.cancel THEN '; cancelled, as requested' ELSE '' END),
        'producer_id', c.producer_id,
        'worker_name', c.worker_name,
        'silent_s', round(c.silent_s::numeric, 3),
        'traceback', NULL,
        'started_at', c.attempted_at,
        'rescue', current_setting('pgq.rescue', true),
        'at', now())),
    metadata = jsonb_set(j.metadata, '{pgq_rescues}',
                         to_jsonb("""
    + _RESCUES_SO_FAR
    + """ + 1))
FROM candidates c
WHERE j.id = c.id
RETURNING j.id, j.state::text AS state, c.reason, c.worker_name, c.silent_s, j.queue, j.task,
          j.attempt, pg_current_xact_id()::text AS xact,
          CASE WHEN j.state = 'available' THEN pg_notify("""
    + _JOBS
    + """, j.queue)::text
               WHEN j.state <> 'retryable' THEN pg_notify("""
    + _DONE
    + """, j.id::text)::text END AS done
"""
)


RESCUE_JOBS: Final = (
    """
WITH lease AS (
    SELECT 1 FROM pgq_leader
    WHERE name = 'default' AND leader_id = $1 AND expires_at > now()
), candidates AS (
    SELECT j.id, j.attempt, COALESCE(j.max_attempts, """
    + _DEFAULT_MAX_ATTEMPTS
    + """) AS max_attempts,
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
    WHERE j.state = 'running' AND EXISTS (SELECT 1 FROM lease)
      AND ((p.id IS NULL AND j.attempted_at < now() - make_interval(secs => $2))
           OR p.heartbeat_at < now() - make_interval(secs => COALESCE(p.stale_after_s, $2))
           OR j.deadline_at < now() - make_interval(secs => COALESCE(p.rescue_grace_s, $3)))
    ORDER BY j.id
    LIMIT $4
    FOR UPDATE OF j SKIP LOCKED
)
"""
    + _RESCUE_UPDATE
)


# A rescue runs in a transaction of its own, which first bounds how long it may sit idle
# (its client frozen between the rows and the commit would otherwise hold up to a batch of
# jobs, and a predecessor's producer rows, locked indefinitely), and names the rescue with a
# token $1 its client drew, which each of its error entries records ('rescue').
RESCUE_BEGIN: Final = """
SELECT set_config('idle_in_transaction_session_timeout', '5s', true),
       set_config('pgq.rescue', $1::text, true)
"""

# Whether transaction $1 (as pg_current_xact_id() gave it, in text) committed, aborted, or
# is still in progress; NULL once too old to tell.
XACT_STATUS: Final = "SELECT pg_xact_status($1::text::xid8)"

# The id of the transaction open on this connection (given one if it has none yet), in text.
CURRENT_XACT: Final = "SELECT pg_current_xact_id()::text"

# Whether the write named $2 (a rescue; with $3 'lost_reply', a stray's hand-back) is in
# the jobs $1. (Not by its transaction's id: after a crash or a failover the server may
# give the same id to another transaction, even another rescue of the same job.)
RESCUE_LANDED: Final = """
SELECT EXISTS (SELECT 1 FROM pgq_jobs
               WHERE id = ANY($1::bigint[])
                 AND errors @> jsonb_build_array(jsonb_build_object('kind', $3::text,
                                                                    'rescue', $2::text)))
"""

# A worker restarted under its stable name: the rows of its predecessor (same name, another
# id), with their heartbeat and fencing bound, so it can rescue their jobs as soon as that
# bound has passed rather than after stale_after.
SAME_NAME_PRODUCERS: Final = """
SELECT id, heartbeat_at, fence_after_s,
       extract(epoch FROM now() - heartbeat_at)::float8 AS age_s
FROM pgq_producers
WHERE worker_name = $1 AND id <> ALL($2::uuid[])
"""

# Rescues the running jobs of the producers $1 whose heartbeat is older than their own fencing
# bound plus $2 seconds (the heartbeat's round trip: a worker's own clock starts when it
# sends), judged again here on the database clock with the producer rows locked: a
# heartbeat that committed first is seen, one that comes later waits for this statement. A
# live process of the same name, beating, keeps its jobs.
RESCUE_PREDECESSOR: Final = (
    """
WITH predecessors AS (
    SELECT p.id, p.worker_name, p.heartbeat_at FROM pgq_producers p
    WHERE p.id = ANY($1::uuid[])
      AND p.heartbeat_at < now() - make_interval(secs => p.fence_after_s + $2)
    FOR UPDATE
), candidates AS (
    SELECT j.id, j.attempt, COALESCE(j.max_attempts, """
    + _DEFAULT_MAX_ATTEMPTS
    + """) AS max_attempts,
           j.producer_id, p.worker_name, j.cancel_requested_at IS NOT NULL AS cancel,
           j.attempted_at, 'worker restarted' AS reason,
           extract(epoch FROM now() - p.heartbeat_at)::float8 AS silent_s
    FROM pgq_jobs j
    JOIN predecessors p ON p.id = j.producer_id
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
)
"""
    + _RESCUE_UPDATE
)

# The predecessor's rows once their jobs are rescued.
DELETE_PREDECESSOR: Final = """
DELETE FROM pgq_producers p
WHERE p.id = ANY($1::uuid[])
  AND p.heartbeat_at < now() - make_interval(secs => p.fence_after_s + $2)
  AND NOT EXISTS (SELECT 1 FROM pgq_jobs j WHERE j.producer_id = p.id AND j.state = 'running')
"""

# Tests only (pgq.testing.drain): scheduled and retryable jobs of a queue's tasks become due
# now, as if their time had come.
MAKE_DUE_NOW: Final = """
WITH due AS (
    UPDATE pgq_jobs SET scheduled_at = now()
    WHERE state IN ('scheduled', 'retryable') AND queue = $1 AND task = ANY($2::text[])
      AND scheduled_at > now()
    RETURNING 1
)
SELECT count(*)::int AS n FROM due
"""

# Producer rows silent for longer than both the leader's reap_after ($1) and their own
# stale_after (by then a live producer has certainly stopped claiming), once none of their
# jobs is running (the rescuer got to them first), are deleted.
REAP_PRODUCERS: Final = """
DELETE FROM pgq_producers p
WHERE p.heartbeat_at < now() - make_interval(secs => greatest($1, p.stale_after_s))
  AND NOT EXISTS (SELECT 1 FROM pgq_jobs j WHERE j.producer_id = p.id AND j.state = 'running')
RETURNING p.id, p.worker_name, p.queue
"""

# Deletes finished jobs of one state older than $2 seconds, $3 at a time: short
# transactions that never hold many locks. SKIP LOCKED keeps out of anyone's way.
DELETE_FINISHED: Final = """
WITH old AS (
    SELECT id FROM pgq_jobs
    WHERE state = $1::text::pgq_job_state AND finalized_at < now() - make_interval(secs => $2)
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pgq_jobs j USING old WHERE j.id = old.id
"""

# The jobs table as the planner sees it: whether its rows were counted and some were alive
# (reltuples: -1 until a VACUUM, ANALYZE or CREATE INDEX counted them), whether it was never
# counted and has grown past $1 pages (planned from its size alone, which misled the claim
# from about 400,000 rows), and whether its columns have statistics (pg_stats shows what
# this role may read, which a worker may).
JOBS_STATISTICS: Final = """
SELECT c.reltuples > 0
           OR (c.reltuples < 0 AND pg_relation_size(c.oid) > $1::bigint * current_setting('block_size')::bigint)
           AS worth_analyzing,
       EXISTS (SELECT 1 FROM pg_stats s
               WHERE s.schemaname = n.nspname AND s.tablename = c.relname) AS analyzed
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = 'pgq_jobs'::regclass
"""

ANALYZE_JOBS: Final = "ANALYZE pgq_jobs"

PERIODIC_LOCK: Final = "SELECT last_slot FROM pgq_periodic WHERE name = $1 FOR UPDATE"

PERIODIC_UPSERT: Final = """
INSERT INTO pgq_periodic (name, last_slot, task, queue, schedule, next_slot, recorded_by)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name) DO UPDATE
SET last_slot = EXCLUDED.last_slot, updated_at = now(), task = EXCLUDED.task,
    queue = EXCLUDED.queue, schedule = EXCLUDED.schedule, next_slot = EXCLUDED.next_slot,
    recorded_by = EXCLUDED.recorded_by
"""

# What a schedule is, refreshed without moving its last slot (another leader moved it).
PERIODIC_DESCRIBE: Final = """
UPDATE pgq_periodic
SET task = $2, queue = $3, schedule = $4, next_slot = $5, recorded_by = $6
WHERE name = $1
"""

LIST_PERIODIC: Final = """
SELECT name, task, queue, schedule, last_slot, next_slot, recorded_by, updated_at
FROM pgq_periodic ORDER BY name
"""

# --------------------------------------------------------------------------- reads

# Databases for tests (pgq.testing). CREATE and DROP DATABASE take no parameters, and run
# outside any transaction or function: the server writes each statement (format's %I
# quotes the names), and the caller runs the text it returns.
DROP_DATABASE: Final = "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', $1::text)"
CREATE_DATABASE: Final = """
SELECT CASE WHEN $2::text IS NULL THEN format('CREATE DATABASE %I', $1::text)
            WHEN current_setting('server_version_num')::int >= 150000
            THEN format('CREATE DATABASE %I TEMPLATE %I STRATEGY FILE_COPY', $1::text, $2::text)
            ELSE format('CREATE DATABASE %I TEMPLATE %I', $1::text, $2::text) END
"""

GET_JOB: Final = (
    """
SELECT """
    + JOB_COLUMNS
    + """
FROM pgq_jobs WHERE id = $1
"""
)

LIST_JOBS: Final = (
    """
SELECT """
    + JOB_COLUMNS
    + """
FROM pgq_jobs
WHERE ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR task = $3)
  AND ($5::jsonb IS NULL OR args @> $5::jsonb)
ORDER BY id DESC
LIMIT $4
"""
)

JOBS_ATTEMPTED_SINCE: Final = (
    """
SELECT """
    + JOB_COLUMNS
    + """
FROM pgq_jobs WHERE attempted_at >= $1 ORDER BY id
"""
)

# Every job matching the filters, oldest first (bulk retry or cancel by filter).
MATCHING_IDS: Final = """
SELECT id FROM pgq_jobs
WHERE ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR task = $3)
ORDER BY id
"""

COUNT_BY_STATE: Final = """
SELECT state::text AS state, count(*)::bigint AS n FROM pgq_jobs
WHERE $1::text IS NULL OR queue = $1
GROUP BY state
"""

STATS_BY_QUEUE: Final = """
SELECT queue, state::text AS state, count(*)::bigint AS n FROM pgq_jobs GROUP BY queue, state
"""

STATS_EXTRA: Final = (
    """
SELECT queue,
       extract(epoch FROM now() - (min(scheduled_at) FILTER (WHERE state = 'available')))::float8
           AS oldest_available_s,
       (count(*) FILTER (WHERE state = 'completed'
                         AND finalized_at > now() - interval '1 minute'))::bigint
           AS completed_last_minute,
       (count(*) FILTER (WHERE state IN """
    + _FINAL
    + """
                         AND finalized_at > now() - interval '1 minute'))::bigint
           AS finished_last_minute
FROM pgq_jobs
WHERE state = 'available' OR finalized_at > now() - interval '1 minute'
GROUP BY queue
"""
)

# Jobs nobody can run: available jobs due for longer than $2 seconds, of a queue whose live
# producers (each judged by its own stale_after, $1 for a row that recorded none) all
# recorded the tasks they serve and none serves the job's task (a worker never claims a
# task it has not registered). A queue with a producer of older code (no task list) is
# never flagged, nor one no live producer serves (that is a queue without workers).
UNRUNNABLE_JOBS: Final = """
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
ORDER BY j.queue, j.task
"""

LIST_QUEUES: Final = (
    """
WITH names AS (
    SELECT name FROM pgq_queues
    UNION SELECT DISTINCT queue FROM pgq_jobs WHERE state NOT IN """
    + _FINAL
    + """
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
ORDER BY n.name
"""
)

# --------------------------------------------------------------------------- operator actions

# A job not yet running is cancelled at once; a running one gets a cancel request that its
# worker obeys (a control NOTIFY now, or its next poll). Final jobs are left alone.
CANCEL_JOBS: Final = (
    """
WITH target AS (
    SELECT id FROM pgq_jobs
    WHERE id = ANY($1::bigint[]) AND state NOT IN """
    + _FINAL
    + """
    ORDER BY id
    FOR UPDATE
), upd AS (
    UPDATE pgq_jobs j
    SET state = CASE WHEN j.state = 'running' THEN j.state ELSE 'cancelled' END,
        finalized_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        cancel_requested_at = now(),
        errors = CASE WHEN j.state = 'running' THEN j.errors
                      ELSE j.errors || jsonb_build_array(jsonb_build_object(
                          'attempt', j.attempt, 'kind', 'cancel',
                          'message', 'cancelled by request', 'traceback', NULL,
                          'at', now())) END
    FROM target WHERE j.id = target.id
    RETURNING j.id, j.state::text AS state
)
SELECT id, state,
       CASE WHEN state = 'running'
            THEN pg_notify("""
    + _CONTROL
    + """, json_build_object('kind', 'cancel', 'job_id', id)::text)::text
            ELSE pg_notify("""
    + _DONE
    + """, id::text)::text END AS notified
FROM upd
"""
)

# Run again: a final or retryable job becomes available now, with one more attempt allowed
# if it had used them all. A finished job that would take its unique key back is left out
# when another job holds the key, and of several asked for that share a key only the newest
# goes (either would hold it twice). The state is checked in the UPDATE itself, so a job
# that changed meanwhile (claimed, say) is left alone.
RETRY_JOBS: Final = (
    """
WITH taking AS (
    SELECT id, unique_key FROM pgq_jobs
    WHERE id = ANY($1::bigint[]) AND state IN """
    + _FINAL
    + """
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
      AND (state IN """
    + _FINAL
    + """ OR state IN ('retryable', 'scheduled'))
      AND id NOT IN (SELECT id FROM refused)
    RETURNING id, queue
)
SELECT id, pg_notify("""
    + _JOBS
    + """, queue)::text AS notified FROM upd
"""
)

# Is queue $1 known: a setting, a job or a producer names it?
QUEUE_KNOWN: Final = """
SELECT EXISTS (SELECT 1 FROM pgq_queues WHERE name = $1)
    OR EXISTS (SELECT 1 FROM pgq_jobs WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM pgq_producers WHERE queue = $1)
"""

PAUSE_QUEUE: Final = (
    """
WITH up AS (
    INSERT INTO pgq_queues (name, paused_at) VALUES ($1, now())
    ON CONFLICT (name) DO UPDATE SET paused_at = COALESCE(pgq_queues.paused_at, now())
    RETURNING name
)
SELECT name,
       pg_notify("""
    + _CONTROL
    + """, json_build_object('kind', 'pause', 'queue', name)::text)::text AS notified
FROM up
"""
)

# Resuming wakes the queue's workers on the jobs channel ('*' wakes all of them).
RESUME_QUEUE: Final = (
    """
WITH up AS (
    INSERT INTO pgq_queues (name, paused_at) VALUES ($1, NULL)
    ON CONFLICT (name) DO UPDATE SET paused_at = NULL
    RETURNING name
)
SELECT name, pg_notify("""
    + _JOBS
    + """, name)::text AS notified FROM up
"""
)

# --------------------------------------------------------------------------- operator reads

# The filter of the dashboard's job listings and bulk actions: $1 states, $2 queue, $3 task,
# $4 a tag, $5 JSON text of an object the args must contain, $6 an id (each NULL: any). A
# statement that uses it takes its own parameters from $7 on.
_JOB_FILTER = """
    ($1::text[] IS NULL OR state = ANY($1::text[]::pgq_job_state[]))
    AND ($2::text IS NULL OR queue = $2)
    AND ($3::text IS NULL OR task = $3)
    AND ($4::text IS NULL OR tags @> ARRAY[$4::text])
    AND ($5::jsonb IS NULL OR args @> $5::jsonb)
    AND ($6::bigint IS NULL OR id = $6)
"""

# The lowest and highest job id (two probes of the primary key).
JOB_ID_BOUNDS: Final = "SELECT min(id) AS low, max(id) AS high FROM pgq_jobs"

# One page of a listing, newest first, among ids in [$8, $7): a bounded slice of the primary
# key, so a filter that matches few jobs of a large table still answers in bounded time (the
# page then offers to search the next slice). No index beyond the primary key is needed.
JOBS_PAGE: Final = (
    """
SELECT """
    + JOB_COLUMNS
    + """
FROM pgq_jobs
WHERE id < $7 AND id >= $8 AND """
    + _JOB_FILTER
    + """
ORDER BY id DESC
LIMIT $9
"""
)

# How many jobs match, among ids up to $7 (a bulk action shows it before it acts).
COUNT_MATCHING: Final = (
    """
SELECT count(*)::bigint AS n FROM pgq_jobs WHERE id <= $7 AND """
    + _JOB_FILTER
)

# The next $9 matching ids above $8, up to $7: a bulk action walks the matches in batches.
MATCHING_BATCH: Final = (
    """
SELECT id FROM pgq_jobs
WHERE id > $8 AND id <= $7 AND """
    + _JOB_FILTER
    + """
ORDER BY id
LIMIT $9
"""
)

# Delete jobs that are not running (cancel a running job first); wakes anyone waiting on
# them, who then finds them gone.
DELETE_JOBS: Final = (
    """
WITH del AS (
    DELETE FROM pgq_jobs WHERE id = ANY($1::bigint[]) AND state <> 'running' RETURNING id
)
SELECT id, pg_notify("""
    + _DONE
    + """, id::text)::text AS notified FROM del
"""
)

# Limits the statements of the current transaction to $1 milliseconds.
LOCAL_STATEMENT_TIMEOUT: Final = "SELECT set_config('statement_timeout', $1::text, true)"

# Jobs by queue in the states that are not final: each branch matches a partial index of
# the claim, the scheduler or the rescuer, so this stays cheap on a table of finished jobs.
ACTIVE_BY_QUEUE: Final = """
SELECT queue, 'available' AS state, count(*)::bigint AS n
FROM pgq_jobs WHERE state = 'available' GROUP BY queue
UNION ALL
SELECT queue, state::text, count(*)::bigint
FROM pgq_jobs WHERE state IN ('scheduled', 'retryable') GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*)::bigint
FROM pgq_jobs WHERE state = 'running' GROUP BY queue
"""

# The planner's estimate of jobs per state (table rows times the state's frequency in the
# last ANALYZE): what a dashboard shows when counting exactly would take too long.
STATE_ESTIMATES: Final = """
SELECT v.state, (v.freq * greatest(c.reltuples, 0))::bigint AS n
FROM pg_class c
JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = c.relname
                AND s.attname = 'state'
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
    AS v(state, freq)
WHERE c.oid = to_regclass('pgq_jobs')
"""

# Finished jobs per minute and queue over the current minute and the $1 - 1 before it,
# from the leader's rollup.
THROUGHPUT: Final = """
SELECT minute, queue, completed, discarded, cancelled
FROM pgq_throughput
WHERE minute > date_trunc('minute', now()) - make_interval(mins => $1)
ORDER BY minute, queue
"""

# The current minute on the database clock (the chart's right edge).
CURRENT_MINUTE: Final = "SELECT date_trunc('minute', now()) AS minute"

# --------------------------------------------------------------------------- throughput rollup

# Count the jobs finished since the start of the minute $2 seconds before $1 (the previous
# round's clock; NULL on a leader's first round) but at most $3 seconds back, into the
# rollup, by range scans of the finalized index; returns this round's clock. A minute is
# counted again on the next rounds (it is still filling, or an outcome committed late: a
# job is finalized in the minute its transaction began); counts only grow, so retention
# deleting the jobs never lowers them.
THROUGHPUT_ROLLUP: Final = (
    """
WITH counted AS (
    INSERT INTO pgq_throughput AS t (minute, queue, completed, discarded, cancelled)
    SELECT date_trunc('minute', finalized_at), queue,
           count(*) FILTER (WHERE state = 'completed'),
           count(*) FILTER (WHERE state = 'discarded'),
           count(*) FILTER (WHERE state = 'cancelled')
    FROM pgq_jobs
    WHERE state IN """
    + _FINAL
    + """
      AND finalized_at >= date_trunc('minute', GREATEST($1::timestamptz - make_interval(secs => $2),
                                                        now() - make_interval(secs => $3)))
    GROUP BY 1, 2
    ON CONFLICT (minute, queue) DO UPDATE
    SET completed = greatest(t.completed, EXCLUDED.completed),
        discarded = greatest(t.discarded, EXCLUDED.discarded),
        cancelled = greatest(t.cancelled, EXCLUDED.cancelled)
)
SELECT now()
"""
)

# The rollup keeps $1 seconds of minutes.
THROUGHPUT_TRIM: Final = """
DELETE FROM pgq_throughput WHERE minute < now() - make_interval(secs => $1)
"""

# Plans each statement of the current transaction for its parameters: the listing filters'
# "$n IS NULL OR ..." would get a poor generic plan after five runs of a prepared statement.
LOCAL_CUSTOM_PLANS: Final = "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)"

# The age of each queue's oldest available job (an index-only scan of the claim's index).
OLDEST_AVAILABLE: Final = """
SELECT queue, extract(epoch FROM now() - min(scheduled_at))::float8 AS age_s
FROM pgq_jobs WHERE state = 'available' GROUP BY queue
"""

# Queues with a setting (paused or not).
QUEUE_SETTINGS: Final = "SELECT name, paused_at FROM pgq_queues ORDER BY name"

# Queues with flow-control limits (docs/flow-control.md).
LIMITED_QUEUES: Final = """
SELECT name, concurrency, rate_count, rate_period_s, key_concurrency, key_rate_count, key_rate_period_s
FROM pgq_queues
WHERE concurrency IS NOT NULL OR rate_count IS NOT NULL
   OR key_concurrency IS NOT NULL OR key_rate_count IS NOT NULL
"""

# Running jobs per producer id, as the jobs table has them (the rescuer's index); a producer
# id with no row left is a worker whose jobs wait for a rescue.
RUNNING_BY_PRODUCER: Final = """
SELECT j.producer_id, count(*)::bigint AS n, (p.id IS NULL) AS orphaned
FROM pgq_jobs j LEFT JOIN pgq_producers p ON p.id = j.producer_id
WHERE j.state = 'running'
GROUP BY j.producer_id, p.id
"""

# --------------------------------------------------------------------------- rolling upgrades

# The oldest code revision the schema still serves (pgq_schema_compat, from pgq_0008 on),
# read only when the schema is at a revision this code does not know; no parameters, so the
# alembic glue runs them through SQLAlchemy as they are.
SCHEMA_COMPAT_EXISTS: Final = "SELECT to_regclass('pgq_schema_compat') IS NOT NULL AS present"
MIN_CODE_REVISION: Final = "SELECT min_code_revision FROM pgq_schema_compat"
