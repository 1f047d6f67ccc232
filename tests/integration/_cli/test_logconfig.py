"""The command line's logging: pgq's loggers at --log-level, every other library's at
--library-log-level (WARNING by default), or a logging config file (--log-config)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import anyio
import pytest

from tests.integration._cli.test_main import pgq_cmd

pytestmark = pytest.mark.anyio

APP = textwrap.dedent("""\
    import logging
    import pgq

    app = pgq.App()

    @app.task(queue="work")
    async def fetch(ctx):
        http = logging.getLogger("httpx")  # as httpx logs each request
        http.debug("library debug")
        http.info("HTTP Request: GET https://api.example/ 200 OK")
        http.warning("library warning")
        ctx.log.info("task line")
    """)


def run_worker(
    python: str,
    dsn: str,
    tmp_path: Path,
    *before: str,
    after: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> str:
    """Enqueue one job and run a burst worker on it with these flags; returns stderr."""
    (tmp_path / "logging_tasks.py").write_text(APP)
    made = pgq_cmd(python, "enqueue", "fetch", "--queue", "work", "--dsn", dsn, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    out = pgq_cmd(
        python, *before, "worker", "logging_tasks:app", "--dsn", dsn, "--burst", *after,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_other_libraries_log_warnings_only_unless_told(
    python: str, dsn: str, tmp_path: Path
) -> None:
    err = run_worker(python, dsn, tmp_path)
    assert "pgq.task: [job 1 fetch#1] task line" in err and "pgq.worker: worker" in err
    assert "httpx: library warning" in err
    assert "HTTP Request" not in err and "library debug" not in err
    err = run_worker(python, dsn, tmp_path, after=("--library-log-level", "info"))
    assert "httpx: HTTP Request: GET https://api.example/ 200 OK" in err
    assert "library debug" not in err and "pgq.task:" in err
    err = run_worker(
        python, dsn, tmp_path, "--log-level", "WARNING", env={"PGQ_LIBRARY_LOG_LEVEL": "debug"}
    )
    assert "httpx: library debug" in err and "httpx: HTTP Request" in err
    assert "pgq.task:" not in err and "pgq.worker:" not in err, "pgq's own level is WARNING"


def test_the_library_level_holds_in_every_supervised_process(
    python: str, dsn: str, tmp_path: Path
) -> None:
    err = run_worker(python, dsn, tmp_path, after=("--processes", "2"))
    assert "pgq.task: [job 1 fetch#1] task line" in err and "httpx: library warning" in err
    assert "HTTP Request" not in err


def test_a_dict_config_file_sets_logging_up_and_keeps_pgqs_loggers(
    python: str, dsn: str, tmp_path: Path
) -> None:
    config = {  # no disable_existing_loggers: pgq's loggers, made at import, stay enabled
        "version": 1,
        "formatters": {"json": {"()": "pgq.logs.JsonFormatter"}},
        "handlers": {"err": {"class": "logging.StreamHandler", "formatter": "json"}},
        "loggers": {"pgq": {"level": "WARNING"}, "pgq.task": {"level": "INFO"}},
        "root": {"level": "INFO", "handlers": ["err"]},
    }
    (tmp_path / "logging.json").write_text(json.dumps(config))
    err = run_worker(python, dsn, tmp_path, "--log-config", "logging.json")
    lines = [json.loads(line) for line in err.splitlines()]
    by_logger = {(line["logger"], line["message"]) for line in lines}
    assert ("pgq.task", "[job 1 fetch#1] task line") in by_logger
    assert ("httpx", "HTTP Request: GET https://api.example/ 200 OK") in by_logger
    assert not any(line["logger"] == "pgq.worker" for line in lines), "pgq at WARNING"
    # A level given beside the file is set after it.
    err = run_worker(python, dsn, tmp_path, "--log-config", "logging.json", "--log-level", "INFO")
    assert any(json.loads(line)["logger"] == "pgq.worker" for line in err.splitlines())


def test_an_ini_file_config_sets_logging_up(python: str, dsn: str, tmp_path: Path) -> None:
    (tmp_path / "logging.ini").write_text(
        textwrap.dedent("""\
        [loggers]
        keys = root
        [handlers]
        keys = err
        [formatters]
        keys = plain
        [logger_root]
        level = WARNING
        handlers = err
        [handler_err]
        class = StreamHandler
        args = (sys.stderr,)
        formatter = plain
        [formatter_plain]
        format = FROM-INI %(name)s %(message)s
        """)
    )
    err = run_worker(python, dsn, tmp_path, after=("--log-config", "logging.ini"))
    assert "FROM-INI httpx library warning" in err.splitlines()
    assert "task line" not in err, "pgq's loggers follow the file's root: WARNING"
    err = run_worker(
        python, dsn, tmp_path, env={"PGQ_LOG_CONFIG": "logging.ini", "PGQ_LOG_LEVEL": "INFO"}
    )
    assert "FROM-INI pgq.task [job 2 fetch#1] task line" in err.splitlines()


@pytest.mark.parametrize(
    ("files", "args", "says"),
    [
        ({}, ["--log-config", "missing.json"], "--log-config 'missing.json' cannot be used"),
        ({}, ["--log-config", "missing.ini"], "no such file: 'missing.ini'"),
        ({"bad.json": "{nope"}, ["--log-config", "bad.json"], "JSONDecodeError"),
        ({"v.json": '{"version": 2}'}, ["--log-config", "v.json"], "Unsupported version"),
        ({"bad.ini": "garbage"}, ["--log-config", "bad.ini"], "no section headers"),
        (
            {"ok.json": '{"version": 1}'},
            ["--log-config", "ok.json", "--log-format", "json"],
            "--log-format (or PGQ_LOG_FORMAT) and --log-config do not go together",
        ),
    ],
)
def test_a_config_file_that_cannot_be_used_is_one_line(
    python: str, tmp_path: Path, files: dict[str, str], args: list[str], says: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = pgq_cmd(python, *args, "stats", "--dsn", "postgresql://u@127.0.0.1:9/db", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("pgq: error: ") and says in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1


async def test_a_bad_library_level_variable_is_refused() -> None:
    import os
    import sys

    done = await anyio.run_process(
        [sys.executable, "-m", "pgq", "stats"],
        env={**os.environ, "PGQ_LIBRARY_LOG_LEVEL": "loud"},
        check=False,
    )
    assert done.returncode == 2
    assert b"library log level must be one of DEBUG" in done.stderr
