"""An App's tasks and schedules, and the options a task or an outcome may take: refused at
once when their jobs could not be written."""

import re

import pytest

import pgq
from pgq.errors import ConfigError, UnknownTaskError


def test_task_registration_and_lookup() -> None:
    app = pgq.App()

    @app.task(queue="emails", max_attempts=3, timeout=5)
    async def send(ctx: pgq.JobContext, to: str) -> None: ...

    @app.task
    def report(ctx: pgq.JobContext) -> None: ...

    assert app.get("send").queue == "emails"
    assert send.is_async and not report.is_async
    assert app.queues() == ["emails", "default"]
    with pytest.raises(UnknownTaskError, match="unknown task 'sned'.*registers report, send"):
        app.get("sned")
    with pytest.raises(ConfigError, match="registered twice"):
        app.task(name="send")(report.fn)


def test_periodic_stacks_on_a_task_and_keeps_its_options() -> None:
    """docs/lifecycle.md: @app.periodic above @app.task schedules that task (several
    schedules need names); the other way round is refused, saying which order works."""
    app = pgq.App()

    @app.periodic(every=3600, args={"full": True}, name="hourly-full")
    @app.periodic("0 3 * * *", name="nightly")
    @app.task(queue="reports", max_attempts=5)
    async def build(ctx: pgq.JobContext, full: bool = False) -> None: ...

    assert isinstance(build, pgq.Task) and list(app.tasks) == ["build"]
    assert (build.queue, build.max_attempts) == ("reports", 5)
    assert [(s.name, s.task, s.args) for s in app.schedules] == [
        ("nightly", build, {}),
        ("hourly-full", build, {"full": True}),
    ]
    with pytest.raises(ConfigError, match="put @app.periodic above @app.task"):

        @app.task(queue="reports")
        @app.periodic(every=60)
        async def upside_down(ctx: pgq.JobContext) -> None: ...


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("timeout", float("inf"), "timeout must be a number of seconds above 0 and at most"),
        ("timeout", float("nan"), "timeout must be a number of seconds above 0 and at most"),
        ("timeout", 1e20, "timeout must be a number of seconds above 0 and at most"),
        ("timeout", "10", "timeout must be a number of seconds above 0 and at most"),
        ("timeout", 0, "timeout must be a number of seconds above 0 and at most"),
        ("max_attempts", 10**10, "max_attempts must be a whole number from 1 to 2147483647"),
        ("max_attempts", True, "max_attempts must be a whole number from 1 to 2147483647"),
        ("max_attempts", 0, "max_attempts must be a whole number from 1 to 2147483647"),
        ("backoff", 60, "backoff must be a pgq.Backoff, got 60"),
        ("backoff", 0, "backoff must be a pgq.Backoff, got 0"),
    ],
)
def test_a_task_option_its_jobs_could_not_be_written_with_is_refused(
    option: str, value: object, says: str
) -> None:
    """Refused when the task is registered: each would have made every claim (or every
    retry) of the queue fail in the database, over and over."""
    app = pgq.App()

    async def job(ctx: pgq.JobContext) -> None:
        pass

    with pytest.raises(ConfigError, match=re.escape(says)):
        app.task(**{option: value})(job)  # type: ignore[call-overload]
    assert "job" not in [t.name for t in app]


@pytest.mark.parametrize("delay", [float("inf"), float("nan"), 1e10, -1])
def test_a_retry_or_snooze_delay_out_of_range_is_refused(delay: float) -> None:
    with pytest.raises(ValueError, match="a delay must be from 0 to 1e"):
        pgq.Retry(delay)
    with pytest.raises(ValueError, match="a delay must be from 0 to 1e"):
        pgq.Snooze(delay)


@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, 1.5, "1", True])
def test_a_task_priority_the_jobs_column_cannot_hold_is_refused(priority: object) -> None:
    app = pgq.App()

    async def job(ctx: pgq.JobContext) -> None:
        pass

    with pytest.raises(ConfigError, match="priority must be an integer from -2147483648"):
        app.task(priority=priority)(job)  # type: ignore[call-overload]
    assert app.task(name="edge", priority=2**31 - 1)(job).priority == 2**31 - 1
