import pytest

from pgq.dsn import mask_dsn, normalize_dsn, resolve_dsn, sqlalchemy_url
from pgq.errors import ConfigError


def test_mask_hides_the_password_of_a_url() -> None:
    masked = mask_dsn("postgresql://alice:s3cret@db:5432/app?sslmode=require")
    assert "s3cret" not in masked
    assert masked == "postgresql://alice:***@db:5432/app?sslmode=require"


def test_mask_hides_a_password_in_the_query_and_keyword_forms() -> None:
    assert "pw" not in mask_dsn("postgresql://db/app?password=pw&sslmode=disable")
    assert "pw" not in mask_dsn("host=db password=pw dbname=app")


def test_mask_keeps_a_url_without_password() -> None:
    assert mask_dsn("postgresql://alice@db/app") == "postgresql://alice@db/app"


def test_normalize_accepts_sqlalchemy_schemes() -> None:
    assert normalize_dsn("postgresql+asyncpg://u:p@h/db") == "postgresql://u:p@h/db"
    assert normalize_dsn("postgres://h/db") == "postgresql://h/db"


@pytest.mark.parametrize(
    "dsn", ["mysql://u:topsecret@h/db", "not a dsn", "postgresql://u:topsecret@h:port/db", ""]
)
def test_normalize_rejects_malformed_dsns_without_leaking_the_password(dsn: str) -> None:
    with pytest.raises(ConfigError, match="malformed DSN") as info:
        normalize_dsn(dsn)
    assert "topsecret" not in str(info.value)


def test_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://from-database-url/db")
    assert resolve_dsn() == "postgresql://from-database-url/db"
    monkeypatch.setenv("PGQ_DSN", "postgresql://from-pgq-dsn/db")
    assert resolve_dsn() == "postgresql://from-pgq-dsn/db"
    assert resolve_dsn("postgresql://explicit/db") == "postgresql://explicit/db"


def test_no_dsn_leaves_it_to_the_libpq_variables() -> None:
    assert resolve_dsn() is None
    assert sqlalchemy_url(None) == "postgresql+asyncpg://"
