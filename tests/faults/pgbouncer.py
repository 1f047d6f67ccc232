"""A real PgBouncer in transaction mode, started by a test on loopback in front of the test
server (Debian's package; `make test` installs it)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.faults.workers import free_port, upstream, via_proxy

#: The settings docs/scaling.md recommends for pgq behind PgBouncer, as the test runs them.
SETTINGS = {
    "pool_mode": "transaction",
    "default_pool_size": "6",
    "max_client_conn": "500",
    "server_reset_query": "",
    "ignore_startup_parameters": "",  # pgq sends none but application_name
    "server_lifetime": "3600",
    "query_wait_timeout": "30",
}


@dataclass
class Bouncer:
    dsn: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found is None:
        pytest.skip("PgBouncer is not installed (make test installs Debian's pgbouncer)")
    return found


@contextlib.contextmanager
def pgbouncer(server_dsn: str) -> Iterator[Bouncer]:
    """PgBouncer on a free loopback port in front of ``server_dsn``'s server, as the
    ``postgres`` user when run as root (PgBouncer refuses root); stopped at the end."""
    host, port = upstream(server_dsn)
    if host.startswith("/"):
        pytest.skip("the embedded server listens on a socket only PgBouncer's user cannot reach")
    parts = urlsplit(server_dsn)
    user = unquote(parts.username or os.environ.get("PGUSER", "postgres"))
    password = unquote(parts.password or "")
    listen = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="pgq-pgbouncer-"))
    settings = "\n".join(f"{k} = {v}" for k, v in SETTINGS.items())
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={port}\n\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\n"
        f"logfile = {workdir / 'pgbouncer.log'}\npidfile = {workdir / 'pgbouncer.pid'}\n"
        f"{settings}\n"
    )
    (workdir / "users.txt").write_text(f'"{user}" "{password}"\n')
    command = [binary(), str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in [workdir, *workdir.iterdir()]:
            os.chown(path, owner.pw_uid, owner.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(listen, process)
        yield Bouncer(via_proxy(server_dsn, listen), workdir / "pgbouncer.log")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"pgbouncer exited at start: {err}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # a process we started, on a deadline: nothing to await
    raise RuntimeError(f"pgbouncer did not listen on 127.0.0.1:{port} within 15 s")
