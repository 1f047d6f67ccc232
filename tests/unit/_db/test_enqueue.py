"""The enqueue's control flow is written once (pgq._db.enqueue) and run by a driver: the
asynchronous and the synchronous runner take the same steps for the same plan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

import pgq
from pgq._core.specs import NewJob
from pgq._db import enqueue, sql
from pgq.job import JobState

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _row(key: str | None = None, parents: tuple[int, ...] | None = None) -> NewJob:
    return NewJob(
        "default", "t", {}, "{}", 0, None, None, None, [], {}, "{}", key, None, None, parents
    )


class Recorder:
    """The steps a runner took, and canned replies: an inserted row per job, a dependent
    whose parents exist."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.next_id = 1

    def reply(self, statement: str, params: Sequence[Any], one: bool) -> Any:
        name = next(n for n, s in sql.STATEMENTS.items() if s is statement)
        self.steps.append(name)
        rows = []
        count = 1 if name in ("ENQUEUE_ONE", "ENQUEUE_DEPENDENT") else len(params[0])
        found = len(params[12]) if name == "ENQUEUE_DEPENDENT" else 0
        for _ in range(count):
            rows.append(
                {
                    "id": self.next_id, "state": JobState.AVAILABLE.value,
                    "scheduled_at": NOW, "created_at": NOW, "unique_key": None, "found": found,
                }
            )  # fmt: skip
            self.next_id += 1
        return rows[0] if one else rows


class SyncFake(Recorder):
    def fetch(self, statement: str, params: Sequence[Any]) -> Any:
        return self.reply(statement, params, one=False)

    def fetchrow(self, statement: str, params: Sequence[Any]) -> Any:
        return self.reply(statement, params, one=True)

    def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None:
        self.steps.append(f"COPY {len(records)}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.steps.append("BEGIN")
        yield
        self.steps.append("COMMIT")


class AsyncFake(Recorder):
    async def fetch(self, statement: str, params: Sequence[Any]) -> Any:
        return self.reply(statement, params, one=False)

    async def fetchrow(self, statement: str, params: Sequence[Any]) -> Any:
        return self.reply(statement, params, one=True)

    async def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None:
        self.steps.append(f"COPY {len(records)}")

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.steps.append("BEGIN")
        yield
        self.steps.append("COMMIT")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_both_runners_take_the_same_steps() -> None:
    plans: dict[str, Callable[[], enqueue.Plan[Any]]] = {
        "one": lambda: enqueue.insert([_row()]),
        "batch": lambda: enqueue.insert([_row(), _row()]),
        "chain": lambda: enqueue.insert_chain([_row(), _row()]),
        "group": lambda: enqueue.insert_group([_row(), _row()], _row()),
    }
    for name, plan in plans.items():
        sync, async_ = SyncFake(), AsyncFake()
        from_sync = enqueue.run_sync(sync, plan())
        from_async = await enqueue.run(async_, plan())
        assert sync.steps == async_.steps, name
        assert from_sync == from_async, name
    chain = SyncFake()
    jobs = enqueue.run_sync(chain, enqueue.insert_chain([_row(), _row()]))
    assert chain.steps == ["BEGIN", "ENQUEUE_ONE", "ENQUEUE_DEPENDENT", "COMMIT"]
    assert [j.depends_on for j in jobs] == [None, [1]]


async def test_a_copy_runs_in_a_transaction_of_its_own_and_builds_its_jobs_once_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build = enqueue.copied_jobs
    for fake in (SyncFake(), AsyncFake()):
        fake.reply = lambda statement, params, one: {"ids": [7, 8], "now": NOW}  # type: ignore[method-assign]

        def building(*args: Any, steps: list[str] = fake.steps) -> list[pgq.Job[Any]]:
            steps.append("BUILD")
            return build(*args)

        monkeypatch.setattr(enqueue, "copied_jobs", building)
        plan = enqueue.copy([_row(), _row()])
        if isinstance(fake, SyncFake):
            jobs = enqueue.run_sync(fake, plan)
        else:
            jobs = await enqueue.run(fake, plan)
        assert fake.steps == ["BEGIN", "COPY 2", "COMMIT", "BUILD"]
        assert [(j.id, j.state, j.created_at) for j in jobs] == [
            (7, JobState.AVAILABLE, NOW),
            (8, JobState.AVAILABLE, NOW),
        ]


def _first_statement(rows: list[NewJob], own_connection: bool) -> str:
    """The name of the first statement :func:`enqueue.write` sends for ``rows``."""
    step = next(enqueue.write(rows, own_connection=own_connection))
    while isinstance(step, enqueue.InTransaction):
        step = next(step.plan)
    assert isinstance(step, enqueue.Fetch | enqueue.FetchRow)
    return next(n for n, s in sql.STATEMENTS.items() if s is step.statement)


def test_write_is_the_one_choice_between_copy_and_insert() -> None:
    batch = [_row(), _row()]
    assert _first_statement(batch, own_connection=True) == "ALLOCATE_JOBS"  # COPY
    assert _first_statement(batch, own_connection=False) == "ENQUEUE_PLAIN"
    assert _first_statement([_row()], own_connection=True) == "ENQUEUE_ONE"
    assert _first_statement([_row(), _row("k")], own_connection=True) == "ENQUEUE_KEYED"
    dependent = [_row(), _row(parents=(1,))]
    assert _first_statement(dependent, own_connection=True) == "ENQUEUE_ONE"
