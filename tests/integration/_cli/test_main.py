import os
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from pgq._db.revision import SCHEMA_REVISION

pytestmark = pytest.mark.anyio

APP = textwrap.dedent("""\
    import pgq
    app = pgq.App()

    @app.task(queue="work")
    async def touch(ctx, n):
        return n + 1
    """)


def pgq_cmd(
    python: str, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pgq", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


async def test_enqueue_then_burst_worker(python: str, dsn: str, tmp_path: Path) -> None:
    (tmp_path / "cli_tasks.py").write_text(APP)
    out = pgq_cmd(
        python,
        "enqueue",
        "touch",
        "--args",
        '{"n": 41}',
        "--queue",
        "work",
        "--count",
        "3",
        cwd=tmp_path,
        env={"PGQ_DSN": dsn},
    )
    assert out.returncode == 0, out.stderr
    header, *made = out.stdout.splitlines()
    assert header.split() == ["id", "state", "queue", "task"]
    assert [line.split()[1:] for line in made] == [["available", "work", "touch"]] * 3
    ids = [int(line.split()[0]) for line in made]
    run = pgq_cmd(
        python,
        "worker",
        "cli_tasks:app",
        "--queue",
        "work:2",
        "--burst",
        cwd=tmp_path,
        env={"DATABASE_URL": dsn},
    )
    assert run.returncode == 0, run.stderr
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT state::text, result::text FROM pgq_jobs WHERE id = ANY($1)", ids
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [("completed", "42")] * 3


@pytest.mark.parametrize(("choice", "loop"), [("auto", "uvloop"), ("asyncio", "asyncio")])
async def test_the_worker_runs_on_uvloop_when_installed_and_says_so(
    python: str, dsn: str, tmp_path: Path, choice: str, loop: str
) -> None:
    pytest.importorskip("uvloop", reason="the speed extra is not installed")
    (tmp_path / "cli_tasks.py").write_text(APP)
    run = pgq_cmd(
        python, "--log-level", "INFO", "worker", "cli_tasks:app", "--queue", "work",
        "--burst", "--event-loop", choice, cwd=tmp_path, env={"PGQ_DSN": dsn},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (started,) = [line for line in run.stderr.splitlines() if " started: " in line]
    assert started.endswith(f"on {loop}"), started


GC_APP = textwrap.dedent("""\
    import gc
    import pgq
    app = pgq.App()

    @app.task
    async def gc_settings(ctx):
        return {"threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
    """)


def default_gc_threshold(python: str) -> int:
    """The interpreter's own first threshold (3.13 changed it), asked of a fresh process:
    this one's may have been changed by a test (mypy's API sets it)."""
    code = "import gc; print(gc.get_threshold()[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.parametrize("choice", [None, "tuned", "default"])
async def test_the_worker_process_tunes_its_garbage_collector_unless_told_not_to(
    python: str, dsn: str, tmp_path: Path, choice: str | None
) -> None:
    """`pgq worker` freezes its start-up objects and raises the collector's first threshold
    (pgq.tune_gc) by default and says so; `--gc default` leaves Python's settings alone, as
    a job running in that process sees them."""
    (tmp_path / "gc_tasks.py").write_text(GC_APP)
    async with pgq.Client(dsn) as client:
        job = await client.enqueue("gc_settings")
    flags = [] if choice is None else ["--gc", choice]
    run = pgq_cmd(
        python, "--log-level", "INFO", "worker", "gc_tasks:app", "--burst", *flags,
        cwd=tmp_path, env={"PGQ_DSN": dsn},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    async with pgq.Client(dsn) as client:
        done = await client.get_job(job.id)
    assert done is not None and done.state is pgq.JobState.COMPLETED
    tuned = "garbage collector tuned for a worker" in run.stderr
    if choice == "default":
        assert not tuned
        assert done.result == {"threshold": default_gc_threshold(python), "frozen": 0}
    else:
        assert tuned, run.stderr
        result = done.result
        assert isinstance(result, dict) and result["threshold"] == 10_000
        assert result["frozen"] > 1_000


def test_a_bad_gc_choice_in_the_environment_is_refused(python: str, tmp_path: Path) -> None:
    (tmp_path / "gc_tasks.py").write_text(GC_APP)
    run = pgq_cmd(
        python, "worker", "gc_tasks:app", "--dsn", "postgresql://127.0.0.1:9/x",
        cwd=tmp_path, env={"PGQ_GC": "off"},
    )  # fmt: skip
    assert run.returncode != 0
    assert "--gc (or PGQ_GC) must be tuned or default, not 'off'" in run.stderr


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("broken:app", "pgq: error: importing 'broken' raised ValueError: no DATABASE_URL"),
        ("../tasks:app", "pgq: error: '../tasks' is not a module name"),
        ("tasks.py:app", "(a module name has no .py)"),
        ("plain:nothere", "pgq: error: module 'plain' has no attribute 'nothere'"),
        ("plain:pgq", "is not a pgq.App (found module)"),
    ],
)
def test_an_app_that_cannot_be_loaded_is_said_so(
    python: str, tmp_path: Path, spec: str, says: str
) -> None:
    """What `pgq worker MODULE:APP` says when the App is not there: the module's own
    traceback when it raised, and a line saying what to fix."""
    (tmp_path / "broken.py").write_text("raise ValueError('no DATABASE_URL')\n")
    (tmp_path / "plain.py").write_text("import pgq\n")
    run = pgq_cmd(python, "worker", spec, "--dsn", "postgresql://127.0.0.1:9/x", cwd=tmp_path)
    assert run.returncode == 1
    assert says in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("pgq: error: "), run.stderr
    if spec.startswith("broken"):
        assert 'broken.py", line 1' in run.stderr  # the module's traceback, to fix it by


@pytest.mark.parametrize("flag", ["--heartbeat-interval", "--poll-interval"])
def test_an_infinite_setting_is_refused_not_ignored(python: str, tmp_path: Path, flag: str) -> None:
    """ "inf" means "never" only for the settings that take none (retention); any other
    setting given it is refused, instead of silently running with its default."""
    (tmp_path / "gc_tasks.py").write_text(GC_APP)
    run = pgq_cmd(
        python, "worker", "gc_tasks:app", flag, "inf", "--dsn", "postgresql://127.0.0.1:9/x",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1
    name = flag[2:].replace("-", "_")
    assert f"pgq: error: {name} must be a number from" in run.stderr, run.stderr


@pytest.mark.parametrize("producer", ["missing", "stale"])
async def test_a_burst_worker_runs_the_jobs_of_a_dead_worker_before_it_exits(
    python: str, dsn: str, tmp_path: Path, producer: str
) -> None:
    (tmp_path / "cli_tasks.py").write_text(APP)
    conn = await asyncpg.connect(dsn)
    try:
        dead = uuid.uuid4()
        if producer == "stale":
            await conn.execute(
                "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency,"
                " heartbeat_at) VALUES ($1, $1, 'dead:1', 'work', 1, now() - interval '1 hour')",
                dead,
            )
        # What a worker killed mid-job leaves: a job running under a producer that is gone.
        orphan = await conn.fetchval(
            "INSERT INTO pgq_jobs (queue, task, args, state, attempt, max_attempts, producer_id,"
            " attempted_at) VALUES ('work', 'touch', '{\"n\": 1}', 'running', 1, 5, $1,"
            " now() - interval '1 hour') RETURNING id",
            dead,
        )
        run = pgq_cmd(
            python,
            "worker",
            "cli_tasks:app",
            "--burst",
            "--rescue-interval",
            "0.2",
            "--dsn",
            dsn,
            cwd=tmp_path,
        )
        assert run.returncode == 0, run.stderr
        row = await conn.fetchrow(
            "SELECT state::text, result::text, attempt FROM pgq_jobs WHERE id = $1", orphan
        )
    finally:
        await conn.close()
    assert row is not None and tuple(row) == ("completed", "2", 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--dsn", "postgresql://bob:hunter2@127.0.0.1:9/db"],
            "cannot connect to PostgreSQL at postgresql://bob:***@127.0.0.1:9/db",
        ),
        (["--dsn", "postgresql://bob:hunter2@host:notaport/db"], "malformed DSN"),
        (["--dsn", "mysql://bob:hunter2@h/db"], "malformed DSN"),
    ],
)
def test_bad_dsn_gives_one_masked_line(
    python: str, tmp_path: Path, args: list[str], message: str
) -> None:
    for command in (["migrate"], ["enqueue", "t"]):
        out = pgq_cmd(python, *command, *args, cwd=tmp_path)
        assert out.returncode == 1
        assert out.stderr.startswith("pgq: error: ") and message in out.stderr
        assert "hunter2" not in out.stderr + out.stdout
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_worker_on_unmigrated_database(python: str, empty_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "cli_tasks.py").write_text(APP)
    out = pgq_cmd(python, "worker", "cli_tasks:app", "--dsn", empty_dsn, cwd=tmp_path)
    assert out.returncode == 1
    assert f"this pgq needs {SCHEMA_REVISION}: run `pgq migrate`" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_installation_without_its_migrations_says_so(
    python: str, empty_dsn: str, tmp_path: Path
) -> None:
    """pgq's package as a build that dropped its migrations leaves it (the sdist that
    carried only a link to them did): `pgq migrate` says so in one line, before it
    connects, with what to do."""
    site = tmp_path / "site"
    shutil.copytree(
        Path(pgq.__file__).parent,
        site / "pgq",
        ignore=shutil.ignore_patterns("migrations", "__pycache__"),
    )
    for args in (["--sql"], ["--dsn", empty_dsn], ["--dsn", "postgresql://u@127.0.0.1:9/nowhere"]):
        out = pgq_cmd(python, "migrate", *args, cwd=tmp_path, env={"PYTHONPATH": str(site)})
        assert out.returncode == 1, out.stderr
        assert out.stderr.startswith(
            "pgq: error: pgq's migrations are missing from this installation"
        ), out.stderr
        assert "reinstall pgq-async from a release wheel or sdist" in out.stderr
        assert "Traceback" not in out.stderr


