"""Applying pgq's alembic migrations: from code, from `pgq migrate`, and from inside a
project's own alembic environment (:func:`upgrade_on`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from pgq._store import sql
from pgq._store.connections import Target, connect, sqlalchemy_engine
from pgq._store.revision import (
    OLD_REVISION_IDS,
    SCHEMA_REVISION,
    VERSION_TABLE,
    Revision,
    is_unknown,
    require_current,
    schema_revision,
)
from pgq.errors import ConfigError, SchemaMismatch

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = (
    "downgrade",
    "downgrade_async",
    "exclude_pgq",
    "head_revision",
    "migrations_dir",
    "rename_old_ids",
    "rename_shared_ids",
    "sql_script",
    "upgrade",
    "upgrade_async",
    "upgrade_on",
)


def migrations_dir() -> Path:
    """Where the migrations live: inside the installed package, or the source checkout's
    top-level ``migrations/`` (the package's copy is a link to it)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("pgq's migrations are missing from this installation")


def _config(dsn: str | None, output: io.StringIO | None = None) -> Any:
    from alembic.config import Config

    cfg = Config(output_buffer=output) if output is not None else Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["pgq_dsn"] = dsn
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(dsn: str | None, revision: str = "head") -> str:
    """Migrate the database at ``dsn`` to ``revision``, with pgq's own version table;
    returns the revision the database is at. A schema at a newer release's revision that
    still serves this pgq (a rolling upgrade whose new code migrated first) is left as it
    is. Blocking: call it outside an event loop, or use :func:`upgrade_async`. Raises
    :class:`~pgq.ConfigError` when the project's own alembic environment runs pgq's
    revisions, :class:`~pgq.SchemaMismatch` at a newer revision that no longer serves this
    pgq (the advice says what to run instead)."""
    from alembic import command

    found = anyio.run(_check_ready, dsn)
    if found.revision is not None and is_unknown(found):
        return found.revision
    command.upgrade(_config(dsn), revision)
    return head_revision() if revision == "head" else revision


def downgrade(dsn: str | None, revision: str = "base") -> None:
    """Undo pgq's migrations down to ``revision`` (``base`` drops every pgq table and
    every job in them: how to remove pgq on purpose)."""
    from alembic import command

    _refuse_newer(anyio.run(_check_ready, dsn))
    command.downgrade(_config(dsn), revision)


async def downgrade_async(dsn: str | None, revision: str = "base") -> None:
    """:func:`downgrade` from async code (runs alembic in a thread)."""
    _refuse_newer(await _check_ready(dsn))
    from alembic import command

    await anyio.to_thread.run_sync(lambda: command.downgrade(_config(dsn), revision))


async def upgrade_async(dsn: str | None, revision: str = "head") -> str:
    """:func:`upgrade` from async code (runs alembic in a thread)."""
    found = await _check_ready(dsn)
    if found.revision is not None and is_unknown(found):
        return found.revision
    from alembic import command

    await anyio.to_thread.run_sync(lambda: command.upgrade(_config(dsn), revision))
    return head_revision() if revision == "head" else revision


def upgrade_on(connection: Connection, revision: str = "head") -> None:
    """Apply pgq's migrations on ``connection`` (a SQLAlchemy Connection), from inside your
    own alembic ``env.py``, before your migrations run: pgq's tables then come with your
    ``alembic upgrade head``, recorded in pgq's own version table, and pgq's revisions stay
    out of your script directory (your ``alembic revision`` never sees them). See
    docs/migrations.md."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from pgq.schema import metadata

    script = ScriptDirectory(str(migrations_dir()))
    context = MigrationContext.configure(
        connection,
        opts={
            "version_table": VERSION_TABLE,
            "target_metadata": metadata,
            "script": script,
            "fn": lambda rev, _context: script._upgrade_revs(revision, rev),
        },
    )
    # alembic.op points at this context while pgq's revisions run, and at nothing after:
    # the caller's own context installs it again for its migrations.
    with Operations.context(context), context.begin_transaction():
        connection.execute(text(sql.MIGRATION_LOCK))
        rename_old_ids(connection)
        context.run_migrations()


def rename_old_ids(connection: Connection, *, shared: bool = False) -> int:
    """Rename pgq's old, unprefixed revision ids ('0002' -> 'pgq_0002') where the database
    records them: pgq's own version table, or (``shared``) the project's. Returns how many
    rows changed."""
    from sqlalchemy import text

    if not shared and not connection.execute(text(sql.OWN_VERSION_TABLE_EXISTS)).scalar():
        return 0
    statement = text(sql.RENAME_SHARED_REVISION if shared else sql.RENAME_OWN_REVISION)
    changed = 0
    for old, new in OLD_REVISION_IDS.items():
        changed += connection.execute(statement, {"old": old, "new": new}).rowcount
    return changed


def rename_shared_ids(dsn: str | None) -> int:
    """`pgq migrate --rename-shared-ids`: rename pgq's old revision ids in the project's own
    ``alembic_version`` (they were '0001'..'0003'; the scripts now say 'pgq_0001'..), so the
    project's alembic environment finds them. Returns how many rows changed."""
    return anyio.run(_rename_shared_ids, dsn)


async def _rename_shared_ids(dsn: str | None) -> int:
    engine = sqlalchemy_engine(dsn)
    try:
        async with engine.begin() as connection:
            return await connection.run_sync(lambda c: rename_old_ids(c, shared=True))
    finally:
        await engine.dispose()


def exclude_pgq(name: str | None, type_: str, parent_names: Any) -> bool:
    """An ``include_name`` hook for your env.py: leaves pgq's tables and types out of your
    ``alembic revision --autogenerate``."""
    return not (name or "").startswith("pgq_")


def sql_script(revision: str = "head") -> str:
    """The DDL of the migrations up to ``revision``, for DBAs who apply it themselves."""
    from alembic import command

    out = io.StringIO()
    command.upgrade(_config(None, out), revision, sql=True)
    return out.getvalue()


def head_revision() -> str:
    """The newest revision the shipped migrations define."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    assert head is not None
    return head


async def _check_ready(dsn: str | None) -> Revision:
    # alembic's own connection errors arrive as long SQLAlchemy tracebacks: fail first,
    # with pgq's one-line message. And a database whose pgq schema the project's own alembic
    # environment manages must not get a second copy from pgq's (type already exists).
    target = Target.resolve(dsn)  # the DSN env.py will use, and the same session options
    conn = await connect(target.dsn, **target.options("pgq migrate"))
    try:
        found = await schema_revision(conn)
    finally:
        await conn.close()
    if is_unknown(found):
        require_current(found)  # a newer schema that no longer serves this pgq
    if found.shared:
        first = (
            "first rename pgq's old revision ids there with `pgq migrate --rename-shared-ids`, "
            "then "
            if found.old_ids
            else ""
        )
        raise ConfigError(
            f"pgq's revisions are recorded in your project's alembic_version (at "
            f"{found.revision}): your alembic environment migrates pgq; {first}run "
            "`alembic upgrade heads` in your project (or `alembic upgrade pgq@head`)"
        )
    return found


def _refuse_newer(found: Revision) -> None:
    # A downgrade starts from the database's revision: one this pgq does not have is not
    # its to undo, compatible or not.
    if is_unknown(found):
        raise SchemaMismatch(
            found.revision, SCHEMA_REVISION, shared=found.shared, newer=True, min_code=None
        )
