"""The dashboard application: its routes, templates, database pool and error pages."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import anyio
import jinja2
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from pgq._core.dsn import mask_dsn, normalize_dsn
from pgq._db.connections import CONNECTION_ERRORS, Pool, Target, create_pool
from pgq._db.revision import check_schema
from pgq.dashboard import _preview, _security
from pgq.dashboard._actions import Actions
from pgq.dashboard._pages import Pages
from pgq.errors import ConfigError, DatabaseUnavailable, SchemaMismatch
from pgq.job import JobState
from pgq.settings import WorkerSettings

if TYPE_CHECKING:
    from pgq.client import Client

log = logging.getLogger("pgq.dashboard")


class _JobIdConvertor(Convertor[int]):
    """A job id in a path: at most 19 digits (a longer number is no job's, and int() would
    refuse one past 4,300), so /jobs/999...9 is a 404 page, not an error."""

    regex = "[0-9]{1,19}"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(int(value))


register_url_convertor("pgq_job_id", _JobIdConvertor())

HERE = Path(__file__).resolve().parent


class Dashboard:
    """The pgq dashboard, an ASGI application: serve it with ``pgq dashboard`` or any ASGI
    server, or mount it in your own Starlette or FastAPI app
    (``app.mount("/pgq", create_app(dsn))``).

    ``allowed_hosts`` names the ``Host`` headers it answers besides ``localhost`` and the
    loopback addresses (a name, ``*.suffix``, an address; ``"*"``: any); any other gets 400,
    against DNS rebinding. Not given, it answers those alone without ``auth``, and any host
    with it (a rebinding page's requests carry no credentials)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        client: Client | None = None,
        read_only: bool = False,
        auth: str | None = None,
        refresh_s: float = 5.0,
        stale_after_s: float | None = None,
        page_size: int = 50,
        scan_window: int = 100_000,
        count_timeout_s: float = 1.0,
        pooler: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
    ) -> None:
        if client is not None and dsn is not None:
            raise ConfigError("give the dashboard a dsn or a client, not both")
        self._target = Target.resolve(dsn, pooler, connects=client is None)
        self._dsn = self._target.dsn
        if self._dsn is not None:
            self._dsn = normalize_dsn(self._dsn)
        self._client = client
        self.read_only = read_only
        self.auth = _security.Credentials.parse(auth) if auth else None
        self.allowed_hosts = _security.AllowedHosts.default(allowed_hosts, auth=self.auth)
        self.refresh_s = refresh_s
        self.stale_after_s = stale_after_s or float(WorkerSettings.from_env("stale_after"))
        self.page_size = page_size
        self.scan_window = scan_window
        self.count_timeout_s = count_timeout_s
        self._pool: Pool | None = None
        self._lock = anyio.Lock()
        self.templates = _templates()
        self._app = _security.Guard(self._build(), auth=self.auth, hosts=self.allowed_hosts)

    @property
    def database(self) -> str:
        """The database shown in the header, with any password masked."""
        return mask_dsn(self._dsn) if self._client is None else "the application's client"

    def _build(self) -> Starlette:
        # The guard wraps this app whole (see __init__), outside Starlette's handler of
        # unexpected errors: a 500 carries the security headers as every page does.
        pages, actions = Pages(self), Actions(self)
        routes = [
            Route("/", pages.overview, name="overview"),
            Route("/jobs", pages.jobs, name="jobs"),
            Route("/jobs/bulk", pages.bulk_confirm, name="bulk_confirm"),
            Route("/jobs/bulk", actions.bulk, methods=["POST"], name="bulk"),
            Route("/jobs/{job_id:pgq_job_id}", pages.job, name="job"),
            Route("/jobs/{job_id:pgq_job_id}/{part}.json", pages.job_value, name="job_value"),
            Route(
                "/jobs/{job_id:pgq_job_id}/{action}", actions.job, methods=["POST"], name="job_act"
            ),
            Route("/producers", pages.producers, name="producers"),
            Route("/queues", pages.queues, name="queues"),
            Route("/queues/{action}", actions.queue, methods=["POST"], name="queue_act"),
            Route("/metrics", pages.metrics, name="metrics"),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        return Starlette(
            routes=routes,
            exception_handlers={
                HTTPException: self._http_error,
                Exception: self._server_error,
                DatabaseUnavailable: self._unavailable,
                SchemaMismatch: self._unavailable,
                **dict.fromkeys(CONNECTION_ERRORS, self._unavailable),
            },
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.aclose()

    async def pool(self) -> Pool:
        """The pool in use: the client's, or one of the dashboard's own, opened on the first
        request (a mounted app gets no startup event) and checked against the schema."""
        if self._client is not None:
            return self._client.pool
        async with self._lock:
            if self._pool is None:
                pool = await create_pool(
                    self._dsn,
                    min_size=0,
                    max_size=4,
                    **self._target.options("pgq dashboard"),
                )
                try:
                    await check_schema(pool)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
            return self._pool

    async def aclose(self) -> None:
        """Close the dashboard's own pool (a client's is its owner's to close)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    def render(self, request: Request, template: str, context: dict[str, Any],
               status: int = 200) -> Response:  # fmt: skip
        """Render ``template`` with what every page shows, and the CSRF cookie it needs."""
        token = request.cookies.get(_security.CSRF_COOKIE)
        fresh = token is None
        token = token or _security.new_csrf_token()
        base = request.scope.get("root_path", "").rstrip("/")
        values = {
            "now": None, "leader": None, "notice": None, "path": request.url.path,
            "self_url": _self_url(request), "base": base, "csrf_token": token,
            "read_only": self.read_only, "refresh_s": self.refresh_s,
            "database": self.database, "count_timeout_s": self.count_timeout_s,
        }  # fmt: skip
        html = self.templates.get_template(template).render({**values, **context})
        response = HTMLResponse(html, status_code=status)
        if fresh:
            response.set_cookie(
                _security.CSRF_COOKIE, token, path=base or "/", httponly=True, samesite="strict"
            )
        return response

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self.render(
            request, "error.html", {"title": exc.status_code, "message": exc.detail},
            exc.status_code,
        )  # fmt: skip

    async def _server_error(self, request: Request, exc: Exception) -> Response:
        # Starlette logs the exception (re-raised to the server) after this page is sent.
        return self.render(request, "error.html", {
            "title": "internal error", "message": "The dashboard failed on this request (a bug: "
            "its log has the traceback). Go back and try again, or report it.",
        }, 500)  # fmt: skip

    async def _unavailable(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, DatabaseUnavailable | SchemaMismatch):
            message = str(exc)
        else:
            message = f"the database connection failed ({type(exc).__name__}); retrying on the next refresh"
        log.warning("dashboard: %s", message)
        return self.render(
            request, "error.html", {"title": "database unavailable", "message": message}, 503
        )


def create_app(dsn: str | None = None, **options: Any) -> Dashboard:
    """The dashboard as an ASGI app; ``options`` as for :class:`Dashboard`."""
    return Dashboard(dsn, **options)


def _self_url(request: Request) -> str:
    """This page's URL for its live refresh, without the notice of an earlier action."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k not in ("done", "n", "q")]
    return request.url.path + (f"?{urlencode(query)}" if query else "")


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is escaped unless marked safe by our own code
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, secs=_secs, pretty=_pretty, compact=_compact, utc=_utc)
    env.filters.update(clip=_preview.clip)
    env.globals.update(ago=_ago, JobState=JobState, tags=_preview.tags, bounds=_preview)
    return env


def _num(value: int | float | None) -> str:
    return "—" if value is None else f"{value:,}"


def _secs(seconds: float | None) -> str:
    """850 ms, 4.2 s, 3 min 5 s, 2 h 3 min, 3 d 4 h."""
    if seconds is None:
        return "—"
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "—"
    delta = (now - when).total_seconds()
    return f"{_secs(delta)} ago" if delta >= 0 else f"in {_secs(-delta)}"


def _utc(when: datetime | None) -> str:
    return "—" if when is None else when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _compact(value: Any) -> str:
    """A value in a row: the start of its JSON on one line."""
    return _preview.json_preview(value, _preview.CELL_CHARS, pretty=False).text


def _pretty(value: Any) -> _preview.Preview:
    """A value on a job's page: the start of its indented JSON, and its size if clipped."""
    return _preview.json_preview(value, _preview.PREVIEW_CHARS, pretty=True)