def test_a_health_address_that_cannot_be_bound_is_one_clear_line(
    python: str, dsn: str, tmp_path: Path
) -> None:
    import socket

    (tmp_path / "cli_tasks.py").write_text(APP)
    worker = ["worker", "cli_tasks:app", "--dsn", dsn, "--burst"]
    out = pgq_cmd(python, *worker, "--health-host", "not an address", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --health-host: expected an address of this machine" in out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args, why in (
            (["--health-host", "192.0.2.1", "--health-port", "0"], "192.0.2.1:0: Cannot assign"),
            (["--health-port", port], f"127.0.0.1:{port}: Address already in use"),
        ):
            for processes in ("1", "2"):  # the worker's own endpoint, and the supervisor's
                out = pgq_cmd(python, *worker, *args, "--processes", processes, cwd=tmp_path)
                assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
                line = f"pgq: error: cannot serve the health endpoint on {why}"
                assert line in out.stderr.splitlines()[-1], out.stderr


def test_version_is_the_distributions(python: str, tmp_path: Path) -> None:
    from importlib.metadata import version

    out = pgq_cmd(python, "--version", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == f"pgq {version('pgq-async')}\n"


def test_worker_with_a_bad_app_path(python: str, tmp_path: Path) -> None:
    out = pgq_cmd(python, "worker", "no_such_module:app", cwd=tmp_path)
    assert out.returncode == 1 and "cannot import 'no_such_module'" in out.stderr
    out = pgq_cmd(python, "worker", "justamodule", cwd=tmp_path)
    assert out.returncode == 1 and "expected MODULE:APP" in out.stderr


def test_help_lists_commands_and_every_setting(python: str, tmp_path: Path) -> None:
    top = pgq_cmd(python, "--help", cwd=tmp_path).stdout
    for command in ("migrate", "worker", "enqueue"):
        assert command in top
    worker_help = pgq_cmd(python, "worker", "--help", cwd=tmp_path).stdout
    for flag in (
        "--queue",
        "--burst",
        "--concurrency",
        "--poll-only",
        "--stale-after",
        "--heartbeat-interval",
        "PGQ_STALE_AFTER",
    ):
        assert flag in worker_help


def test_enqueue_rejects_bad_args_json(python: str, dsn: str, tmp_path: Path) -> None:
    out = pgq_cmd(python, "enqueue", "t", "--args", "{nope", "--dsn", dsn, cwd=tmp_path)
    assert out.returncode == 1 and "--args is not valid JSON" in out.stderr
    out = pgq_cmd(python, "enqueue", "t", "--queue", "bad queue", "--dsn", dsn, cwd=tmp_path)
    assert out.returncode == 1 and "invalid queue name" in out.stderr
    for depth, says in (
        (5_000, "pgq: error: --args is nested too deeply to read: pgq stores at most 256"),
        (300, "pgq: error: args['a'] is nested too deeply: more than 256 levels"),
    ):
        deep = '{"a": ' + "[" * depth + "]" * depth + "}"
        out = pgq_cmd(python, "enqueue", "t", "--args", deep, "--dsn", dsn, cwd=tmp_path)
        assert out.returncode == 1 and out.stderr.startswith(says), out.stderr[-500:]
        assert "Traceback" not in out.stderr


SLOW_APP = textwrap.dedent("""\
    import anyio
    import pgq
    app = pgq.App()

    @app.task
    async def slow(ctx):
        print("STARTED", flush=True)
        await anyio.sleep(600)
    """)


#: The last error of a job whose attempt a stopping worker interrupted.
INTERRUPTED = "interrupted by worker shutdown"


async def _worker_with_a_running_job(
    python: str, dsn: str, tmp_path: Path, shutdown_timeout: str, *flags: str
) -> tuple[subprocess.Popen[str], int]:
    (tmp_path / "slow_tasks.py").write_text(SLOW_APP)
    async with pgq.Client(dsn) as client:
        job = await client.enqueue("slow")
    proc = subprocess.Popen(  # noqa: ASYNC220 - a real process; its pipe is read in a thread
        [
            python,
            "-m",
            "pgq",
            "worker",
            "slow_tasks:app",
            "--dsn",
            dsn,
            "--shutdown-timeout",
            shutdown_timeout,
            *flags,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = await anyio.to_thread.run_sync(proc.stdout.readline)
    assert line.strip() == "STARTED"
    return proc, job.id


async def _state_after(dsn: str, job_id: int) -> tuple[str, int, int, str]:
    """The job's state, attempt and last error message, and how many jobs still run. An
    interrupted job is handed back available at once; the message tells an interrupted
    attempt from one handed back before it began."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT state::text, attempt, errors -> -1 ->> 'message' FROM pgq_jobs WHERE id = $1",
            job_id,
        )
        running = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'")
        assert row is not None
        return row[0], row[1], running, row[2]
    finally:
        await conn.close()


async def test_sigterm_stops_gracefully_and_leaves_nothing_running(
    python: str, dsn: str, tmp_path: Path
) -> None:
    import signal

    proc, job_id = await _worker_with_a_running_job(python, dsn, tmp_path, "0.5")
    proc.send_signal(signal.SIGTERM)
    _, err = await anyio.to_thread.run_sync(proc.communicate, None, 30)
    assert proc.returncode == 0
    assert "SIGTERM: stopping gracefully" in err
    assert await _state_after(dsn, job_id) == ("available", 0, 0, INTERRUPTED)


async def test_an_interrupted_attempt_is_logged_and_shown_alike(
    python: str, dsn: str, tmp_path: Path
) -> None:
    """The log line and `pgq jobs show` agree: attempt 1 was not counted, 0 of 20 are."""
    import signal

    proc, job_id = await _worker_with_a_running_job(python, dsn, tmp_path, "0.2", "--log-jobs")
    proc.send_signal(signal.SIGTERM)
    _, err = await anyio.to_thread.run_sync(proc.communicate, None, 30)
    assert proc.returncode == 0, err
    assert "they are handed back available, those attempts not counted" in err
    assert (
        f"job {job_id} (slow, queue default) attempt 1 of 20 not counted (0 of 20 counted), "
        f"the job available again: {INTERRUPTED}"
    ) in err
    shown = pgq_cmd(python, "jobs", "show", str(job_id), "--dsn", dsn, cwd=tmp_path)
    assert (
        f"  attempts      0 of 20 counted; attempt 1 not counted: {INTERRUPTED}\n" in shown.stdout
    )


async def test_a_reader_that_leaves_ends_the_output_quietly(
    python: str, dsn: str, client: pgq.Client, tmp_path: Path
) -> None:
    """`pgq jobs list --json | head -1`: no BrokenPipeError traceback, SIGPIPE's status."""
    await client.enqueue_many([pgq.JobSpec("t", {"pad": "x" * 500})] * 400)
    proc = subprocess.Popen(  # noqa: ASYNC220 - a real process; its pipe is read in a thread
        [python, "-m", "pgq", "jobs", "list", "--json", "--limit", "400", "--dsn", dsn],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert await anyio.to_thread.run_sync(proc.stdout.readline) == "[\n"
    proc.stdout.close()  # as `head` does once it has its lines
    err = await anyio.to_thread.run_sync(proc.stderr.read)
    proc.stderr.close()
    assert await anyio.to_thread.run_sync(proc.wait, 30) == 141
    assert err == ""


async def test_a_second_sigint_stops_at_once(python: str, dsn: str, tmp_path: Path) -> None:
    import signal
    import time

    proc, job_id = await _worker_with_a_running_job(python, dsn, tmp_path, "600")
    proc.send_signal(signal.SIGINT)
    # Signals of one kind do not queue: send the second once the first was handled.
    assert proc.stderr is not None
    with anyio.fail_after(30):
        while True:
            line = await anyio.to_thread.run_sync(proc.stderr.readline)
            assert line, "the worker exited before handling the first signal"
            if "stopping gracefully" in line:
                break
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = await anyio.to_thread.run_sync(proc.communicate, None, 30)
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 30 < 600, "did not wait for the shutdown timeout"
    assert await _state_after(dsn, job_id) == ("available", 0, 0, INTERRUPTED)


def test_no_shape_of_dsn_shows_its_password_on_the_command_line(
    python: str, tmp_path: Path
) -> None:
    from tests.unit._core.test_dsn import SECRET_SHAPES

    for dsn, pieces in SECRET_SHAPES:
        for command in (["stats"], ["enqueue", "t"]):
            out = pgq_cmd(python, *command, "--dsn", dsn, cwd=tmp_path)
            assert out.returncode == 1, (dsn, out.stderr)
            assert out.stderr.startswith("pgq: error: ") and "Traceback" not in out.stderr
            for piece in pieces:
                assert piece not in out.stderr + out.stdout, (dsn, out.stderr)


def test_connection_flags_go_before_or_after_the_command_and_the_later_wins(
    python: str, dsn: str, tmp_path: Path
) -> None:
    bad = "postgresql://u:S3cretPw@127.0.0.1:9/db"
    out = pgq_cmd(python, "--dsn", bad, "stats", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "cannot connect to PostgreSQL at postgresql://u:***@127.0.0.1:9/db" in out.stderr
    assert "S3cretPw" not in out.stderr + out.stdout
    for args in (["--dsn", dsn, "stats"], ["--dsn", bad, "stats", "--dsn", dsn]):
        out = pgq_cmd(python, *args, "--json", cwd=tmp_path)
        assert out.returncode == 0, (args, out.stderr)
    # --listen-dsn and --pooler are read before the command too: a malformed one is refused.
    listen = "mysql://u:S3cretPw@h/db"
    for args in (
        ["--listen-dsn", listen, "stats", "--dsn", dsn],
        ["--pooler", "transaction", "stats", "--pooler", "none", "--listen-dsn", listen],
    ):
        out = pgq_cmd(python, *args, cwd=tmp_path)
        assert out.returncode == 1 and "malformed DSN 'mysql://u:***@h/db'" in out.stderr, args
    out = pgq_cmd(python, "--pooler", "session-ish", "stats", cwd=tmp_path)
    assert out.returncode == 2 and "argument --pooler: invalid choice" in out.stderr


def test_a_dsn_taken_for_the_command_is_quoted_masked(python: str, tmp_path: Path) -> None:
    """The issue's case, as a shell runs it (the rest: tests/unit/_cli/test_parser.py)."""
    out = pgq_cmd(python, "postgresql://u:S3cretPw@h/db", "stats", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "invalid choice: 'postgresql://u:***@h/db'" in out.stderr, out.stderr
    assert "S3cretPw" not in out.stderr + out.stdout


def test_enqueue_takes_tags_bounded_as_the_client_bounds_them(
    python: str, dsn: str, tmp_path: Path
) -> None:
    out = pgq_cmd(python, "enqueue", "t", "--tag", "x" * 129, "--dsn", dsn, cwd=tmp_path)
    assert out.returncode == 1 and "tags: each tag must be a string of 1 to 128" in out.stderr
    many = [a for i in range(33) for a in ("--tag", f"t{i}")]
    out = pgq_cmd(python, "enqueue", "t", *many, "--dsn", dsn, cwd=tmp_path)
    assert out.returncode == 1 and "at most 32 tags" in out.stderr
    out = pgq_cmd(python, "enqueue", "t", "--tag", "a", "--tag", "b", "--dsn", dsn, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    tags = anyio.run(_tags_of_the_jobs, dsn)
    assert tags == [["a", "b"]]


async def _tags_of_the_jobs(dsn: str) -> list[list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [list(r["tags"]) for r in await conn.fetch("SELECT tags FROM pgq_jobs")]
    finally:
        await conn.close()
