"""The named statements: each read whole from the ``.sql`` files, once; the facts they
write literally (job states, notification channels, the default ``max_attempts``, the COPY
columns, the lock wait) equal their one definition in Python."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pgq
from pgq._db import sql
from pgq.job import DEFAULT_MAX_ATTEMPTS, FINAL_STATES, JobState

SRC = Path(pgq.__file__).resolve().parent
STATES = {s.value for s in JobState}
CHANNELS = {sql.CHANNEL_JOBS, sql.CHANNEL_LEADER, sql.CHANNEL_CONTROL, sql.CHANNEL_DONE}
#: Every other word the statements quote: settings, JSON keys, payloads, relation names.
OTHER_WORDS = {
    "*", "", "alembic_version", "at", "attempt", "block_size", "cancel", "default",
    "dependency", "force_custom_plan", "idle_in_transaction_session_timeout", "job_id",
    "kind", "limits", "lock_timeout", "message", "minute", "number", "off", "pause",
    "pgq_alembic_version", "pgq_schema_compat", "pgq_jobs_id_seq", "pgq_rescues", "plan_cache_mode", "producer_id",
    "queue", "reason", "rescue", "rescued", "resigned", "server_version_num", "silent_s",
    "started_at", "state", "statement_timeout", "synchronous_commit", "traceback", "unknown",
    "worker_name",
}  # fmt: skip


def _bodies() -> str:
    return "\n".join(sql.STATEMENTS.values())


def test_every_statement_is_read_whole_from_a_sql_file() -> None:
    named: dict[str, str] = {}
    for path in sorted((SRC / "_db" / "sql").glob("*.sql")):
        found = sql.parse(path.read_text())
        assert not named.keys() & found.keys()
        named.update(found)
    assert named == sql.STATEMENTS
    for name, statement in named.items():
        assert getattr(sql, name) is sql.STATEMENTS[name]
        assert not statement.endswith(";"), name


def test_a_block_names_each_statement_once() -> None:
    text = "-- name: A\n-- what A does\nSELECT 1;\n\n-- name: B\nSELECT 2\n"
    assert sql.parse(text) == {"A": "SELECT 1", "B": "SELECT 2"}
    with pytest.raises(ValueError, match="named twice"):
        sql.parse(text + "-- name: A\nSELECT 3;\n")


def test_every_quoted_word_is_a_job_state_or_a_known_word() -> None:
    words = set(re.findall(r"'([a-z_*]*)'", _bodies()))
    assert words - STATES - CHANNELS - OTHER_WORDS == set()


def test_every_list_of_final_states_is_the_final_states() -> None:
    final = tuple(s.value for s in JobState if s in FINAL_STATES)
    lists = re.findall(r"\(('[a-z]+'(?:, '[a-z]+')+)\)", _bodies())
    listed = [tuple(w.strip("'") for w in found.split(", ")) for found in lists]
    assert any(names == final for names in listed)
    for names in listed:
        assert set(names) <= STATES, names
        if "completed" in names:
            assert names == final


def test_the_statements_notify_on_the_channels_of_python() -> None:
    notified = set(re.findall(r"pg_notify\('([a-z_]+)'", _bodies()))
    assert notified == CHANNELS


def test_the_wait_listens_on_the_channel_of_python() -> None:
    assert sql.LISTEN_DONE.split() == ["LISTEN", sql.CHANNEL_DONE]


def test_the_default_max_attempts_is_the_one_of_python() -> None:
    defaults = re.findall(r"COALESCE\([a-z.]*max_attempts, (\d+)\)", _bodies())
    assert defaults and set(defaults) == {str(DEFAULT_MAX_ATTEMPTS)}


def test_the_copy_statements_write_the_copy_columns() -> None:
    columns = sql.COPY_JOBS_COLUMNS
    table = sql.COPY_JOBS_TABLE
    assert f"COPY {table} ({', '.join(columns[:6])}) FROM STDIN" == sql.COPY_JOBS_PLAIN
    assert f"COPY {table} ({', '.join(columns)}) FROM STDIN" == sql.COPY_JOBS_FULL


def test_the_outcome_writes_take_their_lock_wait_as_a_parameter() -> None:
    # A fixed wait would bound the rest of a caller's transaction (a stray's hand-back).
    waits = re.findall(r"set_config\('lock_timeout', ([^,]*),", _bodies())
    assert len(waits) == 3 and all(w.startswith("COALESCE($") for w in waits), waits


def test_every_statement_named_in_the_code_exists() -> None:
    python_names = {n for n in vars(sql) if n.isupper()}
    missing = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "sql"
                and node.attr.isupper()
                and node.attr not in sql.STATEMENTS
                and node.attr not in python_names
            ):
                missing.append(f"{path.relative_to(SRC)}: sql.{node.attr}")
    assert missing == []
