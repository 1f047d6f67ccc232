"""pgq as a user has it: built as a release is (`python -m build`: the sdist, then the wheel
from that sdist), installed in virtual environments of its own (the wheel with its extras,
the sdist on its own), used from outside pgq's source tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import anyio
import asyncpg
import pytest

from pgq._core.dsn import sqlalchemy_url
from pgq._db.revision import KNOWN_REVISIONS, SCHEMA_REVISION, check_schema

# One process builds the release and its venvs for the whole module (pytest-xdist's
# loadgroup keeps the module's tests together).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("installed-wheel"),
]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Release:
    """What `python -m build` made."""

    sdist: Path
    wheel: Path


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The release artifacts, built once per session as a release builds them: no flag, so
    `build` makes the sdist from the checkout and then the wheel from that sdist (what
    `pip wheel .` skips: it builds from the checkout, where a link would be followed)."""
    out = tmp_path_factory.mktemp("release")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = out.glob("pgq_async-*.tar.gz")
    (wheel,) = out.glob("pgq_async-*.whl")
    return Release(sdist, wheel)


def _venv(base: Path, *install: str) -> Path:
    """The bin/ folder of a fresh venv under ``base`` with ``install`` pip-installed."""
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True)
    bin_ = base / "venv" / "bin"
    subprocess.run(
        [str(bin_ / "pip"), "install", "--quiet", *install],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return bin_


@pytest.fixture(scope="module")
def installed(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh venv where the release wheel is installed with its sync
    and otel extras, OpenTelemetry's SDK, pytest and alembic (what an application's own
    environment would hold)."""
    return _venv(
        tmp_path_factory.mktemp("wheel"),
        f"{release.wheel}[sync,otel]",
        "opentelemetry-sdk",
        "pytest",
    )


@pytest.fixture(scope="module")
def installed_sdist(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh venv where pip installed the release sdist (building its
    own wheel from it, as a user without a wheel for their platform would)."""
    return _venv(tmp_path_factory.mktemp("sdist"), str(release.sdist))


def _migration_files() -> list[str]:
    """The package's migrations in the checkout, relative to ``src/pgq/migrations``."""
    top = ROOT / "src" / "pgq" / "migrations"
    return sorted(
        str(p.relative_to(top))
        for p in top.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def test_the_release_ships_the_migrations_the_statements_and_py_typed(
    release: Release,
) -> None:
    files = _migration_files()
    revisions = ["_".join(Path(f).stem.split("_")[:2]) for f in files]
    assert revisions == list(KNOWN_REVISIONS), "every known revision and nothing else"
    with tarfile.open(release.sdist) as sdist:
        members = sdist.getmembers()
    assert [m.name for m in members if not (m.isfile() or m.isdir())] == [], "links or devices"
    in_sdist = {m.name.split("/", 1)[1] for m in members if "/" in m.name}
    assert {f"src/pgq/migrations/{f}" for f in files} <= in_sdist
    assert {"alembic.ini", "migrations/env.py", "migrations/script.py.mako"} <= in_sdist
    assert not any("__pycache__" in name for name in in_sdist)
    in_wheel = set(zipfile.ZipFile(release.wheel).namelist())
    for expected in (
        *(f"pgq/migrations/{f}" for f in files),
        "pgq/py.typed",
        "pgq/_db/sql/claims.sql",
        "pgq/_db/sql/outcomes.sql",
    ):
        assert expected in in_wheel
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in in_wheel)


@pytest.mark.parametrize("artifact", ["wheel", "sdist"])
async def test_each_release_artifact_migrates_a_fresh_database_and_runs_a_job(
    artifact: str, request: pytest.FixtureRequest, empty_dsn: str, tmp_path: Path
) -> None:
    """What a new user does first, from each artifact: `pgq migrate`, then a job enqueued
    from the shell and run by a burst worker."""
    bin_: Path = request.getfixturevalue("installed" if artifact == "wheel" else "installed_sdist")
    pgq_ = str(bin_ / "pgq")
    version = await anyio.run_process([pgq_, "--version"], cwd=tmp_path)
    assert version.stdout.decode() == "pgq 0.1.0\n"
    migrated = await anyio.run_process([pgq_, "migrate", "--dsn", empty_dsn], cwd=tmp_path)
    assert migrated.stdout.decode() == f"pgq schema at revision {SCHEMA_REVISION}\n"
    conn = await asyncpg.connect(empty_dsn)
    try:
        await check_schema(conn)
    finally:
        await conn.close()
    shutil.copy(ROOT / "docs" / "examples" / "lifespan.py", tmp_path)
    env = {**os.environ, "PGQ_DSN": empty_dsn}
    await anyio.run_process(
        [pgq_, "enqueue", "greet", "--args", '{"name": "ada"}'], cwd=tmp_path, env=env
    )
    out = await anyio.run_process(
        [pgq_, "worker", "lifespan:app", "--burst"], cwd=tmp_path, env=env
    )
    assert out.stdout.decode().splitlines()[-1] == "lifespan: closed after greeting ada"
    conn = await asyncpg.connect(empty_dsn)
    try:
        done = await conn.fetchrow("SELECT state::text, result::text FROM pgq_jobs")
    finally:
        await conn.close()
    assert done is not None and tuple(done) == ("completed", '"hello ada"')


async def test_an_applications_suite_runs_with_the_installed_plugin(
    installed: Path, server_dsn: str, tmp_path: Path
) -> None:
    """docs/testing.md's example, copied out of the source tree, run by the wheel's
    plugin (found through its entry point)."""
    suite = tmp_path / "app_tests"
    shutil.copytree(
        ROOT / "docs" / "examples" / "testing", suite, ignore=shutil.ignore_patterns("__pycache__")
    )
    out = await anyio.run_process(
        [str(installed / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=suite,
        env={**os.environ, "PGQ_TEST_DSN": server_dsn},
        check=False,
    )
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert b"5 passed" in out.stdout


async def test_typed_enqueue_and_the_sync_client_from_the_wheel(
    installed: Path, dsn: str, tmp_path: Path
) -> None:
    script = tmp_path / "use.py"
    script.write_text(
        textwrap.dedent(f"""\
        import pgq

        app = pgq.App()

        @app.task(queue="emails")
        def send(ctx: pgq.JobContext, to: str) -> str:
            return to

        with pgq.SyncClient({dsn!r}, app=app) as client:
            job = client.enqueue(send.spec(to="a@b.c"), delay=5)
            try:
                client.enqueue("send", {{"too": 1}})
            except pgq.ConfigError as exc:
                print("refused:", exc)
            try:
                client.enqueue("send", {{"to": 1}})
            except pgq.ConfigError as exc:
                print("refused:", exc)
        print(job.id, job.queue, job.state)
        """)
    )
    out = await anyio.run_process([str(installed / "python"), str(script)], cwd=tmp_path)
    lines = out.stdout.decode().splitlines()
    assert lines[0].startswith("refused: task 'send' takes no argument too")
    assert lines[1] == (
        "refused: task 'send': argument to must be str, got int 1; nothing was enqueued"
    )
    assert lines[2] == "1 emails scheduled"


async def test_a_burst_worker_from_the_wheel_runs_the_lifespan(
    installed: Path, dsn: str, tmp_path: Path
) -> None:
    """docs/examples/lifespan.py under the wheel's `pgq worker --burst`: opened once,
    tasks reach it through ctx.state, closed at the end."""
    shutil.copy(ROOT / "docs" / "examples" / "lifespan.py", tmp_path)
    enqueue = [str(installed / "pgq"), "enqueue", "greet", "--dsn", dsn, "--args"]
    await anyio.run_process([*enqueue, '{"name": "ada"}'], cwd=tmp_path)
    await anyio.run_process([*enqueue, '{"name": "bob"}'], cwd=tmp_path)
    out = await anyio.run_process(
        [str(installed / "pgq"), "worker", "lifespan:app", "--dsn", dsn, "--burst"],
        cwd=tmp_path,
    )
    lines = out.stdout.decode().splitlines()
    assert lines[0] == "lifespan: opened"
    assert lines[1] in (
        "lifespan: closed after greeting ada, bob",
        "lifespan: closed after greeting bob, ada",
    )


async def test_json_logs_and_console_traces_from_the_wheels_worker(
    installed: Path, dsn: str, tmp_path: Path
) -> None:
    """docs/examples/observed.py as docs/observability.md runs it: ctx.log's line is JSON
    with the job's fields, and --tracing exports the attempt's span from OTEL_* variables
    (no opentelemetry-instrument)."""
    shutil.copy(ROOT / "docs" / "examples" / "observed.py", tmp_path)
    pgq_ = str(installed / "pgq")
    await anyio.run_process(
        [pgq_, "enqueue", "charge", "--queue", "billing", "--args", '{"amount": 5}', "--dsn", dsn],
        cwd=tmp_path,
    )
    out = await anyio.run_process(
        [pgq_, "--log-format", "json", "worker", "observed:app", "--tracing", "--burst"],
        cwd=tmp_path,
        env={
            **os.environ,
            "PGQ_DSN": dsn,
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_SERVICE_NAME": "billing",
        },
    )
    lines = [json.loads(line) for line in out.stderr.decode().splitlines()]
    (charging,) = [line for line in lines if line["logger"] == "pgq.task"]
    assert charging["message"] == "[job 1 charge#1] charging 5"
    assert {k: charging[k] for k in ("job_id", "task", "queue", "attempt")} == {
        "job_id": 1,
        "task": "charge",
        "queue": "billing",
        "attempt": 1,
    }
    span = json.loads(out.stdout.decode())
    assert span["name"] == "process billing" and span["kind"] == "SpanKind.CONSUMER"
    assert span["attributes"]["messaging.message.id"] == "1"
    assert span["resource"]["attributes"]["service.name"] == "billing"


USER_ENV = """\
import asyncio

from alembic import context
from sqlalchemy import Column, Integer, MetaData, Table
from sqlalchemy.ext.asyncio import create_async_engine

import pgq.migrate

metadata = MetaData()
Table("users", metadata, Column("id", Integer, primary_key=True))

def run(connection):
    pgq.migrate.upgrade_on(connection)  # pgq's tables, in pgq's own version table
    context.configure(
        connection=connection, target_metadata=metadata, include_name=pgq.migrate.exclude_pgq
    )
    with context.begin_transaction():
        context.run_migrations()

async def main():
    engine = create_async_engine(context.config.get_main_option("sqlalchemy.url"))
    async with engine.connect() as connection:
        await connection.run_sync(run)
        await connection.commit()
    await engine.dispose()

asyncio.run(main())
"""


async def test_a_project_runs_pgq_migrations_from_its_alembic_env(
    tmp_path: Path, empty_dsn: str, installed: Path
) -> None:
    """docs/migrations.md, as a user does it: the project's alembic env calls
    pgq.migrate.upgrade_on, the project's revisions stay its own."""
    bin_ = installed
    project = tmp_path / "project"
    project.mkdir()
    await anyio.run_process(
        [str(bin_ / "alembic"), "init", "--template", "async", "alembic"], cwd=project
    )
    (project / "alembic" / "env.py").write_text(USER_ENV)
    ini = project / "alembic.ini"
    ini.write_text(
        ini.read_text().replace("driver://user:pass@localhost/dbname", sqlalchemy_url(empty_dsn))
    )
    made = await anyio.run_process([str(bin_ / "alembic"), "revision", "-m", "users"], cwd=project)
    (revision,) = (project / "alembic" / "versions").glob("*_users.py")
    assert "down_revision: Union[str, Sequence[str], None] = None" in revision.read_text()
    assert b"site-packages" not in made.stdout
    revision.write_text(
        revision.read_text().replace(
            'def upgrade() -> None:\n    """Upgrade schema."""\n    pass',
            "def upgrade() -> None:\n    op.create_table('users', sa.Column('id', sa.Integer, primary_key=True))",
        )
    )
    await anyio.run_process([str(bin_ / "alembic"), "upgrade", "head"], cwd=project)
    conn = await asyncpg.connect(empty_dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('users') IS NOT NULL")
        assert await conn.fetchval("SELECT version_num FROM pgq_alembic_version") == SCHEMA_REVISION
        assert await conn.fetchval("SELECT count(*) FROM alembic_version") == 1, "the project's"
        await check_schema(conn)
    finally:
        await conn.close()
    noop = await anyio.run_process([str(bin_ / "pgq"), "migrate", "--dsn", empty_dsn], cwd=project)
    assert SCHEMA_REVISION.encode() in noop.stdout
    # Autogenerate leaves pgq's tables alone.
    auto = await anyio.run_process(
        [str(bin_ / "alembic"), "revision", "--autogenerate", "-m", "nothing"], cwd=project
    )
    (generated,) = (project / "alembic" / "versions").glob("*_nothing.py")
    assert "pgq_" not in generated.read_text(), auto.stdout


async def alembic_cli(bin_: Path, project: Path, *args: str) -> tuple[int, str, str]:
    """``alembic ARGS`` in ``project``, without raising on a failure."""
    out = await anyio.run_process([str(bin_ / "alembic"), *args], cwd=project, check=False)
    return out.returncode, out.stdout.decode(), out.stderr.decode()


async def pgq_relations(dsn: str) -> list[str]:
    """pgq's tables and types in the database (its version table aside)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT relname AS name FROM pg_class WHERE relname LIKE 'pgq\\_%' "
            "AND relname NOT LIKE 'pgq_alembic_version%' "
            "UNION SELECT typname FROM pg_type WHERE typname = 'pgq_job_state' ORDER BY 1"
        )
        return [r["name"] for r in rows]
    finally:
        await conn.close()


async def test_the_documented_env_py_does_what_each_alembic_command_means(
    tmp_path: Path, empty_dsn: str, installed: Path
) -> None:
    """docs/migrations.md's env.py (docs/examples/alembic/env.py) in a project of its own:
    autogenerate writes nothing, offline mode prints pgq's DDL ahead of the project's, and
    a downgrade below pgq's tables is refused unless asked to keep or remove pgq."""
    bin_ = installed
    project = tmp_path / "project"
    project.mkdir()
    await anyio.run_process(
        [str(bin_ / "alembic"), "init", "--template", "async", "alembic"], cwd=project
    )
    env = (ROOT / "docs" / "examples" / "alembic" / "env.py").read_text()
    assert "target_metadata = MetaData()\n" in env
    (project / "alembic" / "env.py").write_text(
        env.replace(
            "target_metadata = MetaData()\n",
            "target_metadata = MetaData()\nimport sqlalchemy as sa\n"
            "sa.Table('users', target_metadata, sa.Column('id', sa.Integer, primary_key=True))\n",
        )
    )
    ini = project / "alembic.ini"
    ini.write_text(
        ini.read_text().replace("driver://user:pass@localhost/dbname", sqlalchemy_url(empty_dsn))
    )

    # Generating a revision compares, and writes nothing of pgq's.
    code, _, err = await alembic_cli(bin_, project, "revision", "--autogenerate", "-m", "users")
    assert code == 0, err
    (revision,) = (project / "alembic" / "versions").glob("*_users.py")
    generated = revision.read_text()
    assert "op.create_table('users'" in generated and "pgq_" not in generated
    assert await pgq_relations(empty_dsn) == []
    conn = await asyncpg.connect(empty_dsn)
    try:
        # alembic's own doing, pgq or not: an empty version table of the project's.
        tables = await conn.fetch(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
        )
        assert [t["relname"] for t in tables] == ["alembic_version"]
        assert await conn.fetchval("SELECT count(*) FROM alembic_version") == 0
        await conn.execute("DROP TABLE alembic_version")  # a fresh database, for the script
    finally:
        await conn.close()

    # Offline mode: pgq's DDL, every revision in order, then the project's.
    code, script, err = await alembic_cli(bin_, project, "upgrade", "head", "--sql")
    assert code == 0, err
    steps = [script.index("-- Running upgrade  -> pgq_0001")]
    steps += [script.index(f"-> {r}\n") for r in KNOWN_REVISIONS[1:]]
    assert steps == sorted(steps)
    assert steps[-1] < script.index("CREATE TABLE users")
    assert await pgq_relations(empty_dsn) == []  # printed, not run
    conn = await asyncpg.connect(empty_dsn)
    try:
        await conn.execute(script)  # as a DBA would apply it
        await check_schema(conn)
        assert await conn.fetchval("SELECT to_regclass('users') IS NOT NULL")
    finally:
        await conn.close()
    code, _, err = await alembic_cli(bin_, project, "upgrade", "head")
    assert code == 0 and "Running upgrade" not in err, err  # the script did it all

    # A downgrade below pgq's tables is refused, with the ways to keep or remove pgq.
    conn = await asyncpg.connect(empty_dsn)
    try:
        await conn.execute("INSERT INTO pgq_jobs (task) VALUES ('kept')")
    finally:
        await conn.close()
    code, out, err = await alembic_cli(bin_, project, "downgrade", "base")
    said = out + err
    assert code != 0 and "Traceback" not in said
    assert "FAILED: this downgrade goes below pgq's tables" in said
    assert "`alembic -x pgq=keep downgrade base`" in said
    assert "`alembic -x pgq=remove downgrade base`" in said
    assert "pgq_jobs" in await pgq_relations(empty_dsn)
    code, _, err = await alembic_cli(bin_, project, "-x", "pgq=keep", "downgrade", "base")
    assert code == 0, err
    conn = await asyncpg.connect(empty_dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('users') IS NULL")
        assert await conn.fetchval("SELECT task FROM pgq_jobs") == "kept"
    finally:
        await conn.close()
    code, _, err = await alembic_cli(bin_, project, "-x", "pgq=remove", "downgrade", "base")
    assert code == 0, err
    assert await pgq_relations(empty_dsn) == []
