"""Real `pgq worker` processes for the fault tests, and the settings they run with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from tests.tests_support import until

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: Short liveness settings (1 s beats, 4 s stale), as the issue suggests.
SHORT: dict[str, float] = {
    "heartbeat_interval": 1.0,
    "heartbeat_timeout": 0.5,
    "max_heartbeat_failures": 3,
    "stale_after": 4.0,
    "rescue_interval": 1.0,
    "leader_ttl": 3.0,
    "reap_after": 60.0,
    "schedule_interval": 0.2,
    "poll_interval": 0.5,
    "shutdown_timeout": 5.0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WorkerProcess:
    """One `pgq worker APP` process (by default the fault tests' ``fault_app:app``; the
    docs' examples are importable too)."""

    def __init__(
        self,
        name: str,
        dsn: str,
        log_dir: Path,
        settings: dict[str, float],
        concurrency: int = 5,
        health_port: int | None = None,
        app: str = "fault_app:app",
        extra_args: tuple[str, ...] = (),
        effects_dsn: str | None = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.dsn = dsn
        #: Where the app's tasks record their effects (default: where the worker connects).
        self.effects_dsn = effects_dsn or dsn
        self.concurrency = concurrency
        self.log_path = log_dir / f"{name}.log"
        self.health_port = health_port
        args = [
            sys.executable,
            "-m",
            "pgq",
            "--log-level",
            "INFO",
            "worker",
            app,
            "--dsn",
            dsn,
            "--name",
            name,
            "--concurrency",
            str(concurrency),
        ]
        for key, value in settings.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        if health_port is not None:
            args += ["--health-port", str(health_port)]
        self.prefix = prefix  # e.g. `ip netns exec NAME`: where the process runs
        self.args = [*prefix, *args, *extra_args]
        self.proc: subprocess.Popen[bytes] | None = None
        #: Set before start(): variables of the process's own, and directories put first on
        #: its PYTHONPATH (a ``sitecustomize`` there runs in every Python it starts).
        self.env: dict[str, str] = {}
        self.path: list[str] = []

    def start(self) -> None:
        env = {
            **os.environ,
            "FAULT_DSN": self.effects_dsn,
            "FAULT_WORKER": self.name,
            "PGQ_DSN": self.dsn,
            "PYTHONPATH": os.pathsep.join(
                [*self.path, str(HERE), str(ROOT / "docs" / "examples"), str(ROOT / "src")]
            ),
            **self.env,
        }
        self.log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args, cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is not None:
                return self.proc.returncode
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(10)
        finally:
            self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def upstream(dsn: str) -> tuple[str, int]:
    """Where ``dsn`` connects: a host and port, or a socket directory and port."""
    parts = urlsplit(dsn)
    socket_dir = dict(parse_qsl(parts.query)).get("host")
    if socket_dir and socket_dir.startswith("/"):
        return socket_dir, parts.port or 5432
    return parts.hostname or "127.0.0.1", parts.port or 5432


def via_proxy(dsn: str, port: int) -> str:
    """``dsn`` sent through a local proxy listening on ``port`` (over TCP, whatever ``dsn``
    connects by)."""
    parts = urlsplit(dsn)
    userinfo, _, _host = parts.netloc.rpartition("@")
    host = f"127.0.0.1:{port}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "host"])
    return str(
        urlunsplit(parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host, query=query))
    )


async def wait_registered(conn: asyncpg.Connection[asyncpg.Record], *names: str) -> None:
    """Return once every named worker has registered its producers."""

    async def ready() -> bool:
        n = await conn.fetchval(
            "SELECT count(DISTINCT worker_name) FROM pgq_producers WHERE worker_name = ANY($1)",
            list(names),
        )
        return bool(n == len(names))

    await until(ready, limit_s=30)
