"""A tiny HTTP server for probes and scrapes: ``GET /healthz`` -> 200 or 503 with JSON, and
``GET /metrics`` -> the worker's Prometheus metrics (when it has them); ``HEAD`` gets the
same head without the body. It answers only a ``Host`` that is an IP address or
``localhost`` (400 otherwise): a name that another site rebinds to this machine never reads
it. A probe never takes down what it probes: a check that raises is answered 500."""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from pgq._core.metrics import CONTENT_TYPE as METRICS_TYPE
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
_PATHS = ("/healthz", "/health", "/livez", "/metrics")
_ALLOW = "GET, HEAD"
#: A request line (RFC 9112 section 3): a method token, a target, the protocol's version.
_REQUEST_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) HTTP/\d\.\d")


class _Failures:
    """How the answers to one path fail: the first failure in a row logs at ERROR with its
    traceback, the rest at DEBUG until an answer succeeds (a probe every few seconds must
    not fill the log, nor hide that the check broke)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._failing = False

    def failed(self, exc: Exception) -> None:
        level = logging.DEBUG if self._failing else logging.ERROR
        log.log(level, "%s failed, answered 500: %s", self._what, exc, exc_info=exc)
        self._failing = True

    def succeeded(self) -> None:
        if self._failing:
            log.info("%s answers again", self._what)
        self._failing = False


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
    responder = _Responder(check, metrics)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    await stream.send(await responder.answer(await _read_head(stream)))
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


class _Responder:
    """The answers to the requests of one server, and how its checks have been failing."""

    def __init__(self, check: Check, metrics: Metrics | None) -> None:
        self._check = check
        self._metrics = metrics
        self._health = _Failures("health check")
        self._scrape = _Failures("metrics scrape")

    async def answer(self, head: str) -> bytes:
        """The whole response to a request whose head is ``head``: status line, headers
        and (but for ``HEAD``) body."""
        status, content_type, payload, extra = await self._respond(head)
        lines = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(payload)}",
            *extra,
            "Connection: close",
        ]
        body = b"" if head.startswith("HEAD ") else payload  # RFC 9110 9.3.2: the head only
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def _respond(self, head: str) -> tuple[int, str, bytes, list[str]]:
        line = _REQUEST_LINE.fullmatch(head.split("\n", 1)[0].rstrip("\r"))
        if line is None:
            return *_json(400, {"error": "bad request: expected GET /healthz HTTP/1.1"}), []
        if not _host_ok(head):
            return *_json(400, {"error": _BY_ADDRESS}), []
        method, path = line[1], line[2].split("?", 1)[0]
        if path not in _PATHS:
            return *_json(404, {"error": f"no such path {path}; try /healthz or /metrics"}), []
        if method not in ("GET", "HEAD"):
            return *_json(405, {"error": f"use GET or HEAD, not {method}"}), [f"Allow: {_ALLOW}"]
        if path == "/metrics":
            return *await self._scraped(), []
        try:
            ok, body = self._check()
            answer = _json(200 if ok else 503, body)
        except Exception as exc:  # a probe must never take down what it probes
            self._health.failed(exc)
            return *_json(500, {"status": "error", "error": f"health check failed: {exc}"}), []
        self._health.succeeded()
        return *answer, []

    async def _scraped(self) -> tuple[int, str, bytes]:
        if self._metrics is None:
            return _json(404, {"error": _NO_METRICS})
        try:
            payload = await self._metrics()
        except Exception as exc:  # a scrape must never take the worker down
            self._scrape.failed(exc)
            return _json(500, {"error": f"metrics failed: {exc}"})
        self._scrape.succeeded()
        return 200, METRICS_TYPE, payload


def _json(status: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, _JSON, json.dumps(body).encode()
