"""Applying pgq's alembic migrations: from code, from `pgq migrate`, and from inside a
project's own alembic environment (:func:`upgrade_on`)."""

from __future__ import annotations

import functools
import io
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from pgq._db import sql
from pgq._db.connections import Target, connect, sqlalchemy_engine
from pgq._db.revision import (
    OLD_REVISION_IDS,
    SCHEMA_REVISION,
    VERSION_TABLE,
    Revision,
    is_unknown,
    read_revision,
    require_current,
    schema_revision,
)
from pgq.errors import ConfigError, SchemaMismatch

if TYPE_CHECKING:
    from alembic.runtime.environment import EnvironmentContext
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy.engine import Connection
    from sqlalchemy.exc import DBAPIError

__all__ = (
    "downgrade",
    "downgrade_async",
    "exclude_pgq",
    "head_revision",
    "migrations_dir",
    "rename_old_ids",
    "rename_shared_ids",
    "require_removal_asked",
    "sql_script",
    "upgrade",
    "upgrade_async",
    "upgrade_on",
)


def migrations_dir() -> Path:
    """Where pgq's revisions live: ``pgq/migrations`` in the package, holding
    ``versions/``. Raises :class:`~pgq.ConfigError` when this installation has none."""
    here = Path(__file__).resolve().parent / "migrations"
    if not any((here / "versions").glob(f"{SCHEMA_REVISION}_*.py")):
        raise ConfigError(
            f"pgq's migrations are missing from this installation (no {SCHEMA_REVISION} in "
            f"{here / 'versions'}): it was built without pgq/migrations; reinstall pgq-async "
            "from a release wheel or sdist"
        )
    return here


def upgrade(dsn: str | None, revision: str = "head") -> str:
    """Migrate the database at ``dsn`` to ``revision``, with pgq's own version table;
    returns the revision the database is at. A schema at a newer release's revision that
    still serves this pgq (a rolling upgrade whose new code migrated first) is left as it
    is. Blocking: call it outside an event loop, or use :func:`upgrade_async`. Raises
    :class:`~pgq.ConfigError` when the project's own alembic environment runs pgq's
    revisions, :class:`~pgq.SchemaMismatch` at a newer revision that no longer serves this
    pgq (the advice says what to run instead)."""
    return anyio.run(upgrade_async, dsn, revision)


def downgrade(dsn: str | None, revision: str = "base") -> None:
    """Undo pgq's migrations down to ``revision`` (``base`` drops every pgq table and
    every job in them: how to remove pgq on purpose)."""
    anyio.run(downgrade_async, dsn, revision)


async def downgrade_async(dsn: str | None, revision: str = "base") -> None:
    """:func:`downgrade` from async code."""
    _refuse_newer(await _check_ready(dsn))
    await _apply(dsn, revision, downgrade=True)


async def upgrade_async(dsn: str | None, revision: str = "head") -> str:
    """:func:`upgrade` from async code."""
    found = await _check_ready(dsn)
    if found.revision is not None and is_unknown(found):
        return found.revision
    await _apply(dsn, revision, downgrade=False)
    return head_revision() if revision == "head" else revision


async def _apply(dsn: str | None, revision: str, *, downgrade: bool) -> None:
    """Run pgq's revisions up (or down) to ``revision`` on a connection of pgq's own, in
    one transaction (PostgreSQL's DDL is transactional: all of them or none)."""
    engine = sqlalchemy_engine(dsn)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(lambda c: _run_pgq(c, revision, downgrade=downgrade))
            await connection.commit()
    finally:
        await engine.dispose()


# What ``-x pgq=...`` may say when a downgrade goes past pgq's base.
_KEEP, _REMOVE = "keep", "remove"
# The migration context option by which pgq's own environments say a removal is asked for.
_REMOVAL_ASKED = "pgq_removal_asked"


