"""The server process of ``kvstores bench --tasks``: FastMCP over uvicorn with one ``task=True`` tool.

``python _tasks_server.py kvstores FD CONCURRENCY`` serves :class:`kvstores.tasks.StoreTasks` on
the store whose URL is in ``$KVSTORES_BENCH_TASKS_URL`` (and whose constructor options are the
JSON object in ``$KVSTORES_BENCH_TASKS_OPTIONS``); ``python _tasks_server.py docket FD
CONCURRENCY`` serves ``fastmcp_tasks.TasksExtension`` (Docket) on the Redis URL in that variable,
its queue named by ``$KVSTORES_BENCH_TASKS_OPTIONS``'s ``name``. The Docket server runs under
another Python (fastmcp-tasks pins an older FastMCP), where kvstores is not installed: this file
imports only FastMCP, uvicorn and the engine it serves, and keeps to Python 3.11's syntax. FD is
a TCP socket bound to a loopback port, inherited from the bench (:mod:`kvstores._loopback`).

The tool, ``stamp``, returns at once the server's ``time.monotonic()`` when it started (one clock
for every process on Linux), from which the benchmark reads the pickup latency. ``GET /health``
answers ``ok`` once the server is up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

__all__ = ["OPTIONS_VARIABLE", "URL_VARIABLE", "build", "main"]

URL_VARIABLE = "KVSTORES_BENCH_TASKS_URL"
"""The environment variable holding the store's URL (not argv: a URL may hold a password)."""

OPTIONS_VARIABLE = "KVSTORES_BENCH_TASKS_OPTIONS"
"""The environment variable holding a JSON object: the store's options, or Docket's ``name``."""


def build(kind: str, url: str, options: dict[str, Any], concurrency: int) -> Any:
    """The FastMCP server of ``kind`` (``kvstores`` or ``docket``) with the ``stamp`` tool."""
    from fastmcp import FastMCP
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse

    mcp = FastMCP("kvbench-tasks")
    if kind == "kvstores":
        from kvstores import open_store
        from kvstores.tasks import StoreTasks

        mcp.add_extension(StoreTasks(open_store(url, **options), concurrency=concurrency))
    else:
        from fastmcp_tasks import TasksExtension  # type: ignore[import-not-found,unused-ignore]

        mcp.add_extension(TasksExtension(url=url, name=options["name"], concurrency=concurrency))

    @mcp.tool(task=True)
    async def stamp() -> float:
        """When this run started, on the host's monotonic clock."""
        return time.monotonic()

    @mcp.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return mcp


def main(argv: list[str]) -> None:
    """Serve until terminated: ``KIND FD CONCURRENCY``, FD a bound TCP socket inherited from the bench."""
    import asyncio
    import socket

    import uvicorn

    kind, fd, concurrency = argv
    options: dict[str, Any] = json.loads(os.environ.get(OPTIONS_VARIABLE) or "{}")
    mcp = build(kind, os.environ[URL_VARIABLE], options, int(concurrency))
    # connections kept open past the client's keep-alive (30 s): a server closing an idle connection
    # as the client reuses it (uvicorn's default: 5 s, httpx's too) fails that request with a ReadError
    config = uvicorn.Config(mcp.http_app(), log_level="warning", timeout_keep_alive=60, timeout_graceful_shutdown=1)
    asyncio.run(uvicorn.Server(config).serve(sockets=[socket.socket(fileno=int(fd))]))


if __name__ == "__main__":
    main(sys.argv[1:])
