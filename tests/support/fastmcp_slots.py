"""Helpers for the FastMCP store-slot tests: a fake upstream IdP, a scripted browser, loopback servers.

The OAuth test runs FastMCP's real code on real HTTP: an :class:`OAuthProxy` server on uvicorn,
a fake identity provider (:class:`FakeIdP`) on uvicorn, and FastMCP's own client ``OAuth`` whose
browser step is played by :class:`BrowserOAuth` (it follows the redirects and submits the
consent form the way a browser would, and stops at the client's loopback redirect).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
from fastmcp import FastMCP
from fastmcp.client.auth import OAuth
from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.server.auth.oauth_proxy import OAuthProxy
from key_value.aio.protocols import AsyncKeyValue
from mcp.shared.auth import AuthorizationCodeResult
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.support.events import serving

UPSTREAM_CLIENT_ID = "kvstores-upstream-client"
UPSTREAM_CLIENT_SECRET = "kvstores-upstream-secret-0123456789"  # a test credential
JWT_SIGNING_KEY = b"kvstores-test-jwt-signing-key-32b"
"""Bytes are used as they are (a str would go through 1,000,000 PBKDF2 rounds on every server)."""


class Loopback:
    """One loopback port that servers are started on, stopped, and started on again (a restart)."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"

    @contextlib.asynccontextmanager
    async def serving(self, app: Any) -> AsyncIterator[str]:
        """Serve ``app`` with uvicorn on this port in this event loop; yield the base URL."""
        async with serving(app, self.port):
            yield self.base_url


@dataclass
class Grant:
    """Tokens the fake IdP issued, and until when the access token is valid."""

    access_token: str
    refresh_token: str | None
    expires_at: float


@dataclass
class FakeIdP:
    """An OAuth 2 authorization server that approves everyone: ``/authorize`` and ``/token``.

    Access tokens live ``expires_in`` seconds; a refresh token comes with them when
    ``refresh`` is set. Every token it issues starts with ``idp-`` and is kept in
    :attr:`grants`, so that tests can look for token text in a store.
    """

    expires_in: int = 3600
    refresh: bool = True
    codes: dict[str, str] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)

    def app(self) -> Starlette:
        """The IdP as an ASGI app."""
        return Starlette(
            routes=[Route("/authorize", self.authorize), Route("/token", self.token, methods=["POST"])],
        )

    async def authorize(self, request: Request) -> Response:
        """Approve at once: redirect to the proxy's callback with a code and the proxy's state."""
        params = request.query_params
        assert params["client_id"] == UPSTREAM_CLIENT_ID
        code = f"idp-code-{secrets.token_urlsafe(16)}"
        self.codes[code] = params.get("code_challenge", "")
        query = urlencode({"code": code, "state": params["state"]})
        return RedirectResponse(f"{params['redirect_uri']}?{query}", status_code=302)

    async def token(self, request: Request) -> Response:
        """Exchange a code (or a refresh token) for new tokens."""
        form = await request.form()
        if form.get("grant_type") == "authorization_code" and self.codes.pop(str(form.get("code")), None) is None:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        grant = Grant(
            access_token=f"idp-access-{secrets.token_urlsafe(24)}",
            refresh_token=f"idp-refresh-{secrets.token_urlsafe(24)}" if self.refresh else None,
            expires_at=time.time() + self.expires_in,
        )
        self.grants.append(grant)
        body: dict[str, Any] = {
            "access_token": grant.access_token,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "scope": "read",
        }
        if grant.refresh_token:
            body["refresh_token"] = grant.refresh_token
        return JSONResponse(body)

    def secrets_issued(self) -> list[str]:
        """Every access and refresh token text the IdP has issued."""
        return [token for grant in self.grants for token in (grant.access_token, grant.refresh_token) if token]


class FakeIdPVerifier(TokenVerifier):
    """Accepts the IdP's access tokens until they expire (an in-process stand-in for introspection)."""

    def __init__(self, idp: FakeIdP) -> None:
        super().__init__(required_scopes=["read"])
        self.idp = idp

    async def verify_token(self, token: str) -> AccessToken | None:
        for grant in self.idp.grants:
            if grant.access_token == token and grant.expires_at > time.time():
                return AccessToken(token=token, client_id=UPSTREAM_CLIENT_ID, scopes=["read"])
        return None


def oauth_proxy(base_url: str, idp_url: str, idp: FakeIdP, client_storage: AsyncKeyValue) -> OAuthProxy:
    """An OAuthProxy in front of the fake IdP, keeping its state in ``client_storage``."""
    return OAuthProxy(
        upstream_authorization_endpoint=f"{idp_url}/authorize",
        upstream_token_endpoint=f"{idp_url}/token",
        upstream_client_id=UPSTREAM_CLIENT_ID,
        upstream_client_secret=UPSTREAM_CLIENT_SECRET,
        token_verifier=FakeIdPVerifier(idp),
        base_url=base_url,
        jwt_signing_key=JWT_SIGNING_KEY,
        client_storage=client_storage,
    )


def protected_server(auth: OAuthProxy) -> FastMCP[Any]:
    """A FastMCP server behind ``auth`` with one tool, ``whoami``."""
    server: FastMCP[Any] = FastMCP("oauth-slot", auth=auth)

    @server.tool
    def whoami() -> str:
        """Answer only to an authenticated client."""
        return "an authenticated client"

    return server


_FORM_FIELD = re.compile(r'<input type="hidden" name="(txn_id|csrf_token)" value="([^"]*)"')


class BrowserOAuth(OAuth):
    """FastMCP's client OAuth with a scripted browser instead of a real one and a callback server.

    ``redirect_handler`` walks the authorization URL like a browser: the proxy's consent page
    (approved through its form, with the cookies it set), the IdP, the proxy's callback, and
    stops at the redirect to this client's loopback callback, whose code ``callback_handler``
    returns. :attr:`authorizations` counts the browser flows.
    """

    def __init__(self, mcp_url: str, **kwargs: Any) -> None:
        self.authorizations = 0
        self._result: AuthorizationCodeResult | None = None
        super().__init__(mcp_url, callback_host="127.0.0.1", **kwargs)

    async def redirect_handler(self, authorization_url: str) -> None:
        self.authorizations += 1
        callback = f"http://127.0.0.1:{self.redirect_port}/callback"
        async with httpx.AsyncClient(timeout=10) as browser:
            response = await browser.get(authorization_url)
            for _ in range(10):
                if response.status_code == 200 and "consentForm" in response.text:
                    form = dict(_FORM_FIELD.findall(response.text))
                    response = await browser.post(str(response.url), data={**form, "action": "approve"})
                    continue
                assert response.status_code in (302, 303, 307), (response.status_code, response.text[:500])
                location = response.headers["location"]
                if location.startswith(callback):
                    query = parse_qs(urlparse(location).query, keep_blank_values=True)
                    assert "error" not in query, query
                    self._result = AuthorizationCodeResult(
                        code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]
                    )
                    return
                response = await browser.get(location)
        raise AssertionError("the authorization flow did not reach the client's callback")

    async def callback_handler(self) -> AuthorizationCodeResult:
        assert self._result is not None, "redirect_handler did not finish the flow"
        result, self._result = self._result, None
        return result
