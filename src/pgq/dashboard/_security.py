"""The dashboard's guards: HTTP Basic auth, a CSRF token on every state-changing request,
headers that keep job content inert, and the rule on which addresses it may listen."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgq.errors import ConfigError

CSRF_COOKIE = "pgq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"

#: No inline script, no script from elsewhere, no framing: even a payload that escaped the
#: templates' escaping could not run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name and password for HTTP Basic auth."""

    user: str
    password: str

    @classmethod
    def parse(cls, text: str) -> Credentials:
        """``USER:PASSWORD`` (the password may contain colons)."""
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise ConfigError("--auth (or PGQ_DASHBOARD_AUTH) takes USER:PASSWORD, both non-empty")
        return cls(user, password)

    def accepts(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials."""
        if not header or not header.lower().startswith("basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        # Both compared, always: the time taken says nothing about which one was wrong.
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, auth: Credentials | None, read_only: bool) -> None:
    """Refuse to listen beyond this machine with no password unless nothing can be changed."""
    if is_loopback(host) or auth is not None or read_only:
        return
    raise ConfigError(
        f"refusing to serve the dashboard on {host} without a password: anyone who can reach "
        "it could retry, cancel and delete jobs. Pass --auth USER:PASSWORD (or set "
        "PGQ_DASHBOARD_AUTH), or --read-only, or bind 127.0.0.1 and use an SSH tunnel"
    )


def new_csrf_token() -> str:
    """A fresh random token for the CSRF cookie."""
    return secrets.token_urlsafe(32)


def csrf_ok(cookie: str | None, sent: str | None) -> bool:
    """Whether a request proves it came from one of our pages: the token it sent (form field
    or header) equals the cookie only our pages can read (double submit)."""
    if not cookie or not sent:
        return False
    return hmac.compare_digest(cookie.encode(), sent.encode())


def same_origin(headers: Any, scheme: str) -> bool:
    """Whether the request's ``Origin`` (when the browser sent one) is this server."""
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return bool(origin == f"{scheme}://{headers.get('host', '')}")


class Guard:
    """ASGI middleware: Basic auth (when configured) and the security headers on every
    response."""

    def __init__(self, app: ASGIApp, *, auth: Credentials | None) -> None:
        self._app = app
        self._auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if self._auth is not None:
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not self._auth.accepts(header):
                await _unauthorized(send)
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self._app(scope, receive, send_with_headers)


async def _unauthorized(send: Send) -> None:
    body = b"pgq dashboard: sign in with the user and password given to --auth\n"
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"www-authenticate", b'Basic realm="pgq dashboard", charset="UTF-8"'),
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
