"""Worker hosts in network namespaces: each namespace is joined to this machine by a veth
pair on addresses of its own (10.213.0.0/16), and reaches Postgres through forwarders
(tests.faults.proxy) listening on the host side of that pair, since the server listens on
127.0.0.1 only. Cutting a namespace off takes its end of the link down: packets stop, the
connections stay open, as when a host drops off the network.

Needs root and iproute2 (`ip netns`); tests skip with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass
class Namespace:
    """One network namespace: its name, its address and the host's on the link."""

    name: str
    host_ip: str
    ns_ip: str
    link: str

    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Take the namespace's end of the link down: nothing crosses it."""
        _ip("netns", "exec", self.name, "ip", "link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.link, "up")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2 (ip)"
    return None


@contextlib.contextmanager
def namespace(index: int) -> Iterator[Namespace]:
    """Namespace number ``index`` of this process (its addresses derive from both), removed
    with its link at the end."""
    reason = available()
    if reason is not None:
        pytest.skip(reason)
    tag = f"{os.getpid() % 10000}x{index}"
    name, host_link, ns_link = f"pgq{tag}", f"pgh{tag}", f"pgn{tag}"
    # Each pytest-xdist process of one run (gw0, gw1, ...) takes a subnet of its own.
    process = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    subnet = (process % 8 + 8 * (os.getpid() % 31)) % 250 + 1
    host_ip, ns_ip = f"10.213.{subnet}.{4 * index + 1}", f"10.213.{subnet}.{4 * index + 2}"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
        _ip("link", "set", ns_link, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_link)
        _ip("link", "set", host_link, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_link)
        _ip("netns", "exec", name, "ip", "link", "set", ns_link, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield Namespace(name, host_ip, ns_ip, ns_link)
    finally:
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", name)  # takes its end of the pair, and so the pair, with it
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", host_link)