def upgrade_on(connection: Connection | None, revision: str = "head") -> None:
    """Apply pgq's migrations from inside your own alembic ``env.py``, before yours: pgq's
    tables then come with your ``alembic upgrade head``, recorded in pgq's own version
    table, and pgq's revisions stay out of your script directory. Called from an alembic
    command, it does what that command means for pgq (docs/migrations.md):

    - ``alembic upgrade``: pgq's revisions first, on ``connection`` (a SQLAlchemy
      Connection); with ``--sql`` (offline mode) call it with ``None``: pgq's DDL is written
      where alembic writes yours, ahead of it;
    - ``alembic downgrade`` past pgq's base (``base``): refused with a
      :class:`~pgq.ConfigError` that says how to keep pgq (``-x pgq=keep``) or remove it on
      purpose (``-x pgq=remove``); a downgrade that keeps a revision of yours leaves pgq alone;
    - any other command (``revision --autogenerate``, ``check``, ``current``, ``stamp``):
      nothing, so generating a revision writes nothing to the database.

    Called outside alembic, it upgrades. A schema at a newer pgq's revision that still serves
    this pgq is left as it is (:class:`~pgq.SchemaMismatch` when it does not)."""
    env = _running_environment()
    command = _command(env)
    if env is not None and command == "downgrade":
        _on_downgrade(env, connection)
    elif command == "upgrade":
        _run_in_env(connection, env, revision, downgrade=False)


def _running_environment() -> EnvironmentContext | None:
    """The alembic environment whose env.py is running, if any."""
    from alembic import context

    return getattr(context, "_proxy", None)


def _command(env: EnvironmentContext | None) -> str:
    """'upgrade' or 'downgrade' for the alembic commands that migrate, 'other' for the rest
    (revision, check, current, stamp...); 'upgrade' outside alembic."""
    if env is None:
        return "upgrade"
    # alembic hands env.py the step its command takes; upgrade's and downgrade's bear the
    # command's name (alembic.command), every other command's does not.
    name = getattr(env.context_opts.get("fn"), "__name__", "")
    return name if name in ("upgrade", "downgrade") else "other"


def _run_in_env(
    connection: Connection | None,
    env: EnvironmentContext | None,
    revision: str,
    *,
    downgrade: bool,
) -> None:
    """pgq's revisions from inside the project's alembic environment ``env``: on
    ``connection``, or, in alembic's offline mode, as SQL written where alembic writes the
    project's."""
    if env is None or not env.is_offline_mode():
        if connection is None:
            raise ConfigError(
                "pgq.migrate.upgrade_on needs the connection your env.py migrates with (only "
                "offline mode, alembic --sql, takes None)"
            )
        _run_pgq(connection, revision, downgrade=downgrade)
    elif downgrade:
        _run_pgq(None, revision, downgrade=True, output=_output(env), starting=SCHEMA_REVISION)
    elif env.context_opts.get("starting_rev") is not None:
        # The range is the project's: where pgq's schema stands then is unknown here.
        _output(env).write(
            "-- pgq's DDL is left out: a starting revision was given, and pgq's revisions "
            "keep their own. `pgq migrate --sql` prints it.\n\n"
        )
    else:
        _run_pgq(None, revision, downgrade=False, output=_output(env))


def _run_pgq(
    connection: Connection | None,
    revision: str,
    *,
    downgrade: bool,
    output: TextIO | None = None,
    starting: str | None = None,
) -> None:
    """Run pgq's revisions up (or down) to ``revision`` on ``connection``, in pgq's own
    version table under the migration lock; with ``output`` instead (offline), write their
    SQL there, from ``starting`` (None: from base)."""
    from alembic.operations import Operations
    from alembic.script import ScriptDirectory
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from pgq.schema import metadata

    script = ScriptDirectory(str(migrations_dir()))
    steps = script._downgrade_revs if downgrade else script._upgrade_revs
    opts: dict[str, Any] = {
        "version_table": VERSION_TABLE,
        "target_metadata": metadata,
        "script": script,
        "fn": lambda rev, _context: steps(revision, rev),
        _REMOVAL_ASKED: downgrade,  # only ever called to go down when asked (-x pgq=remove)
    }
    if output is not None:
        if starting is not None:
            opts["starting_rev"] = starting
        context = _migration_context(None, {**opts, "as_sql": True, "output_buffer": output})
    else:
        assert connection is not None
        context = _migration_context(connection, opts)
    # alembic.op points at this context while pgq's revisions run, and at nothing after:
    # the caller's own context installs it again for its migrations.
    with Operations.context(context), context.begin_transaction():
        if connection is not None:
            connection.execute(text(sql.MIGRATION_LOCK))
            rename_old_ids(connection)
            found = _revision_on(connection)
            _refuse_unrecorded(found)
            if is_unknown(found):  # a newer pgq's: left as it is if it serves this pgq
                if downgrade:
                    _refuse_newer(found)
                require_current(found)
                return
            try:
                context.run_migrations()
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) not in _NOT_THAT_SHAPE:
                    raise
                raise _tables_not_at(found, exc) from exc
        else:
            context.run_migrations()


