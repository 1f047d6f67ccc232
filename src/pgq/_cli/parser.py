"""The `pgq` argument parser: one function per command, the flags' value types (each
refuses a value that cannot work, saying what a valid one looks like), and argparse's
parser with usage errors that never show a password."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pgq._cli import logconfig
from pgq._cli.supervisor import add_process_arguments
from pgq._core.dsn import scrub_arguments
from pgq._core.names import is_host_name
from pgq.job import MAX_JOB_ID, JobState
from pgq.settings import env_name, optional_setting, parse_optional_seconds, setting_help

_DSN_HELP = (
    "PostgreSQL URL; default: PGQ_DSN, then DATABASE_URL, then the libpq variables "
    "(PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD)"
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every command."""
    parser = Parser(
        prog="pgq",
        description="pgq: a PostgreSQL job queue for asyncio services.",
        epilog="Run `pgq COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"pgq {distribution_version()}",
        help="print the installed pgq-async's version and exit",
    )
    # Before the command, and after it (`pgq worker app:app --log-level DEBUG`): the one
    # before counts only when the one after is not given. Defaults and variables are read
    # where they are used (logconfig.settings, the connections).
    logconfig.add_flags(parser, default=None)
    _connection_flags(parser, default=None)
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=SubParser
    )
    _migrate(sub)
    _worker(sub)
    _producers(sub)
    _stats_jobs_queues(sub)
    _enqueue(sub)
    _dashboard(sub)
    return parser


def distribution_version() -> str:
    """The installed pgq-async distribution's version, or a note that none is installed
    (pgq run from a source tree put on the path by hand)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pgq-async")
    except PackageNotFoundError:
        return "(pgq-async is not installed: run from a source tree)"


def _connection_flags(p: argparse.ArgumentParser, *, default: Any) -> None:
    """--dsn, --pooler and --listen-dsn: every command's, before or after it."""
    p.add_argument("--dsn", default=default, help=_DSN_HELP)
    p.add_argument(
        "--pooler",
        default=default,
        choices=["none", "transaction"],
        help="'transaction' behind PgBouncer in transaction mode: no session state, no kept "
        "prepared statements, polling instead of LISTEN (default: PGQ_POOLER, else none)",
    )
    p.add_argument(
        "--listen-dsn",
        default=default,
        metavar="DSN",
        help="with --pooler transaction: a DSN that reaches Postgres directly, for LISTEN "
        "(default: PGQ_LISTEN_DSN; without one, workers poll)",
    )


def _command(parent: Any, name: str, help: str, *, json: bool = False) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
    logconfig.add_flags(p, default=argparse.SUPPRESS)
    _connection_flags(p, default=argparse.SUPPRESS)
    if json:
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def _migrate(sub: Any) -> None:
    p = _command(sub, "migrate", "create or upgrade pgq's tables (alembic upgrade head)", json=True)
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the DDL instead of applying it (for a DBA to review and run)",
    )
    p.add_argument(
        "--rename-shared-ids",
        action="store_true",
        help="in a project whose own alembic environment runs pgq's revisions: rename pgq's "
        "old revision ids (0001..0003) in its alembic_version to pgq_0001..",
    )


