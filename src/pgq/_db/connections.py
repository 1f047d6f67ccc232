"""Connections: opening pools and connections with clear errors, and telling passing
failures from refusals (a caller's connection is ``drivers.py``'s)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

from pgq._core.dsn import each_host, for_asyncpg, mask_dsn, normalize_dsn, resolve_dsn, scrub
from pgq.errors import ConfigError, DatabaseUnavailable

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("pgq")

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    #: Where a statement runs: a connection (in its transaction), or a pool (one acquire).
    Db: TypeAlias = Connection | Pool
    Record: TypeAlias = asyncpg.Record
else:
    Connection = asyncpg.Connection
    Pool = asyncpg.Pool
    Db = asyncpg.Connection | asyncpg.Pool
    Record = asyncpg.Record

# Errors that mean "the database is not there" rather than "the statement was wrong".
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # protocol state lost mid-statement (e.g. server shutting down)
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.ConnectionFailureError,
    asyncpg.TooManyConnectionsError,
    asyncpg.QueryCanceledError,
)


# SQLSTATE classes of failures that pass: connection exceptions, transaction rollbacks
# (deadlock, serialization), insufficient resources (disk full, out of memory), operator
# intervention (shutdown, cancel), system errors.
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_READ_ONLY_TRANSACTION = "25006"  # connected to a standby (e.g. during a failover)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not do it *now*: the same statement may well
    succeed later. Otherwise the statement itself (or what it carries) was refused."""
    if isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate or ""
        return (
            state[:2] in _TRANSIENT_CLASSES
            or state == _READ_ONLY_TRANSACTION
            or isinstance(exc, asyncpg.InvalidCachedStatementError)
        )
    return isinstance(exc, CONNECTION_ERRORS)


def _unavailable(dsn: str | None, exc: BaseException) -> DatabaseUnavailable:
    reason = scrub(str(exc) or type(exc).__name__, dsn)
    if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
        asked = _session_attrs(dsn)
        if asked in (None, "read-write", "primary"):
            reason = (
                "the server is a standby (read-only), and pgq writes: give the primary's "
                "address, or every host with target_session_attrs=read-write"
            )
        else:
            reason = (
                f"no host is what target_session_attrs={asked} asks for; pgq writes, so "
                "leave it out or ask for read-write"
            )
    err = DatabaseUnavailable(
        f"cannot connect to PostgreSQL at {mask_dsn(dsn)}: {reason}; check that the server "
        "is running and the DSN (--dsn, PGQ_DSN or DATABASE_URL) is right"
    )
    err.__cause__ = exc
    return err


def _unparsable(dsn: str | None, exc: ValueError) -> ConfigError:
    return ConfigError(
        f"malformed DSN {mask_dsn(dsn)}: {scrub(str(exc), dsn)}; expected "
        "postgresql://user:password@host:port/database"
    )


_connect_errors: tuple[type[Exception], ...] = (
    *CONNECTION_ERRORS,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.InvalidCatalogNameError,
)
#: Connection trouble, or a statement the server refused: a loop logs it and tries again.
DATABASE_ERRORS: tuple[type[Exception], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)


#: The array types pgq's statements send and read, as (array oid, element oid, element
#: name). PostgreSQL fixes the oids of its built-in types: they are the same on every server.
_ARRAY_TYPES = (
    (1000, 16, "bool"),
    (1007, 23, "int4"),
    (1009, 25, "text"),
    (1016, 20, "int8"),
    (1022, 701, "float8"),
    (1185, 1184, "timestamptz"),
    (2951, 2950, "uuid"),
    # The limited claim's jobs, anonymous records: asyncpg reads their fields by the types
    # declared here (their int8[] and text[] too), which it would not ask the server about.
    (2287, 2249, "record"),
)
# Each in the shape of a row of asyncpg's type introspection, which is what it registers.
_ARRAY_TYPE_ROWS = tuple(
    {
        "oid": oid, "ns": "pg_catalog", "name": f"_{element}", "kind": b"b", "basetype": None,
        "elemtype": element_oid, "elemdelim": ",", "range_subtype": None, "attrtypoids": None,
        "attrnames": None, "depth": 0, "basetype_name": None, "elemtype_name": element,
        "range_subtype_name": None,
    }
    for oid, element_oid, element in _ARRAY_TYPES
)  # fmt: skip


