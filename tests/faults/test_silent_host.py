"""A multi-host DSN whose first host is gone without a word: a powered-off machine (or a
cut network) answers no SYN, so a connection to it waits rather than fails. A worker must
still reach the primary listed after it within its heartbeat timeout, as libpq does (its
``connect_timeout`` applies to each host in turn).

asyncpg's connect timeout covers the whole host list: handed one budget, the silent host
spends it all and a fleet whose DSN lists a silently dead old primary first never reaches
the new one. pgq tries the hosts one at a time, each with the whole budget.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import anyio
import pytest

from pgq._store.connections import connect
from tests.faults.cluster import Server, lone_server

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(60)]


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that drops every new SYN: its listener's accept queue is full, and
    the kernel then drops SYNs without a reply, as a dead host's network does."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(4):  # fill the accept queue; never accepted
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        probe = stack.enter_context(socket.socket())
        probe.settimeout(0.5)
        silent = False
        try:
            probe.connect(("127.0.0.1", port))
        except TimeoutError:
            silent = True
        except OSError:
            pass
        if not silent:
            pytest.skip("this kernel answers SYNs past a full accept queue: no silent host")
        yield port


@pytest.fixture
def server() -> Iterator[Server]:
    with lone_server() as s:
        yield s


async def test_a_heartbeat_reaches_the_primary_past_a_silent_host(server: Server) -> None:
    with silent_port() as dead:
        dsn = (
            f"postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{server.port}/postgres"
            "?target_session_attrs=read-write"
        )
        with anyio.fail_after(10):
            # the heartbeat's connect, with the default heartbeat_timeout
            conn = await connect(dsn, timeout_s=2.0)
        try:
            assert await conn.fetchval("SELECT inet_server_port()") == server.port
        finally:
            await conn.close()
