"""OpenTelemetry: a span on enqueue and one per attempt, linked through the job, checked with
the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import pgq
from tests.integration._core.test_joblog import worker_idle
from tests.integration._worker.test_liveness import FAST

pytestmark = pytest.mark.anyio

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans ended during the test (one global provider per process, as in an app)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def traced_app() -> pgq.App:
    app = pgq.App()
    tracer = trace.get_tracer("the-app")

    @app.task(queue="billing", max_attempts=1)
    async def invoice(ctx: pgq.JobContext, customer: int) -> None:
        with tracer.start_as_current_span("render pdf"):
            if customer < 0:
                raise ValueError("no such customer")

    return app


def by_name(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


async def test_an_attempt_continues_the_trace_of_its_enqueue(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("the-app")
    async with pgq.Client(dsn, tracing=True) as client:
        with tracer.start_as_current_span("POST /orders") as request:
            job = await client.enqueue("invoice", {"customer": 7}, queue="billing")
    async with pgq.Worker(traced_app(), dsn, tracing=True, **FAST) as worker:
        await worker_idle(worker, 1)
    (send,) = by_name(spans, "send billing")
    (process,) = by_name(spans, "process billing")
    (inner,) = by_name(spans, "render pdf")
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    # One trace: the request, its enqueue, the attempt, and the task's own span.
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in (send, process, inner)} == {trace_id}
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert inner.parent is not None and inner.parent.span_id == process.context.span_id
    assert send.attributes is not None and process.attributes is not None
    assert send.attributes["messaging.system"] == "pgq"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.destination.name"] == "billing"
    assert send.attributes["messaging.message.id"] == str(job.id)
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.message.id"] == str(job.id)
    assert process.attributes["pgq.task"] == "invoice"
    assert process.attributes["pgq.attempt"] == 1
    assert process.attributes["pgq.worker"] == worker.name
    assert process.status.status_code is StatusCode.UNSET


async def test_a_failed_attempt_is_an_error_span_with_the_exception(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    async with pgq.Client(dsn, tracing=True) as client:
        await client.enqueue("invoice", {"customer": -1}, queue="billing")
    async with pgq.Worker(traced_app(), dsn, tracing=True, **FAST) as worker:
        await worker_idle(worker, 1)
    (process,) = by_name(spans, "process billing")
    assert process.status.status_code is StatusCode.ERROR
    assert process.status.description == "ValueError: no such customer"
    (event,) = [e for e in process.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"


async def test_a_batch_is_one_send_span_that_every_attempt_continues(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    async with pgq.Client(dsn, tracing=True) as client:
        await client.enqueue_many(
            [pgq.JobSpec("invoice", {"customer": i}, queue="billing") for i in range(3)]
        )
    async with pgq.Worker(traced_app(), dsn, tracing=True, **FAST) as worker:
        await worker_idle(worker, 3)
    (send,) = by_name(spans, "send billing")
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 3
    processes = by_name(spans, "process billing")
    assert len(processes) == 3
    assert all(p.parent is not None and p.parent.span_id == send.context.span_id for p in processes)


async def test_without_tracing_no_span_and_no_context_in_the_job(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    async with pgq.Client(dsn) as client:
        job = await client.enqueue("invoice", {"customer": 1}, queue="billing")
        async with pgq.Worker(traced_app(), dsn, **FAST) as worker:
            await worker_idle(worker, 1)
        stored = await client.get_job(job.id)
    assert stored is not None and "pgq_trace" not in stored.metadata
    assert by_name(spans, "send billing") == [] and by_name(spans, "process billing") == []


def test_the_cli_leaves_a_configured_provider_alone(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pgq worker --tracing` under opentelemetry-instrument (or an app that set its own
    provider) sets up nothing of its own."""
    from pgq._core.tracing import configure_from_env

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    before = trace.get_tracer_provider()
    assert configure_from_env() is None
    assert trace.get_tracer_provider() is before
