"""The health port's HTTP (pgq._worker.health) and the supervisor's view of its
children's (pgq._cli.supervisor): a probe never takes down what it probes."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import pytest

from pgq._cli.supervisor import POLL_S, FleetHealth
from pgq._worker.health import Check, Metrics, serve

pytestmark = pytest.mark.anyio


async def ask(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``request`` as it is; the status line, headers and body of the answer."""
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(request)
        data = b""
        with anyio.fail_after(10):
            while True:
                try:
                    data += await s.receive()
                except anyio.EndOfStream:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return status, headers, body


@asynccontextmanager
async def server(check: Check, metrics: Metrics | None = None) -> AsyncIterator[int]:
    """A health server on a free loopback port while the block runs; an exception out of
    it fails the block."""
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: serve(check, port=0, metrics=metrics, task_status=task_status)
        )
        yield port
        tg.cancel_scope.cancel()


async def test_a_check_that_raises_is_a_500_and_the_server_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = [True, True, False, True]

    def check() -> tuple[bool, dict[str, Any]]:
        if broken.pop(0):
            raise RuntimeError("the check broke")
        return True, {"status": "ok"}

    caplog.set_level(logging.DEBUG, logger="pgq.health")
    async with server(check) as port:
        answers = [await ask(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")]
        answers += [await ask(port, b"GET /healthz HTTP/1.0\r\n\r\n") for _ in range(3)]
    assert [a[0] for a in answers] == [
        "HTTP/1.1 500 Internal Server Error",
        "HTTP/1.1 500 Internal Server Error",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 500 Internal Server Error",
    ]
    assert json.loads(answers[0][2])["error"] == "health check failed: the check broke"
    failures = [r for r in caplog.records if "health check failed" in r.getMessage()]
    # The first failure of a run at ERROR with its traceback, the next at DEBUG; after a
    # success, the first failure again at ERROR.
    assert [r.levelno for r in failures] == [logging.ERROR, logging.DEBUG, logging.ERROR]
    assert failures[0].exc_info is not None and failures[0].exc_text is not None
    assert "RuntimeError: the check broke" in failures[0].exc_text


async def test_head_gets_the_head_of_get_and_no_body() -> None:
    async def metrics() -> bytes:
        return b"pgq_up 1\n"

    async with server(lambda: (False, {"status": "unhealthy"}), metrics) as port:
        for path in ("/healthz", "/metrics"):
            got = await ask(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            head = await ask(port, f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            assert head[0] == got[0] and head[0].split()[1] in ("200", "503"), path
            assert head[1] == got[1], path
            assert int(head[1]["content-length"]) == len(got[2]) > 0, path
            assert head[2] == b"", path


@pytest.mark.parametrize(
    "request_line",
    [b"garbage", b"GET", b"GET /healthz", b"GET /healthz HTTX/1.1", b"G(T /healthz HTTP/1.1",
     b"\x00\x01\x02 / HTTP/1.1", b""],
)  # fmt: skip
async def test_a_malformed_request_line_is_a_400(request_line: bytes) -> None:
    async with server(lambda: (True, {})) as port:
        status, _, body = await ask(port, request_line + b"\r\n\r\n")
    assert status == "HTTP/1.1 400 Bad Request"
    assert "bad request" in json.loads(body)["error"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
async def test_another_method_is_a_405_that_says_what_is_allowed(method: str) -> None:
    async with server(lambda: (True, {})) as port:
        for path in ("/healthz", "/metrics"):
            status, headers, _ = await ask(
                port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
            )
            assert status == "HTTP/1.1 405 Method Not Allowed", path
            assert headers["allow"] == "GET, HEAD", path


@dataclass
class FakeChild:
    """A supervised child as the supervisor's health port reads it."""

    index: int
    name: str
    health_port: int | None
    running: bool = True
    started: bool = True
    pid: int | None = 1
    spawned_at: float = 0.0
    restarts: int = 0
    last_status: int | None = None


async def test_the_supervisor_survives_children_that_answer_anything(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What answers on a child's port may not be a worker (the port reused by another
    # process): nothing it says may stop the supervisor's polls nor break its /healthz.
    answers = [b"not http at all\r\n\r\n", b"HTTP/1.0 200 OK\r\n\r\n[1, 2]", b"HTTP/1.0\r\n\r\n"]

    asked = [0] * len(answers)

    async def answer(i: int, reply: bytes, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        async def handle(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                await stream.receive()
                await stream.send(reply)
            asked[i] += 1

        async with await anyio.create_tcp_listener(
            local_host="127.0.0.1", local_port=0
        ) as listener:
            task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
            await listener.serve(handle)

    caplog.set_level(logging.DEBUG, logger="pgq.health")
    async with anyio.create_task_group() as tg:
        children = []
        for i, reply in enumerate(answers):
            port = await tg.start(functools.partial(answer, i, reply))
            children.append(FakeChild(i, f"w{i + 1}", port, spawned_at=time.monotonic()))
        fleet = FleetHealth(children, startup_grace_s=30)
        await tg.start(fleet.poll)
        # A second round of polls begins once the first has read every answer (or it
        # would have failed this task group).
        with anyio.fail_after(POLL_S * 10):
            while min(asked) < 2:  # noqa: ASYNC110 - the polls come at their own pace
                await anyio.sleep(0.05)
        async with server(fleet.check, fleet.metrics) as port:
            status, _, body = await ask(port, b"GET /healthz HTTP/1.0\r\n\r\n")
            scraped = await ask(port, b"GET /metrics HTTP/1.0\r\n\r\n")
        tg.cancel_scope.cancel()
    assert status == "HTTP/1.1 200 OK", body  # no answer yet counts within SILENT_AFTER_S
    assert [w["status"] for w in json.loads(body)["workers"]] == ["ok"] * 3
    assert scraped[0] == "HTTP/1.1 200 OK"
    assert b'pgq_worker_up{worker="w1"} 0' in scraped[2]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
