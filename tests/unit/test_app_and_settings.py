import random
import re

import pytest

import pgq
from pgq._cli.worker_command import parse_queues
from pgq._core.backoff import Backoff
from pgq._core.names import check_queue_name
from pgq.errors import ConfigError, UnknownTaskError
from pgq.settings import WorkerSettings


def test_backoff_doubles_then_caps_with_bounded_jitter() -> None:
    b = Backoff(base_s=1.0, max_s=10.0, jitter=0.1)
    rng = random.Random(7)
    for attempt, raw in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (40, 10.0)]:
        delay = b.delay(attempt, rng)
        assert raw * 0.9 <= delay <= raw * 1.1


def test_backoff_without_jitter_is_exact() -> None:
    assert Backoff(base_s=0.5, max_s=100, jitter=0).delay(3) == 2.0


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


@pytest.mark.parametrize(
    "fields", [{"base_s": float("nan")}, {"max_s": float("inf")}, {"base_s": "1"}, {"max_s": 1e10}]
)
def test_a_backoff_whose_delays_the_database_could_not_hold_is_refused(
    fields: dict[str, object],
) -> None:
    with pytest.raises(ConfigError, match="invalid backoff"):
        Backoff(**fields)  # type: ignore[arg-type]


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


@pytest.mark.parametrize("name", ["", "with space", "semi;colon", "-dash", "x" * 129, "é", None])
def test_odd_queue_names_are_refused(name: object) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        check_queue_name(name)


def test_settings_precedence_keyword_over_env_over_default() -> None:
    env = {"PGQ_STALE_AFTER": "40", "PGQ_POLL_ONLY": "true", "PGQ_CONCURRENCY": "7"}
    s = WorkerSettings.resolve({"concurrency": 3, "poll_interval": None}, env)
    assert s.stale_after == 40.0
    assert s.poll_only is True
    assert s.concurrency == 3
    assert s.poll_interval == WorkerSettings().poll_interval


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        ({"stale_after": -1}, {}, "stale_after must be a number from 0"),
        ({"concurrency": 2.5}, {}, "concurrency must be a whole number"),
        ({"concurrency": 10**12}, {}, "concurrency must be a number from 1 to 1e"),
        ({"stale_after": float("inf")}, {}, "stale_after must be a number from .* to 1e"),
        ({}, {"PGQ_POLL_INTERVAL": "inf"}, "poll_interval must be a number from"),
        ({"shutdown_timeout": float("nan")}, {}, "shutdown_timeout must be a number from"),
        (
            {},
            {"PGQ_HEARTBEAT_INTERVAL": "soon"},
            "PGQ_HEARTBEAT_INTERVAL='soon' is not a valid float",
        ),
        ({"bogus": 1}, {}, "unknown worker setting"),
    ],
)
def test_invalid_settings_say_which(
    overrides: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkerSettings.resolve(overrides, env)


def test_cli_queue_flags() -> None:
    assert parse_queues(["emails:20", "reports"], 4) == {"emails": 20, "reports": 4}
    assert parse_queues([], 4) is None
    with pytest.raises(ConfigError, match="whole number"):
        parse_queues(["emails:x"], None)


def test_a_settings_object_is_taken_beside_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    monkeypatch.setenv("PGQ_POLL_INTERVAL", "9")
    base = WorkerSettings(stale_after=40.0, concurrency=4)
    worker = pgq.Worker(app, "postgresql://h/db", settings=base, concurrency=6)
    assert worker.settings.stale_after == 40.0, "from the object"
    assert worker.settings.concurrency == 6, "a keyword wins over the object"
    assert worker.settings.poll_interval == base.poll_interval, "the object wins over PGQ_*"


def test_one_setting_is_read_without_checking_the_others() -> None:
    env = {"PGQ_STALE_AFTER": "45", "PGQ_HEARTBEAT_INTERVAL": "soon"}
    assert WorkerSettings.from_env("stale_after", env) == 45.0
    assert WorkerSettings.from_env("concurrency", env) == 10
    with pytest.raises(ConfigError, match="not a valid float"):
        WorkerSettings.from_env("heartbeat_interval", env)


def test_the_fencing_bound_is_computed_in_one_place() -> None:
    s = WorkerSettings(heartbeat_interval=2.0, max_heartbeat_failures=4, heartbeat_timeout=1.5)
    assert s.fencing_bound == 2.0 * 4 + 1.5


def test_a_shutdown_timeout_may_be_infinite() -> None:
    """The one setting whose infinity means something: running jobs finish, however long."""
    assert WorkerSettings.resolve({"shutdown_timeout": float("inf")}).shutdown_timeout == float(
        "inf"
    )