#: What a revision's DDL meets on tables of another shape than the revision it starts from:
#: a duplicate (column, object, table, function) or a missing one (column, table, object,
#: function).
_NOT_THAT_SHAPE = frozenset({
    "42701", "42710", "42P07", "42723", "42703", "42P01", "42704", "42883",
})  # fmt: skip
_RECORD = (
    "find the revision the tables are at (the pgq release that last migrated them; `pgq "
    "migrate --sql` prints each revision's DDL), record it"
)


def _tables_not_at(found: Revision, exc: DBAPIError) -> SchemaMismatch:
    """A revision's DDL failed on pgq's tables: they are not at the recorded revision."""
    reason = str(exc.orig.__cause__ or exc.orig) if exc.orig is not None else str(exc)
    return SchemaMismatch(
        found.revision,
        SCHEMA_REVISION,
        fix=(
            f"migrating from {found.revision or 'base'} failed ({reason}), so the tables are "
            f"not at {found.revision or 'base'}: {VERSION_TABLE} or the tables were changed "
            f"by hand. Nothing was changed; {_RECORD} (UPDATE {VERSION_TABLE} SET "
            "version_num = 'pgq_00NN'), then run `pgq migrate` again"
        ),
    )


_PGQ_ID = re.compile(r"pgq_(\d{4,})")


def _refuse_unrecorded(found: Revision) -> None:
    """Raise :class:`~pgq.SchemaMismatch` when pgq's version table cannot say where its
    tables stand: no row beside the tables, or an id no pgq release writes (a newer pgq's is
    ``pgq_`` and a number past this one's). Migrating from there would fail half-way."""
    if found.revision is None or found.shared:
        return
    if found.revision.startswith("unknown"):  # read_revision: tables, no version
        raise SchemaMismatch(
            found.revision,
            SCHEMA_REVISION,
            fix=(
                f"pgq's tables exist but {VERSION_TABLE} records no revision (it was emptied "
                f"or dropped). Nothing was changed; {_RECORD} (CREATE TABLE IF NOT EXISTS "
                f"{VERSION_TABLE} (version_num varchar(32) PRIMARY KEY); INSERT INTO "
                f"{VERSION_TABLE} VALUES ('pgq_00NN')), then run `pgq migrate` again"
            ),
        )
    newer = _PGQ_ID.fullmatch(found.revision)
    if is_unknown(found) and (newer is None or int(newer[1]) <= int(SCHEMA_REVISION[4:])):
        raise SchemaMismatch(
            found.revision,
            SCHEMA_REVISION,
            fix=(
                f"no pgq release has revision {found.revision!r} ({VERSION_TABLE} was changed "
                f"by hand or by another tool). Nothing was changed; {_RECORD} (UPDATE "
                f"{VERSION_TABLE} SET version_num = 'pgq_00NN'), then run `pgq migrate` again"
            ),
        )


def _migration_context(connection: Connection | None, opts: dict[str, Any]) -> MigrationContext:
    from alembic.runtime.migration import MigrationContext

    if connection is not None:
        return MigrationContext.configure(connection, opts=opts)
    return MigrationContext.configure(
        dialect_name="postgresql",
        dialect_opts={"paramstyle": "named"},
        opts={**opts, "literal_binds": True},
    )


def _output(env: EnvironmentContext) -> TextIO:
    """Where alembic writes the project's SQL in offline mode."""
    configured = env.context_opts.get("output_buffer") or env.config.output_buffer
    return configured if configured is not None else sys.stdout


