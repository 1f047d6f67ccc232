"""pgq's logs: a JSON formatter (one object per line, with the job's fields) and a one-call
set-up for services that do not configure logging themselves (under uvicorn, for one).

pgq logs under ``pgq.*``: ``pgq.worker`` (start, stop), ``pgq.leader`` (leader changes,
rescues), ``pgq.jobs`` (failed attempts, discards; successes with ``log_jobs``) and more.
A job's line carries ``job_id``, ``task``, ``queue``, ``attempt``, ``producer``, ``worker``
and ``outcome`` as structured fields (``record.pgq``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["JsonFormatter", "TextFormatter", "configure"]

Format = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


#: Control characters (C0, DEL, C1) as escapes: text from a job (an exception's message)
#: put in a log line or on a terminal must not forge a line, move the cursor or recolour
#: the screen. A tab stays; a newline stays only where :func:`printable` is told.
_ESCAPES = {
    code: {0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}")
    for code in (*range(0x00, 0x20), *range(0x7F, 0xA0))
    if code != 0x09
}
_ESCAPES_KEEPING_NEWLINES = {k: v for k, v in _ESCAPES.items() if k != 0x0A}


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\r``; newlines too
    unless ``newlines``), safe for one log line or a terminal."""
    return text.translate(_ESCAPES_KEEPING_NEWLINES if newlines else _ESCAPES)


#: The job's fields a task's own lines (``ctx.log``) carry as record attributes.
_JOB_FIELDS = ("job_id", "task", "queue", "attempt")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the record's ``pgq`` fields (a task's ``ctx.log`` lines: ``job_id``,
    ``task``, ``queue``, ``attempt``), and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "pgq", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        else:
            for name in _JOB_FIELDS:
                if name in record.__dict__ and name not in out:
                    out[name] = record.__dict__[name]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """pgq's text lines: time, level, logger, message."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)


def configure(
    level: int | str = "INFO",
    log_format: Format | None = None,
    *,
    logger: str = "pgq",
) -> logging.Handler:
    """Send ``logger``'s records (pgq's, by default) to stderr at ``level``, as text or JSON
    (default: ``PGQ_LOG_FORMAT``, else text). Returns the handler it added; records do not
    also propagate to the root logger, so nothing is printed twice."""
    chosen = log_format or os.environ.get("PGQ_LOG_FORMAT", "text").strip().lower()
    if chosen not in ("text", "json"):
        from pgq.errors import ConfigError

        raise ConfigError(f"log format must be text or json, not {chosen!r} (PGQ_LOG_FORMAT)")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    target = logging.getLogger(logger)
    target.addHandler(handler)
    target.setLevel(level)
    target.propagate = False
    return handler
