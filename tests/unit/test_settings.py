"""WorkerSettings: each setting from a keyword, then its variable, then its default, checked
together."""

import pytest

import pgq
from pgq.errors import ConfigError
from pgq.settings import WorkerSettings


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
