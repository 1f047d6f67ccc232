"""The child's end of ``pgq worker --processes N``: a worker started by the supervisor finds
its place in the environment (:data:`ENV`), tells the supervisor when it has started (and
where its health endpoint is) or why it could not, and stops gracefully when the
supervisor goes away (its end of the link closes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import anyio

from pgq._worker.worker import Worker

log = logging.getLogger("pgq.cli")

#: ``INDEX,FD,HEALTH``: set by the supervisor for each child, private to pgq (the child's
#: number from 1, its end of the link, 1 when the supervisor serves a health port).
ENV = "_PGQ_SUPERVISED"
#: What the supervisor sends down the link: stop gracefully, stop now.
STOP, STOP_NOW = b"s", b"n"


@dataclass(frozen=True)
class Link:
    """A supervised child's place: its number, its end of the link, whether it serves
    health (on a free loopback port the supervisor polls)."""

    index: int
    sock: socket.socket
    health: bool

    def name(self, base: str | None) -> str | None:
        """``BASE-INDEX`` under a base name (``--name`` or ``PGQ_WORKER_NAME``), else None:
        the worker's own default, ``host:pid``."""
        base = base or os.environ.get("PGQ_WORKER_NAME")
        return f"{base}-{self.index}" if base else None

    def report(self, **message: Any) -> None:
        """Send one message to the supervisor (lost, harmlessly, when it has gone)."""
        with contextlib.suppress(OSError):
            self.sock.sendall(json.dumps(message).encode() + b"\n")

    async def serve(self, worker: Worker) -> None:
        """Report the start; stop the worker when the supervisor says so (as one signal
        would: a worker signalled directly too, by a service manager that signals the
        whole group, stops no sooner), and gracefully when the supervisor goes away."""
        self.sock.setblocking(False)
        loop = asyncio.get_running_loop()
        async with anyio.create_task_group() as tg:

            async def report_start() -> None:
                await worker.started.wait()
                message = {"started": True, "health_port": worker.health_port}
                await loop.sock_sendall(self.sock, json.dumps(message).encode() + b"\n")

            tg.start_soon(report_start)
            while True:
                try:
                    data = await loop.sock_recv(self.sock, 64)
                except OSError:
                    data = b""
                if not data:
                    log.warning("worker %s: its supervisor has gone; stopping", worker.name)
                    worker.stop()
                    break
                if STOP_NOW in data:
                    log.warning("worker %s: stopping now, as its supervisor asks", worker.name)
                    worker.stop(now=True)
                elif STOP in data:
                    log.info("worker %s: stopping gracefully, as its supervisor asks", worker.name)
                    worker.stop()


def link_from_env() -> Link | None:
    """This process's link to its supervisor, or None when it was not started by one."""
    value = os.environ.pop(ENV, None)  # not handed down to anything this worker starts
    if not value:
        return None
    index, fd, health = (int(part) for part in value.split(","))
    os.set_inheritable(fd, False)  # a process a task starts must not hold the link open
    return Link(index, socket.socket(fileno=fd), bool(health))
