"""Every SQL statement pgq runs, named, in one place.

The statements live whole in the ``.sql`` files beside this module, one file per subject,
each under a ``-- name: NAME`` line followed by the comments that explain it: every one can
be pasted into ``psql`` or ``EXPLAIN`` as it is. They are read once, at import, into
:data:`STATEMENTS` and exposed as attributes (``sql.CLAIM_JOBS``); nothing joins or edits
statement text, here or at run time. A variation is a parameter, not a twin: the outcome
writes and the claims take whether to commit without waiting for the WAL's flush as their
last parameter. Values always travel as parameters; JSON travels as ``text`` and is cast in
SQL, so a caller's connection works whatever type codecs it has registered.

Facts that live in Python and also appear literally in the statements (the notification
channels below, the job states of :class:`~pgq.JobState`, the default ``max_attempts``) are
held equal to their source by tests.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

#: Notification channels.
CHANNEL_JOBS: Final = "pgq_jobs"  # payload: a queue with new jobs ('*': every queue)
CHANNEL_LEADER: Final = "pgq_leader"  # payload: 'resigned'
CHANNEL_CONTROL: Final = "pgq_control"  # payload: a JSON control message (see _worker.control)
CHANNEL_DONE: Final = "pgq_done"  # payload: comma-separated ids of jobs that became final

#: The table and columns asyncpg's COPY writes (``copy_records_to_table``); a batch of jobs
#: all due now, without tags or metadata, writes the first six only and leaves state,
#: scheduled_at, tags and metadata to their defaults. created_at always takes its default,
#: now(): the transaction clock ALLOCATE_JOBS read. COPY_JOBS_PLAIN and COPY_JOBS_FULL are
#: the same COPY for psycopg.
COPY_JOBS_TABLE: Final = "pgq_jobs"
COPY_JOBS_COLUMNS: Final = (
    "id",
    "queue",
    "task",
    "args",
    "priority",
    "max_attempts",
    "state",
    "scheduled_at",
    "tags",
    "metadata",
    "limit_key",
)

_NAME = re.compile(r"^-- name: ([A-Z][A-Z0-9_]*)[ \t]*$", re.MULTILINE)
# A block's leading comments and blank lines, and its closing semicolon.
_LEADING = re.compile(r"\A(?:[ \t]*(?:--[^\n]*)?\n)*")
_CLOSING = re.compile(r"\s*;?\s*\Z")


def parse(text: str) -> dict[str, str]:
    """The statements of one ``.sql`` file by name: each block runs from its ``-- name:``
    line to the next, less its leading comment lines and its closing semicolon."""
    parts = _NAME.split(text)
    named: dict[str, str] = {}
    for name, block in zip(parts[1::2], parts[2::2], strict=True):
        statement = _CLOSING.sub("", _LEADING.sub("", block))
        if name in named or not statement:
            raise ValueError("a statement is named twice, or is empty", name)
        named[name] = statement
    return named


def _load() -> dict[str, str]:
    found: dict[str, str] = {}
    # Read beside this module (not through importlib.resources, whose imports, zipfile and
    # tempfile among them, would add objects every full garbage collection walks).
    for path in sorted(Path(__file__).parent.glob("*.sql")):
        named = parse(path.read_text(encoding="utf-8"))
        if found.keys() & named.keys():
            raise ValueError("statements named twice", sorted(found.keys() & named.keys()))
        found.update(named)
    return found


#: Every statement by name.
STATEMENTS: Final[dict[str, str]] = _load()
globals().update(STATEMENTS)

if TYPE_CHECKING:

    def __getattr__(name: str) -> str: ...
