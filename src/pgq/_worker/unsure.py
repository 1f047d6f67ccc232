"""Writes whose commit's outcome is unknown: rescues, takeovers and hand-backs of strays, run
each in a transaction of its own and named by a token in the error entries they write, so
that the worker can later ask whether they landed."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import anyio

from pgq._db import maintenance
from pgq._db.connections import Connection, Db


class Written(Protocol):
    """A job a write took, as it came back before the commit."""

    @property
    def id(self) -> int:
        """The job's id."""
        ...

    @property
    def xact(self) -> str:
        """The write's transaction (its ``pg_current_xact_id()``, in text)."""
        ...


W = TypeVar("W", bound=Written)


class Unsure(Generic[W]):
    """Runs writes each in a transaction of its own, and keeps those whose commit's outcome
    is unknown (the connection broke, or the wait was cancelled, after the rows came back).
    :meth:`landed` later asks the database what became of each such transaction, so that
    every write that landed is counted and reported once (found by a token it drew, written
    in its error entries of kind ``kind``: not another worker's write of the same job), none
    that did not, and one still in progress (its commit held up) is asked about again."""

    def __init__(self, log: logging.Logger, kind: str = "rescued", what: str = "rescued") -> None:
        self._log = log
        self._kind = kind
        self._what = what
        #: By the write's token: its transaction's id, and its rows.
        self._pending: dict[str, tuple[str, list[W]]] = {}
        #: Answers "still in progress" about a write whose outcome was unknown.
        self.in_progress = 0
        # One asker at a time: a round and the worker's stop may both ask.
        self._asking = anyio.Lock()

    async def commit(
        self, conn: Connection, write: Callable[[Connection, str], Awaitable[list[W]]]
    ) -> list[W]:
        """Run ``write`` on ``conn`` in a transaction, with the token it is to write into
        its error entries; return its rows once committed."""
        rows: list[W] = []
        token = uuid.uuid4().hex
        try:
            async with conn.transaction():
                await maintenance.begin_rescue(conn, token)
                rows = await write(conn, token)
        except BaseException:
            if rows:  # the rows came back, so the commit is what failed: its outcome unknown
                self._pending[token] = (rows[0].xact, rows)
            raise
        return rows

    async def landed(self, db: Db) -> list[W]:
        """The rows of the transactions whose outcome was unknown that have landed since;
        those that did not are forgotten (their jobs are as they were, and may be taken
        again). A transaction still in progress is asked about again next time. Nothing is
        settled unless every question got its answer."""
        async with self._asking:
            verdicts = await self._ask(db)
        landed: list[W] = []
        for token, found in verdicts.items():
            rows = self._pending.pop(token)[1]
            if found:
                landed += rows
        if landed:
            self._log.info(
                "%d job(s) %s by a commit whose reply was lost: it had landed",
                len(landed),
                self._what,
            )
        return landed

    async def _ask(self, db: Db) -> dict[str, bool]:
        """Whether each pending write landed, by its token; a write whose transaction is
        still in progress has no answer yet."""
        verdicts: dict[str, bool] = {}
        for token, (xact, rows) in list(self._pending.items()):  # a commit may add one
            if await maintenance.xact_status(db, xact) == "in progress":
                self.in_progress += 1
                continue
            # Committed, aborted, or unknown here (after a crash or a failover the server
            # may even have given the id to another transaction): the jobs say whether the
            # write named by this token is there.
            verdicts[token] = await maintenance.rescue_landed(
                db, [r.id for r in rows], token, self._kind
            )
        return verdicts

    @property
    def waiting(self) -> int:
        """Jobs whose write's outcome is still unknown."""
        return sum(len(rows) for _, rows in self._pending.values())
