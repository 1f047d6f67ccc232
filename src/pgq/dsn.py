"""DSN resolution, validation and masking.

Resolution everywhere: an explicit DSN > ``PGQ_DSN`` > ``DATABASE_URL`` > libpq variables
(``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``, ``PGDATABASE``), which asyncpg reads itself.
"""

from __future__ import annotations

import os
import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

from pgq.errors import ConfigError

_SCHEMES = ("postgres", "postgresql")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def resolve_dsn(explicit: str | None = None) -> str | None:
    """Return the DSN to use, or None to let asyncpg read the libpq environment variables."""
    for candidate in (explicit, os.environ.get("PGQ_DSN"), os.environ.get("DATABASE_URL")):
        if candidate:
            return normalize_dsn(candidate)
    return None


def normalize_dsn(dsn: str) -> str:
    """Check that ``dsn`` is a PostgreSQL URL and return it in the form asyncpg accepts.

    SQLAlchemy-style schemes (``postgresql+asyncpg://``) are accepted and reduced to
    ``postgresql://``. Anything else raises :class:`ConfigError` with the password masked.
    """
    dsn = dsn.strip()
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        raise ConfigError(
            f"malformed DSN {mask_dsn(dsn)!r}: {exc}; expected "
            "postgresql://user:password@host:port/database"
        ) from None
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme not in _SCHEMES or (not parts.netloc and not parts.query and not parts.path):
        raise ConfigError(
            f"malformed DSN {mask_dsn(dsn)!r}: expected "
            "postgresql://user:password@host:port/database"
        )
    return urlunsplit(SplitResult("postgresql", parts.netloc, parts.path, parts.query, ""))


def sqlalchemy_url(dsn: str | None) -> str:
    """The same DSN for SQLAlchemy's asyncpg dialect (used by alembic)."""
    if dsn is None:
        return "postgresql+asyncpg://"
    return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


def mask_dsn(dsn: str | None) -> str:
    """``dsn`` with any password replaced by ``***``, safe for logs and error messages."""
    if dsn is None:
        return "(libpq environment)"
    if "://" not in dsn:
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    scheme, rest = dsn.split("://", 1)
    netloc, sep, tail = rest.partition("/")
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    tail = re.sub(r"(password=)[^&]*", r"\1***", tail, flags=re.IGNORECASE)
    return f"{scheme}://{netloc}{sep}{tail}"
