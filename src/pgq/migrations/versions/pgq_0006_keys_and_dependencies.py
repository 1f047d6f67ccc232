"""Partitioned limits and job dependencies: a job's limit key, limits per key on the queue,
the key of each logged start; the ``pending`` state (appended, so stored unique-state masks
keep their meaning), a job's parents, and the trigger that releases or cancels dependents
when a parent finishes.

Revision ID: pgq_0006
Revises: pgq_0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pgq_0006"
down_revision: str | None = "pgq_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of pgq.schema's functions as of this revision. The new enum value cannot be
# used in the transaction that adds it: the unique-states function is created without its
# body being checked (check_function_bodies off), so 'pending' is first read when the
# function is first used, after this migration has committed; the trigger's statements are
# planned only when it first fires. (Comparing the state as text instead would work too,
# but the function runs in the unique index's predicate on every update of a job, and the
# cast made an unlimited queue's drain 8% slower.)
UNIQUE_ACTIVE_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_unique_active(state pgq_job_state, mask integer)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (mask & (CASE state
        WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2 WHEN 'running' THEN 4
        WHEN 'retryable' THEN 8 WHEN 'completed' THEN 16 WHEN 'discarded' THEN 32
        WHEN 'cancelled' THEN 64 WHEN 'pending' THEN 128 END)) <> 0
$$
"""

RELEASE_FUNCTION = """
CREATE FUNCTION pgq_release_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
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
    SELECT count(pg_notify('pgq_jobs', q.queue)) INTO told
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
    SELECT count(pg_notify('pgq_done', cancelled.id::text)) INTO told FROM cancelled;
    RETURN NULL;
END
$$
"""
RELEASE_ON_FINISH = """
CREATE TRIGGER pgq_jobs_parent_finished AFTER UPDATE OF state ON pgq_jobs
FOR EACH ROW
WHEN (NEW.has_dependents
      AND NEW.state IN ('completed', 'discarded', 'cancelled')
      AND OLD.state NOT IN ('completed', 'discarded', 'cancelled'))
EXECUTE FUNCTION pgq_release_dependents()
"""
RELEASE_ON_DELETE = """
CREATE TRIGGER pgq_jobs_parent_deleted AFTER DELETE ON pgq_jobs
FOR EACH ROW
WHEN (OLD.has_dependents AND OLD.state NOT IN ('completed', 'discarded', 'cancelled'))
EXECUTE FUNCTION pgq_release_dependents()
"""


def upgrade() -> None:
    op.execute("ALTER TYPE pgq_job_state ADD VALUE IF NOT EXISTS 'pending'")
    op.execute("SET LOCAL check_function_bodies = false")
    op.execute(UNIQUE_ACTIVE_FUNCTION)
    op.execute("SET LOCAL check_function_bodies = true")
    # Partitioned limits.
    op.add_column("pgq_jobs", sa.Column("limit_key", sa.Text(), nullable=True))
    op.add_column("pgq_queues", sa.Column("key_concurrency", sa.Integer(), nullable=True))
    op.add_column("pgq_queues", sa.Column("key_rate_count", sa.Integer(), nullable=True))
    op.add_column("pgq_queues", sa.Column("key_rate_period_s", sa.Float(), nullable=True))
    op.add_column("pgq_rate_log", sa.Column("limit_key", sa.Text(), nullable=True))
    op.create_index("pgq_rate_log_key_idx", "pgq_rate_log", ["queue", "limit_key", "started_at"])
    op.create_index(
        "pgq_jobs_limit_key_idx",
        "pgq_jobs",
        ["queue", "limit_key", sa.text("priority DESC"), "scheduled_at", "id"],
        postgresql_where=sa.text("state = 'available' AND limit_key IS NOT NULL"),
    )
    # Dependencies.
    op.add_column("pgq_jobs", sa.Column("depends_on", postgresql.ARRAY(sa.BigInteger())))
    op.add_column("pgq_jobs", sa.Column("deps_left", sa.Integer(), nullable=True))
    op.add_column("pgq_jobs", sa.Column("on_parent_failure", sa.Text(), nullable=True))
    op.add_column(
        "pgq_jobs",
        sa.Column("has_dependents", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index(
        "pgq_jobs_depends_on_idx",
        "pgq_jobs",
        ["depends_on"],
        postgresql_using="gin",
        postgresql_where=sa.text("depends_on IS NOT NULL"),
    )
    op.execute(RELEASE_FUNCTION)
    op.execute(RELEASE_ON_FINISH)
    op.execute(RELEASE_ON_DELETE)


def downgrade() -> None:
    op.execute("DROP TRIGGER pgq_jobs_parent_deleted ON pgq_jobs")
    op.execute("DROP TRIGGER pgq_jobs_parent_finished ON pgq_jobs")
    op.execute("DROP FUNCTION pgq_release_dependents")
    # A value cannot be dropped from an enum: jobs still pending are cancelled, and the
    # value stays unused (the unique-states function keeps its bit).
    op.execute(
        "UPDATE pgq_jobs SET state = 'cancelled', finalized_at = now() "
        "WHERE state::text = 'pending'"
    )
    op.drop_index("pgq_jobs_depends_on_idx", table_name="pgq_jobs")
    op.drop_column("pgq_jobs", "has_dependents")
    op.drop_column("pgq_jobs", "on_parent_failure")
    op.drop_column("pgq_jobs", "deps_left")
    op.drop_column("pgq_jobs", "depends_on")
    op.drop_index("pgq_jobs_limit_key_idx", table_name="pgq_jobs")
    op.drop_index("pgq_rate_log_key_idx", table_name="pgq_rate_log")
    op.drop_column("pgq_rate_log", "limit_key")
    op.drop_column("pgq_queues", "key_rate_period_s")
    op.drop_column("pgq_queues", "key_rate_count")
    op.drop_column("pgq_queues", "key_concurrency")
    op.drop_column("pgq_jobs", "limit_key")
