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

from pgq._worker.worker import Worker

log = logging.getLogger("pgq.cli")

#: ``INDEX,FD,HEALTH``: set by the supervisor for each child, private to pgq (the child's
#: number from 1, its end of the link, 1 when the supervisor serves a health port).
ENV = "_PGQ_SUPERVISED"


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
        """Report the start, then stop the worker gracefully if the supervisor goes away."""
        await worker.started.wait()
        self.report(started=True, health_port=worker.health_port, name=worker.name)
        self.sock.setblocking(False)
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await loop.sock_recv(self.sock, 256)
            except OSError:
                data = b""
            if not data:
                log.warning("worker %s: its supervisor has gone; stopping", worker.name)
                worker.stop()
                return


def link_from_env() -> Link | None:
    """This process's link to its supervisor, or None when it was not started by one."""
    value = os.environ.pop(ENV, None)  # not handed down to anything this worker starts
    if not value:
        return None
    index, fd, health = (int(part) for part in value.split(","))
    return Link(index, socket.socket(fileno=fd), bool(health))
