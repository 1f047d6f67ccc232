"""A TCP proxy between a worker and Postgres that a test controls: pass, stall, or cut."""

from __future__ import annotations

import asyncio
import enum
import logging

import anyio
import anyio.abc

log = logging.getLogger("tests.proxy")


class Mode(enum.Enum):
    PASS = "pass"
    STALL = "stall"  # connections stay open; no byte moves either way
    CUT = "cut"  # every connection is closed, new ones are closed at once


class Proxy:
    """Listens on ``listen_host`` (127.0.0.1 unless told; a free port) and forwards to
    ``target_host:target_port``, or to a Unix socket when ``target_host`` is a socket
    directory (an embedded server's)."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = 0
        self.mode = Mode.PASS
        self._flowing = anyio.Event()
        self._flowing.set()
        self._scopes: set[anyio.CancelScope] = set()
        self.connections = 0
        #: When set, the first connection whose client sends these bytes is cut before
        #: they are forwarded (then it is None again, and :attr:`cut_done` is set).
        self.cut_at: bytes | None = None
        self.cut_done = anyio.Event()
        #: The same, but the connection stalls (as :meth:`stall`) with the bytes held,
        #: and :attr:`stall_done` is set. A pattern split across two reads is missed.
        self.stall_at: bytes | None = None
        self.stall_done = anyio.Event()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host=self.listen_host, local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started(self.port)
        async with listener:
            await listener.serve(self._handle)

    def stall(self) -> None:
        self.mode = Mode.STALL
        self._flowing = anyio.Event()

    def cut(self) -> None:
        self.mode = Mode.CUT
        for scope in list(self._scopes):
            scope.cancel()

    def heal(self) -> None:
        self.mode = Mode.PASS
        self._flowing.set()

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if self.mode is Mode.CUT:
                return
            self.connections += 1
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    await self._flow()
                    async with (
                        await self._connect() as upstream,
                        anyio.create_task_group() as tg,
                    ):
                        tg.start_soon(self._pipe, client, upstream, tg.cancel_scope, True)
                        tg.start_soon(self._pipe, upstream, client, tg.cancel_scope)
                except OSError:
                    pass
                finally:
                    self._scopes.discard(scope)

    async def _connect(self) -> anyio.abc.ByteStream:
        host, port = self.target
        if host.startswith("/"):
            # asyncio's own streams: anyio's raw-socket UNIX stream can set a result on a
            # future that a cancellation already settled (InvalidStateError in a callback).
            reader, writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            return _UnixStream(reader, writer)
        return await anyio.connect_tcp(host, port)

    async def _flow(self) -> None:
        while not self._flowing.is_set():
            await self._flowing.wait()

    async def _pipe(
        self,
        src: anyio.abc.ByteStream,
        dst: anyio.abc.ByteStream,
        scope: anyio.CancelScope,
        from_client: bool = False,
    ) -> None:
        try:
            while True:
                data = await src.receive(65536)
                if from_client and self.stall_at is not None and self.stall_at in data:
                    self.stall_at = None
                    self.stall()
                    self.stall_done.set()
                await self._flow()
                if from_client and self.cut_at is not None and self.cut_at in data:
                    self.cut_at = None
                    self.cut_done.set()
                    return  # the finally closes this connection; the bytes never arrive
                await dst.send(data)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            scope.cancel()


class _UnixStream(anyio.abc.ByteStream):
    """An asyncio stream pair as the byte stream the proxy pipes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self._reader.read(max_bytes)
        except OSError as exc:
            raise anyio.BrokenResourceError from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        try:
            self._writer.write(item)
            await self._writer.drain()
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def send_eof(self) -> None:
        self._writer.write_eof()

    async def aclose(self) -> None:
        self._writer.close()
