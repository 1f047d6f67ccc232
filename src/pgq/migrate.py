"""Applying pgq's alembic migrations from code and from `pgq migrate`."""

from __future__ import annotations

import io
from pathlib import Path

import anyio

from pgq._dsn import sqlalchemy_url
from pgq._store.connections import connect


def migrations_dir() -> Path:
    """Where the migrations live: inside the installed package, or the source checkout's
    top-level ``migrations/`` (the package's copy is a link to it)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("pgq's migrations are missing from this installation")


def _config(dsn: str | None, output: io.StringIO | None = None) -> object:
    from alembic.config import Config

    cfg = Config(output_buffer=output) if output is not None else Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["pgq_url"] = sqlalchemy_url(dsn)
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(dsn: str | None, revision: str = "head") -> None:
    """Migrate the database at ``dsn`` to ``revision``. Blocking: call it outside an event
    loop, or use :func:`upgrade_async`."""
    from alembic import command

    anyio.run(_check_reachable, dsn)
    command.upgrade(_config(dsn), revision)  # type: ignore[arg-type]


def downgrade(dsn: str | None, revision: str = "base") -> None:
    """Undo pgq's migrations down to ``revision`` (``base`` drops every pgq table)."""
    from alembic import command

    anyio.run(_check_reachable, dsn)
    command.downgrade(_config(dsn), revision)  # type: ignore[arg-type]


async def upgrade_async(dsn: str | None, revision: str = "head") -> None:
    """:func:`upgrade` from async code (runs alembic in a thread)."""
    await _check_reachable(dsn)
    from alembic import command

    await anyio.to_thread.run_sync(lambda: command.upgrade(_config(dsn), revision))  # type: ignore[arg-type]


def sql_script(revision: str = "head") -> str:
    """The DDL of the migrations up to ``revision``, for DBAs who apply it themselves."""
    from alembic import command

    out = io.StringIO()
    command.upgrade(_config(None, out), revision, sql=True)  # type: ignore[arg-type]
    return out.getvalue()


def head_revision() -> str:
    """The newest revision the shipped migrations define."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    assert head is not None
    return head


async def _check_reachable(dsn: str | None) -> None:
    # alembic's own connection errors arrive as long SQLAlchemy tracebacks; fail first,
    # with pgq's one-line message.
    conn = await connect(dsn)
    await conn.close()
