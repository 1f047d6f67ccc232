"""The supervisor's ``/healthz`` and ``/metrics``: each child serves its own on a free
loopback port, which the supervisor polls every POLL_S; the fleet is healthy only while
every child is running, answering and healthy by its own verdict. ``/metrics`` gathers the
children's metrics at scrape time, each series labelled with its ``worker``."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

#: Seconds between polls of each child's /healthz, and how long one poll may take.
POLL_S, POLL_TIMEOUT_S = 1.0, 2.0
#: Seconds without an answer after which a running child counts as unhealthy (a stopped,
#: hung or swamped process).
SILENT_AFTER_S = 5.0
#: Seconds a scrape waits for each child's metrics.
SCRAPE_TIMEOUT_S = 5.0


class Child(Protocol):
    """What the health port reads of a supervised child (the supervisor's record)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def running(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def health_port(self) -> int | None: ...
    @property
    def spawned_at(self) -> float: ...
    @property
    def restarts(self) -> int: ...
    @property
    def last_status(self) -> int | None: ...


class FleetHealth:
    """What the supervisor's health port says about its children."""

    def __init__(self, children: Sequence[Child], startup_grace_s: float) -> None:
        self._children = children
        self._grace_s = startup_grace_s
        #: Per child index: (when it last answered, its verdict, its body).
        self._answers: dict[int, tuple[float, bool, dict[str, Any]]] = {}

    async def poll(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Ask every started child for its health, every POLL_S, until cancelled."""
        task_status.started()
        while True:
            async with anyio.create_task_group() as tg:
                for c in self._children:
                    if c.running and c.started and c.health_port is not None:
                        tg.start_soon(self._ask, c.index, c.health_port)
            await anyio.sleep(POLL_S)

    async def _ask(self, index: int, port: int) -> None:
        with anyio.move_on_after(POLL_TIMEOUT_S):
            try:
                status, body = await get(port, "/healthz")
                verdict = json.loads(body)
            except (OSError, ValueError, anyio.EndOfStream):
                return
            if not isinstance(verdict, dict):  # not a worker's answer: as if it had none
                return
            self._answers[index] = (time.monotonic(), status == 200, verdict)

    def check(self) -> tuple[bool, dict[str, Any]]:
        """The fleet's verdict for ``/healthz``: 503 naming each child that is down,
        silent or unhealthy."""
        workers = [self._verdict(c) for c in self._children]
        sick = [w for w in workers if not w["ok"]]
        body: dict[str, Any] = {"status": "unhealthy" if sick else "ok", "workers": workers}
        if sick:
            body["reason"] = "; ".join(f"{w['name']}: {w['reason']}" for w in sick)
        return not sick, body

    def _verdict(self, c: Child) -> dict[str, Any]:
        now = time.monotonic()
        base: dict[str, Any] = {"name": c.name, "restarts": c.restarts}
        if not c.running:
            why = "not started yet" if c.last_status is None else describe(c.last_status)
            return {**base, "ok": False, "status": "down", "reason": f"down ({why})"}
        base["pid"] = c.pid
        if not c.started:
            waited = now - c.spawned_at
            if waited <= self._grace_s:
                return {**base, "ok": True, "status": "starting"}
            return {**base, "ok": False, "status": "starting",
                    "reason": f"not started after {waited:.0f}s"}  # fmt: skip
        answered_at, ok, verdict = self._answers.get(c.index, (c.spawned_at, True, {}))
        if answered_at < c.spawned_at:  # an answer of the child's previous run
            answered_at, ok, verdict = c.spawned_at, True, {}
        silent_s = now - answered_at
        if silent_s > SILENT_AFTER_S:
            return {**base, "ok": False, "status": "silent",
                    "reason": f"its health endpoint has not answered for {silent_s:.0f}s"}  # fmt: skip
        result = {**base, "ok": ok, "status": verdict.get("status", "ok" if ok else "unhealthy")}
        if not ok:
            result["reason"] = verdict.get("reason", "unhealthy")
        return result

    async def metrics(self) -> bytes:
        """Every running child's metrics, labelled with its worker name, as one scrape;
        ``pgq_worker_up`` says which children answered."""
        bodies: list[tuple[str, str | None]] = []

        async def scrape(c: Child, port: int) -> None:
            text = None
            with anyio.move_on_after(SCRAPE_TIMEOUT_S):
                try:
                    status, body = await get(port, "/metrics")
                    text = body.decode() if status == 200 else None
                except (OSError, ValueError, anyio.EndOfStream):  # ValueError: not HTTP, not text
                    text = None
            bodies.append((c.name, text))

        async with anyio.create_task_group() as tg:
            for c in self._children:
                if c.running and c.started and c.health_port is not None:
                    tg.start_soon(scrape, c, c.health_port)
                else:
                    bodies.append((c.name, None))
        bodies.sort(key=lambda pair: pair[0])
        return merge_metrics(bodies).encode()


def describe(status: int) -> str:
    """A child's exit status as a person reads it (128 + N: killed by signal N)."""
    if status > 128 and status - 128 in signal.valid_signals():
        return f"killed by {signal.Signals(status - 128).name}"
    return f"exit status {status}"


async def get(port: int, path: str) -> tuple[int, bytes]:
    """``GET path`` from a child's health server on loopback: its status and body."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        try:
            while True:
                data += await stream.receive()
        except anyio.EndOfStream:
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if not status or not status[0].isdigit():  # whatever answers there, it is not HTTP
        raise ValueError(f"not an HTTP response from port {port}: {head[:40]!r}")
    return int(status[0]), body


def merge_metrics(bodies: Sequence[tuple[str, str | None]]) -> str:
    """The Prometheus text of several workers as one exposition: each family's HELP and
    TYPE once, its samples from every worker together, each with a ``worker`` label."""
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for worker, text in bodies:
        family = ""
        for line in (text or "").splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split(" ", 3)[2]
                known = heads.setdefault(family, [])
                if line not in known:
                    known.append(line)
            elif line.strip() and not line.startswith("#"):
                samples.setdefault(family, []).append(_labelled(line, worker))
    up = [f'pgq_worker_up{{worker="{_escape(w)}"}} {0 if t is None else 1}' for w, t in bodies]
    lines = [
        "# HELP pgq_worker_up 1 while the supervisor could read this worker's metrics",
        "# TYPE pgq_worker_up gauge",
        *up,
    ]
    for family, head in heads.items():
        lines += head + samples.get(family, [])
    return "\n".join(lines) + "\n"


def _labelled(sample: str, worker: str) -> str:
    label = f'worker="{_escape(worker)}"'
    brace, space = sample.find("{"), sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = sample[brace + 1 :]
        return f"{sample[: brace + 1]}{label}{'' if rest.startswith('}') else ','}{rest}"
    return f"{sample[:space]}{{{label}}}{sample[space:]}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