def _worker(sub: Any) -> None:
    p = _command(sub, "worker", "run a worker for an App")
    p.description = (
        "Run the jobs of an App until SIGTERM or SIGINT (graceful: running jobs get "
        "--shutdown-timeout seconds; a second signal stops at once)."
    )
    p.add_argument("app", metavar="MODULE:APP", help="where the App is, e.g. myproject.tasks:app")
    p.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="NAME[:N]",
        help="a queue to work, with its concurrency; repeatable (default: every queue the "
        "App's tasks use)",
    )
    p.add_argument(
        "--burst", action="store_true", help="exit (status 0) once no runnable job is left"
    )
    p.add_argument(
        "--name",
        help="worker name shown in `pgq producers` (default: host:pid, or PGQ_WORKER_NAME)",
    )
    p.add_argument(
        "--health-port",
        type=health_port,
        metavar="P",
        default=os.environ.get("PGQ_HEALTH_PORT") or None,  # a string: checked by the type
        help="serve GET /healthz on this port (200, or 503 with a JSON reason; 0 takes a "
        "free port, named in the start-up log); env PGQ_HEALTH_PORT",
    )
    p.add_argument(
        "--health-host",
        type=bind_host,
        default=os.environ.get("PGQ_HEALTH_HOST") or "127.0.0.1",
        help="address the health endpoint binds (default 127.0.0.1; 0.0.0.0: every interface)",
    )
    add_process_arguments(p)
    p.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        default=os.environ.get("PGQ_EVENT_LOOP", "auto"),
        help="auto (default): uvloop when installed (the speed extra), else asyncio's own",
    )
    p.add_argument(
        "--gc",
        choices=("tuned", "default"),
        default=os.environ.get("PGQ_GC", "tuned"),
        help="tuned (default): freeze start-up objects and collect less often (pgq.tune_gc);"
        " default: Python's own garbage-collector settings; env PGQ_GC",
    )
    for name, (default, text) in setting_help().items():
        _setting_flag(p, name, default, text)


def _setting_flag(p: argparse.ArgumentParser, name: str, default: Any, text: str) -> None:
    """The flag of one worker setting: same name, same help, its variable named."""
    flag = "--" + name.replace("_", "-")
    if isinstance(default, bool):
        p.add_argument(
            flag,
            action="store_const",
            const=True,
            default=None,
            help=f"{text} (env {env_name(name)})",
        )
        if default:  # on unless turned off
            p.add_argument(
                "--no-" + name.replace("_", "-"),
                dest=name,
                action="store_const",
                const=False,
                help=f"turn {flag} off",
            )
    elif optional_setting(name):
        p.add_argument(
            flag,
            type=parse_optional_seconds,
            default=None,
            metavar="S|none",
            help=f"{text} (default {default:g}, env {env_name(name)})",
        )
    else:
        p.add_argument(
            flag,
            type=type(default),
            default=None,
            metavar="N",
            help=f"{text} (default {default:g}, env {env_name(name)})",
        )


def _producers(sub: Any) -> None:
    p = _command(sub, "producers", "list producers, their heartbeats and the leader", json=True)
    p.description = (
        "List every producer registered in the database with its heartbeat age and status "
        "(alive, unhealthy, stale), and which worker leads."
    )
    p.add_argument(
        "--stale-after",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which a silent producer shows as stale (default: PGQ_STALE_AFTER or 30)",
    )


def _stats_jobs_queues(sub: Any) -> None:
    _command(
        sub,
        "stats",
        "jobs by queue and state, oldest available job, last minute's throughput",
        json=True,
    )
    jobs = sub.add_parser(
        "jobs",
        help="list, show, retry or cancel jobs",
        description="List, show, retry or cancel jobs.",
    )
    actions = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    p = _command(actions, "list", "the newest jobs, filtered", json=True)
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--queue")
    p.add_argument("--task")
    p.add_argument(
        "--limit", type=whole(1, MAX_LIST), default=50, help="at most this many (default 50)"
    )
    p = _command(
        actions, "show", "one job: args, attempts, errors with tracebacks, producer", json=True
    )
    p.add_argument("id", type=job_id)
    for action, text in (
        ("retry", "run finished, retryable or scheduled jobs again now"),
        ("cancel", "cancel jobs (running ones are stopped by their worker)"),
    ):
        p = _command(actions, action, f"{text}: by id, or every job the filters match", json=True)
        p.add_argument("ids", type=job_id, nargs="*", metavar="ID")
        p.add_argument(
            "--state", action="append", choices=[s.value for s in JobState], help="repeatable"
        )
        p.add_argument("--queue")
        p.add_argument("--task")
        p.add_argument(
            "--yes", action="store_true", help="act on what the filters match without asking"
        )

    queues = sub.add_parser(
        "queues",
        help="list, pause, resume or limit queues",
        description="List, pause, resume or limit queues.",
    )
    actions = queues.add_subparsers(dest="queues_command", metavar="ACTION", required=True)
    _command(actions, "list", "every queue with its backlog, producers and pause state", json=True)
    for action in ("pause", "resume"):
        p = _command(
            actions, action, f"{action} claiming from a queue ('*': every queue)", json=True
        )
        p.add_argument("name", metavar="QUEUE")
        p.add_argument(
            "--force", action="store_true", help="even a queue no job or worker names yet"
        )
    _queue_limit(actions)


