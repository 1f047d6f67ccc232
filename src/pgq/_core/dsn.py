"""DSN resolution, validation and masking.

Resolution everywhere: an explicit DSN > ``PGQ_DSN`` > ``DATABASE_URL`` > libpq variables
(``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``, ``PGDATABASE``), which asyncpg reads itself.

No message pgq writes carries any part of a password, whatever the DSN's shape: errors about
a DSN describe the problem in pgq's own words and show the DSN only through
:func:`mask_dsn`, never a parser's message (which may quote a piece of the password).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pgq.errors import ConfigError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_SCHEMES = ("postgres", "postgresql")
# Keyword form: host=db password='x y' ...
_KEYWORD = re.compile(r"^\s*\w+\s*=")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"(password=)[^&#]*", re.IGNORECASE)
# A scheme however mistyped (postgres//, postgresql:/), before the user information.
_MASK_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:?//?")
_EXPECTED = "expected postgresql://user:password@host:port/database"


def resolve_dsn(explicit: str | None = None) -> str | None:
    """Return the DSN to use, or None to let asyncpg read the libpq environment variables."""
    for candidate in (explicit, os.environ.get("PGQ_DSN"), os.environ.get("DATABASE_URL")):
        if candidate:
            return normalize_dsn(candidate)
    return None


def normalize_dsn(dsn: str) -> str:
    """Check that ``dsn`` is a PostgreSQL URL and return it in the form asyncpg accepts.

    SQLAlchemy-style schemes (``postgresql+asyncpg://``) are reduced to ``postgresql://``;
    several hosts (``postgresql://u@db1:5432,db2:5432/app``) are kept. Anything else raises
    :class:`ConfigError` saying what is wrong, with the password masked.
    """
    dsn = dsn.strip()
    match = _SCHEME.match(dsn)
    if match is None or match.group(1).split("+", 1)[0].lower() not in _SCHEMES:
        raise _malformed(dsn, _EXPECTED)
    rest = dsn[match.end() :]
    end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    if "@" in tail:
        raise _malformed(
            dsn,
            "the user name or password seems to hold a '/', '?', '#' or '@' as is, or "
            "a query value an '@': percent-encode such characters (e.g. '/' as %2F, '@' "
            "as %40; ?application_name=ops%40example)",
        )
    if netloc.count("@") > 1:
        raise _malformed(
            dsn,
            "the user name or password holds an '@' as is: percent-encode it as %40 (the "
            "driver would take what follows the first '@' for the host)",
        )
    hosts = netloc.rpartition("@")[2]
    for host in hosts.split(",") if hosts else ():
        _check_host(dsn, host)
    if not netloc and not tail:
        raise _malformed(dsn, _EXPECTED)
    return "postgresql://" + netloc + tail.split("#", 1)[0]


#: libpq's connection options that asyncpg does not take: it would send each to the server
#: as a setting, which the server refuses. (``connect_timeout`` is taken apart, below.)
_LIBPQ_ONLY = frozenset({
    "fallback_application_name", "gssdelegation", "keepalives", "keepalives_count",
    "keepalives_idle", "keepalives_interval", "load_balance_hosts", "sslcompression",
    "sslsni", "tcp_user_timeout",
})  # fmt: skip
#: libpq's options that restrict or pin the connection, which asyncpg cannot honour:
#: refused, never dropped (pgq would connect without the guarantee the DSN demands).
_LIBPQ_REFUSED = {
    "channel_binding": "asyncpg does not enforce channel binding",
    "require_auth": "asyncpg does not restrict the authentication methods it answers",
    "gssencmode": "asyncpg has no GSSAPI encryption",
    "requiressl": "use sslmode=require (or verify-full) instead",
    "requirepeer": "asyncpg does not check the server process's user",
    "hostaddr": "give the address as the host",
    "replication": "pgq's connections are not replication connections",
}


@dataclass(frozen=True, slots=True)
class AsyncpgDsn:
    """A DSN as asyncpg takes it: libpq's ``connect_timeout`` taken out (as seconds; None
    where the DSN gives none, 0 where it asks to wait indefinitely), and the libpq options
    asyncpg does not take left out, named in ``dropped``."""

    dsn: str | None
    connect_timeout_s: float | None = None
    dropped: tuple[str, ...] = ()


def for_asyncpg(dsn: str | None) -> AsyncpgDsn:
    """Split what asyncpg cannot take off ``dsn`` (a normalized URL, or None)."""
    if dsn is None or "?" not in dsn:
        return AsyncpgDsn(dsn)
    base, _, query = dsn.partition("?")
    kept: list[str] = []
    dropped: list[str] = []
    timeout: float | None = None
    for pair in query.split("&"):
        name = pair.partition("=")[0]
        if name == "connect_timeout":
            timeout = _connect_timeout(dsn, pair.partition("=")[2])
        elif name in _LIBPQ_REFUSED:
            raise _malformed(
                dsn,
                f"{name} is a libpq option asyncpg cannot honour ({_LIBPQ_REFUSED[name]}): "
                "pgq refuses to connect without what it demands; remove it or use what "
                "the note says",
            )
        elif name in _LIBPQ_ONLY:
            dropped.append(name)
        elif pair:
            kept.append(pair)
    return AsyncpgDsn(base + ("?" + "&".join(kept) if kept else ""), timeout, tuple(dropped))


def each_host(dsn: str) -> list[str]:
    """``dsn`` once per host it lists in its address (``postgresql://u@db1,db2:5433/app``
    gives ``postgresql://u@db1/app`` and ``postgresql://u@db2:5433/app``), in order; a DSN
    of one host (or of none, or with hosts in its query) as it is.

    libpq gives each host its own ``connect_timeout``; asyncpg gives the whole list one
    budget, which a silent first host (a machine powered off drops the SYN) spends alone.
    Trying the hosts one by one restores libpq's rule."""
    match = _SCHEME.match(dsn)
    if match is None:
        return [dsn]
    rest = dsn[match.end() :]
    end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
    user, at, hosts = rest[:end].rpartition("@")
    if "," not in hosts:
        return [dsn]
    head = dsn[: match.end()] + user + at
    return [head + host + rest[end:] for host in hosts.split(",") if host]


def _connect_timeout(dsn: str, value: str) -> float:
    """libpq's ``connect_timeout``: whole seconds, at least 2; 0 or less waits
    indefinitely (returned as 0)."""
    try:
        seconds = int(value)
    except ValueError:
        raise _malformed(
            dsn, f"connect_timeout must be a whole number of seconds, not {value!r}"
        ) from None
    return 0.0 if seconds <= 0 else float(max(seconds, 2))


def _check_host(dsn: str, host: str) -> None:
    if host.startswith("["):  # [IPv6]:port
        close = host.find("]")
        port = host[close + 1 :] if close != -1 else ""
        if close == -1 or (port and not port.startswith(":")):
            raise _malformed(dsn, "an IPv6 host must be written [address] or [address]:port")
        port = port[1:]
    else:
        port = host.partition(":")[2]
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise _malformed(
            dsn,
            "a port is not a number from 1 to 65535 (if the password holds a '/', '?', "
            "'#' or '@', percent-encode it)",
        )


def _malformed(dsn: str, why: str) -> ConfigError:
    return ConfigError(f"malformed DSN {mask_dsn(dsn)!r}: {why}")


def sqlalchemy_url(dsn: str | None) -> str:
    """The same DSN for SQLAlchemy's asyncpg dialect (used by alembic)."""
    if dsn is None:
        return "postgresql+asyncpg://"
    return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


def mask_dsn(dsn: str | None) -> str:
    """``dsn`` with any password replaced by ``***``, safe for logs and error messages,
    whatever the DSN's shape (keyword form, a URL with a missing ``:`` or ``//``, characters
    a password should have percent-encoded)."""
    if dsn is None:
        return libpq_target()
    if "://" not in dsn and _KEYWORD.match(dsn):
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    text = dsn
    at = text.rfind("@")
    if at != -1:
        # Everything before the last '@' is user information, whatever a password holds.
        head = text[:at]
        scheme = _MASK_PREFIX.match(head)
        prefix = scheme.group(0) if scheme else ""
        user, colon, _password = head[len(prefix) :].partition(":")
        if colon:
            text = f"{prefix}{user}:***{text[at:]}"
    else:
        # No user information: a "port" that is not a number may be a password whose '@'
        # went missing (postgresql://user:secret/db).
        scheme = _SCHEME.match(text)
        if scheme is not None:
            rest = text[scheme.end() :]
            end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
            hosts = [_mask_port(h) for h in rest[:end].split(",")]
            text = text[: scheme.end()] + ",".join(hosts) + rest[end:]
    return _QUERY_PASSWORD.sub(r"\1***", text)


def libpq_target() -> str:
    """Where a connection without a DSN goes (libpq's variables, then its defaults), said so
    that an error names the host and database it tried."""
    import getpass

    user = os.environ.get("PGUSER") or getpass.getuser()
    host = os.environ.get("PGHOST") or "the local socket or localhost"
    port = os.environ.get("PGPORT") or "5432"
    database = os.environ.get("PGDATABASE") or user
    return (
        f"host {host}, port {port}, database {database}, user {user} (no DSN was given: "
        "libpq's PG* variables and defaults; set --dsn, PGQ_DSN or DATABASE_URL)"
    )


def scrub(text: str, dsn: str | None) -> str:
    """``text`` (a driver's or the system's message about ``dsn``) with every piece of the
    DSN's password replaced by ``***``: parsers echo what they choke on."""
    if not dsn:
        return text
    for secret in sorted(_password_pieces(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def scrub_arguments(text: str, arguments: Sequence[str]) -> str:
    """``text`` (a usage error quoting command-line arguments) with the password of every
    argument shaped like a DSN replaced by ``***``: the argument itself, the value of
    ``--flag=value``, and either as a message quotes it (``repr``, escapes and all)."""
    for argument in arguments:
        values = [argument]
        if argument.startswith("-") and "=" in argument:
            values.insert(0, argument.partition("=")[2])
        for value in values:
            for shown in (value, repr(value)[1:-1]):
                text = scrub(text, shown)
    return text


def _password_pieces(dsn: str) -> set[str]:
    from urllib.parse import unquote

    found: list[str] = []
    masked = mask_dsn(dsn)
    if masked != dsn:
        # What masking hid, found by lining the two up: the text between the common prefix
        # and the common suffix, once per masked span.
        for piece in re.split(r"\*\*\*", masked):
            dsn = dsn.replace(piece, "\0", 1) if piece else dsn
        found = [p for p in dsn.split("\0") if p]
    pieces: set[str] = set()
    for secret in found:
        for variant in (secret, unquote(secret)):
            pieces.add(variant)
            pieces.update(p for p in re.split(r"[/?#@:&'\s]", variant) if len(p) >= 3)
    return pieces


def _mask_port(host: str) -> str:
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if colon and not (port.isdigit() or (name.startswith("[") and not name.endswith("]"))):
        return f"{name}:***"
    return host