def _revision_on(connection: Connection) -> Revision:
    """Where pgq's schema stands, as recorded in pgq's own version table."""
    from sqlalchemy import text

    own: list[str] = []
    if connection.execute(text(sql.OWN_VERSION_TABLE_EXISTS)).scalar():
        own = [str(r[0]) for r in connection.execute(text(sql.PGQ_VERSION))]
    has_jobs = bool(
        connection.execute(text(sql.SCHEMA_VERSION_TABLES)).mappings().one()["has_jobs"]
    )
    found = read_revision(own, [], has_jobs=has_jobs)
    if is_unknown(found) and connection.execute(text(sql.SCHEMA_COMPAT_EXISTS)).scalar():
        found = replace(found, min_code=connection.execute(text(sql.MIN_CODE_REVISION)).scalar())
    return found


def _on_downgrade(env: EnvironmentContext, connection: Connection | None) -> None:
    """A downgrade of the project's revisions leaves pgq's alone, unless it goes past pgq's
    base: then pgq's tables, and the jobs in them, are dropped only when asked."""
    if not _reaches_base(env, connection):
        return
    choice = env.get_x_argument(as_dictionary=True).get("pgq")
    if choice == _KEEP:
        return
    if choice == _REMOVE:
        _run_in_env(connection, env, "base", downgrade=True)
        return
    raise _refused()(
        "this downgrade goes below pgq's tables (pgq_jobs and the rest, created by alembic "
        "upgrade before your first revision), and pgq never drops them and their jobs as a "
        "side effect. To downgrade your own revisions and keep pgq: `alembic -x pgq=keep "
        "downgrade base`. To remove pgq on purpose, jobs and all: `alembic -x pgq=remove "
        "downgrade base`"
    )


def require_removal_asked(context: MigrationContext) -> None:
    """Raise unless the migration that undoes pgq's first revision (dropping its tables and
    every job in them) was asked for: from pgq's own environment (`pgq migrate`'s,
    :func:`downgrade`), from :func:`upgrade_on` told ``-x pgq=remove``, or, where a project's
    alembic runs pgq's revisions (the older setup), with ``-x pgq=remove``."""
    if context.opts.get(_REMOVAL_ASKED):
        return
    env = context.environment_context
    if env is not None and env.get_x_argument(as_dictionary=True).get("pgq") == _REMOVE:
        return
    raise _refused()(
        "this downgrade undoes pgq's first revision, dropping pgq's tables (pgq_jobs and the "
        "rest), and pgq never drops them and their jobs as a side effect. To downgrade your "
        "own revisions and keep pgq: `alembic downgrade YOURBRANCH@base`. To remove pgq on "
        "purpose, jobs and all: `alembic -x pgq=remove downgrade base`"
    )


def _reaches_base(env: EnvironmentContext, connection: Connection | None) -> bool:
    """Whether the project's downgrade leaves none of its revisions applied."""
    destination = env.context_opts.get("destination_rev")
    if destination == "base":
        return True
    if connection is None:  # offline: the range names its end; only base is below pgq
        return False
    from alembic.runtime.migration import MigrationContext

    # The project's current heads, read with alembic's own reader, outside any transaction
    # of the caller's (its env.py begins its own next).
    outer = connection.in_transaction()
    heads = MigrationContext.configure(
        connection,
        opts={
            "version_table": env.context_opts.get("version_table", "alembic_version"),
            "version_table_schema": env.context_opts.get("version_table_schema"),
        },
    ).get_current_heads()
    if not outer and connection.in_transaction():
        connection.rollback()
    applied = {s.revision for s in env.script.iterate_revisions(heads, None)}
    removed = {step.revision.revision for step in env.context_opts["fn"](heads, None)}
    return bool(applied) and applied <= removed


@functools.cache
def _refused() -> type[ConfigError]:
    """pgq's refusal, also an alembic CommandError: alembic's command line prints that as
    one line (``FAILED: ...``), anything else as a traceback. Made on first use, as alembic
    is imported only where it runs."""
    from alembic.util import CommandError

    return type(
        "MigrationRefused",
        (ConfigError, CommandError),
        {"__module__": __name__, "__doc__": "A migration pgq does not do as a side effect."},
    )


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
    out = io.StringIO()
    _run_pgq(None, revision, downgrade=False, output=out)
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
    migrations_dir()  # an installation without its migrations says so before connecting
    target = Target.resolve(dsn)  # the DSN env.py will use, and the same session options
    conn = await connect(target.dsn, **target.options("pgq migrate"))
    try:
        found = await schema_revision(conn)
    finally:
        await conn.close()
    _refuse_unrecorded(found)
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
