"""The enqueue's control flow is written once (pgq._store.enqueue) and run by a driver: the
asynchronous and the synchronous runner take the same steps for the same plan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from pgq._store import enqueue, sql
from pgq._store.codec import NewJob
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


def test_a_copy_runs_in_a_transaction_of_its_own() -> None:
    fake = SyncFake()
    fake.reply = lambda statement, params, one: {"ids": [7, 8], "now": NOW}  # type: ignore[method-assign]
    jobs = enqueue.run_sync(fake, enqueue.copy([_row(), _row()]))
    assert fake.steps == ["BEGIN", "COPY 2", "COMMIT"]
    assert [(j.id, j.state, j.created_at) for j in jobs] == [
        (7, JobState.AVAILABLE, NOW),
        (8, JobState.AVAILABLE, NOW),
    ]
