"""Embedding pgq in an ASGI service: the Starlette (or FastAPI) lifespan owns a Client and a
Worker, so the service enqueues jobs and runs them in the same process.

Run it with `PGQ_DSN=postgresql://... uvicorn docs.examples.starlette_service:service`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import pgq

tasks = pgq.App()
sent: list[str] = []  # stands in for an email provider


@tasks.task(queue="emails", max_attempts=5, timeout=30)
async def send_welcome(ctx: pgq.JobContext, to: str) -> str:
    """Send the welcome email (here: remember it was sent)."""
    sent.append(to)
    return f"welcomed {to}"


@contextlib.asynccontextmanager
async def lifespan(service: Starlette) -> AsyncIterator[None]:
    dsn = os.environ["PGQ_DSN"]
    async with (
        pgq.Client(dsn, app=tasks) as client,
        pgq.Worker(tasks, dsn, queues={"emails": 10}, shutdown_timeout=10),
    ):
        service.state.pgq = client
        yield
    # Leaving the block stops the worker gracefully: running jobs finish first.


async def signup(request: Request) -> JSONResponse:
    body = await request.json()
    client: pgq.Client = request.app.state.pgq
    job = await client.enqueue(send_welcome, {"to": body["email"]})
    return JSONResponse({"job_id": job.id}, status_code=202)


async def job_status(request: Request) -> JSONResponse:
    client: pgq.Client = request.app.state.pgq
    job = await client.get_job(int(request.path_params["job_id"]))
    if job is None:
        return JSONResponse({"error": "no such job"}, status_code=404)
    return JSONResponse({"state": job.state.value, "result": job.result})


service = Starlette(
    routes=[
        Route("/signup", signup, methods=["POST"]),
        Route("/jobs/{job_id:int}", job_status),
    ],
    lifespan=lifespan,
)
