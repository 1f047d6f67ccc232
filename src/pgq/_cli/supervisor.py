"""``pgq worker --processes N``: one supervisor, N worker processes.

Each child is ``python -m pgq`` with the supervisor's own arguments, so the App's import
path and every setting (flags and ``PGQ_*`` variables alike) are the same by construction;
an environment variable (:data:`ENV`) tells it its number and hands it its
end of a socket pair, the link. A child says over the link when it has started; the
supervisor asks it to stop over the link, so a child that a service manager also signalled
directly counts one stop, not two; when the supervisor goes away, the link closes and the
child stops gracefully. Each child runs in a session of its own (see _run_child). Below
the supervisor: the child's end of the link, and the fleet's /healthz and /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc

from pgq._core import metrics as _metrics
from pgq._worker import health as health_server
from pgq._worker.worker import Worker
from pgq.errors import ConfigError
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.supervisor")

#: Seconds a stopping child gets beyond ``shutdown_timeout`` to write its outcomes, hand
#: back what it holds and delete its rows, before it is killed.
STOP_MARGIN = 10.0
#: Restart delays: doubled after each crash in a row, from FIRST_DELAY up to MAX_DELAY; a
#: child that ran RESET_AFTER seconds or more starts the count again.
FIRST_DELAY, MAX_DELAY, RESET_AFTER = 0.5, 30.0, 60.0
#: Restarts in a row that failed before the worker started, after which the supervisor
#: gives up (and on its first start, any such failure: a wrong App, a bad setting).
MAX_START_FAILURES = 8
#: How a child the stop reached before it started may end: killed by SIGTERM or SIGINT, or
#: interrupted (130) while it imported the App.
_STOPPED_EARLY = (-signal.SIGTERM, -signal.SIGINT, 130)
#: Seconds to read what an exited child wrote last, should a process it started itself
#: hold its end of the link open.
LAST_WORDS_S = 1.0
#: Children per CPU past which ``--processes`` is refused without ``--no-process-limit``:
#: each is a Python process with its own pool, and thousands would swamp the host.
MAX_PER_CPU = 4
#: Seconds a child starting up holds its start-up slot at most (a child slow to connect
#: then lets the next one start): at most one child per CPU starts at a time.
STARTING_S = 10.0


@dataclass
class Child:
    """One worker process under the supervisor, as the supervisor knows it."""

    index: int
    name: str
    process: anyio.abc.Process | None = None
    spawned_at: float = 0.0
    started: bool = False
    health_port: int | None = None
    error: str | None = None
    last_status: int | None = None
    restarts: int = 0

    link: socket.socket | None = None
    #: Set once the child of this run reported its start.
    up: anyio.Event = field(default_factory=anyio.Event, repr=False)

    def stop(self, *, now: bool) -> None:
        """Ask the child to stop: over the link once it has started (a signal it also got
        from a service manager then counts once), else with SIGTERM (nothing runs yet)."""
        if not self.running:
            return
        assert self.process is not None
        if self.started and self.link is not None:
            with contextlib.suppress(OSError):
                self.link.send(STOP_NOW if now else STOP)
                return
        self.process.send_signal(signal.SIGTERM)

    @property
    def pid(self) -> int | None:
        """Its process id (None before its first start)."""
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        """Whether its process is alive now."""
        return self.process is not None and self.process.returncode is None


def add_process_arguments(p: argparse.ArgumentParser) -> None:
    """``pgq worker``'s flags for the supervisor: ``--processes`` and its override."""
    p.add_argument(
        "--processes",
        type=process_count,
        metavar="N|auto",
        default=os.environ.get("PGQ_PROCESSES") or "1",  # a string: checked by the type
        help="run N worker processes under one supervisor (auto: one per CPU this process "
        "may use), each with this App and these settings, named NAME-1..N under --name "
        f"NAME; at most {MAX_PER_CPU} per CPU unless --no-process-limit; a crashed one is "
        "restarted; the supervisor owns --health-port. A flag only (not a pgq.Worker "
        "keyword): an embedded worker is one process. Default 1: this process is the "
        "worker; env PGQ_PROCESSES",
    )
    p.add_argument(
        "--no-process-limit",
        action="store_true",
        help=f"allow --processes beyond {MAX_PER_CPU} per CPU this process may use (refused "
        "without it: a typo would swamp the host)",
    )


def process_count(text: str) -> int:
    """``--processes``: a whole number >= 1, or ``auto``: the CPUs this process may run on
    (its affinity mask, as ``os.process_cpu_count()`` counts them)."""
    if text.strip().lower() == "auto":
        return usable_cpus()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of processes >= 1, or auto, got {text!r}"
        )
    return value


