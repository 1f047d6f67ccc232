"""The transition an attempt's outcome makes, as SQL functions every outcome statement
calls (the planner inlines them): a cancel request redirects only an outcome that would run
the job again. Additive: new functions only, which code of pgq_0008 does not call, so
``pgq_schema_compat.min_code_revision`` stays.

Revision ID: pgq_0009
Revises: pgq_0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "pgq_0009"
down_revision: str | None = "pgq_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of pgq.schema.OUTCOME_FUNCTIONS as of this revision, in creation order (each
# body is checked against the functions before it).
FUNCTIONS = (
    (
        "pgq_is_final",
        """\
CREATE FUNCTION pgq_is_final(state pgq_job_state) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT state IN ('completed', 'discarded', 'cancelled')
$$
""",
    ),
    (
        "pgq_outcome_state",
        """\
CREATE FUNCTION pgq_outcome_state(wanted pgq_job_state, cancel_requested boolean)
RETURNS pgq_job_state LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN cancel_requested AND NOT pgq_is_final(wanted)
                THEN 'cancelled'::pgq_job_state ELSE wanted END
$$
""",
    ),
    (
        "pgq_failed_state",
        """\
CREATE FUNCTION pgq_failed_state(attempt integer, max_attempts integer)
RETURNS pgq_job_state LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN attempt >= max_attempts THEN 'discarded'::pgq_job_state
                ELSE 'retryable'::pgq_job_state END
$$
""",
    ),
    (
        "pgq_outcome_finalized_at",
        """\
CREATE FUNCTION pgq_outcome_finalized_at(wanted pgq_job_state, cancel_requested boolean)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pgq_is_final(pgq_outcome_state(wanted, cancel_requested))
                THEN now() END
$$
""",
    ),
    (
        "pgq_attempt_error",
        """\
CREATE FUNCTION pgq_attempt_error(entry jsonb, started_at timestamptz, producer_id uuid,
                                  worker_name text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT entry || jsonb_build_object('at', now(), 'started_at', started_at,
                                       'producer_id', producer_id, 'worker_name', worker_name)
$$
""",
    ),
    (
        "pgq_cancel_entry",
        """\
CREATE FUNCTION pgq_cancel_entry(attempt integer)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('attempt', attempt, 'kind', 'cancel',
                              'message', 'cancelled by request', 'traceback', NULL,
                              'at', now())
$$
""",
    ),
    (
        "pgq_outcome_errors",
        """\
CREATE FUNCTION pgq_outcome_errors(errors jsonb, entry jsonb, wanted pgq_job_state,
                                   cancel_requested boolean, attempt integer)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT COALESCE(errors || entry, errors)
           || CASE WHEN pgq_outcome_state(wanted, cancel_requested) <> wanted
                   THEN pgq_cancel_entry(attempt) ELSE '[]'::jsonb END
$$
""",
    ),
)


def upgrade() -> None:
    for _name, function in FUNCTIONS:
        op.execute(function)


def downgrade() -> None:
    for name, _function in reversed(FUNCTIONS):
        op.execute(f"DROP FUNCTION {name}")
