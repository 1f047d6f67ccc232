"""The dashboard's guards: the Host it is served as (against DNS rebinding), a bound on
request bodies, HTTP Basic auth, a CSRF token on every state-changing request, headers that
keep job content inert, and the rule on which addresses it may listen."""

from __future__ import annotations

import base64
import binascii
import hmac
import html
import ipaddress
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgq._core.names import is_host_name
from pgq.errors import ConfigError

CSRF_COOKIE = "pgq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"

#: The largest request body the dashboard reads (its forms are a few fields): a larger one
#: is refused with 413 as it streams in, before any authentication work or parsing.
MAX_BODY_BYTES = 64 * 1024

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


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an IP address (``10.0.0.5``, ``[::1]``): no DNS answer, and so no
    rebinding, stands behind it."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port, lower case (``[::1]:8181`` ->
    ``[::1]``)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[: end + 1] if end > 0 else header
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header


class AllowedHosts:
    """The ``Host`` names a dashboard answers (against DNS rebinding: a page of another site
    whose name resolves to this machine is served as that name, never as ours).

    Always ``localhost`` and the loopback addresses; then each given name (``dash.example``),
    suffix (``*.example.com``), or IP address; a wildcard address (``0.0.0.0``, ``::``: the
    bind address of a dashboard that listens on every interface) allows any IP address, and
    ``*`` allows every name."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names: set[str] = set()
        self.suffixes: list[str] = []
        self.any_ip = False
        self.any = False
        for raw in names:
            name = raw.strip().lower()
            if not name:
                continue
            _check_allowed(raw, name)
            if name == "*":
                self.any = True
            elif name.startswith("*."):
                self.suffixes.append(name[1:])
            elif is_ip_literal(name) and ipaddress.ip_address(name.strip("[]")).is_unspecified:
                self.any_ip = True
            else:
                bare = name.strip("[]")
                self.names.update({bare, f"[{bare}]"} if is_ip_literal(bare) else {name})

    @classmethod
    def default(
        cls, given: Sequence[str] | None, *, auth: Credentials | None
    ) -> AllowedHosts | None:
        """The check a dashboard makes (None: none): loopback names and ``given``; with
        nothing given, loopback names alone without auth, and no check with it (credentials
        do not follow a rebinding name, so a page served there cannot sign in)."""
        if given is None and auth is not None:
            return None
        if isinstance(given, str):
            raise ConfigError("allowed_hosts takes a list of host names, not one string")
        check = cls(given or ())
        return None if check.any else check

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header may be answered."""
        if self.any:
            return True
        if not header:
            return False
        name = host_name(header)
        if name in self.names or is_loopback(name):
            return True
        if self.any_ip and is_ip_literal(name):
            return True
        return any(name.endswith(s) and len(name) > len(s) for s in self.suffixes)


def _check_allowed(raw: str, name: str) -> None:
    """Refuse an ``allowed_hosts`` entry that can never match a request's ``Host``."""
    suffix = name[2:] if name.startswith("*.") else None
    if name == "*" or is_ip_literal(name) or is_host_name(suffix or name):
        return
    if "/" in name:
        why = "a URL: give its host alone, as in dash.example.com"
    elif any(c.isspace() for c in name):
        why = "a name with a space in it"
    elif suffix == "":
        why = "a suffix with no name after '*.': write *.example.com"
    elif "*" in name:
        why = "a '*' where only a leading '*.' (*.example.com) or a lone '*' matches"
    elif ":" in name:
        why = "a name with a port: a Host's port is not compared, give the name alone"
    else:
        why = "not a host name, a suffix or an IP address"
    raise ConfigError(
        f"allowed_hosts (--allowed-hosts, PGQ_DASHBOARD_ALLOWED_HOSTS): {raw!r} can never "
        f"match a request's Host: it is {why}. Give a name (dash.example.com), a suffix "
        "(*.example.com), an IP address (10.0.0.5, [::1]), or * for any"
    )


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
    """ASGI middleware around the whole dashboard, in this order: the ``Host`` check (400),
    the body's declared size (413), Basic auth (when configured), then the body's size as it
    streams (413 at the limit); and the security headers on every response, error pages
    (a 500 included) as much as pages."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: Credentials | None,
        hosts: AllowedHosts | None = None,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self._app = app
        self._auth = auth
        self._hosts = hosts
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self._hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if not self._hosts.allows(host):
                await _refuse(send, 400, "Bad request", _wrong_host(host))
                return
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared[:30]) > self._max_body:
            await _refuse(send, 413, "Request too large", _too_large(self._max_body))
            return
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if self._auth is not None and not self._auth.accepts(authorization):
            await _unauthorized(send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in _HEADERS.items():
                    out.setdefault(name, value)
            await send(message)

        await self._app(scope, _bounded(receive, self._max_body), send_with_headers)


def _bounded(receive: Receive, limit: int) -> Receive:
    """``receive``, refusing a body (chunked, or longer than it declared) past ``limit``
    bytes as it streams: what a handler reads is never more than that."""
    received = 0

    async def bounded() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(413, _too_large(limit))
        return message

    return bounded


def _wrong_host(host: str) -> str:
    shown = host[:100] or "(none)"
    return (
        f"This dashboard is not served as {shown!r}. Open it by an address it answers (such "
        "as 127.0.0.1 or localhost), or start it with --allowed-hosts (allowed_hosts=) "
        "naming this host."
    )


def _too_large(limit: int) -> str:
    return (
        f"Refused: the request body is larger than {limit:,} bytes (the dashboard's forms "
        "are a few fields)."
    )


async def _refuse(send: Send, status: int, title: str, message: str) -> None:
    """An error page of the guard's own (no template, no data of the dashboard's), with the
    headers every page carries."""
    body = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{status} · pgq</title></head><body><h1>{html.escape(title)}</h1>"
        f"<p>{html.escape(message)}</p></body></html>\n"
    ).encode()
    await _send(send, status, body, [(b"content-type", b"text/html; charset=utf-8")])


async def _unauthorized(send: Send) -> None:
    body = b"pgq dashboard: sign in with the user and password given to --auth\n"
    await _send(send, 401, body, [
        (b"www-authenticate", b'Basic realm="pgq dashboard", charset="UTF-8"'),
        (b"content-type", b"text/plain; charset=utf-8"),
    ])  # fmt: skip


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    security = [(k.encode(), v.encode()) for k, v in _HEADERS.items()]
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [*headers, *security, (b"content-length", str(len(body)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
