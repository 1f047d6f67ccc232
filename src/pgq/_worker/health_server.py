"""A tiny HTTP server for liveness probes: ``GET /healthz`` -> 200 or 503 with JSON."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

log = logging.getLogger("pgq.health")

Check = Callable[[], tuple[bool, dict[str, Any]]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def serve(
    check: Check,
    *,
    host: str = "127.0.0.1",
    port: int,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/healthz`` on ``host:port`` (loopback unless told otherwise) until cancelled.
    ``task_status`` receives the bound port (useful with ``port=0``)."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    log.info("health endpoint on http://%s:%d/healthz", host, bound)
    task_status.started(bound)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    request = await _read_head(stream)
                    status, body = _respond(request, check)
                    payload = json.dumps(body).encode()
                    head = (
                        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                        "Content-Type: application/json\r\n"
                        f"Content-Length: {len(payload)}\r\n"
                        "Connection: close\r\n\r\n"
                    )
                    await stream.send(head.encode() + payload)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return

    async with listener:
        await listener.serve(handle)


async def _read_head(stream: anyio.abc.SocketStream) -> str:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data and len(data) < 8192:
        data += await stream.receive(4096)
    return data.decode("latin-1").split("\n", 1)[0].strip()


def _respond(request_line: str, check: Check) -> tuple[int, dict[str, Any]]:
    parts = request_line.split()
    if len(parts) < 2:
        return 404, {"error": "bad request"}
    method, path = parts[0], parts[1].split("?", 1)[0]
    if path not in ("/healthz", "/health", "/livez"):
        return 404, {"error": f"no such path {path}; try /healthz"}
    if method not in ("GET", "HEAD"):
        return 405, {"error": "use GET"}
    ok, body = check()
    return (200 if ok else 503), body
