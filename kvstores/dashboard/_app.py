"""The dashboard's routes: the page, its JSON, and the one action (cancel a task).

::

    GET  /                          the page (kvstores.dashboard._page)
    GET  /api/state                 the last sample (kvstores.dashboard._collect)
    GET  /api/tasks?state=&tool=&after=   one bounded page of tasks, in label order
    GET  /api/tasks/{label}         one task: its row, times, error, attempts seen
    POST /api/tasks/{label}/cancel  cancel it: token, CSRF value and same origin (kvstores.dashboard._guard)
    POST /api/unlock                check a token the page was given (the same guards)
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from kvstores.dashboard._collect import Collector
from kvstores.dashboard._guard import HostGuard, refusal, security_headers
from kvstores.dashboard._page import STATES, render

__all__ = ["build"]

_STATES = frozenset(STATES)


def build(collector: Collector, *, token: str | None, hosts: Iterable[str], close: bool) -> Starlette:
    """The Starlette app over ``collector``; ``close``: its shutdown also stops the collector's listener."""
    csrf = secrets.token_urlsafe(24) if token is not None else ""

    async def page(request: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        base = request.scope.get("root_path", "").rstrip("/") + "/"
        text = render(nonce=nonce, base=base, interval=collector.interval, writable=token is not None, csrf=csrf)
        return HTMLResponse(text, headers=security_headers(nonce))

    async def state(request: Request) -> Response:
        return JSONResponse(await collector.snapshot())

    async def tasks(request: Request) -> Response:
        query = request.query_params
        wanted_state = query.get("state") or None
        if wanted_state is not None and wanted_state not in _STATES:
            return JSONResponse({"error": "no such state"}, status_code=400)
        tool = (query.get("tool") or None) if len(query.get("tool") or "") <= 200 else None
        return JSONResponse(await collector.tasks.page(query.get("after"), wanted_state, tool))

    async def task(request: Request) -> Response:
        detail = await collector.tasks.detail(request.path_params["label"])
        if detail is None:
            return JSONResponse({"error": "no such task"}, status_code=404)
        return JSONResponse(detail)

    async def cancel(request: Request) -> Response:
        refused = refusal(request, token, csrf)
        if refused is not None:
            return JSONResponse({"error": refused}, status_code=403)
        label = request.path_params["label"]
        after = await collector.tasks.cancel(label)
        if after is None:
            return JSONResponse({"error": "no such task"}, status_code=404)
        return JSONResponse({"task": label, "state": after})

    async def unlock(request: Request) -> Response:
        refused = refusal(request, token, csrf)
        if refused is not None:
            return JSONResponse({"error": refused}, status_code=403)
        return Response(status_code=204)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close:
                await collector.aclose()

    routes: list[Any] = [
        Route("/", page),
        Route("/favicon.ico", favicon),
        Route("/api/state", state),
        Route("/api/tasks", tasks),
        Route("/api/tasks/{label}", task),
        Route("/api/tasks/{label}/cancel", cancel, methods=["POST"]),
        Route("/api/unlock", unlock, methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(HostGuard, hosts=hosts)], lifespan=lifespan)
