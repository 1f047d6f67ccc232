import pytest

from pgq._core.dsn import each_host, mask_dsn, normalize_dsn, resolve_dsn, sqlalchemy_url
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


# Malformed (and odd but valid) DSNs, each with the pieces of its password that must never
# show: a parser that splits the password at '/', '?', '#', '@' or ':' would echo a piece.
SECRET_SHAPES = [
    ("postgres//u:S3cretPw@127.0.0.1:9/db", ["S3cretPw"]),  # missing ':' after the scheme
    ("postgresql:/u:S3cretPw@127.0.0.1:9/db", ["S3cretPw"]),  # one '/'
    ("postgresql://u:Pa55/w0rd@127.0.0.1:9/db", ["Pa55", "w0rd"]),  # '/' in the password
    ("postgresql://u:Pa55#w0rd@127.0.0.1:9/db", ["Pa55", "w0rd"]),  # '#'
    ("postgresql://u:Pa55?w0rd@127.0.0.1:9/db", ["Pa55", "w0rd"]),  # '?'
    ("postgresql://u:Pa55@w0rd@127.0.0.1:9/db", ["Pa55", "w0rd"]),  # '@'
    ("postgresql://u:Pa55:w0rd@127.0.0.1:9/db", ["Pa55", "w0rd"]),  # ':'
    ("postgresql://u:Pa55w0rd/db", ["Pa55w0rd"]),  # the '@host' went missing
    ("postgresql://u:Pa%2F55w0rd@127.0.0.1:9x/db", ["Pa%2F55w0rd", "55w0rd"]),  # encoded
    ("postgresql://u:Pa55w0rd@127.0.0.1:99999/db", ["Pa55w0rd"]),  # port out of range
    ("postgresql://127.0.0.1:9/db?password=Pa55w0rd&sslmode=x", ["Pa55w0rd"]),  # in the query
    ("mysql://u:Pa55w0rd@127.0.0.1:9/db", ["Pa55w0rd"]),  # another database
    ("host=127.0.0.1 port=9 password='Pa55 w0rd' dbname=db", ["Pa55", "w0rd"]),  # keywords
    ("host=127.0.0.1 password=Pa55w0rd", ["Pa55w0rd"]),
    ("u:Pa55w0rd@127.0.0.1:9/db", ["Pa55w0rd"]),  # no scheme at all
]


@pytest.mark.parametrize(("dsn", "pieces"), SECRET_SHAPES)
def test_no_shape_of_dsn_shows_its_password(dsn: str, pieces: list[str]) -> None:
    shown = [mask_dsn(dsn)]
    try:
        normalize_dsn(dsn)
    except ConfigError as exc:
        shown.append(str(exc))
    for text in shown:
        for piece in pieces:
            assert piece not in text, f"{piece!r} shows in {text!r}"


@pytest.mark.parametrize(
    ("dsn", "why"),
    [
        ("postgres//u:S3cretPw@h/db", "expected postgresql://"),
        ("postgresql://u:Pa55/w0rd@h/db", "percent-encode"),
        ("postgresql://u:Pa55w0rd@h:54x2/db", "port is not a number"),
        ("postgresql://u:Pa55w0rd/db", "port is not a number"),
        ("postgresql://u:p@ssw0rd@localhost/db", "holds an '@' as is: percent-encode it"),
        ("postgresql://u:p@s@s3cr3tPW@h/db", "holds an '@' as is: percent-encode it"),
    ],
)
def test_a_malformed_dsn_says_what_is_wrong(dsn: str, why: str) -> None:
    with pytest.raises(ConfigError, match="malformed DSN") as info:
        normalize_dsn(dsn)
    assert why in str(info.value)
    password = dsn.split("u:", 1)[1].rpartition("@")[0]
    for piece in (password, *password.split("@")):
        assert len(piece) < 2 or piece not in str(info.value).split("://", 1)[1], info.value


def test_an_at_sign_in_a_query_value_is_refused_with_the_encoding_that_works() -> None:
    """It cannot be told apart from a password holding '?' and '=' (u:2024?k=v@host),
    which the driver would read as host 'u', port 2024: percent-encoded, it is taken."""
    with pytest.raises(ConfigError, match="ops%40example") as info:
        normalize_dsn("postgresql://u:pw@h/db?application_name=ops@example")
    assert "pw" not in str(info.value)
    encoded = "postgresql://u:pw@h/db?application_name=ops%40example"
    assert normalize_dsn(encoded) == encoded
    with pytest.raises(ConfigError, match="percent-encode") as info:
        normalize_dsn("postgresql://app:2024?Zq=9@db.prod:5432/app")
    assert "2024" not in str(info.value) and "Zq" not in str(info.value)


