"""Durable MCP background tasks on any kvstores store with atomic operations.

::

    from fastmcp import FastMCP
    from kvstores import open_store
    from kvstores.tasks import StoreTasks

    store = open_store("postgresql://app@db/app")
    mcp = FastMCP("app", session_state_store=store)
    mcp.add_extension(StoreTasks(store))        # in place of fastmcp_tasks.TasksExtension

    @mcp.tool(task=True)
    async def analyze(dataset: str) -> str: ...

The engine (:mod:`kvstores.tasks._engine`) keeps each task as one record on the store, claims
it with a leased compare-and-set and fences every later write on the lease's token; the worker
(:mod:`kvstores.tasks._worker`) runs in every server process; the extension
(:mod:`kvstores.tasks._extension`) speaks the wire of ``fastmcp-tasks``. The engine, the worker
and their records need only a store: the extension and the wire client (``StoreTasks``,
``serve_worker``, ``TaskClient``, which need the ``fastmcp`` extra) are imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstores.tasks._engine import DEFAULT_LEASE, DEFAULT_TTL, TaskEngine
from kvstores.tasks._record import TaskRecord, TaskState
from kvstores.tasks._worker import DEFAULT_CONCURRENCY, DEFAULT_RESCAN, Worker

if TYPE_CHECKING:
    from kvstores.tasks._client import TaskClient
    from kvstores.tasks._extension import StoreTasks, serve_worker

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_LEASE",
    "DEFAULT_RESCAN",
    "DEFAULT_TTL",
    "StoreTasks",
    "TaskClient",
    "TaskEngine",
    "TaskRecord",
    "TaskState",
    "Worker",
    "serve_worker",
]

_MCP_SIDE = {
    "StoreTasks": "kvstores.tasks._extension",
    "serve_worker": "kvstores.tasks._extension",
    "TaskClient": "kvstores.tasks._client",
}
"""What needs the ``fastmcp`` extra, imported on first access: the engine and the worker stand alone."""


def __getattr__(name: str) -> Any:
    module = _MCP_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module 'kvstores.tasks' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
