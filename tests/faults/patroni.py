"""A Patroni-managed cluster on loopback: one etcd and three PostgreSQL nodes, each node a
`patroni` process (Debian's package) with the configuration docs/scaling.md shows, read from
the page itself; only addresses, ports, paths, secrets and a small ``shared_buffers`` are
this harness's own. Everything runs as the ``postgres`` user when run as root (Patroni and
initdb refuse root), is killed at the end, and its files removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.faults.cluster import bindir
from tests.faults.workers import ROOT, free_port

SCALING = ROOT / "docs" / "scaling.md"

#: The nodes' names, as the page names them.
NODES = ("db1", "db2", "db3")


def programs() -> dict[str, str]:
    """Where patroni, patronictl and etcd are; skips the test when one is missing."""
    found = {p: shutil.which(p) for p in ("patroni", "patronictl", "etcd")}
    missing = [p for p, path in found.items() if path is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (make chaos installs Debian's patroni and "
            "etcd-server)"
        )
    return {p: str(path) for p, path in found.items()}


def documented_config() -> dict[str, Any]:
    """The Patroni node configuration docs/scaling.md shows (its first YAML block under
    "### Patroni"), parsed by Patroni's own interpreter, which has PyYAML."""
    page = SCALING.read_text()
    section = page[page.index("### Patroni") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None, "docs/scaling.md: no yaml block under ### Patroni"
    patroni = programs()["patroni"]
    interpreter = Path(patroni).read_text(errors="replace").splitlines()[0].removeprefix("#!")
    done = subprocess.run(
        [
            *interpreter.split(),
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ],
        input=block.group(1),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    config: dict[str, Any] = json.loads(done.stdout)
    return config


@dataclass
class Node:
    """One Patroni node: its Patroni process and the PostgreSQL it runs."""

    name: str
    port: int
    api_port: int
    data: Path
    config_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def postmaster_pid(self) -> int | None:
        """The node's running postmaster (None when none runs: its pid file outlives a
        kill, and the pid in it may be another process's by now)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if str(self.data).encode() in cmdline:
                return pid
        return None

    def kill9(self) -> None:
        """The node dies: its Patroni and its PostgreSQL (the postmaster and every
        backend: the postmaster's process group) killed at once, nothing shut down."""
        groups = [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []
        postmaster = self.postmaster_pid()
        if postmaster is not None:
            # Patroni starts it in a session of its own, led by a launcher that has exited
            with contextlib.suppress(ProcessLookupError):
                groups.append(os.getpgid(postmaster))
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)  # the kernel's reaping, polled on a deadline

    def api(self, path: str) -> Any:
        """GET one of the node's REST API resources, as JSON."""
        url = f"http://127.0.0.1:{self.api_port}{path}"
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.loads(reply.read())


@dataclass
class PatroniCluster:
    """etcd and the Patroni nodes, under ``root``; every node's superuser and replication
    user have ``password``."""

    root: Path
    password: str
    etcd_port: int
    nodes: list[Node] = field(default_factory=list)
    etcd: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """Every node, the writable one chosen at each connection (as the docs write it)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return (
            f"postgresql://postgres:{self.password}@{hosts}/postgres"
            "?target_session_attrs=read-write"
        )

    def node_dsn(self, node: Node) -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{node.port}/postgres"

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (``GET /cluster``) from the first node answering."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    members: list[dict[str, Any]] = n.api("/cluster")["members"]
                    return members
        return []

    def leader(self) -> str | None:
        leaders = [m["name"] for m in self.members() if m["role"] == "leader"]
        return leaders[0] if len(leaders) == 1 else None

    def wait_healthy(self, alive: int, limit_s: float = 120) -> str:
        """Wait until one leader runs and ``alive - 1`` replicas stream from it, one of
        them its synchronous standby; returns the leader's name."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            members = self.members()
            running = [m for m in members if m["state"] in ("running", "streaming")]
            roles = sorted(m["role"] for m in running)
            timelines = {m.get("timeline") for m in running}
            if (
                len(running) == alive
                and roles.count("leader") == 1
                and "sync_standby" in roles
                and len(timelines) == 1
                and all(m.get("lag", 0) == 0 for m in running if m["role"] != "leader")
            ):
                return str(next(m["name"] for m in running if m["role"] == "leader"))
            self.check_etcd()
            time.sleep(0.2)  # another process's state, polled on a deadline
        raise RuntimeError(f"the cluster did not become healthy: {self.members()}")

    def switchover(self, leader: str, candidate: str) -> None:
        """`patronictl switchover`, as an operator runs it."""
        done = subprocess.run(
            [
                programs()["patronictl"],
                "-c",
                str(self.nodes[0].config_path),
                "switchover",
                "--leader",
                leader,
                "--candidate",
                candidate,
                "--force",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"patronictl switchover: {done.stdout}{done.stderr}")

    def logs(self) -> str:
        """The tail of every node's log, for a failure's message."""
        return "\n".join(
            f"--- {n.name}\n" + n.log_path.read_text(errors="replace")[-3000:]
            for n in self.nodes
            if n.log_path.exists()
        )

    def check_etcd(self) -> None:
        if self.etcd is not None and self.etcd.poll() is not None:
            raise RuntimeError("etcd exited: " + (self.root / "etcd.log").read_text()[-2000:])


def node_config(
    base: dict[str, Any], cluster: PatroniCluster, node: Node, pg_bin: str
) -> dict[str, Any]:
    """The page's configuration, moved onto this machine for ``node``."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    config["name"] = node.name
    address = f"127.0.0.1:{node.api_port}"
    config["restapi"] = {**config["restapi"], "listen": address, "connect_address": address}
    config["etcd3"] = {**config["etcd3"], "hosts": [f"127.0.0.1:{cluster.etcd_port}"]}
    pg = config["postgresql"]
    pg["listen"] = pg["connect_address"] = f"127.0.0.1:{node.port}"
    pg["data_dir"] = str(node.data)
    pg["bin_dir"] = pg_bin
    # Every address the page allows is this machine's loopback here.
    pg["pg_hba"] = [re.sub(r"\d+\.\d+\.\d+\.\d+/\d+", "127.0.0.1/32", r) for r in pg["pg_hba"]]
    for role in pg["authentication"].values():
        role["password"] = cluster.password
    pg["parameters"] = {
        **pg.get("parameters", {}),
        # the machine's own server has /var/run/postgresql: these nodes keep off it
        "unix_socket_directories": str(cluster.root),
        "shared_buffers": "32MB",
    }
    config["log"] = {"level": "INFO"}
    return config


@contextlib.contextmanager
def patroni_cluster() -> Iterator[PatroniCluster]:
    """etcd and three Patroni nodes, healthy (a leader and two streaming replicas, one of
    them synchronous); all killed and removed at the end."""
    found = programs()
    base = documented_config()
    pg_bin = bindir()
    root = Path(tempfile.mkdtemp(prefix="pgq-patroni-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = PatroniCluster(root, secrets.token_hex(12), free_port())
    try:
        peer = f"http://127.0.0.1:{free_port()}"
        client = f"http://127.0.0.1:{cluster.etcd_port}"
        cluster.etcd = spawn(
            [
                found["etcd"],
                "--name=etcd1",
                f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=etcd1={peer}",
            ],
            root / "etcd.log",
            root,
        )
        _wait_etcd(cluster)
        for name in NODES:
            node = Node(
                name,
                free_port(),
                free_port(),
                root / name,
                root / f"{name}.yml",
                root / f"{name}.log",
            )
            cluster.nodes.append(node)
            # JSON is YAML: Patroni reads it as it is
            node.config_path.write_text(json.dumps(node_config(base, cluster, node, pg_bin)))
            if os.geteuid() == 0:
                shutil.chown(node.config_path, "postgres", "postgres")
        for i, node in enumerate(cluster.nodes):
            node.proc = spawn([found["patroni"], str(node.config_path)], node.log_path, root)
            if i == 0:  # the first one bootstraps: the others then join as replicas
                _wait_leader(cluster)
        cluster.wait_healthy(alive=len(NODES))
        yield cluster
    finally:
        for node in cluster.nodes:
            node.kill9()
        if cluster.etcd is not None:
            cluster.etcd.kill()
            cluster.etcd.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _wait_etcd(cluster: PatroniCluster) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            url = f"http://127.0.0.1:{cluster.etcd_port}/health"
            with urllib.request.urlopen(url, timeout=2) as reply:
                if json.loads(reply.read()).get("health") == "true":
                    return
        cluster.check_etcd()
        time.sleep(0.1)  # another process's state, polled on a deadline
    raise RuntimeError("etcd did not answer within 30 s")


def _wait_leader(cluster: PatroniCluster) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if cluster.leader() is not None:
            return
        time.sleep(0.2)  # another process's state, polled on a deadline
    raise RuntimeError("the first node did not bootstrap:\n" + cluster.logs())


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` runs (a zombie waiting to be reaped does not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def spawn(command: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """``command`` in a process group of its own, as ``postgres`` when run as root."""
    user = "postgres" if os.geteuid() == 0 else None
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "HOME": str(cwd)},
            start_new_session=True,
            user=user,
            group=user,
        )