def check_count(count: int, *, no_limit: bool) -> None:
    """Refuse ``count`` children past :data:`MAX_PER_CPU` per usable CPU, unless the
    operator said ``--no-process-limit``: a typo (100000 for 10) would fork until the
    host, or the database's connections, gave out."""
    cpus = usable_cpus()
    limit = MAX_PER_CPU * cpus
    if count > limit and not no_limit:
        raise ConfigError(
            f"--processes {count} (or PGQ_PROCESSES) is more than {MAX_PER_CPU} per CPU this "
            f"process may use ({cpus} CPU{'' if cpus == 1 else 's'}: at most {limit}); give "
            f"--processes auto (one per CPU) or at most {limit}, or add --no-process-limit "
            f"to start {count} anyway"
        )


def usable_cpus() -> int:
    """How many CPUs this process may use: its affinity where the platform has one."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13
    if counter is not None:
        return int(counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def run(args: argparse.Namespace, argv: Sequence[str], overrides: dict[str, Any]) -> int:
    """Supervise ``args.processes`` workers until a signal (or, with --burst, until all of
    them exited); the exit status is the first non-zero one among the children's."""
    check_count(args.processes, no_limit=args.no_process_limit)
    settings = WorkerSettings.resolve(overrides)  # a bad setting: one error, no children
    supervisor = Supervisor(
        argv,
        args.processes,
        settings,
        base_name=args.name or os.environ.get("PGQ_WORKER_NAME"),
        burst=args.burst,
        health=(args.health_host, args.health_port) if args.health_port is not None else None,
    )
    return anyio.run(supervisor.run)


class RestartPolicy:
    """When one child is started again: after a delay that doubles with each crash in a
    row (from FIRST_DELAY to MAX_DELAY, the count reset by a run of RESET_AFTER), and never
    when it could not start on its first run, or MAX_START_FAILURES times in a row."""

    def __init__(self) -> None:
        self.crashes = 0
        self.start_failures = 0
        self._ever_started = False

    def after_exit(self, *, started: bool, ran_s: float) -> float | None:
        """The delay before the next start, or None: give up."""
        if started:
            self._ever_started = True
            self.start_failures = 0
        else:
            self.start_failures += 1
            if not self._ever_started or self.start_failures >= MAX_START_FAILURES:
                return None
        self.crashes = 1 if ran_s >= RESET_AFTER else self.crashes + 1
        return float(min(FIRST_DELAY * 2 ** (self.crashes - 1), MAX_DELAY))


