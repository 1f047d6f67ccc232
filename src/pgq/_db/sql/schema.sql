-- name: SCHEMA_VERSION_TABLES
SELECT to_regclass('pgq_alembic_version') IS NOT NULL AS own,
       to_regclass('alembic_version') IS NOT NULL AS shared,
       to_regclass('pgq_jobs') IS NOT NULL AS has_jobs;

-- name: PGQ_VERSION
SELECT version_num FROM pgq_alembic_version;

-- name: SHARED_VERSION
-- When the user runs pgq's migrations inside their own alembic environment (branch "pgq").
SELECT version_num FROM alembic_version WHERE version_num = ANY($1::text[]);

-- name: OWN_VERSION_TABLE_EXISTS
-- pgq's revisions had unprefixed ids ('0002') before 'pgq_0002': renamed where a database
-- records them. These run through SQLAlchemy in the alembic glue (pgq.migrate), hence the
-- named parameters.
SELECT to_regclass('pgq_alembic_version') IS NOT NULL;

-- name: RENAME_OWN_REVISION
UPDATE pgq_alembic_version SET version_num = :new WHERE version_num = :old;

-- name: RENAME_SHARED_REVISION
UPDATE alembic_version SET version_num = :new WHERE version_num = :old;

-- name: MIGRATION_LOCK
-- Serializes concurrent migrators (two workers' deploy hooks, say) inside one transaction.
SELECT pg_advisory_xact_lock(hashtext('pgq migrations'));

-- name: SCHEMA_COMPAT_EXISTS
-- Rolling upgrades: whether the schema records the oldest code revision it still serves
-- (pgq_schema_compat, from pgq_0008 on); read only when the schema is at a revision this
-- code does not know. No parameters, so the alembic glue runs it through SQLAlchemy as it is.
SELECT to_regclass('pgq_schema_compat') IS NOT NULL AS present;

-- name: MIN_CODE_REVISION
-- The oldest code revision the schema still serves.
SELECT min_code_revision FROM pgq_schema_compat;
