"""`pgq dashboard`: the web dashboard under uvicorn, on loopback unless told otherwise."""

from __future__ import annotations

import argparse
import logging

import anyio

from pgq._cli.logconfig import LogSettings
from pgq._core.dsn import mask_dsn, resolve_dsn
from pgq._db.connections import Target, connect
from pgq._db.revision import check_schema
from pgq.errors import ConfigError

log = logging.getLogger("pgq.dashboard")


def run(args: argparse.Namespace, logs: LogSettings) -> int:
    """Serve until SIGINT or SIGTERM; refuses an unsafe bind and a database it cannot use."""
    try:
        import uvicorn

        from pgq.dashboard import Dashboard
        from pgq.dashboard._security import check_bind
    except ImportError:
        raise ConfigError(
            "pgq dashboard needs its extra: pip install 'pgq-async[dashboard]'"
        ) from None
    dashboard = Dashboard(
        resolve_dsn(args.dsn),
        read_only=args.read_only,
        auth=args.auth,
        refresh_s=args.refresh,
        stale_after_s=args.stale_after,
        allowed_hosts=allowed_hosts(args),
    )
    check_bind(args.host, auth=dashboard.auth, read_only=args.read_only)
    anyio.run(_check_database, resolve_dsn(args.dsn))
    config = uvicorn.Config(
        dashboard,
        host=args.host,
        port=args.port,
        # uvicorn is one of the other libraries: at --library-log-level (its access lines
        # are INFO), unless a --log-config file sets its loggers' levels.
        log_level=None if logs.config else logging.getLogger().getEffectiveLevel(),
        access_log=logs.config is not None or logging.getLogger().isEnabledFor(logging.INFO),
        log_config=None,  # uvicorn's records go to pgq's handler (text or --log-format json)
        lifespan="on",
    )
    server = uvicorn.Server(config)
    log.info(
        "pgq dashboard on http://%s:%d/ (%s%s%s)",
        args.host if ":" not in args.host else f"[{args.host}]",
        args.port,
        mask_dsn(resolve_dsn(args.dsn)),
        ", read-only" if args.read_only else "",
        ", password required" if dashboard.auth else "",
    )
    server.run()
    return 0


def allowed_hosts(args: argparse.Namespace) -> list[str] | None:
    """The Host names the served dashboard answers besides localhost and loopback addresses:
    those given and the address it listens on; None (any) with --auth and none given."""
    if args.allowed_hosts is None and args.auth:
        return None
    return [*(args.allowed_hosts or []), args.host]


async def _check_database(dsn: str | None) -> None:
    """Fail at start, with the reason, rather than on the first page."""
    target = Target.resolve(dsn)
    conn = await connect(target.dsn, **target.options("pgq dashboard"))
    try:
        await check_schema(conn)
    finally:
        await conn.close()