def _queue_limit(actions: Any) -> None:
    p = _command(
        actions,
        "limit",
        "set a queue's limits across every worker, live (no option: show them)",
        json=True,
    )
    p.add_argument("name", metavar="QUEUE")
    p.add_argument("--concurrency", type=int, metavar="N", help="at most N of its jobs running")
    p.add_argument(
        "--rate",
        metavar="COUNT/SECONDS",
        help="at most COUNT jobs started in any SECONDS (e.g. 100/60)",
    )
    p.add_argument(
        "--key-concurrency",
        type=int,
        metavar="N",
        help="at most N running per limit key (per customer, say)",
    )
    p.add_argument(
        "--key-rate",
        metavar="COUNT/SECONDS",
        help="at most COUNT started per limit key in any SECONDS",
    )
    p.add_argument("--clear", action="store_true", help="remove the queue's limits")


def _enqueue(sub: Any) -> None:
    p = _command(sub, "enqueue", "enqueue jobs from the shell", json=True)
    p.description = "Enqueue jobs of a task by name."
    p.add_argument("task", metavar="TASK", help="task name")
    p.add_argument(
        "--app",
        metavar="MODULE:APP",
        help="the App that registers TASK: its arguments are checked and its queue, priority "
        "and max_attempts are the defaults",
    )
    p.add_argument(
        "--args",
        default="{}",
        metavar="JSON",
        help='keyword arguments as a JSON object, e.g. \'{"to": "a@b.c"}\'',
    )
    p.add_argument(
        "--queue", default=None, help="queue (default: the task's with --app, else default)"
    )
    p.add_argument(
        "--delay",
        type=float,
        default=None,
        metavar="S",
        help="run no sooner than S seconds from now",
    )
    p.add_argument("--priority", type=int, default=None, help="higher runs first (default 0)")
    p.add_argument("--max-attempts", type=int, default=None, metavar="N")
    p.add_argument(
        "--limit-key", default=None, metavar="KEY", help="the key per-key queue limits count"
    )
    p.add_argument(
        "--tag",
        action="append",
        default=None,
        metavar="TAG",
        help="a tag for the job, shown and filtered by in the dashboard (repeatable; at most "
        "32, of at most 128 characters)",
    )
    p.add_argument(
        "--depends-on",
        default=None,
        metavar="ID[,ID...]",
        help="run only once these jobs have completed (pending until then)",
    )
    p.add_argument(
        "--on-parent-failure",
        choices=("cancel", "run"),
        default=None,
        help="when a job it depends on fails for good: cancel this one (default) or run it",
    )
    p.add_argument(
        "--count",
        type=int,
        default=1,
        metavar="N",
        help="enqueue N identical jobs in one round trip",
    )


