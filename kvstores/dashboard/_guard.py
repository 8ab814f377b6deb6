"""The dashboard's guards: the Host check (DNS rebinding), security headers, and who may cancel.

- **Host.** Every request must name the dashboard by a host name it serves (loopback names by
  default, plus those the operator allows): a page elsewhere that re-points its own name at
  127.0.0.1 (DNS rebinding) is refused with 421 before any route runs. A request without a
  Host is refused too. There is no wildcard.
- **Headers.** Every response says ``Cache-Control: no-store``, ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer``, ``X-Frame-Options: DENY``, and a Content-Security-Policy that
  allows only this page's own inline script and style (a nonce per response) and requests to
  itself: no other origin's script, frame, image or connection.
- **Cancel.** Only with an operator token configured; the request must carry it
  (``Authorization: Bearer <token>``, compared in constant time; never a cookie, so a browser
  never sends it by itself), the page's CSRF value (``X-CSRF-Token``, random per process, in
  the page only), and come from this origin: an ``Origin`` naming the same host the request
  was addressed to, or failing that ``Sec-Fetch-Site: same-origin``. Anything else is 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["LOOPBACK_HOSTS", "HostGuard", "host_name", "refusal", "security_headers"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Host names a loopback dashboard answers to."""


def host_name(header: str) -> str:
    """The host part of a ``Host`` header (or an origin's netloc), lower-cased, without port or brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def security_headers(nonce: str) -> dict[str, str]:
    """The headers of every response; ``nonce`` admits the page's own inline script and style."""
    policy = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }


class HostGuard:
    """ASGI middleware: refuse a request whose Host is not served (421), add the security headers."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(host_name(host) for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the Host of an HTTP request, then run the app with the headers added to its response."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if not host or host_name(host) not in self.hosts:
            await _plain(send, 421, "This dashboard is not served under that host name.")
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                added = [  # the page sets its own policy, with its nonce
                    (name.lower().encode(), value.encode())
                    for name, value in security_headers("none").items()
                    if name.lower().encode() not in present
                ]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), value.encode()) for name, value in security_headers("none").items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def refusal(request: Request, token: str | None, csrf: str) -> str | None:
    """Why ``request`` may not cancel (None: it may): no token configured or given, no CSRF value, another origin."""
    if token is None:
        return "this dashboard is read-only: start it with an operator token to cancel tasks"
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
        return "the operator token is missing or wrong"
    if not hmac.compare_digest(request.headers.get("x-csrf-token", "").encode(), csrf.encode()):
        return "the request lacks this page's CSRF value"
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
            return "the request comes from another origin"
    elif request.headers.get("sec-fetch-site") != "same-origin":
        return "the request does not say it comes from this origin"
    return None