def test_several_hosts_are_accepted_and_masked() -> None:
    dsn = "postgresql://u:pw@db1:5432,db2:5433,[::1]:5434/app?target_session_attrs=read-write"
    assert normalize_dsn(dsn) == dsn
    assert mask_dsn(dsn) == dsn.replace(":pw@", ":***@")


def test_a_pooler_mode_is_checked_and_keeps_no_session_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pgq._db.connections import Target

    with pytest.raises(ConfigError, match="pooler must be 'transaction'"):
        Target.resolve("postgresql://h/db", "statement")
    monkeypatch.setenv("PGQ_POOLER", "Transaction")
    pooled = Target.resolve("postgresql://h/db")
    assert pooled.pooled and not pooled.can_listen
    assert pooled.options("pgq worker w", {"plan_cache_mode": "force_custom_plan"}) == {
        "server_settings": {"application_name": "pgq worker w"},
        "statement_cache_size": 0,
    }
    listening = Target.resolve("postgresql://h/db", listen_dsn="postgresql://direct/db")
    assert listening.can_listen and listening.listen_target().dsn == "postgresql://direct/db"
    assert not listening.listen_target().pooled


def test_a_direct_target_asks_for_a_writable_server_unless_the_dsn_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pgq._db.connections import Target

    monkeypatch.delenv("PGQ_POOLER", raising=False)
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    options = Target.resolve("postgresql://h1,h2/db").options("pgq client")
    assert options["target_session_attrs"] == "read-write"
    own = Target.resolve("postgresql://h1,h2/db?target_session_attrs=primary")
    assert "target_session_attrs" not in own.options("pgq client")


def test_libpq_options_asyncpg_lacks_are_taken_apart() -> None:
    """connect_timeout becomes asyncpg's timeout; libpq-only options are left out and
    named; every other parameter (server settings, asyncpg's own options) stays."""
    from pgq._core.dsn import for_asyncpg

    split = for_asyncpg(
        "postgresql://u@h/db?connect_timeout=7&sslmode=disable&keepalives=1&application_name=a"
    )
    assert split.dsn == "postgresql://u@h/db?sslmode=disable&application_name=a"
    assert split.connect_timeout_s == 7.0
    assert split.dropped == ("keepalives",)
    assert for_asyncpg("postgresql://u@h/db?connect_timeout=1").connect_timeout_s == 2.0
    assert for_asyncpg("postgresql://u@h/db?connect_timeout=0").connect_timeout_s == 0.0
    assert for_asyncpg("postgresql://u@h/db?connect_timeout=0").dsn == "postgresql://u@h/db"
    assert for_asyncpg("postgresql://u@h/db") == for_asyncpg("postgresql://u@h/db")
    assert for_asyncpg(None).dsn is None
    with pytest.raises(ConfigError, match="connect_timeout must be a whole number of seconds"):
        for_asyncpg("postgresql://u:pw@h/db?connect_timeout=soon")


@pytest.mark.parametrize(
    "option", ["channel_binding=require", "require_auth=scram-sha-256", "requiressl=1",
               "gssencmode=require", "requirepeer=postgres", "hostaddr=10.0.0.1"]
)  # fmt: skip
def test_libpq_options_that_demand_a_guarantee_asyncpg_cannot_give_are_refused(
    option: str,
) -> None:
    """Dropped, they would let pgq connect without it (no channel binding, any auth
    method, no TLS): refused instead, naming the option."""
    from pgq._core.dsn import for_asyncpg

    with pytest.raises(ConfigError, match=f"{option.split('=')[0]} is a libpq option asyncpg"):
        for_asyncpg(f"postgresql://u:pw@h/db?sslmode=require&{option}")


@pytest.mark.parametrize(
    ("dsn", "hosts"),
    [
        ("postgresql://u:p@db1,db2:5433/app?sslmode=require",
         ["postgresql://u:p@db1/app?sslmode=require",
          "postgresql://u:p@db2:5433/app?sslmode=require"]),
        ("postgresql://[::1]:5432,127.0.0.1/app",
         ["postgresql://[::1]:5432/app", "postgresql://127.0.0.1/app"]),
        ("postgresql://a%40b:p,w@h1,h2",
         ["postgresql://a%40b:p,w@h1", "postgresql://a%40b:p,w@h2"]),
        ("postgresql://u@db1:5432/app", ["postgresql://u@db1:5432/app"]),
        ("postgresql:///app?host=/run/postgresql", ["postgresql:///app?host=/run/postgresql"]),
    ],
)  # fmt: skip
def test_each_host_splits_a_host_list_keeping_the_rest(dsn: str, hosts: list[str]) -> None:
    assert each_host(dsn) == hosts
