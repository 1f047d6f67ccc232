from datetime import UTC, datetime

import pytest

from pgq._core.cron import Cron, Every, make_schedule
from pgq.errors import ConfigError


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "now", "latest"),
    [
        ("*/5 * * * *", "2026-03-04T10:17:42", "2026-03-04T10:15:00"),
        ("0 * * * *", "2026-03-04T10:00:00", "2026-03-04T10:00:00"),
        ("30 9 * * mon-fri", "2026-03-08T12:00:00", "2026-03-06T09:30:00"),  # Sunday -> Friday
        ("@daily", "2026-03-04T00:00:59", "2026-03-04T00:00:00"),
        ("0 0 29 2 *", "2026-03-01T00:00:00", "2024-02-29T00:00:00"),
        ("15,45 8-10 1 jan *", "2026-06-01T00:00:00", "2026-01-01T10:45:00"),
        ("0 12 13 * 5", "2026-03-12T00:00:00", "2026-03-06T12:00:00"),  # dom OR dow
        ("0 0 * * 7", "2026-03-04T00:00:00", "2026-03-01T00:00:00"),  # 7 is Sunday
    ],
)
def test_latest_slot(expr: str, now: str, latest: str) -> None:
    assert Cron(expr).latest(at(now)) == at(latest)


def test_time_zone_is_respected() -> None:
    # 09:00 in Paris (UTC+1 in winter) is 08:00 UTC.
    assert Cron("0 9 * * *", "Europe/Paris").latest(at("2026-01-10T08:30:00")) == at(
        "2026-01-10T08:00:00"
    )
    # Summer time: UTC+2.
    assert Cron("0 9 * * *", "Europe/Paris").latest(at("2026-07-10T08:30:00")) == at(
        "2026-07-10T07:00:00"
    )


def test_every_aligns_to_the_epoch() -> None:
    assert Every(60).latest(at("2026-03-04T10:17:42")) == at("2026-03-04T10:17:00")


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", "needs 5 fields"),
        ("61 * * * *", "out of range"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "bad step"),
        ("* * * foo *", "not valid in the month field"),
    ],
)
def test_bad_expressions_say_why(expr: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Cron(expr)


def test_schedule_needs_exactly_one_form() -> None:
    with pytest.raises(ConfigError, match="one of the two"):
        make_schedule("* * * * *", 5, "UTC")
    with pytest.raises(ConfigError, match="unknown time zone"):
        make_schedule("* * * * *", None, "Mars/Olympus")


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30,31 2 *", "0 0 31 4,6,9,11 *"])
def test_an_expression_that_never_fires_is_refused(expr: str) -> None:
    with pytest.raises(ConfigError, match="never matches"):
        Cron(expr)


@pytest.mark.parametrize("expr", ["0 0 29 2 *", "0 0 31 2 mon", "0 0 31 1-2 *"])
def test_rare_expressions_that_do_fire_are_accepted(expr: str) -> None:
    # Feb 29 (leap years), Feb 31 *or* a Monday, the 31st of January.
    assert Cron(expr).latest(at("2026-03-04T00:00:00")) <= at("2026-03-04T00:00:00")


def test_registering_a_schedule_that_never_fires_is_refused() -> None:
    import pgq

    app = pgq.App()
    with pytest.raises(ConfigError, match="never matches"):

        @app.periodic("0 0 31 2 *")
        async def never(ctx: pgq.JobContext) -> None: ...

    assert app.schedules == [] and "never" not in app.tasks


def test_a_schedule_whose_jobs_could_not_be_enqueued_is_refused_at_registration() -> None:
    from datetime import datetime

    import pgq

    app = pgq.App()
    with pytest.raises(pgq.SerializationError, match=r"args\['when'\]"):
        app.periodic(every=60, args={"when": datetime(2026, 1, 1)})
    with pytest.raises(ConfigError, match="invalid queue name"):
        app.periodic(every=60, queue="no spaces")


@pytest.mark.parametrize(
    ("expr", "now", "following"),
    [
        ("*/5 * * * *", "2026-03-04T10:17:42", "2026-03-04T10:20:00"),
        ("0 * * * *", "2026-03-04T10:00:00", "2026-03-04T11:00:00"),
        ("30 9 * * mon-fri", "2026-03-06T12:00:00", "2026-03-09T09:30:00"),  # Friday -> Monday
        ("0 0 29 2 *", "2026-03-01T00:00:00", "2028-02-29T00:00:00"),
    ],
)
def test_following_slot(expr: str, now: str, following: str) -> None:
    assert Cron(expr).following(at(now)) == at(following)


def test_every_follows_and_both_describe_themselves() -> None:
    assert Every(60).following(at("2026-03-04T10:17:42")) == at("2026-03-04T10:18:00")
    assert Every(30).describe() == "every 30s"
    assert Cron("0 9 * * *", "Europe/Paris").describe() == "0 9 * * * (Europe/Paris)"
