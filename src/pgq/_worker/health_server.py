"""A tiny HTTP server for probes and scrapes: ``GET /healthz`` -> 200 or 503 with JSON, and
``GET /metrics`` -> the worker's Prometheus metrics (when it has them). It answers only a
``Host`` that is an IP address or ``localhost`` (400 otherwise): a name that another site
rebinds to this machine never reads it."""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from pgq._metrics import CONTENT_TYPE as METRICS_TYPE
from pgq.errors import ConfigError

log = logging.getLogger("pgq.health")

Check = Callable[[], tuple[bool, dict[str, Any]]]
Metrics = Callable[[], Awaitable[bytes]]

_REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    500: "Internal Server Error", 503: "Service Unavailable",
}  # fmt: skip
_JSON = "application/json"
_BY_ADDRESS = (
    "answered only by IP address or localhost, not by name (against DNS rebinding): ask "
    "http://ADDRESS:PORT/healthz, as a kubelet or a Prometheus target by address does"
)
_NO_METRICS = (
    "no metrics: install the metrics extra (pip install 'pgq-async[metrics]') and leave metrics on"
)


async def serve(
    check: Check,
    *,
    host: str = "127.0.0.1",
    port: int,
    metrics: Metrics | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/healthz`` (and ``/metrics``) on ``host:port`` (loopback unless told
    otherwise) until cancelled. ``task_status`` receives the bound port (for ``port=0``)."""
    try:
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:  # a name that does not resolve, an address not ours, a port taken
        raise ConfigError(
            f"cannot serve the health endpoint on {host}:{port}: {exc.strerror or exc}; "
            "--health-host (health_host=) takes an address of this machine (127.0.0.1, or "
            "0.0.0.0 or :: for every interface) or a name that resolves to one, and "
            "--health-port (health_port=) a free port (0 takes any)"
        ) from exc
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    log.info(
        "health endpoint on http://%s:%d/healthz%s",
        host, bound, " (and /metrics)" if metrics else "",
    )  # fmt: skip
    task_status.started(bound)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    request = await _read_head(stream)
                    status, content_type, payload = await _respond(request, check, metrics)
                    head = (
                        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                        f"Content-Type: {content_type}\r\n"
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
    return data.decode("latin-1")


def _host_ok(head: str) -> bool:
    """Whether the request's ``Host`` (when it sent one: HTTP/1.0 need not) is an IP address
    or ``localhost``, with any port."""
    for line in head.split("\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "host":
            host = value.strip().lower()
            if host.startswith("["):
                host = host[1 : host.find("]")] if "]" in host else host
            elif host.count(":") == 1:
                host = host.partition(":")[0]
            if host == "localhost":
                return True
            try:
                ipaddress.ip_address(host)
            except ValueError:
                return False
    return True


async def _respond(head: str, check: Check, metrics: Metrics | None) -> tuple[int, str, bytes]:
    parts = head.split("\n", 1)[0].split()
    if len(parts) < 2:
        return _json(404, {"error": "bad request"})
    if not _host_ok(head):
        return _json(400, {"error": _BY_ADDRESS})
    method, path = parts[0], parts[1].split("?", 1)[0]
    if path not in ("/healthz", "/health", "/livez", "/metrics"):
        return _json(404, {"error": f"no such path {path}; try /healthz or /metrics"})
    if method not in ("GET", "HEAD"):
        return _json(405, {"error": "use GET"})
    if path == "/metrics":
        if metrics is None:
            return _json(404, {"error": _NO_METRICS})
        try:
            return 200, METRICS_TYPE, await metrics()
        except Exception as exc:  # a scrape must never take the worker down
            log.warning("metrics scrape failed: %s", exc)
            return _json(500, {"error": f"metrics failed: {exc}"})
    ok, body = check()
    return _json(200 if ok else 503, body)


def _json(status: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, _JSON, json.dumps(body).encode()
