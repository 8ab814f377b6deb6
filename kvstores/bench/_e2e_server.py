"""The server process of ``kvstores bench --e2e``: one FastMCP server, served one of two ways.

``python -m kvstores.bench._e2e_server MODE FD`` serves, with uvicorn on FD (a TCP socket bound to
a loopback port, inherited from the bench: :mod:`kvstores._loopback`),
a FastMCP server whose ``remember(key, value)`` and ``recall(key)`` tools call
``ctx.set_state`` / ``ctx.get_state`` on the store at ``$KVSTORES_BENCH_E2E_URL``, its events in a
:class:`kvstores.events.StoreEventStore` on the same store: through FastMCP's own stateful
``http_app`` (MODE ``fastmcp``) or through :func:`kvstores.sessions.http_app` (MODE ``durable``).
With ``$KVSTORES_BENCH_E2E_PROFILE`` set, the process runs under cProfile and writes its
statistics to that file when it stops (SIGTERM or SIGINT).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import signal
import sys
from typing import Any

from fastmcp import Context, FastMCP

from kvstores.bench._e2e import MODES, PROFILE_VARIABLE, URL_VARIABLE


def app_for(mode: str, store: Any) -> Any:
    """The ASGI app serving the bench's FastMCP server on ``store`` in ``mode``."""
    from kvstores.events import StoreEventStore

    mcp: FastMCP[Any] = FastMCP("kvstores-bench-e2e", session_state_store=store)

    @mcp.tool
    async def remember(key: str, value: str, ctx: Context) -> str:
        """Store ``value`` under ``key`` in this session's state."""
        await ctx.set_state(key, value)
        return value

    @mcp.tool
    async def recall(key: str, ctx: Context) -> str | None:
        """The value stored under ``key`` in this session's state (None when unset)."""
        value = await ctx.get_state(key)
        return None if value is None else str(value)

    events = StoreEventStore(store)
    if mode == "fastmcp":
        return mcp.http_app(event_store=events)
    from kvstores.sessions import http_app

    return http_app(mcp, store=store, event_store=events)


async def _serve(mode: str, fd: int) -> None:
    import socket

    import uvicorn

    from kvstores.registry import open_store

    async with open_store(os.environ[URL_VARIABLE]) as store:
        config = uvicorn.Config(app_for(mode, store), log_level="warning", timeout_graceful_shutdown=1)
        await uvicorn.Server(config).serve(sockets=[socket.socket(fileno=fd)])


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    mode, fd = argv or sys.argv[1:]
    if mode not in MODES:
        raise SystemExit(f"MODE is one of {', '.join(MODES)}, not {mode!r}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # uvicorn stops on either, gracefully
    profile_path = os.environ.get(PROFILE_VARIABLE)
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        asyncio.run(_serve(mode, int(fd)))
    except KeyboardInterrupt:
        pass
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


if __name__ == "__main__":
    main()
