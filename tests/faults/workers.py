"""Real `pgq worker` processes for the fault tests, and the settings they run with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

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
    """One `pgq worker fault_app:app` process."""

    def __init__(
        self,
        name: str,
        dsn: str,
        log_dir: Path,
        settings: dict[str, float],
        concurrency: int = 5,
        health_port: int | None = None,
    ) -> None:
        self.name = name
        self.dsn = dsn
        self.log_path = log_dir / f"{name}.log"
        self.health_port = health_port
        args = [
            sys.executable,
            "-m",
            "pgq.cli",
            "--log-level",
            "INFO",
            "worker",
            "fault_app:app",
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
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "FAULT_DSN": self.dsn,
            "FAULT_WORKER": self.name,
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src")]),
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


def via_proxy(dsn: str, port: int) -> str:
    """``dsn`` sent through a local proxy listening on ``port``."""
    parts = urlsplit(dsn)
    userinfo, _, _host = parts.netloc.rpartition("@")
    host = f"127.0.0.1:{port}"
    return str(urlunsplit(parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host)))


async def wait_registered(conn: asyncpg.Connection[asyncpg.Record], *names: str) -> None:
    """Return once every named worker has registered its producers."""

    async def ready() -> bool:
        n = await conn.fetchval(
            "SELECT count(DISTINCT worker_name) FROM pgq_producers WHERE worker_name = ANY($1)",
            list(names),
        )
        return bool(n == len(names))

    await until(ready, limit_s=30)
