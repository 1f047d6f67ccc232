"""The ``pgq`` command line: ``parser`` builds the arguments, ``worker_command`` runs a
worker (``supervisor``: N of them), ``admin`` holds the commands that look and act,
``render`` shows what they found, ``dashboard_command`` serves the dashboard and
``logconfig`` sets up the logs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from pgq._cli import admin, logconfig, worker_command
from pgq._cli.parser import build_parser
from pgq._core.dsn import libpq_target, resolve_dsn
from pgq.errors import DatabaseError, PgqError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pgq`` console script (and of ``python -m pgq``)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
        return code
    except BrokenPipeError:
        return _reader_left()
    except BaseExceptionGroup as group:
        if group.split(BrokenPipeError)[1] is not None:
            raise
        return _reader_left()


def _reader_left() -> int:
    """stdout's reader left (``pgq jobs list --json | head``): stop quietly, as a program
    killed by SIGPIPE would, and keep Python from failing again on flushing at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13  # the shell's status for SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        logs = logconfig.settings(args)
        logconfig.configure(logs)
    except PgqError as exc:
        print(f"pgq: error: {exc}", file=sys.stderr)
        return 2
    # Connection options every command shares, read where the connections are made.
    if getattr(args, "pooler", None):
        os.environ["PGQ_POOLER"] = args.pooler
    if getattr(args, "listen_dsn", None):
        os.environ["PGQ_LISTEN_DSN"] = args.listen_dsn
    try:
        if args.command == "migrate":
            return admin.migrate(args)
        if args.command == "worker":
            return worker_command.run(args, argv)
        if args.command == "enqueue":
            return anyio.run(admin.enqueue, args)
        if args.command == "producers":
            return anyio.run(admin.producers, args)
        if args.command == "dashboard":
            from pgq._cli import dashboard_command  # the dashboard extra, imported only when asked

            return dashboard_command.run(args, logs)
        return anyio.run(admin.operate, args)
    except PgqError as exc:
        print(f"pgq: error: {_where(exc, args)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        matched, rest = group.split(PgqError)
        if matched is None or rest is not None:
            raise
        print(f"pgq: error: {_where(_first_leaf(matched), args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _where(exc: BaseException, args: argparse.Namespace) -> str:
    """The error, naming where pgq connected when no DSN was given anywhere (libpq's
    defaults may not be the database the user thinks)."""
    message = str(exc)
    if not isinstance(exc, DatabaseError) or "no DSN was given" in message:
        return message
    try:
        given = resolve_dsn(getattr(args, "dsn", None))
    except PgqError:
        return message
    return message if given is not None else f"{message} [in {libpq_target()}]"


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
