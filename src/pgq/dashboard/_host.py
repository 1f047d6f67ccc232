"""What pages and actions need of the dashboard that serves them (a protocol, so they do
not import the application module that imports them)."""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from pgq._db.connections import Pool


class Host(Protocol):
    """The dashboard's settings, its pool and its renderer."""

    read_only: bool
    stale_after_s: float
    count_timeout_s: float
    page_size: int
    scan_window: int

    async def pool(self) -> Pool:
        """The pool to read and act through."""
        ...

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """A page from ``template``."""
        ...
