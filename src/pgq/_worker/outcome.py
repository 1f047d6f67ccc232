"""The end of one attempt, as the executor decides it and the completer writes it."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from pgq._core import serde
from pgq.job import Job

#: Longest message and traceback kept in an error entry, in characters: a failure must never
#: make its own outcome too big to store.
MAX_MESSAGE = 10_000
MAX_TRACEBACK = 50_000

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass(slots=True)
class Outcome:
    """One attempt's outcome. ``(job_id, token)`` is its fencing token: the write changes
    the job only while that attempt is still the one running. ``attempt_delta`` is -1 when
    the attempt must not count (a snooze, a shutdown). ``queue`` names the producer that ran
    it, for its counters."""

    job_id: int
    token: uuid.UUID | None
    attempt: int
    queue: str
    state: str
    delay_s: float | None = None
    error: str | None = None
    result: str | None = None
    attempt_delta: int = 0
    #: Why the attempt failed when the machine ran short (``MemoryError``, ``OSError
    #: ENOMEM``...): its producer counts it.
    resource: str | None = None

    @classmethod
    def of(
        cls,
        job: Job,
        state: str,
        *,
        delay_s: float | None = None,
        error: str | None = None,
        result: str | None = None,
        attempt_delta: int = 0,
    ) -> Outcome:
        """The outcome ``state`` for ``job``'s current attempt."""
        return cls(
            job.id,
            job.attempt_token,
            job.attempt,
            job.queue,
            state,
            delay_s,
            error,
            result,
            attempt_delta,
        )


def error_entry(
    attempt: int,
    kind: str,
    message: str,
    traceback: str | None = None,
    *,
    rescue: str | None = None,
) -> str:
    """One entry of a job's ``errors``, as JSON text (with ``rescue``, the token of the
    write that took the job back). Whatever the message holds (a NUL, a lone surrogate,
    megabytes of text), the entry can be stored."""
    entry = {
        "attempt": attempt,
        "kind": kind,
        "message": storable_text(message, MAX_MESSAGE),
        "traceback": None if traceback is None else storable_text(traceback, MAX_TRACEBACK),
    }
    if rescue is not None:
        entry["rescue"] = rescue
    return serde.dumps(entry, "error")


def storable_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (saying so), with what jsonb cannot hold (NUL,
    lone surrogates) replaced by U+FFFD."""
    if len(text) > limit:
        text = f"{text[: limit // 2]}\n... [{len(text) - limit} characters cut] ...\n{text[-limit // 2 :]}"
    if not text.isascii():
        text = _UNSTORABLE.sub("\ufffd", text)
    elif "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text