def _dashboard(sub: Any) -> None:
    p = _command(sub, "dashboard", "serve the web dashboard (needs the dashboard extra)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; another address needs --auth or "
        "--read-only)",
    )
    p.add_argument("--port", type=port, default=8181, help="port to listen on (default 8181)")
    p.add_argument(
        "--allowed-hosts",
        type=host_list,
        default=host_list(os.environ.get("PGQ_DASHBOARD_ALLOWED_HOSTS")),
        metavar="HOST[,HOST...]",
        help="also answer requests whose Host header names one of these (a name, *.suffix, an "
        "address, or * for any); others get 400, against DNS rebinding (default: "
        "PGQ_DASHBOARD_ALLOWED_HOSTS; else localhost, loopback addresses and --host only, "
        "and any host with --auth)",
    )
    p.add_argument(
        "--auth",
        default=os.environ.get("PGQ_DASHBOARD_AUTH"),
        metavar="USER:PASSWORD",
        help="require HTTP Basic auth (default: PGQ_DASHBOARD_AUTH; prefer the variable, "
        "which other users cannot read in the process list)",
    )
    p.add_argument(
        "--read-only", action="store_true", help="show everything, change nothing (no actions)"
    )
    p.add_argument(
        "--refresh",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often pages refresh themselves (default 5)",
    )
    p.add_argument(
        "--stale-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="judge producers stale past this heartbeat age (default: each worker's own "
        "setting, as it recorded it)",
    )


# --------------------------------------------------------------------------- flag values
# argparse ``type=`` functions that parse a value and refuse one that cannot work, saying
# what a valid one looks like.

#: The most rows a listing returns.
MAX_LIST = 100_000


def whole(lowest: int, highest: int) -> Callable[[str], int]:
    """An argument type: a whole number from ``lowest`` to ``highest``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {lowest:,} to {highest:,}, got {text!r}"
            )
        return value

    return parse


job_id = whole(1, MAX_JOB_ID)
port = whole(1, 65535)
health_port = whole(0, 65535)


def host_list(text: str | None) -> list[str] | None:
    """``a.example,b.example`` as a list (None: not given)."""
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def bind_host(text: str) -> str:
    """An argument type: an address to listen on, an IP address (``127.0.0.1``, ``::``) or a
    host name (``localhost``, ``pod.internal``); whether this machine has it shows at bind."""
    name = text.strip()
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
        return name.removeprefix("[").removesuffix("]")
    except ValueError:
        pass
    if is_host_name(name):
        return name
    raise argparse.ArgumentTypeError(
        f"expected an address of this machine (127.0.0.1, or 0.0.0.0 or :: for every "
        f"interface) or a host name, got {text!r}"
    )


# --------------------------------------------------------------------------- usage errors
# argparse quotes what it cannot parse (``invalid choice: 'postgresql://u:secret@db/app'``),
# so every message is scrubbed of the password of every argument shaped like a DSN, and of
# ``--auth``'s.

#: Options whose whole value after the first ':' is a password (USER:PASSWORD).
_PASSWORD_FLAGS = ("--auth",)


class _Usage(Exception):
    """A subcommand's usage error, carried up to the parser that knows every argument."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class SubParser(argparse.ArgumentParser):
    """A command's parser: its usage errors go up to :class:`Parser`, which masks them."""

    def error(self, message: str) -> NoReturn:
        raise _Usage(self, message)


class Parser(argparse.ArgumentParser):
    """The top-level parser: a usage error, its own or a command's, is printed with every
    argument's password masked, then exits with status 2 as argparse does."""

    _argv: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = list(sys.argv[1:] if args is None else args)
        try:
            return super().parse_known_args(self._argv, namespace)
        except _Usage as usage:
            self._fail(usage.parser, usage.message)

    def error(self, message: str) -> NoReturn:
        self._fail(self, message)

    def _fail(self, parser: argparse.ArgumentParser, message: str) -> NoReturn:
        masked = scrub_arguments(message, self._argv)
        for i, arg in enumerate(self._argv):
            flag, eq, value = arg.partition("=")
            if flag in _PASSWORD_FLAGS:
                if not eq:
                    value = self._argv[i + 1] if i + 1 < len(self._argv) else ""
                password = value.partition(":")[2]
                if password:
                    masked = masked.replace(password, "***")
        parser.print_usage(sys.stderr)
        parser.exit(2, f"{parser.prog}: error: {masked}\n")
