"""The dashboard's actions (every POST): checked for a CSRF token and the read-only switch,
done through the store, then a redirect back to the page they came from."""

from __future__ import annotations

import logging
from typing import cast
from urllib.parse import urlencode, urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgq._core.names import check_queue_name
from pgq._db import inspect
from pgq._db import queues as store_queues
from pgq.dashboard import _security
from pgq.dashboard._forms import Filters, field_of, read_form
from pgq.dashboard._host import Host
from pgq.errors import ConfigError
from pgq.job import MAX_JOB_ID

log = logging.getLogger("pgq.dashboard")

_JOB_ACTIONS = ("retry", "cancel", "delete")


class Actions:
    """The POST handlers of a dashboard."""

    def __init__(self, dashboard: Host) -> None:
        self._d = dashboard

    async def _form(self, request: Request) -> dict[str, list[str]]:
        """The form, once the request proved it may change something."""
        if self._d.read_only:
            raise HTTPException(403, "This dashboard is read-only (started with --read-only).")
        if not _security.same_origin(request.headers, request.url.scheme):
            raise HTTPException(403, "Refused: the request came from another site.")
        try:
            form = await read_form(request)
        except ValueError:
            raise HTTPException(413, "Refused: the form is too large.") from None
        sent = field_of(form, _security.CSRF_FIELD) or request.headers.get(_security.CSRF_HEADER)
        if not _security.csrf_ok(request.cookies.get(_security.CSRF_COOKIE), sent):
            raise HTTPException(
                403, "Refused: the form's security token is missing or stale. Reload the page "
                "and try again.",
            )  # fmt: skip
        return form

    async def job(self, request: Request) -> Response:
        """Retry, cancel or delete one job."""
        form = await self._form(request)
        action = str(request.path_params["action"])
        if action not in _JOB_ACTIONS:
            raise HTTPException(404, f"Unknown action {action!r}: use retry, cancel or delete.")
        job_id = int(request.path_params["job_id"])
        if job_id > MAX_JOB_ID:
            raise HTTPException(404, f"No job {job_id}: job ids end at {MAX_JOB_ID}.")
        pool = await self._d.pool()
        changed = await inspect.act(pool, [job_id], cast(inspect.Action, action))
        log.info("dashboard: %s job %d (%d changed)", action, job_id, len(changed))
        back = _local(field_of(form, "next"), request) or f"/jobs/{job_id}"
        if action == "delete" and changed:
            back = "/jobs"
        if action == "retry" and not changed:
            return self._back(request, back, done="retry_none")
        return self._back(request, back, done=action, n=len(changed))

    async def bulk(self, request: Request) -> Response:
        """Retry, cancel or delete every job matching a filter, up to the id counted."""
        form = await self._form(request)
        action = field_of(form, "action")
        if action not in _JOB_ACTIONS:
            raise HTTPException(400, f"Unknown action {action!r}: use retry, cancel or delete.")
        filters = Filters.from_params(form)
        filt = filters.job_filter()
        if filt is None:
            raise HTTPException(400, "; ".join(filters.errors))
        try:
            up_to = int(field_of(form, "up_to"))
        except ValueError:
            up_to = -1
        if not 0 <= up_to <= MAX_JOB_ID:
            raise HTTPException(
                400, f"The confirmation's id bound (up_to) must be a whole number from 0 to "
                f"{MAX_JOB_ID}; start again from the jobs page.",
            )  # fmt: skip
        pool = await self._d.pool()
        n = await inspect.act_on_matching(pool, filt, cast(inspect.Action, action), up_to=up_to)
        log.info("dashboard: bulk %s of %s: %d changed", action, filters.query(), n)
        return self._back(request, "/jobs?" + filters.query(), done=action, n=n)

    async def queue(self, request: Request) -> Response:
        """Pause or resume a queue."""
        form = await self._form(request)
        action = str(request.path_params["action"])
        name = field_of(form, "queue")
        if action not in ("pause", "resume"):
            raise HTTPException(404, f"Unknown action {action!r}: use pause or resume.")
        try:
            check_queue_name(name)
        except ConfigError as exc:
            raise HTTPException(400, f"queue: {exc}") from None
        pool = await self._d.pool()
        if not await store_queues.known(pool, name):
            raise HTTPException(404, f"No queue {name!r}: no job, worker or setting names it.")
        await (store_queues.pause if action == "pause" else store_queues.resume)(pool, name)
        log.info("dashboard: %s queue %s", action, name)
        back = _local(field_of(form, "next"), request) or "/queues"
        return self._back(request, back, done=action, q=name)

    def _back(self, request: Request, path: str, **notice: str | int) -> Response:
        """A 303 to ``path`` (under the dashboard's prefix), carrying the notice's code."""
        base = request.scope.get("root_path", "").rstrip("/")
        sep = "&" if "?" in path else "?"
        return RedirectResponse(f"{base}{path}{sep}{urlencode(notice)}", status_code=303)


def _local(target: str, request: Request) -> str | None:
    """``target`` if it is a path inside the dashboard (never another site), else None;
    without the prefix and any earlier notice."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or "\\" in target:
        return None
    base = request.scope.get("root_path", "").rstrip("/")
    path = parts.path[len(base) :] if base and parts.path.startswith(base) else parts.path
    query = "&".join(
        p for p in parts.query.split("&") if p and p.split("=")[0] not in ("done", "n", "q")
    )
    return path + (f"?{query}" if query else "")
