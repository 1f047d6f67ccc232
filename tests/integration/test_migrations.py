import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

import pgq
from pgq import migrate
from pgq._core.dsn import sqlalchemy_url
from pgq._db.revision import check_schema
from pgq.schema import SCHEMA_REVISION, metadata

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]

CATALOG = {
    "columns": """
        SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default,
               is_identity
        FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name LIKE 'pgq\\_%' AND table_name <> 'pgq_alembic_version'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename LIKE 'pgq\\_%' AND tablename <> 'pgq_alembic_version'
        ORDER BY 1""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text LIKE 'pgq\\_%'
          AND conrelid::regclass::text <> 'pgq_alembic_version'
        ORDER BY 1, 2""",
    "enums": """
        SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder)::text
        FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid GROUP BY 1 ORDER BY 1""",
    # Laid out alike or not, the same text (an older revision wrapped a body's lines).
    "functions": """
        SELECT proname, pg_get_function_arguments(oid), pg_get_function_result(oid), provolatile,
               btrim(regexp_replace(prosrc, '\\s+', ' ', 'g'))  -- layout aside
        FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'pgq\\_%'
        ORDER BY 1""",
    "triggers": """
        SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE 'pgq\\_%'
        ORDER BY 1""",
    "row types": """
        SELECT t.typname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_type t JOIN pg_class c ON c.oid = t.typrelid
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
        WHERE t.typnamespace = 'public'::regnamespace AND c.relkind = 'c'
          AND t.typname LIKE 'pgq\\_%'
        ORDER BY 1, 2""",
}


async def snapshot(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {k: [tuple(r) for r in await conn.fetch(q)] for k, q in CATALOG.items()}
    finally:
        await conn.close()


async def test_migrating_equals_create_all(dsn: str, empty_dsn: str) -> None:
    engine = create_async_engine(sqlalchemy_url(empty_dsn))
    async with engine.begin() as c:
        await c.run_sync(metadata.create_all)
    await engine.dispose()
    migrated, created = await snapshot(dsn), await snapshot(empty_dsn)
    assert migrated["columns"] and migrated["indexes"] and migrated["constraints"]
    assert {"pgq_outcome_state", "pgq_unique_active"} <= {f[0] for f in migrated["functions"]}
    assert {"pgq_jobs_parent_finished", "pgq_jobs_parent_deleted"} <= {
        t[0] for t in migrated["triggers"]
    }
    assert migrated == created


async def test_autogenerate_finds_nothing_to_change(dsn: str) -> None:
    engine = create_async_engine(sqlalchemy_url(dsn))

    def diff(sync_conn: Any) -> list[Any]:
        ctx = MigrationContext.configure(
            sync_conn, opts={"compare_type": True, "version_table": "pgq_alembic_version"}
        )
        return [
            d
            for d in compare_metadata(ctx, metadata)
            if not (d[0] == "remove_table" and d[1].name == "pgq_alembic_version")
        ]

    async with engine.connect() as c:
        assert await c.run_sync(diff) == []
    await engine.dispose()


async def test_the_database_reads_states_as_job_state_defines_them(dsn: str) -> None:
    """The enum's order, the unique-states bits and the final states (of the check
    constraint and of the outcome transition) in the migrated database agree with
    pgq.JobState, their one definition."""
    conn = await asyncpg.connect(dsn)
    try:
        order = await conn.fetchval("SELECT enum_range(NULL::pgq_job_state)::text[]")
        assert order == [s.value for s in pgq.JobState]
        for state in pgq.JobState:
            hits = [
                other.value
                for other in pgq.JobState
                if await conn.fetchval(
                    "SELECT pgq_unique_active($1::pgq_job_state, $2)", state.value, other.bit
                )
            ]
            assert hits == [state.value], state
        final = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'pgq_jobs_finalized_at_check'"
        )
        assert sorted(re.findall(r"'(\w+)'", final)) == sorted(
            s.value for s in pgq.JobState if s.is_final
        )
        for state in pgq.JobState:
            is_final = await conn.fetchval("SELECT pgq_is_final($1::pgq_job_state)", state.value)
            assert is_final is state.is_final, state
    finally:
        await conn.close()


def test_head_is_the_revision_the_code_needs() -> None:
    assert migrate.head_revision() == SCHEMA_REVISION


async def test_downgrade_to_base_removes_everything(dsn: str) -> None:
    await anyio.to_thread.run_sync(migrate.downgrade, dsn)
    conn = await asyncpg.connect(dsn)
    try:
        left = await conn.fetch(
            "SELECT relname FROM pg_class WHERE relname LIKE 'pgq\\_%' "
            "AND relname NOT LIKE 'pgq_alembic_version%'"
        )
        types = await conn.fetch("SELECT typname FROM pg_type WHERE typname = 'pgq_job_state'")
        functions = await conn.fetch("SELECT proname FROM pg_proc WHERE proname LIKE 'pgq\\_%'")
        assert left == [] and types == [] and functions == []
        with pytest.raises(pgq.SchemaMismatch, match="revision none"):
            await check_schema(conn)
    finally:
        await conn.close()
    await migrate.upgrade_async(dsn)
    assert (await snapshot(dsn))["columns"]


