"""OpenTelemetry tracing (the ``otel`` extra): a span on enqueue and one per attempt, linked
through the job. The enqueue's trace context (W3C ``traceparent``/``tracestate``) is stored
in the job's metadata under ``pgq_trace``; the worker continues that trace, so an attempt's
span is a child of the span that enqueued it, however long the job waited.

Attributes follow OpenTelemetry's messaging semantic conventions (``messaging.system``,
``messaging.operation.type`` ``send``/``process``, ``messaging.destination.name`` for the
queue, ``messaging.message.id`` for the job id), with ``pgq.task``, ``pgq.attempt`` and
``pgq.worker`` beside them. Spans go to the global tracer provider: configure the SDK (and
an exporter) in the application; without one they cost next to nothing and go nowhere.
``pgq worker --tracing`` sets one up from ``OTEL_*`` variables when the SDK is installed
and nothing configured one (:func:`configure_from_env`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from pgq._core import serde
from pgq.errors import ConfigError
from pgq.job import JobContext, Snooze

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from pgq._core.specs import NewJob

#: The metadata key that carries an enqueue's trace context.
METADATA_KEY = "pgq_trace"
SYSTEM = "pgq"

log = logging.getLogger("pgq.worker")


def require() -> None:
    """Raise a clear error when the extra is missing."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise ConfigError("tracing needs the otel extra: pip install 'pgq-async[otel]'") from None


def _tracer() -> Any:
    from importlib.metadata import PackageNotFoundError, version

    from opentelemetry import trace

    try:
        ours = version("pgq-async")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        ours = None
    return trace.get_tracer("pgq", ours)


@contextmanager
def send_span(rows: list[NewJob]) -> Iterator[Span]:
    """A PRODUCER span around an enqueue of ``rows``; stores its context in each row's
    metadata (so the attempts continue the trace)."""
    from opentelemetry import propagate, trace

    queues = sorted({r.queue for r in rows})
    name = f"send {queues[0]}" if len(queues) == 1 else "send"
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if len(queues) == 1:
        attributes["messaging.destination.name"] = queues[0]
    if len(rows) > 1:
        attributes["messaging.batch.message_count"] = len(rows)
    with _tracer().start_as_current_span(
        name, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            for row in rows:
                row.metadata = {**row.metadata, METADATA_KEY: carrier}
                row.metadata_json = serde.dumps(row.metadata, "metadata")
        yield span


def sent(span: Span, job_ids: list[int]) -> None:
    """Name the job an enqueue made (a single one; a batch has no one id)."""
    if len(job_ids) == 1:
        span.set_attribute("messaging.message.id", str(job_ids[0]))


Middleware = Callable[[JobContext, Callable[[], Awaitable[Any]]], Awaitable[Any]]


def attempt_middleware(worker_name: str) -> Middleware:
    """The outermost middleware of a worker with tracing: a CONSUMER span per attempt, a
    child of the enqueue's span when the job carries its context, current while the task
    runs (so the task's own spans nest under it)."""
    require()
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Status, StatusCode

    tracer = _tracer()

    async def trace_attempt(ctx: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        job = ctx.job
        carrier = job.metadata.get(METADATA_KEY)
        parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "pgq.task": job.task,
            "pgq.attempt": job.attempt,
            "pgq.worker": worker_name,
        }
        with tracer.start_as_current_span(
            f"process {job.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                return await call_next()
            except Snooze:
                raise  # not a failure: the job asked to wait
            except BaseException as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise

    return trace_attempt


def configure_from_env() -> Any:
    """For ``pgq worker --tracing``: when no tracer provider is set yet (none from
    ``opentelemetry-instrument`` or the application) and the OpenTelemetry SDK is installed,
    set one up from the ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER``, default ``otlp``;
    ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, and the exporter's own). Returns
    the provider to shut down at exit (which flushes its spans), or None when it set none."""
    require()
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # configured already: leave it
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "--tracing: no OpenTelemetry SDK installed, so spans go nowhere; install "
            "opentelemetry-sdk and an exporter (configured by OTEL_* variables), or run "
            "under opentelemetry-instrument"
        )
        return None
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporters = []
    for name in (n.strip() for n in names.split(",")):
        if name in ("", "none"):
            continue
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={names}: no exporter {name!r} is installed (otlp: "
                "pip install opentelemetry-exporter-otlp; console comes with the SDK)"
            )
        exporters.append(next(iter(found)).load()())
    if not exporters:
        return None
    provider = TracerProvider(resource=Resource.create())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing: spans exported to %s (OTEL_TRACES_EXPORTER)", names)
    return provider
