"""The pgq dashboard: queues, jobs, producers and schedules in a browser, with the actions
an operator needs (retry, cancel, delete, pause).

Run it with ``pgq dashboard``, or mount it in your own ASGI app::

    from pgq.dashboard import create_app

    app.mount("/pgq", create_app("postgresql://app@db/app", auth="admin:secret"))

Needs the ``dashboard`` extra (``pip install 'pgq-async[dashboard]'``).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the pgq dashboard needs its extra: pip install 'pgq-async[dashboard]'"
    ) from exc

from pgq.dashboard._app import Dashboard, create_app

__all__ = ["Dashboard", "create_app"]
