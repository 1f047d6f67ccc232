"""The pgq schema as SQLAlchemy metadata: the single source of truth for migrations.

Alembic revisions under ``pgq/migrations/versions`` are written from this module, and a test
proves ``alembic upgrade head`` yields exactly what ``metadata.create_all`` yields.
"""

from __future__ import annotations

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Enum,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    event,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, UUID

from pgq._db import sql
from pgq._db.revision import SCHEMA_REVISION, VERSION_TABLE
from pgq._db.sql import CHANNEL_DONE, CHANNEL_JOBS
from pgq.job import FINAL_STATES, JobState

#: The job states in the database enum's order: JobState's, the one definition.
STATES = tuple(s.value for s in JobState)
_FINAL_SQL = ", ".join(f"'{s.value}'" for s in JobState if s in FINAL_STATES)

metadata = MetaData(
    naming_convention={
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        "uq": "%(table_name)s_%(column_0_N_name)s_key",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "pk": "%(table_name)s_pkey",
    }
)

job_state = Enum(*STATES, name="pgq_job_state", metadata=metadata)

TSTZ = TIMESTAMP(timezone=True)

jobs = Table(
    "pgq_jobs",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("queue", Text, nullable=False, server_default="default"),
    Column("task", Text, nullable=False),
    Column("args", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("state", job_state, nullable=False, server_default="available"),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("attempt", Integer, nullable=False, server_default="0"),
    # NULL until claimed when the enqueuer did not know the task: the worker then applies
    # the task's own max_attempts (and timeout) at claim time.
    Column("max_attempts", Integer),
    Column("scheduled_at", TSTZ, nullable=False, server_default=func.now()),
    Column("attempted_at", TSTZ),
    Column("finalized_at", TSTZ),
    Column("created_at", TSTZ, nullable=False, server_default=func.now()),
    # The producer running the job (liveness: the rescuer joins it to its heartbeat). It may
    # change while the job runs, when its producer re-registers and adopts the job.
    Column("producer_id", UUID(as_uuid=True)),
    # The fencing token of the running attempt, drawn at claim time and never changed while
    # it runs: every outcome write matches (id, attempt_token, state = 'running').
    Column("attempt_token", UUID(as_uuid=True)),
    # The worker (its name) running the attempt: with producer_id, who ran which attempt.
    Column("attempted_by", Text),
    # When a running attempt overran its task's timeout; the rescuer uses it for hung jobs.
    Column("deadline_at", TSTZ),
    Column("errors", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("tags", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("result", JSONB),
    # Uniqueness: jobs sharing a key cannot coexist in the states of the unique_states mask.
    Column("unique_key", Text),
    Column("unique_states", Integer),
    # Set by client.cancel() on a running job; its worker cancels it (NOTIFY, or its poll).
    Column("cancel_requested_at", TSTZ),
    # Partitioned limits (docs/flow-control.md): the key the queue's per-key limits count by.
    Column("limit_key", Text),
    # Dependencies: the parents, in the order given; how many are not yet finished; what a
    # failed parent means ('cancel' or 'run'); and, on a parent, that some job waits for it.
    Column("depends_on", ARRAY(BigInteger)),
    Column("deps_left", Integer),
    Column("on_parent_failure", Text),
    Column("has_dependents", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint(f"(finalized_at IS NOT NULL) = (state IN ({_FINAL_SQL}))", name="finalized_at"),
    CheckConstraint("attempt >= 0 AND max_attempts >= 1", name="attempts"),
    CheckConstraint("char_length(queue) BETWEEN 1 AND 128", name="queue_length"),
    CheckConstraint("char_length(task) BETWEEN 1 AND 255", name="task_length"),
    CheckConstraint("jsonb_typeof(args) = 'object'", name="args_object"),
)

# The fetch path: the next available jobs of one queue, by priority then schedule time.
Index(
    "pgq_jobs_fetch_idx",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.scheduled_at,
    jobs.c.id,
    postgresql_where=jobs.c.state == literal_column("'available'"),
)
# The scheduler: scheduled and retryable jobs that came due.
Index(
    "pgq_jobs_due_idx",
    jobs.c.scheduled_at,
    postgresql_where=jobs.c.state.in_(
        [literal_column("'scheduled'"), literal_column("'retryable'")]
    ),
)
# The rescuer: running jobs, joined to their producer.
Index(
    "pgq_jobs_running_idx",
    jobs.c.producer_id,
    postgresql_where=jobs.c.state == literal_column("'running'"),
)
# Partitioned limits: the keys of a queue's available jobs (a skip scan), and each key's
# next jobs. Rows without a key are not in it: plain queues write nothing here.
Index(
    "pgq_jobs_limit_key_idx",
    jobs.c.queue,
    jobs.c.limit_key,
    jobs.c.priority.desc(),
    jobs.c.scheduled_at,
    jobs.c.id,
    postgresql_where=text("state = 'available' AND limit_key IS NOT NULL"),
)
# Dependencies: the jobs that wait for a parent. Without GIN's fast update: each parent's
# outcome looks its dependents up, and a lookup reads the whole pending list (up to 4 MB of
# entries not yet merged) where an insert without it adds one entry per parent.
Index(
    "pgq_jobs_depends_on_idx",
    jobs.c.depends_on,
    postgresql_using="gin",
    postgresql_where=text("depends_on IS NOT NULL"),
    postgresql_with={"fastupdate": "off"},
)
# Retention and operator listings: finished jobs by state and age.
Index(
    "pgq_jobs_finalized_idx",
    jobs.c.state,
    jobs.c.finalized_at,
    postgresql_where=jobs.c.finalized_at.isnot(None),
)

# Bit i of a unique_states mask stands for STATES[i] (JobState.bit). IMMUTABLE, so a
# partial index can use it. Written from JobState; a test checks it agrees with the Python
# side, and migrations keep frozen copies.
UNIQUE_ACTIVE_FUNCTION = (
    "CREATE FUNCTION pgq_unique_active(state pgq_job_state, mask integer) RETURNS boolean\n"
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$\n"
    "    SELECT (mask & (CASE state "
    + " ".join(f"WHEN '{s.value}' THEN {s.bit}" for s in JobState)
    + " END)) <> 0\n$$\n"
)
event.listen(jobs, "before_create", DDL(UNIQUE_ACTIVE_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_drop", DDL("DROP FUNCTION IF EXISTS pgq_unique_active"))  # type: ignore[no-untyped-call]

# The transition an attempt's outcome makes, defined once for every statement that ends an
# attempt (the worker's outcome writes, the last-resort failure, a task's own settle, the
# rescues): a cancel request redirects only an outcome that would run the job again (it
# ends cancelled, with a 'cancel' entry); an outcome that ends the job stands. Single-SELECT
# SQL functions without a strict or SECURITY DEFINER clause, so the planner inlines them
# into each statement (EXPLAIN VERBOSE shows their bodies, not calls). Migrations keep
# frozen copies; a test checks the migrated database has these very texts.
OUTCOME_FUNCTIONS = (
    (
        "pgq_is_final",
        "CREATE FUNCTION pgq_is_final(state pgq_job_state) RETURNS boolean\n"
        "LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$\n"
        f"    SELECT state IN ({_FINAL_SQL})\n$$\n",
    ),
    (
        "pgq_outcome_state",
        "CREATE FUNCTION pgq_outcome_state(wanted pgq_job_state, cancel_requested boolean)\n"
        "RETURNS pgq_job_state LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$\n"
        "    SELECT CASE WHEN cancel_requested AND NOT pgq_is_final(wanted)\n"
        f"                THEN '{JobState.CANCELLED.value}'::pgq_job_state ELSE wanted END\n$$\n",
    ),
    (
        "pgq_failed_state",
        "CREATE FUNCTION pgq_failed_state(attempt integer, max_attempts integer)\n"
        "RETURNS pgq_job_state LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$\n"
        f"    SELECT CASE WHEN attempt >= max_attempts THEN '{JobState.DISCARDED.value}'::pgq_job_state\n"
        f"                ELSE '{JobState.RETRYABLE.value}'::pgq_job_state END\n$$\n",
    ),
    (
        "pgq_outcome_finalized_at",
        "CREATE FUNCTION pgq_outcome_finalized_at(wanted pgq_job_state, cancel_requested boolean)\n"
        "RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$\n"
        "    SELECT CASE WHEN pgq_is_final(pgq_outcome_state(wanted, cancel_requested))\n"
        "                THEN now() END\n$$\n",
    ),
    (
        "pgq_attempt_error",
        "CREATE FUNCTION pgq_attempt_error(entry jsonb, started_at timestamptz, producer_id uuid,\n"
        "                                  worker_name text)\n"
        "RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$\n"
        "    SELECT entry || jsonb_build_object('at', now(), 'started_at', started_at,\n"
        "                                       'producer_id', producer_id, 'worker_name', worker_name)\n"
        "$$\n",
    ),
    (
        "pgq_cancel_entry",
        "CREATE FUNCTION pgq_cancel_entry(attempt integer)\n"
        "RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$\n"
        "    SELECT jsonb_build_object('attempt', attempt, 'kind', 'cancel',\n"
        "                              'message', 'cancelled by request', 'traceback', NULL,\n"
        "                              'at', now())\n$$\n",
    ),
    (
        "pgq_outcome_errors",
        "CREATE FUNCTION pgq_outcome_errors(errors jsonb, entry jsonb, wanted pgq_job_state,\n"
        "                                   cancel_requested boolean, attempt integer)\n"
        "RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$\n"
        "    SELECT COALESCE(errors || entry, errors)\n"
        "           || CASE WHEN pgq_outcome_state(wanted, cancel_requested) <> wanted\n"
        "                   THEN pgq_cancel_entry(attempt) ELSE '[]'::jsonb END\n$$\n",
    ),
)
for _name, _function in OUTCOME_FUNCTIONS:
    event.listen(jobs, "before_create", DDL(_function))  # type: ignore[no-untyped-call]
    event.listen(jobs, "after_drop", DDL(f"DROP FUNCTION IF EXISTS {_name}"))  # type: ignore[no-untyped-call]

# Enforces unique jobs: one row per key among the states its mask names. Not a read-then-write.
Index(
    "pgq_jobs_unique_idx",
    jobs.c.unique_key,
    unique=True,
    postgresql_where=text("unique_key IS NOT NULL AND pgq_unique_active(state, unique_states)"),
)

# Dependencies: when a job with dependents finishes (or is deleted unfinished), each
# dependent has one parent fewer to wait for (and becomes due at none) if the parent
# completed or the dependent runs anyway, and is cancelled otherwise. A trigger, so every
# path that finishes a job (outcomes, rescue, cancel, operator actions, a task's own
# transaction) releases dependents in the same transaction; its WHEN clause reads only the
# row, so jobs without dependents pay nothing. The row-level locks of the UPDATEs order
# two parents finishing at once: the second sees the first's decrement.
RELEASE_FUNCTION = (
    """CREATE FUNCTION pgq_release_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent bigint;
    outcome text;
    told bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        parent := OLD.id;
        outcome := 'deleted';
    ELSE
        parent := NEW.id;
        outcome := NEW.state::text;
        -- Acted on once: should this job run again (an operator's retry), its dependents
        -- are not counted down twice. (Not an update of state: this trigger does not fire.)
        UPDATE pgq_jobs SET has_dependents = false WHERE id = parent;
    END IF;
    WITH released AS (
        UPDATE pgq_jobs c
        SET deps_left = c.deps_left - 1,
            state = CASE WHEN c.deps_left > 1 THEN c.state
                         WHEN c.scheduled_at > clock_timestamp() THEN 'scheduled'
                         ELSE 'available' END
        WHERE c.depends_on @> ARRAY[parent] AND c.state = 'pending'
          AND (outcome = 'completed' OR c.on_parent_failure = 'run')
        RETURNING c.queue, c.state
    )
    SELECT count(pg_notify('"""
    + CHANNEL_JOBS
    + """', q.queue)) INTO told
    FROM (SELECT DISTINCT queue FROM released WHERE state = 'available') q;
    IF outcome = 'completed' THEN
        RETURN NULL;
    END IF;
    -- Every pending descendant that does not run anyway is cancelled in this one statement
    -- (a chain of any length, no nesting of this trigger per link), each saying which
    -- parent failed; the dependents of these that run anyway are counted down as each
    -- cancelled job's own trigger fires.
    WITH RECURSIVE doomed(id, via) AS (
        SELECT c.id, parent FROM pgq_jobs c
        WHERE c.depends_on @> ARRAY[parent] AND c.state = 'pending'
          AND c.on_parent_failure <> 'run'
        UNION
        SELECT c.id, d.id FROM doomed d JOIN pgq_jobs c ON c.depends_on @> ARRAY[d.id]
        WHERE c.state = 'pending' AND c.on_parent_failure <> 'run'
    ), cancelled AS (
        UPDATE pgq_jobs c
        SET state = 'cancelled', finalized_at = now(), deps_left = 0,
            errors = c.errors || jsonb_build_array(jsonb_build_object(
                'attempt', c.attempt, 'kind', 'dependency',
                'message', 'parent job ' || d.via || ' was '
                           || CASE WHEN d.via = parent THEN outcome ELSE 'cancelled' END,
                'traceback', NULL, 'at', now()))
        FROM (SELECT DISTINCT ON (id) id, via FROM doomed ORDER BY id, via) d
        WHERE c.id = d.id
        RETURNING c.id
    )
    SELECT count(pg_notify('"""
    + CHANNEL_DONE
    + """', cancelled.id::text)) INTO told FROM cancelled;
    RETURN NULL;
END
$$"""
)
RELEASE_ON_FINISH = f"""CREATE TRIGGER pgq_jobs_parent_finished AFTER UPDATE OF state ON pgq_jobs
FOR EACH ROW
WHEN (NEW.has_dependents AND NEW.state IN ({_FINAL_SQL}) AND OLD.state NOT IN ({_FINAL_SQL}))
EXECUTE FUNCTION pgq_release_dependents()"""
RELEASE_ON_DELETE = f"""CREATE TRIGGER pgq_jobs_parent_deleted AFTER DELETE ON pgq_jobs
FOR EACH ROW
WHEN (OLD.has_dependents AND OLD.state NOT IN ({_FINAL_SQL}))
EXECUTE FUNCTION pgq_release_dependents()"""
event.listen(jobs, "after_create", DDL(RELEASE_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_create", DDL(RELEASE_ON_FINISH))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_create", DDL(RELEASE_ON_DELETE))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_drop", DDL("DROP FUNCTION IF EXISTS pgq_release_dependents"))  # type: ignore[no-untyped-call]

# Periodic schedules: the last slot the leader enqueued, so a slot is enqueued once.
periodic = Table(
    "pgq_periodic",
    metadata,
    Column("name", Text, primary_key=True),
    Column("last_slot", TSTZ, nullable=False),
    Column("updated_at", TSTZ, nullable=False, server_default=func.now()),
    # What the schedule is, as the leader last recorded it (for a dashboard without the App).
    Column("task", Text),
    Column("queue", Text),
    Column("schedule", Text),
    Column("next_slot", TSTZ),
    Column("recorded_by", Text),
)

producers = Table(
    "pgq_producers",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    # The worker process that runs this producer; the leader lease names it when it leads.
    Column("worker_id", UUID(as_uuid=True), nullable=False),
    Column("worker_name", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("started_at", TSTZ, nullable=False, server_default=func.now()),
    Column("heartbeat_at", TSTZ, nullable=False, server_default=func.now()),
    Column("concurrency", Integer, nullable=False),
    Column("running", Integer, nullable=False, server_default="0"),
    Column("healthy", Boolean, nullable=False, server_default=text("true")),
    Column("claimed", BigInteger, nullable=False, server_default="0"),
    Column("completed", BigInteger, nullable=False, server_default="0"),
    Column("failed", BigInteger, nullable=False, server_default="0"),
    Column("rejected_outcomes", BigInteger, nullable=False, server_default="0"),
    # The worker's own liveness bounds: peers judge it by these, never by their own
    # settings (NULL in rows of older code: peers fall back to theirs).
    Column("fence_after_s", Float),
    Column("stale_after_s", Float),
    Column("rescue_grace_s", Float),
    # The task names the producer serves: jobs of a task no live producer of their queue
    # serves are reported as unrunnable (NULL: never used to flag).
    Column("tasks", ARRAY(Text)),
)

# One row per election (only "default" is used): who leads and until when, on the db clock.
leader = Table(
    "pgq_leader",
    metadata,
    Column("name", Text, primary_key=True),
    Column("leader_id", UUID(as_uuid=True), nullable=False),
    Column("worker_name", Text, nullable=False),
    Column("elected_at", TSTZ, nullable=False, server_default=func.now()),
    Column("expires_at", TSTZ, nullable=False),
)

# Finished jobs per minute and queue, counted by the leader from the jobs it can still see
# (a rollup: the dashboard's throughput chart reads 60 rows, not an hour of jobs).
throughput = Table(
    "pgq_throughput",
    metadata,
    Column("minute", TSTZ, primary_key=True),
    Column("queue", Text, primary_key=True),
    Column("completed", BigInteger, nullable=False, server_default="0"),
    Column("discarded", BigInteger, nullable=False, server_default="0"),
    Column("cancelled", BigInteger, nullable=False, server_default="0"),
)

queues = Table(
    "pgq_queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused_at", TSTZ),
    Column("created_at", TSTZ, nullable=False, server_default=func.now()),
    # Flow control (docs/flow-control.md): at most `concurrency` running across all workers,
    # at most `rate_count` started per `rate_period_s` seconds (a sliding window).
    Column("concurrency", Integer),
    Column("rate_count", Integer),
    Column("rate_period_s", Float),
    # The same limits for each limit key of the queue's jobs.
    Column("key_concurrency", Integer),
    Column("key_rate_count", Integer),
    Column("key_rate_period_s", Float),
)

rate_log = Table(
    "pgq_rate_log",
    metadata,
    Column("queue", Text, nullable=False),
    Column("started_at", TSTZ, nullable=False),
    Column("limit_key", Text),
    # True where the start is summed in pgq_rate_sums too; NULL where code of a revision
    # before pgq_0011 logged it (it sums nothing).
    Column("summed", Boolean),
    Index("pgq_rate_log_idx", "queue", "started_at"),
    # Per-key rates: one key's starts within the window.
    Index("pgq_rate_log_key_idx", "queue", "limit_key", "started_at"),
    # The starts only logged, not summed: counted one by one, beside the sums.
    Index(
        "pgq_rate_log_unsummed_idx",
        "queue",
        "started_at",
        postgresql_where=text("summed IS NULL"),
    ),
)

# A rate limit's starts as sums: one row per limited claim that started jobs, with its
# count and the queue's running total, so that the starts within a window are two index
# probes (pgq_rate_started) however many there were.
rate_sums = Table(
    "pgq_rate_sums",
    metadata,
    # A queue's totals only grow (its newest row is never trimmed): the key is unique, and
    # gives the table a replica identity for logical replication.
    Column("queue", Text, primary_key=True),
    Column("started_at", TSTZ, primary_key=True),
    Column("total", BigInteger, primary_key=True),
    Column("starts", Integer, nullable=False),
)
event.listen(rate_sums, "after_create", DDL(sql.RATE_STARTED_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(rate_sums, "after_drop", DDL("DROP FUNCTION IF EXISTS pgq_rate_started"))  # type: ignore[no-untyped-call]

# The limited claim in one round trip (docs/flow-control.md): a function, so that its count
# takes a snapshot after the queue's lock. Its text lives in claims.sql beside the statement
# that calls it; migrations keep frozen copies, and a test checks they agree.
event.listen(rate_log, "after_create", DDL(sql.CLAIMED_JOB_TYPE))  # type: ignore[no-untyped-call]
event.listen(rate_log, "after_create", DDL(sql.LIMITED_CLAIM_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(rate_log, "after_drop", DDL("DROP FUNCTION IF EXISTS pgq_claim_limited"))  # type: ignore[no-untyped-call]
event.listen(rate_log, "after_drop", DDL("DROP TYPE IF EXISTS pgq_claimed_job"))  # type: ignore[no-untyped-call]

# The oldest code revision this schema still serves (docs/migrations.md, "Rolling
# upgrades"): one row, set by the revision that brought the rule (pgq_0008) and raised only
# by a breaking revision. Code at or above it runs on the schema even at a revision it does
# not know (a newer, additive one); older code refuses it.
schema_compat = Table(
    "pgq_schema_compat",
    metadata,
    Column("one_row", Boolean, primary_key=True, server_default=text("true")),
    Column("min_code_revision", Text, nullable=False),
    CheckConstraint("one_row", name="one_row"),
)

__all__ = (
    "SCHEMA_REVISION",
    "STATES",
    "VERSION_TABLE",
    "jobs",
    "leader",
    "metadata",
    "periodic",
    "producers",
    "queues",
    "schema_compat",
)