class Supervisor:
    """Starts the children, restarts those that crash, forwards the stop, owns /healthz."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        settings: WorkerSettings,
        *,
        base_name: str | None,
        burst: bool,
        health: tuple[str, int] | None,
    ) -> None:
        self._argv = [sys.executable, "-m", "pgq", *argv]
        self._settings = settings
        self._burst = burst
        self._health = health
        self._base_name = base_name
        self.children = [Child(i, _name(base_name, i, None)) for i in range(1, count + 1)]
        self._stopping = anyio.Event()
        self._failure: str | None = None
        self._fleet = FleetHealth(self.children, settings.stale_after)
        self._tg: anyio.abc.TaskGroup | None = None
        #: One start-up at a time per CPU: a child's start (Python, the App's import, its
        #: connections) takes most of a CPU for a while, and a burst of them swamps a host.
        self._slots = anyio.Semaphore(usable_cpus())

    async def run(self) -> int:
        """Run until every child has exited for good; returns the combined exit status."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self._signals)  # before any child: a stop is heard from the start
            if self._health is not None:
                host, port = self._health
                await tg.start(self._fleet.poll)
                await tg.start(
                    lambda task_status: health_server.serve(
                        self._fleet.check,
                        host=host,
                        port=port,
                        metrics=self._fleet.metrics if self._serves_metrics() else None,
                        task_status=task_status,
                    )
                )
            names = [c.name for c in self.children]
            log.info(
                "supervising %d worker processes: %s",
                len(names),
                ", ".join(names if len(names) <= 10 else [*names[:9], "…", names[-1]]),
            )
            async with anyio.create_task_group() as children:
                for c in self.children:
                    children.start_soon(self._keep, c)
            tg.cancel_scope.cancel()
        if self._failure is not None:
            print(f"pgq: error: {self._failure}", file=sys.stderr)
            return 1
        return next((s for c in self.children if (s := c.last_status or 0)), 0)

    def _serves_metrics(self) -> bool:
        """Whether the children serve /metrics (the extra installed, metrics on)."""
        return self._settings.metrics and _metrics.available()

    def stop(self, *, now: bool = False) -> None:
        """Stop every child gracefully, killing those still running past their
        ``shutdown_timeout`` and a margin (``now``: as a second signal stops a worker)."""
        for c in self.children:
            c.stop(now=now)
        self._stopping.set()
        seconds = STOP_MARGIN if now else self._settings.shutdown_timeout + STOP_MARGIN
        if self._tg is not None and math.isfinite(seconds):
            self._tg.start_soon(self._kill_after, seconds)

    async def _keep(self, c: Child) -> None:
        """Run one child, restarting it after a crash, until the stop (or its burst ends)."""
        policy = RestartPolicy()
        while not self._stopping.is_set():
            status = await self._run_child(c)
            if status is None:  # the stop came before its turn to start
                return
            ran_s = time.monotonic() - c.spawned_at  # its wait for a start-up slot aside
            if self._stopping.is_set() or (self._burst and status == 0):
                return
            delay = policy.after_exit(started=c.started, ran_s=ran_s)
            if delay is None:
                self._fail(c, status, policy.start_failures)
                return
            log.error(
                "worker %s exited (%s) after %.1fs; restarting it in %.1fs",
                c.name, describe(status), ran_s, delay,
            )  # fmt: skip
            with anyio.move_on_after(delay):
                await self._stopping.wait()
            if self._stopping.is_set():
                return
            c.restarts += 1

    async def _run_child(self, c: Child) -> int | None:
        """Start the child once a start-up slot is free, and wait for its exit; its status,
        128 + N for signal N (None: the stop came first, and it was not started)."""
        if not await self._take_slot():
            return None
        held = True

        def release() -> None:  # once: at its start, or at its end, whichever comes first
            nonlocal held
            if held:
                held = False
                self._slots.release()

        try:
            ours = await self._spawn(c)
            heard = anyio.Event()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._starting, c, release)
                    tg.start_soon(self._listen, c, ours, heard)
                    assert c.process is not None
                    code = await c.process.wait()
                    # What it said just before it exited ("started", its error) may still
                    # be on the way: read to the end of the link (closed with the process).
                    with anyio.move_on_after(LAST_WORDS_S):
                        await heard.wait()
                    tg.cancel_scope.cancel()
            finally:
                c.link = None
                ours.close()
        finally:
            release()
        if not c.started and self._stopping.is_set() and code in _STOPPED_EARLY:
            code = 0  # stopped by a signal before it could catch it: nothing ran yet
        c.last_status = code if code >= 0 else 128 - code
        return c.last_status

    async def _spawn(self, c: Child) -> socket.socket:
        """Start the child's process; the supervisor's end of its link."""
        ours, theirs = socket.socketpair()
        env = {
            **os.environ,
            ENV: f"{c.index},{theirs.fileno()},{int(self._health is not None)}",
        }
        c.started, c.health_port, c.error, c.up = False, None, None, anyio.Event()
        try:
            c.process = await anyio.open_process(
                self._argv,
                stdin=subprocess.DEVNULL,
                stdout=None,
                stderr=None,
                env=env,
                pass_fds=(theirs.fileno(),),
                # As a worker started on its own: a terminal's signals reach the supervisor,
                # which relays them over the link, and where the kernel groups scheduling by
                # session (autogroup), each child has a session's share of the CPU instead
                # of the N sharing one.
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        c.link = ours
        c.spawned_at = time.monotonic()
        if self._base_name is None:
            c.name = _name(None, c.index, c.process.pid)
        if self._stopping.is_set():  # the stop came while it was being started
            c.stop(now=False)
        return ours

    async def _take_slot(self) -> bool:
        """Wait for a start-up slot; False (and no slot) when the stop comes first."""
        taken = False

        async def take(scope: anyio.CancelScope) -> None:
            nonlocal taken
            await self._slots.acquire()
            taken = True
            scope.cancel()

        async def stop(scope: anyio.CancelScope) -> None:
            await self._stopping.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, tg.cancel_scope)
            tg.start_soon(stop, tg.cancel_scope)
        if taken and self._stopping.is_set():
            self._slots.release()
            return False
        return taken

    @staticmethod
    async def _starting(c: Child, release: Callable[[], None]) -> None:
        """Hold the child's start-up slot until it has started, or STARTING_S has passed
        (its exit releases it too)."""
        with anyio.move_on_after(STARTING_S):
            await c.up.wait()
        release()

    async def _listen(self, c: Child, sock: socket.socket, heard: anyio.Event) -> None:
        """Read the child's messages, its start (and health port) or why it failed, to
        the end of the link; then set ``heard``."""
        try:
            await self._read_link(c, sock)
        finally:
            heard.set()

    async def _read_link(self, c: Child, sock: socket.socket) -> None:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        buffered = b""
        while True:
            try:
                data = await loop.sock_recv(sock, 4096)
            except OSError:
                return
            if not data:
                return
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if message.get("started"):
                    c.started = True
                    c.health_port = message.get("health_port")
                    c.up.set()
                    log.info("worker %s started (pid %s)", c.name, c.pid)
                elif "error" in message:
                    c.error = str(message["error"])

    def _fail(self, c: Child, status: int, attempts: int) -> None:
        """Give up: a child cannot start. Stop the others and exit with its error."""
        why = c.error or "no error reported; its output is above"
        tries = f" ({attempts} starts in a row)" if attempts > 1 else ""
        self._failure = f"worker {c.name} could not start{tries}, {describe(status)}: {why}"
        log.error("%s; stopping the other workers", self._failure)
        self.stop()

    async def _signals(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            seen = 0
            async for signum in signals:
                seen += 1
                name = signal.Signals(signum).name
                if seen == 1:
                    log.info(
                        "%s: stopping %d workers gracefully (send again to stop them at once)",
                        name, len(self.children),
                    )  # fmt: skip
                    self.stop()
                else:
                    log.warning("%s again: stopping the workers now", name)
                    self.stop(now=True)

    async def _kill_after(self, seconds: float) -> None:
        """SIGKILL the children still running ``seconds`` from now."""
        await anyio.sleep(seconds)
        for c in self.children:
            if c.running:
                assert c.process is not None
                log.error("worker %s did not stop within %.0fs: killing it", c.name, seconds)
                c.process.kill()


def _name(base: str | None, index: int, pid: int | None) -> str:
    """A child's name: ``BASE-INDEX``, else the worker's default ``host:pid``."""
    if base:
        return f"{base}-{index}"
    return f"{socket.gethostname()}:{pid}" if pid is not None else f"worker {index}"


# --------------------------------------------------------------------------- the child's end
# The child's end of ``pgq worker --processes N``: a worker started by the supervisor finds
# its place in the environment (:data:`ENV`), tells the supervisor when it has started (and
# where its health endpoint is) or why it could not, and stops gracefully when the
# supervisor goes away (its end of the link closes).

child_log = logging.getLogger("pgq.cli")

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
                    child_log.warning("worker %s: its supervisor has gone; stopping", worker.name)
                    worker.stop()
                    break
                if STOP_NOW in data:
                    child_log.warning(
                        "worker %s: stopping now, as its supervisor asks", worker.name
                    )
                    worker.stop(now=True)
                elif STOP in data:
                    child_log.info(
                        "worker %s: stopping gracefully, as its supervisor asks", worker.name
                    )
                    worker.stop()


def link_from_env() -> Link | None:
    """This process's link to its supervisor, or None when it was not started by one."""
    value = os.environ.pop(ENV, None)  # not handed down to anything this worker starts
    if not value:
        return None
    index, fd, health = (int(part) for part in value.split(","))
    os.set_inheritable(fd, False)  # a process a task starts must not hold the link open
    return Link(index, socket.socket(fileno=fd), bool(health))


# --------------------------------------------------------------------------- the fleet's health
# The supervisor's ``/healthz`` and ``/metrics``: each child serves its own on a free
# loopback port, which the supervisor polls every POLL_S; the fleet is healthy only while
# every child is running, answering and healthy by its own verdict. ``/metrics`` gathers the
# children's metrics at scrape time, each series labelled with its ``worker``.

#: Seconds between polls of each child's /healthz, and how long one poll may take.
POLL_S, POLL_TIMEOUT_S = 1.0, 2.0
#: Seconds without an answer after which a running child counts as unhealthy (a stopped,
#: hung or swamped process).
SILENT_AFTER_S = 5.0
#: Seconds a scrape waits for each child's metrics.
SCRAPE_TIMEOUT_S = 5.0


class ChildView(Protocol):
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

    def __init__(self, children: Sequence[ChildView], startup_grace_s: float) -> None:
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

    def _verdict(self, c: ChildView) -> dict[str, Any]:
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

        async def scrape(c: ChildView, port: int) -> None:
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