def test_pgq_migrate_sql_prints_the_ddl(python: str) -> None:
    out = subprocess.run(
        [python, "-m", "pgq", "migrate", "--sql"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert "CREATE TABLE pgq_jobs" in out and "CREATE INDEX pgq_jobs_fetch_idx" in out
    assert "pgq_alembic_version" in out and out.rstrip().endswith("COMMIT;")


def test_alembic_upgrade_head_from_the_repo_root(python: str, empty_dsn: str) -> None:
    subprocess.run(
        [python, "-m", "alembic", "-x", f"dsn={empty_dsn}", "upgrade", "head"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [python, "-m", "pgq", "migrate", "--dsn", empty_dsn],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )  # already at head: a no-op


async def test_pgq_revisions_run_inside_a_users_alembic_environment(
    tmp_path: Path, empty_dsn: str, python: str
) -> None:
    """docs/migrations.md: a project adds pgq's versions to its own environment."""
    (tmp_path / "versions").mkdir()
    (tmp_path / "alembic.ini").write_text(
        textwrap.dedent("""\
        [alembic]
        script_location = %(here)s
        version_locations = %(here)s/versions pgq:migrations/versions
        path_separator = space
        """)
    )
    (tmp_path / "env.py").write_text(
        textwrap.dedent(f"""\
        import asyncio
        from alembic import context
        from sqlalchemy.ext.asyncio import create_async_engine

        def run(conn):
            context.configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()

        async def main():
            engine = create_async_engine({sqlalchemy_url(empty_dsn)!r})
            async with engine.connect() as conn:
                await conn.run_sync(run)
            await engine.dispose()

        asyncio.run(main())
        """)
    )
    (tmp_path / "versions" / "a1_users.py").write_text(
        textwrap.dedent("""\
        import sqlalchemy as sa
        from alembic import op
        revision = "a1"
        down_revision = None
        branch_labels = ("app",)
        depends_on = None
        def upgrade():
            op.create_table("users", sa.Column("id", sa.Integer, primary_key=True))
        def downgrade():
            op.drop_table("users")
        """)
    )
    await anyio.run_process([python, "-m", "alembic", "upgrade", "heads"], cwd=tmp_path)
    conn = await asyncpg.connect(empty_dsn)
    try:
        rows = {r[0] for r in await conn.fetch("SELECT version_num FROM alembic_version")}
        assert rows == {"a1", SCHEMA_REVISION}
        await check_schema(conn)  # reads the shared version table
    finally:
        await conn.close()


async def pgq_cli(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pgq ARGS``, without raising on a failure."""
    out = await anyio.run_process([python, "-m", "pgq", *args], check=False)
    return subprocess.CompletedProcess(
        out.args, out.returncode, out.stdout.decode(), out.stderr.decode()
    )


async def test_old_revision_ids_are_read_as_theirs_and_pgq_migrate_renames_and_upgrades(
    dsn: str, python: str
) -> None:
    await migrate.downgrade_async(dsn, "pgq_0003")
    conn = await asyncpg.connect(dsn)
    try:
        # As a database migrated before the ids were prefixed records its revision.
        await conn.execute("UPDATE pgq_alembic_version SET version_num = '0003'")
        with pytest.raises(pgq.SchemaMismatch, match="schema at revision pgq_0003, this pgq"):
            await check_schema(conn)
        out = await pgq_cli(python, "migrate", "--dsn", dsn)
        assert out.returncode == 0, out.stderr
        assert await conn.fetchval("SELECT version_num FROM pgq_alembic_version") == SCHEMA_REVISION
        await check_schema(conn)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (
            "UPDATE pgq_alembic_version SET version_num = 'deadbeef'",
            "schema at revision deadbeef, this pgq needs {head}: no pgq release has "
            "revision 'deadbeef'",
        ),
        (
            "UPDATE pgq_alembic_version SET version_num = 'pgq_0005'",
            "schema at revision pgq_0005, this pgq needs {head}: migrating from pgq_0005 "
            'failed (column "limit_key" of relation "pgq_jobs" already exists), so the '
            "tables are not at pgq_0005",
        ),
        (
            "DELETE FROM pgq_alembic_version",
            "pgq's tables exist but pgq_alembic_version records no revision",
        ),
        (
            "DROP TABLE pgq_alembic_version",
            "pgq's tables exist but pgq_alembic_version records no revision",
        ),
    ],
)
async def test_a_version_table_that_cannot_say_where_the_tables_stand_gets_advice(
    dsn: str, python: str, damage: str, says: str
) -> None:
    """An unknown id, an older revision than the tables are at, no row or no table: `pgq
    migrate` changes nothing and says what to do, and the advice works."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO pgq_jobs (task) VALUES ('kept')")
        await conn.execute(damage)
        before = await snapshot(dsn)
        out = await pgq_cli(python, "migrate", "--dsn", dsn)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("pgq: error: "), out.stderr
        assert says.format(head=SCHEMA_REVISION) in out.stderr
        assert "Nothing was changed" in out.stderr and "run `pgq migrate` again" in out.stderr
        assert await snapshot(dsn) == before
        assert await conn.fetchval("SELECT task FROM pgq_jobs") == "kept"
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS pgq_alembic_version (version_num varchar(32) PRIMARY KEY);"
            "DELETE FROM pgq_alembic_version"
        )
        await conn.execute("INSERT INTO pgq_alembic_version VALUES ($1)", SCHEMA_REVISION)
        again = await pgq_cli(python, "migrate", "--dsn", dsn)
        assert again.returncode == 0, again.stderr
        await check_schema(conn)
    finally:
        await conn.close()


async def test_a_project_whose_alembic_runs_pgq_gets_advice_not_a_traceback(
    dsn: str, python: str
) -> None:
    """pgq's revisions recorded in the project's own alembic_version (the shared setup)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "ALTER TABLE pgq_alembic_version RENAME TO alembic_version;"
            "UPDATE alembic_version SET version_num = '0002'"  # an old id, and behind
        )
        with pytest.raises(pgq.SchemaMismatch, match="run `alembic upgrade heads` in your project"):
            await check_schema(conn)
        out = await pgq_cli(python, "migrate", "--dsn", dsn)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert "your alembic environment migrates pgq" in out.stderr
        assert "pgq migrate --rename-shared-ids" in out.stderr
        renamed = await pgq_cli(python, "migrate", "--rename-shared-ids", "--dsn", dsn)
        assert renamed.returncode == 0 and "renamed 1" in renamed.stdout, renamed.stderr
        assert await conn.fetchval("SELECT version_num FROM alembic_version") == "pgq_0002"
        again = await pgq_cli(python, "migrate", "--dsn", dsn)
        assert "rename" not in again.stderr and "alembic upgrade heads" in again.stderr
    finally:
        await conn.close()


async def test_a_shared_setups_downgrade_base_keeps_pgq_unless_told_to_remove_it(
    tmp_path: Path, empty_dsn: str, python: str
) -> None:
    """The older setup (pgq's revisions in the project's script directory): `alembic
    downgrade base` would run pgq's first revision down, dropping its tables and jobs; it is
    refused, the whole downgrade with it, unless `-x pgq=remove` asks for that."""
    (tmp_path / "versions").mkdir()
    (tmp_path / "alembic.ini").write_text(
        "[alembic]\nscript_location = %(here)s\n"
        "version_locations = %(here)s/versions pgq:migrations/versions\npath_separator = space\n"
    )
    (tmp_path / "env.py").write_text(
        textwrap.dedent(f"""\
        import asyncio
        from alembic import context
        from sqlalchemy.ext.asyncio import create_async_engine

        def run(conn):
            context.configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()

        async def main():
            engine = create_async_engine({sqlalchemy_url(empty_dsn)!r})
            async with engine.connect() as conn:
                await conn.run_sync(run)
            await engine.dispose()

        asyncio.run(main())
        """)
    )
    (tmp_path / "versions" / "a1_users.py").write_text(
        "import sqlalchemy as sa\nfrom alembic import op\n"
        "revision = 'a1'\ndown_revision = None\nbranch_labels = ('app',)\ndepends_on = None\n"
        "def upgrade():\n    op.create_table('users', sa.Column('id', sa.Integer, primary_key=True))\n"
        "def downgrade():\n    op.drop_table('users')\n"
    )

    async def alembic(*args: str) -> subprocess.CompletedProcess[str]:
        out = await anyio.run_process([python, "-m", "alembic", *args], cwd=tmp_path, check=False)
        return subprocess.CompletedProcess(
            out.args, out.returncode, out.stdout.decode(), out.stderr.decode()
        )

    assert (await alembic("upgrade", "heads")).returncode == 0
    refused = await alembic("downgrade", "base")
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in said
    assert "FAILED: this downgrade undoes pgq's first revision" in said
    assert "`alembic -x pgq=remove downgrade base`" in said
    conn = await asyncpg.connect(empty_dsn)
    try:
        # Rolled back whole: the project's table too.
        assert await conn.fetchval("SELECT to_regclass('users') IS NOT NULL")
        await check_schema(conn)
        own = await alembic("downgrade", "app@base")
        assert own.returncode == 0, own.stderr
        assert await conn.fetchval("SELECT to_regclass('users') IS NULL")
        await check_schema(conn)
        removed = await alembic("-x", "pgq=remove", "downgrade", "base")
        assert removed.returncode == 0, removed.stderr
        assert await conn.fetchval("SELECT to_regclass('pgq_jobs') IS NULL")
    finally:
        await conn.close()