async def declare_array_types(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Give a new connection the codecs of :data:`_ARRAY_TYPES` up front.

    asyncpg asks the server about every array type a connection meets for the first time:
    a recursive catalog query planned afresh (3-15 ms on a busy two-core machine), with
    ``jit`` switched off and back around it, once per connection and type set, so several
    times over as a worker's pool connections take turns at its statements. The answer
    for built-in types never varies, so pgq declares it instead. (pgq's own enum, whose oid
    differs from database to database, is passed as text and cast in the statements.)
    This goes through
    asyncpg's protocol settings, which are not public API: should they change, the
    connection is left as it was, and asyncpg asks the server as before."""
    try:
        protocol: Any = getattr(conn, "_protocol")  # noqa: B009 - not in asyncpg's stubs
        protocol.get_settings().register_data_types(_ARRAY_TYPE_ROWS)
    except Exception as exc:  # pragma: no cover - depends on the asyncpg release
        log.debug("array codecs not declared (%s): asyncpg will introspect them", exc)


#: Seconds asyncpg may spend cancelling a statement cut short (a CancelRequest sent on a
#: connection of its own, then the server's acknowledgment on the statement's): past them
#: the connection is closed. asyncpg leaves it unbounded, and on a host gone silent (a
#: machine powered off, a failover's old primary) the connection never comes back, nor
#: does the pool's slot it holds: a pool of one (a worker's claims) would claim no more.
CANCEL_S = 10.0


if TYPE_CHECKING:
    _AsyncpgConnection: TypeAlias = asyncpg.Connection[asyncpg.Record]
else:
    _AsyncpgConnection = asyncpg.Connection


class _Connection(_AsyncpgConnection):
    """asyncpg's connection, with cancellations bounded by :data:`CANCEL_S`: pgq's own
    connections and pools are of this class."""

    __slots__ = ()

    async def _cancel(self, *args: Any, **kwargs: Any) -> None:
        # asyncpg's private hook, run in a task of its own once a statement is cancelled;
        # a release of the connection to its pool waits for it.
        async with asyncio.timeout(CANCEL_S) as limit:
            await super()._cancel(*args, **kwargs)  # type: ignore[misc]
        if limit.expired():
            log.debug("a statement's cancellation took over %gs: closing its connection", CANCEL_S)
            self.terminate()  # which completes what waits for the cancellation


#: Seconds to open a connection, unless the caller or the DSN's ``connect_timeout`` says.
CONNECT_TIMEOUT_S = 10.0
#: DSNs already warned about for libpq options asyncpg does not take (once per process).
_warned: set[str] = set()


#: The seconds asyncpg gets to connect where the DSN asks to wait indefinitely
#: (``connect_timeout=0``): about 31 years.
_NO_LIMIT_S = 1e9


def _for_asyncpg(dsn: str | None, timeout_s: float | None) -> tuple[str | None, float]:
    """The DSN asyncpg gets, and the seconds it may take to connect: the caller's, else the
    DSN's ``connect_timeout``, else :data:`CONNECT_TIMEOUT_S`."""
    split = for_asyncpg(dsn)
    if split.dropped and dsn not in _warned:
        _warned.add(dsn or "")
        log.warning(
            "the DSN %s names libpq options asyncpg does not take (%s): pgq's connections "
            "go without them",
            mask_dsn(dsn), ", ".join(split.dropped),
        )  # fmt: skip
    if timeout_s is None:
        timeout_s = split.connect_timeout_s
        if timeout_s is None:
            timeout_s = CONNECT_TIMEOUT_S
    return split.dsn, (timeout_s or _NO_LIMIT_S)


def _refused_setting(dsn: str | None, exc: asyncpg.PostgresError) -> ConfigError:
    """The server refused a setting a connection asked for at its start: one the DSN's
    query names (asyncpg sends every parameter it does not know itself as a setting)."""
    return ConfigError(
        f"PostgreSQL at {mask_dsn(dsn)} refused a setting: {scrub(str(exc), dsn)}. A "
        "parameter in the DSN's query is neither a connection option asyncpg knows nor a "
        "server setting, or its value is wrong: correct or remove it"
    )


#: What the server answers a connection's start with when a setting it was sent is unknown
#: or wrong.
_SETTING_ERRORS = (asyncpg.UndefinedObjectError, asyncpg.InvalidParameterValueError)


#: The ``target_session_attrs`` under which a DSN's hosts are tried one at a time: every
#: value libpq and asyncpg take. ``prefer-standby`` looks for a standby first, then takes
#: the first host that answered.
_ONE_HOST_AT_A_TIME = frozenset(
    {None, "any", "read-write", "primary", "read-only", "standby", "prefer-standby"}
)
#: A host that failed in one of these ways is passed over for the next, as libpq does.
_NEXT_HOST_ERRORS: tuple[type[Exception], ...] = (
    *CONNECTION_ERRORS,
    asyncpg.TargetServerAttributeNotMatched,
)
#: Per multi-host DSN (as asyncpg takes it), the host that answered its last connection:
#: tried first next time, so that after a failover only the first connection waits out a
#: silent old primary listed before the new one.
_answered: dict[str, str] = {}


def _in_turn(dsn: str, hosts: list[str]) -> list[str]:
    """``hosts`` in the order to try them: the one that answered last first, then the
    others in the DSN's order."""
    last = _answered.get(dsn)
    return [last, *(h for h in hosts if h != last)] if last in hosts else hosts


def connect_budget_s(dsn: str | None, per_host_s: float | None = None) -> float:
    """The seconds a connection to ``dsn`` may take when every host is tried in turn, each
    with ``per_host_s`` (by default the DSN's ``connect_timeout``, else
    :data:`CONNECT_TIMEOUT_S`): what an outer limit on a connect must allow, or a silent
    first host spends it alone."""
    target, timeout = _for_asyncpg(dsn, per_host_s)
    tries = len(each_host(target)) if target is not None else 1
    if tries > 1 and _session_attrs(target) == "prefer-standby":
        tries *= 2  # a standby is looked for first, then any host that answered
    return timeout * tries


async def _connect_each_host(
    dsn: str | None = None, **kwargs: Any
) -> asyncpg.Connection[asyncpg.Record]:
    """``asyncpg.connect``, with each host of a multi-host DSN given the whole ``timeout``
    in turn (libpq's rule) rather than one budget for the list, which a silent first host
    would spend alone; the host that answered last is tried first. Raises what the last
    host raised."""
    hosts = each_host(dsn) if dsn is not None else []
    attrs = kwargs.get("target_session_attrs") or _session_attrs(dsn)
    if dsn is None or len(hosts) < 2 or attrs not in _ONE_HOST_AT_A_TIME:
        conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(dsn, **kwargs)
        return conn
    hosts = _in_turn(dsn, hosts)
    choose = _prefer_standby if attrs == "prefer-standby" else _first_host
    _answered[dsn], conn = await choose(hosts, kwargs)
    return conn


#: A connection, and the host of the list it was opened to.
_Landed: TypeAlias = "tuple[str, asyncpg.Connection[asyncpg.Record]]"


async def _open(host: str, kwargs: dict[str, Any]) -> _Landed:
    return host, await asyncpg.connect(host, **kwargs)


async def _first_host(hosts: list[str], kwargs: dict[str, Any]) -> _Landed:
    """The first of ``hosts`` that answers as asked."""
    for host in hosts[:-1]:
        try:
            return await _open(host, kwargs)
        except _NEXT_HOST_ERRORS as exc:
            log.debug("%s: %s; trying the next host", mask_dsn(host), type(exc).__name__)
    return await _open(hosts[-1], kwargs)


async def _prefer_standby(hosts: list[str], kwargs: dict[str, Any]) -> _Landed:
    """libpq's ``prefer-standby``: the first standby of ``hosts``, else the first host that
    answered (a silent host is waited for once, not twice)."""
    answered: list[str] = []
    last: Exception | None = None
    for host in hosts:
        try:
            return await _open(host, {**kwargs, "target_session_attrs": "standby"})
        except asyncpg.TargetServerAttributeNotMatched as exc:
            answered.append(host)  # up, and a primary
            last = exc
        except CONNECTION_ERRORS as exc:
            log.debug("%s: %s; trying the next host", mask_dsn(host), type(exc).__name__)
            last = exc
    for host in answered:
        try:
            return await _open(host, {**kwargs, "target_session_attrs": "any"})
        except CONNECTION_ERRORS as exc:
            last = exc
    assert last is not None  # hosts is never empty
    raise last


async def connect(
    dsn: str | None, *, timeout_s: float | None = None, **kwargs: Any
) -> asyncpg.Connection[asyncpg.Record]:
    """Open one connection, turning driver and socket failures into DatabaseUnavailable,
    and a DSN the server or asyncpg refuses into ConfigError."""
    target, timeout = _for_asyncpg(dsn, timeout_s)
    kwargs.setdefault("connection_class", _Connection)
    try:
        conn = await _connect_each_host(target, timeout=timeout, **kwargs)
    except _connect_errors as exc:
        raise _unavailable(dsn, exc) from exc
    except _SETTING_ERRORS as exc:
        raise _refused_setting(dsn, exc) from None
    except ValueError as exc:  # asyncpg's own DSN parser
        raise _unparsable(dsn, exc) from None
    await declare_array_types(conn)
    return conn


#: Session settings for the worker's connections. Its batch statements join arrays whose
#: sizes vary to the jobs table: a generic plan (which Postgres switches to after five runs
#: of a prepared statement) guesses their size and can pick a plan many times slower;
#: custom plans cost a fraction of a millisecond per batch. (The client's inserts have no
#: join to get wrong, and keep cheap generic plans; so do the worker's unlimited claims, on
#: connections of their own: their generic plan is the custom one, see docs/architecture.md.)
WORKER_SESSION_SETTINGS = {"plan_cache_mode": "force_custom_plan"}

#: Session settings for the worker's claim connections, which keep cached plans: a plan
#: cached while the jobs table was small would otherwise keep scanning it whole once it
#: has grown (a table that grows without being analyzed or vacuumed never has its plans
#: made again). Every claim statement finds its rows through an index (the queue's in claim
#: order, the primary key, the limits' own), so the planner is left no other way. No JIT:
#: a plan that could not avoid a disabled scan would cost enough to be compiled every run.
CLAIM_SESSION_SETTINGS = {"enable_seqscan": "off", "enable_bitmapscan": "off", "jit": "off"}


POOLERS = ("none", "transaction")


@dataclass(frozen=True, slots=True)
class Target:
    """Where pgq's connections go, and how: the DSN, the pooler in front of it, and a direct
    DSN for LISTEN.

    ``pooler="transaction"`` (PgBouncer, or any pooler that hands a server connection to a
    client for one transaction) keeps no state in a session: no startup parameter but
    ``application_name``, no prepared statement kept across transactions (asyncpg's
    statement cache is off; each statement is parsed unnamed), and no LISTEN on a pooled
    connection: workers poll, unless ``listen_dsn`` reaches Postgres past the pooler.
    """

    dsn: str | None
    pooler: str = "none"
    listen_dsn: str | None = None

    @classmethod
    def resolve(
        cls,
        dsn: str | None,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        *,
        connects: bool = True,
    ) -> Target:
        """The target from explicit values, else ``PGQ_POOLER`` / ``PGQ_LISTEN_DSN`` (and the
        DSN's own variables), else no pooler. ``connects=False``: the caller brings its own
        pool or client, and no DSN is looked for."""
        for name, value in (("dsn", dsn), ("listen_dsn", listen_dsn)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f"{name} must be a PostgreSQL URL (a str) or None, not {type(value).__name__}"
                )
        mode = (pooler or os.environ.get("PGQ_POOLER") or "none").strip().lower()
        if mode == "session":
            mode = "none"  # a session pooler keeps the session: nothing to change
        if mode not in POOLERS:
            raise ConfigError(
                f"pooler must be 'transaction' (PgBouncer's pool_mode = transaction) or "
                f"'none', not {mode!r}"
            )
        listen = listen_dsn or os.environ.get("PGQ_LISTEN_DSN") or None
        own = resolve_dsn(dsn) if connects else None
        return cls(own, mode, normalize_dsn(listen) if listen is not None else None)

    @property
    def pooled(self) -> bool:
        """Whether a transaction pooler stands between pgq and Postgres."""
        return self.pooler == "transaction"

    @property
    def can_listen(self) -> bool:
        """Whether LISTEN works: directly, or through ``listen_dsn``."""
        return not self.pooled or self.listen_dsn is not None

    def listen_target(self) -> Target:
        """Where a LISTEN connection goes (past the pooler when ``listen_dsn`` is set)."""
        if not self.pooled:
            return self
        return Target(self.listen_dsn)

    def options(
        self, application_name: str, server_settings: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """asyncpg keywords for a connection or pool of this target. Through a transaction
        pooler, ``server_settings`` (session state) are left out: set them per transaction."""
        settings = {"application_name": application_name[:63]}
        if self.pooled:
            return {"server_settings": settings, "statement_cache_size": 0}
        options: dict[str, Any] = {"server_settings": {**(server_settings or {}), **settings}}
        if not _names_session_attrs(self.dsn):
            # pgq writes: with several hosts (or a primary demoted), take only a primary
            options["target_session_attrs"] = "read-write"
        return options

    def libpq_options(self, application_name: str) -> dict[str, Any]:
        """The same for libpq (psycopg): what it should ask of the server."""
        options: dict[str, Any] = {"application_name": application_name[:63]}
        if not self.pooled and not _names_session_attrs(self.dsn):
            options["target_session_attrs"] = "read-write"
        return options


def _session_attrs(dsn: str | None) -> str | None:
    """The ``target_session_attrs`` the DSN (or ``PGTARGETSESSIONATTRS``) asks for."""
    query = (dsn or "").partition("?")[2]
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "target_session_attrs":
            return value
    return os.environ.get("PGTARGETSESSIONATTRS")


def _names_session_attrs(dsn: str | None) -> bool:
    return "target_session_attrs" in (dsn or "") or "PGTARGETSESSIONATTRS" in os.environ


async def _reset(conn: Connection) -> None:
    # asyncpg's default reset costs a round trip per release (UNLISTEN *, RESET ALL, ...):
    # one per job batch on the hot path. pgq's statements leave no session state behind
    # (LISTENs are removed by their owner); only an abandoned transaction needs undoing.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(
    dsn: str | None,
    *,
    min_size: int,
    max_size: int,
    timeout_s: float | None = None,
    **kwargs: Any,
) -> Pool:
    """Open a pool (its first connections too) for pgq's own use, with the same error
    translation."""
    target, timeout = _for_asyncpg(dsn, timeout_s)
    kwargs.setdefault("reset", _reset)
    kwargs.setdefault("connection_class", _Connection)
    init = kwargs.pop("init", None)

    async def setup(conn: asyncpg.Connection[asyncpg.Record]) -> None:
        await declare_array_types(conn)
        if init is not None:
            await init(conn)

    kwargs["init"] = setup
    try:
        pool = await asyncpg.create_pool(
            target,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            connect=_connect_each_host,
            **kwargs,
        )
    except _connect_errors as exc:
        raise _unavailable(dsn, exc) from exc
    except _SETTING_ERRORS as exc:
        raise _refused_setting(dsn, exc) from None
    except ValueError as exc:
        raise _unparsable(dsn, exc) from None
    assert pool is not None
    return pool


def sqlalchemy_engine(dsn: str | None) -> AsyncEngine:
    """A SQLAlchemy engine (asyncpg dialect, no pool) whose connections asyncpg opens from
    ``dsn`` itself: every DSN asyncpg takes works (several hosts, ``target_session_attrs``,
    ``sslmode``), where SQLAlchemy's URL parser would refuse a host list. Behind a
    transaction pooler (``PGQ_POOLER``) neither asyncpg nor SQLAlchemy keeps statements."""
    from sqlalchemy import pool
    from sqlalchemy.ext.asyncio import create_async_engine

    target = Target.resolve(dsn)

    async def open_connection() -> asyncpg.Connection[asyncpg.Record]:
        return await connect(target.dsn, **target.options("pgq migrate"))

    url = "postgresql+asyncpg://"
    if target.pooled:
        url += "?prepared_statement_cache_size=0"
    return create_async_engine(url, async_creator=open_connection, poolclass=pool.NullPool)
