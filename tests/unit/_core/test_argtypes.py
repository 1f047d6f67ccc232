"""Job arguments checked against the task's annotations at enqueue (pgq._core.argtypes): the
types JSON can carry, the error naming the argument and the type, the rest let through."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, NewType, NotRequired, TypedDict

import pytest

import pgq

if TYPE_CHECKING:
    from decimal import Decimal

OrderId = NewType("OrderId", int)


class Address(TypedDict):
    street: str
    number: int
    floor: NotRequired[int | None]


app = pgq.App()


@app.task
async def typed(
    ctx: pgq.JobContext,
    order_id: int = 0,
    amount: float = 0.0,
    name: str = "",
    urgent: bool = False,
    nothing: None = None,
    ids: list[int] | None = None,
    pairs: dict[str, list[str]] | None = None,
    maybe: int | str | None = None,
    mode: Literal["fast", "slow", 3] = "fast",
    address: Address | None = None,
    seq: Sequence[float] = (),
    mapping: Mapping[str, Any] | None = None,
    wrapped: Annotated[int, "meta"] = 0,
    new: OrderId = OrderId(0),
    anything: Any = None,
    when: datetime | None = None,
    unknown: object = None,
) -> None: ...


FITS: list[dict[str, Any]] = [
    {"order_id": 7},
    {"order_id": True},  # a bool is an int, as a type checker has it
    {"amount": 1},
    {"amount": 1.5},
    {"name": "ada"},
    {"urgent": False},
    {"nothing": None},
    {"ids": [1, 2]},
    {"ids": None},
    {"pairs": {"a": ["b"]}},
    {"maybe": 1},
    {"maybe": "x"},
    {"maybe": None},
    {"mode": "slow"},
    {"mode": 3},
    {"address": {"street": "Main", "number": 1}},
    {"address": {"street": "Main", "number": 1, "floor": None}},
    {"seq": [1, 2.5]},
    {"mapping": {"k": object()}},
    {"wrapped": 1},
    {"new": 5},
    {"anything": object()},
    {"when": "2026-01-01"},  # a datetime is not JSON: not checked
    {"unknown": [1]},
]

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"order_id": "x"}, "argument order_id must be int, got str 'x'"),
    ({"order_id": 1.5}, "argument order_id must be int, got float 1.5"),
    ({"amount": "1"}, "argument amount must be float, got str '1'"),
    ({"name": 3}, "argument name must be str, got int 3"),
    ({"urgent": 1}, "argument urgent must be bool, got int 1"),
    ({"nothing": 0}, "argument nothing must be None, got int 0"),
    ({"ids": [1, "2"]}, r"argument ids must be list\[int\] \| None, got list \[1, '2'\]"),
    ({"pairs": {"a": "b"}}, r"argument pairs must be dict\[str, list\[str\]\] \| None"),
    ({"pairs": {1: ["b"]}}, r"argument pairs must be dict\[str, list\[str\]\] \| None"),
    ({"maybe": 1.5}, r"argument maybe must be int \| str \| None, got float 1.5"),
    ({"mode": "medium"}, r"argument mode must be Literal\['fast', 'slow', 3\], got str"),
    ({"mode": 3.0}, r"argument mode must be Literal\['fast', 'slow', 3\], got float"),
    ({"address": {"street": "Main"}}, r"argument address must be Address \| None"),
    ({"address": {"street": "Main", "number": "1"}}, "argument address must be Address"),
    ({"address": {"street": "M", "number": 1, "x": 1}}, "argument address must be Address"),
    ({"address": {"street": "M", "number": 1, "floor": "2"}}, "argument address must be"),
    ({"seq": "abc"}, r"argument seq must be Sequence\[float\], got str"),
    ({"mapping": [1]}, r"argument mapping must be Mapping\[str, Any\] \| None, got list"),
    ({"wrapped": "1"}, "argument wrapped must be int, got str"),
    ({"new": "5"}, "argument new must be OrderId, got str"),
]


@pytest.mark.parametrize("args", FITS)
def test_values_that_fit_are_taken(args: dict[str, Any]) -> None:
    assert typed.argument_problem(args) is None


@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_values_that_do_not_fit_are_refused_naming_the_argument_and_type(
    args: dict[str, Any], message: str
) -> None:
    problem = typed.argument_problem(args)
    assert problem is not None
    assert problem.startswith("task 'typed': ")
    assert pytest.importorskip("re").search(message, problem), problem
    with pytest.raises(pgq.ConfigError, match=message):
        typed.spec(**args)


def test_a_worker_checks_names_only() -> None:
    """Values were checked at enqueue; a worker does not judge them again."""
    assert typed.names_problem({"order_id": "x"}) is None
    assert typed.names_problem({"nope": 1}) is not None


def test_an_annotation_that_cannot_be_resolved_leaves_the_values_unchecked() -> None:
    local = pgq.App()

    @local.task
    async def priced(ctx: pgq.JobContext, price: Decimal, n: int) -> None: ...

    assert priced.argument_problem({"price": "1.5", "n": "not checked"}) is None


def test_the_first_parameter_must_be_the_context() -> None:
    local = pgq.App()
    with pytest.raises(pgq.ConfigError, match="the first parameter receives the JobContext"):

        @local.task  # type: ignore[arg-type]
        async def wrong(order_id: int, ctx: pgq.JobContext) -> None: ...

    with pytest.raises(pgq.ConfigError, match="order_id cannot be str"):

        @local.task  # type: ignore[arg-type]
        def also_wrong(order_id: str) -> None: ...

    @local.task
    async def untyped(ctx, n):  # type: ignore[no-untyped-def]
        return n

    @local.task
    async def loose(ctx: object, n: int) -> None: ...

    @local.task
    async def any_ctx(ctx: Any, n: int) -> None: ...

    assert set(local.tasks) == {"untyped", "loose", "any_ctx"}
