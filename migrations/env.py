"""The repository's alembic environment for pgq's migrations (alembic.ini at the root).

Used by `alembic upgrade head` and `alembic revision --autogenerate` from the repo root, on
the revisions in src/pgq/migrations/versions. `pgq migrate` (:mod:`pgq.migrate`) runs the
same revisions without it, as does a project's own environment (docs/migrations.md). A
caller may pass the DSN as ``config.attributes["pgq_dsn"]``.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

from pgq._core.dsn import resolve_dsn, sqlalchemy_url
from pgq._db import sql
from pgq._db.connections import sqlalchemy_engine
from pgq.migrate import rename_old_ids
from pgq.schema import VERSION_TABLE, metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

MIGRATION_LOCK = text(sql.MIGRATION_LOCK)


def _dsn() -> str | None:
    """pgq.migrate passes the DSN; `alembic -x dsn=...` (or PGQ_DSN, DATABASE_URL) otherwise."""
    if "pgq_dsn" in config.attributes:
        return config.attributes["pgq_dsn"]  # type: ignore[no-any-return]
    return resolve_dsn(context.get_x_argument(as_dictionary=True).get("dsn"))


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        compare_server_default=True,
        pgq_removal_asked=True,  # pgq's own environment: a downgrade here is on purpose
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    _configure(url=sqlalchemy_url(None), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        connection.execute(MIGRATION_LOCK)
        rename_old_ids(connection)  # a database stamped before the ids were prefixed
        context.run_migrations()


async def run_migrations_online() -> None:
    # asyncpg opens the connection from the DSN as given: several hosts and
    # target_session_attrs work, which SQLAlchemy's URL parser would refuse.
    engine = sqlalchemy_engine(_dsn())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
