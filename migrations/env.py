"""Alembic environment for pgq's migrations.

Used by `pgq migrate`, by `alembic upgrade head` from the repo root, and not needed when a
project runs pgq's revisions from its own environment (branch label ``pgq``; see
docs/migrations.md).
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from pgq._dsn import resolve_dsn, sqlalchemy_url
from pgq._store import sql
from pgq.migrate import rename_old_ids
from pgq.schema import VERSION_TABLE, metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

MIGRATION_LOCK = text(sql.MIGRATION_LOCK)


def _url() -> str:
    url = config.attributes.get("pgq_url")
    if url is None:
        dsn = context.get_x_argument(as_dictionary=True).get("dsn")
        url = sqlalchemy_url(resolve_dsn(dsn))
    return str(url)


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        compare_server_default=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        connection.execute(MIGRATION_LOCK)
        rename_old_ids(connection)  # a database stamped before the ids were prefixed
        context.run_migrations()


async def run_migrations_online() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
