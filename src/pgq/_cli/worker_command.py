"""`pgq worker MODULE:APP`: load the App, run a worker, stop it on SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from pgq._cli import supervisor
from pgq._core.gc import GC_THRESHOLD, tune_gc
from pgq._core.tracing import configure_from_env
from pgq._worker.worker import Worker
from pgq.app import App
from pgq.errors import ConfigError, PgqError
from pgq.settings import FOREVER, WorkerSettings, optional_setting, setting_help

log = logging.getLogger("pgq.cli")

LOOPBACK = "127.0.0.1"


def load_app(spec: str) -> App:
    """Import ``MODULE:ATTR`` (the current directory is importable) and return the App."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:APP, e.g. myproject.tasks:app, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if not all(part.isidentifier() for part in module_name.split(".")):
        # a path, or a relative name ("../tasks", ".tasks", "tasks.py")
        raise ConfigError(
            f"{module_name!r} is not a module name: give a dotted name as Python imports it "
            "(myproject.tasks), from the directory that holds the package or with it on "
            "PYTHONPATH"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = " (a module name has no .py)" if module_name.endswith(".py") else ""
        raise ConfigError(f"cannot import {module_name!r}: {exc}{hint}") from exc
    except Exception as exc:  # the module itself raised as it was imported
        log.error("importing %s raised:", module_name, exc_info=exc)
        raise ConfigError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc} (traceback above)"
        ) from exc
    if not hasattr(module, attr):
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not a pgq.App (found {type(app).__name__})")
    return app


def parse_queues(values: Sequence[str], default: int | None) -> dict[str, int] | None:
    """``["emails:20", "reports"]`` -> ``{"emails": 20, "reports": default}``."""
    if not values:
        return None
    queues: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition(":")
        if sep:
            if not count.isdigit() or int(count) < 1:
                raise ConfigError(
                    f"--queue {value!r}: the concurrency after ':' must be a whole number >= 1"
                )
            queues[name] = int(count)
        else:
            queues[name] = default or WorkerSettings.from_env("concurrency")
    return queues


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the worker until a signal (or, with --burst, until nothing is left); with
    ``--processes`` above 1, a supervisor of that many worker processes instead."""
    link = supervisor.link_from_env()
    if link is None and args.processes > 1:
        return supervisor.run(args, argv, resolve_settings(args))
    try:
        return _run_worker(args, link)
    except BaseException as exc:
        if link is not None:
            link.report(error=_first_error(exc))
        raise


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The worker settings given as flags (``none``/``forever`` read as None)."""
    return {
        # "none"/"forever" of an optional setting; infinity given to another is refused
        name: None if value == FOREVER and optional_setting(name) else value
        for name in setting_help()
        if (value := getattr(args, name)) is not None
    }


def _run_worker(args: argparse.Namespace, link: supervisor.Link | None) -> int:
    app = load_app(args.app)
    if link is None:
        name, health_port, health_host = args.name, args.health_port, args.health_host
    else:  # its supervisor owns the health port and polls this one, on loopback
        name, health_port, health_host = link.name(args.name), 0 if link.health else None, LOOPBACK
    worker = Worker(
        app,
        args.dsn,
        queues=parse_queues(args.queue, args.concurrency),
        name=name,
        health_port=health_port,
        health_host=health_host,
        **resolve_settings(args),
    )

    backend_options = event_loop_options(args.event_loop)
    if gc_choice(args.gc) == "tuned":
        frozen = tune_gc()
        log.info(
            "garbage collector tuned for a worker: %d start-up objects frozen, first "
            "generation at %d (--gc default keeps Python's)",
            frozen,
            GC_THRESHOLD,
        )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_handle_signals, worker)
            if link is not None:
                tg.start_soon(link.serve, worker)
            await worker.run(burst=args.burst)
            tg.cancel_scope.cancel()

    provider = configure_from_env() if worker.settings.tracing else None
    try:
        anyio.run(main, backend_options=backend_options)
    finally:
        if provider is not None:
            provider.shutdown()  # the spans still batched, exported
    return 0


def _first_error(exc: BaseException) -> str:
    """What stopped a worker, as its supervisor says it: pgq's own message when it has one."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, PgqError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def gc_choice(choice: str) -> str:
    """``--gc`` (or PGQ_GC), checked: ``tuned`` (default, see :func:`pgq.tune_gc`) or
    ``default`` (Python's own settings)."""
    if choice not in ("tuned", "default"):
        raise ConfigError(f"--gc (or PGQ_GC) must be tuned or default, not {choice!r}")
    return choice


def event_loop_options(choice: str) -> dict[str, bool]:
    """anyio's options for the event loop ``choice`` (auto: uvloop when it is installed)."""
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(
            f"--event-loop (or PGQ_EVENT_LOOP) must be auto, uvloop or asyncio, not {choice!r}"
        )
    if choice == "asyncio":
        return {"use_uvloop": False}
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "--event-loop uvloop: uvloop is not installed (pip install 'pgq-async[speed]')"
            ) from None
        return {"use_uvloop": False}
    return {"use_uvloop": True}


async def _handle_signals(worker: Worker) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        seen = 0
        async for signum in signals:
            seen += 1
            if seen == 1:
                log.info(
                    "%s: stopping gracefully (send again to stop at once)",
                    signal.Signals(signum).name,
                )
                worker.stop()
            else:
                log.warning("%s again: stopping now", signal.Signals(signum).name)
                worker.stop(now=True)
