"""The server process of ``kvstores demo``'s durable-session scene.

``python -m kvstores._demo_server --fd FD --name NAME`` serves
:func:`kvstores.harness.state_server` on the store at ``$KVSTORES_URL`` (or ``--store URL``) through
:func:`kvstores.sessions.http_app` with uvicorn on FD, a TCP socket bound to a loopback port and
inherited from the demo (:mod:`kvstores._loopback`) (events in a
:class:`kvstores.events.StoreEventStore` on the same store), plus a ``server_name`` tool
answering NAME, so that the demo shows which process answered each request,
``count_to``, a call that streams one progress notification per step, and ``write_report``, a
background task (:class:`kvstores.tasks.StoreTasks` on the same store, with a short lease so that
the scene of a killed server takes seconds) that says which server runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvicorn
from fastmcp import Context
from fastmcp.dependencies import Progress

from kvstores.events import StoreEventStore
from kvstores.harness import state_server
from kvstores.registry import open_store
from kvstores.sessions import http_app
from kvstores.tasks import StoreTasks

__all__ = ["main"]

_RETRY_MS = 300
"""How long a client whose stream was cut waits before it resumes."""

TASK_LEASE = 2.0
"""Seconds a worker's claim on a task lasts without a heartbeat (10 by default; short for the demo)."""

TASK_RESCAN = 1.0
"""Seconds between two rescans of the task queue (2.5 by default)."""


async def _serve(store_url: str | None, fd: int, name: str) -> None:
    async with open_store(store_url) as store:
        mcp = state_server(store)

        @mcp.tool
        def server_name() -> str:
            """Which of the demo's server processes answered."""
            return name

        @mcp.tool
        async def count_to(steps: int, ctx: Context) -> str:
            """Report steps 1..steps, 0.2 s apart, each naming this server; then answer."""
            for step in range(1, steps + 1):
                await ctx.report_progress(step, steps, f"step {step} (run by server {name})")
                await asyncio.sleep(0.2)
            return f"counted to {steps} on server {name}"

        @mcp.tool(task=True)
        async def write_report(seconds: float, progress: Progress = Progress()) -> str:  # noqa: B008 - as users write it
            """A background task: says which server runs it, takes ``seconds``, answers which server wrote it."""
            await progress.set_message(f"writing on server {name}")
            await asyncio.sleep(seconds)
            return f"report written by server {name}"

        mcp.add_extension(StoreTasks(store, lease=TASK_LEASE, rescan=TASK_RESCAN))

        app = http_app(mcp, store=store, event_store=StoreEventStore(store), retry_interval=_RETRY_MS)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        await uvicorn.Server(config).serve(sockets=[socket.socket(fileno=fd)])


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m kvstores._demo_server", description="A server of kvstores demo.")
    parser.add_argument(
        "--store", help="kvstores URL shared with the other server processes (default: $KVSTORES_URL, out of ps)"
    )
    parser.add_argument("--fd", type=int, required=True, help="a bound TCP socket inherited from the demo")
    parser.add_argument("--name", required=True, help="what the server_name tool answers")
    options = parser.parse_args(argv)
    asyncio.run(_serve(options.store, options.fd, options.name))


if __name__ == "__main__":
    main()
