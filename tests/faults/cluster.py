"""Servers of this machine's PostgreSQL binaries on loopback ports of their own, for tests
that stop, restart or fail over a server: a lone server to restart, and a primary with a
synchronous streaming standby. Built with initdb (and pg_basebackup; as the ``postgres`` user
when run as root: initdb refuses root), removed at the end, so such a test never touches the
server the rest of the suite shares.

`python -m tests.faults.cluster` builds one, fails it over under two `pgq worker`
processes draining jobs, and prints how long work took to resume (see docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.workers import free_port

STANDBY_NAME = "standby1"


def bindir() -> str:
    """The newest PostgreSQL server binaries on this machine (PGQ_TEST_PG_BINDIR wins)."""
    if os.environ.get("PGQ_TEST_PG_BINDIR"):
        return os.environ["PGQ_TEST_PG_BINDIR"]
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_basebackup) on this machine")
    return os.path.dirname(found[-1])


@dataclass
class Cluster:
    """A primary and its synchronous standby."""

    root: Path
    bin: str
    primary_port: int
    standby_port: int

    @property
    def dsn(self) -> str:
        """Both hosts, the writable one chosen at each connection (as an HA DSN is written)."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
            "/postgres?target_session_attrs=read-write"
        )

    @property
    def primary_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/postgres"

    @property
    def standby_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/postgres"

    def stop_primary_immediately(self) -> None:
        """The primary dies: no shutdown checkpoint, clients cut off mid-statement."""
        self._pg("pg_ctl", "-D", str(self.root / "primary"), "-m", "immediate", "-w", "stop")

    def promote_standby(self) -> None:
        self._pg("pg_ctl", "-D", str(self.root / "standby"), "-w", "promote")

    def _pg(self, program: str, *args: str) -> None:
        run_as_postgres([f"{self.bin}/{program}", *args])


@dataclass
class Server:
    """A lone server of its own."""

    root: Path
    bin: str
    port: int

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def restart(self) -> None:
        """A fast shutdown (clients cut off, a checkpoint written), then a start."""
        data = self.root / "data"
        run_as_postgres([f"{self.bin}/pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop"])
        _start(self.bin, data)


@contextlib.contextmanager
def lone_server(settings: dict[str, str] | None = None) -> Iterator[Server]:
    """A running server of its own on a free loopback port, with ``settings`` (name: value
    as postgresql.conf spells it) on top of the ones below."""
    bin = bindir()
    root = Path(tempfile.mkdtemp(prefix="pgq-server-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = Server(root, bin, free_port())
    data = root / "data"
    try:
        run_as_postgres([f"{bin}/initdb", "-D", str(data), "-U", "postgres", "-A", "trust", "-N"])
        _append(
            data / "postgresql.auto.conf",
            {
                "listen_addresses": "'127.0.0.1'",
                "unix_socket_directories": f"'{root}'",
                "port": str(server.port),
                "fsync": "off",  # a test server: durability against power loss is not tested
                "shared_buffers": "32MB",
                **(settings or {}),
            },
        )
        _start(bin, data)
        yield server
    finally:
        _stop_immediately(bin, data)
        shutil.rmtree(root, ignore_errors=True)


def _stop_immediately(bin: str, data: Path) -> None:
    if (data / "postmaster.pid").exists():
        with contextlib.suppress(RuntimeError):
            run_as_postgres([f"{bin}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"])


def run_as_postgres(command: list[str]) -> None:
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")


@contextlib.contextmanager
def primary_and_standby() -> Iterator[Cluster]:
    """A running primary with ``synchronous_standby_names`` naming its one standby, and the
    standby streaming from it (synchronous: a commit returns once the standby has it)."""
    bin = bindir()
    root = Path(tempfile.mkdtemp(prefix="pgq-cluster-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = Cluster(root, bin, free_port(), free_port())
    primary, standby = root / "primary", root / "standby"
    try:
        run_as_postgres(
            [f"{bin}/initdb", "-D", str(primary), "-U", "postgres", "-A", "trust", "-N"]
        )
        common = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{root}'",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "synchronous_commit": "on",
            "fsync": "off",  # a test cluster: durability against power loss is not tested
            "shared_buffers": "32MB",
        }
        _append(
            primary / "postgresql.auto.conf",
            {
                **common,
                "port": str(cluster.primary_port),
                "synchronous_standby_names": f"'{STANDBY_NAME}'",
            },
        )
        _start(bin, primary)
        run_as_postgres(
            [
                f"{bin}/pg_basebackup",
                "-h",
                "127.0.0.1",
                "-p",
                str(cluster.primary_port),
                "-U",
                "postgres",
                "-D",
                str(standby),
                "-X",
                "stream",
                "-R",
            ]
        )
        _append(
            standby / "postgresql.auto.conf",
            {
                **common,
                "port": str(cluster.standby_port),
                # once promoted it has no standby of its own to wait for
                "synchronous_standby_names": "''",
                "primary_conninfo": f"'host=127.0.0.1 port={cluster.primary_port} "
                f"user=postgres application_name={STANDBY_NAME}'",
            },
        )
        _start(bin, standby)
        _wait_synchronous(cluster)
        yield cluster
    finally:
        for data in (primary, standby):
            _stop_immediately(bin, data)
        shutil.rmtree(root, ignore_errors=True)


def _append(path: Path, settings: dict[str, str]) -> None:
    with path.open("a") as f:
        f.writelines(f"{k} = {v}\n" for k, v in settings.items())


def _start(bin: str, data: Path) -> None:
    run_as_postgres(
        [
            f"{bin}/pg_ctl",
            "-D",
            str(data),
            "-l",
            str(data.parent / f"{data.name}.log"),
            "-w",
            "start",
        ]
    )


def _wait_synchronous(cluster: Cluster) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = subprocess.run(
            [
                f"{cluster.bin}/psql",
                cluster.primary_dsn,
                "-Atc",
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = "
                f"'{STANDBY_NAME}'",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.stdout.strip() == "sync":
            return
        time.sleep(0.1)  # another process's state, polled on a deadline
    raise RuntimeError("the standby did not become synchronous within 60 s")
