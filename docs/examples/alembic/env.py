"""alembic/env.py of a project whose alembic runs pgq's migrations with its own: alembic's
async template (``alembic init --template async``) with the lines marked ``pgq``."""

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import MetaData, pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import async_engine_from_config

import pgq.migrate  # pgq

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)

# Your models' metadata, for autogenerate (from myapp.models import Base; Base.metadata).
target_metadata = MetaData()


def run_migrations_offline() -> None:
    """`alembic upgrade head --sql`: the SQL, pgq's first."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    pgq.migrate.upgrade_on(None)  # pgq: its DDL first, into the same output
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    pgq.migrate.upgrade_on(connection)  # pgq: its tables first, in pgq_alembic_version
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=pgq.migrate.exclude_pgq,  # pgq: autogenerate leaves its tables alone
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    connectable = async_engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    async with connectable.connect() as connection:
        await connection.run_sync(do_run_migrations)
    await connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
