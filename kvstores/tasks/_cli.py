"""``kvstores tasks ls|show|cancel`` and ``kvstores worker``: the operator's view of background tasks.

Tasks are named by their label (``#`` and 12 hex digits of the id's SHA-256), never by id: an id
is what lets a client read a task's result (the store keeps only its digest as the key).
Nothing a task carries for its tool (arguments, result, the caller's token and headers, input
answers) is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import time
from typing import Any

from kvstores.tasks._engine import TaskEngine
from kvstores.tasks._record import TaskRecord, TaskState, label, ref

__all__ = ["tasks", "worker"]


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7_200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3_600:.1f}h"


async def _find(engine: TaskEngine, wanted: str) -> TaskRecord | None:
    """The record named by ``wanted``: its label (or the task's id, which is digested first)."""
    refs = await engine.all_refs()
    matches = [task_ref for task_ref in refs if wanted in (label(task_ref), task_ref, "#" + task_ref)]
    if not matches and ref(wanted) in refs:
        matches = [ref(wanted)]
    records = await engine.records(matches[:1])
    return records[0] if records else None


async def tasks(options: argparse.Namespace, store: Any) -> int:
    """``kvstores tasks ACTION TARGET [TASK]`` on an opened ``store``; the exit code."""
    engine = TaskEngine(store)
    now = time.time()
    if options.action == "ls":
        refs = await engine.all_refs()
        rows = [record.summary(now) for record in await engine.records(refs) if record is not None]
        rows.sort(key=lambda row: -row["age"])
        if options.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                worker = row["worker"] or "-"
                print(
                    f"{row['task']}  {row['state']:<14} {_age(row['age']):>6}  {row['tool']:<24} "
                    f"worker {worker:<16} attempts {row['attempts']}"
                )
        return 0
    if not options.task:
        print(f"kvstores tasks {options.action}: which task? (its label, as `kvstores tasks ls` prints it)")
        return 2
    record = await _find(engine, options.task)
    if record is None:
        print(f"kvstores tasks {options.action}: no task {options.task}")
        return 1
    if options.action == "show":
        print(json.dumps(record.summary(now), indent=2))
        return 0
    ended = await engine.cancel(record.id, record.scope)
    after = (await engine.records([record.ref]))[0]
    cancelled = ended and after is not None and after.state is TaskState.CANCELLED
    print(f"{label(record.ref)}: {'cancelled' if cancelled else 'unchanged'} ({(after or record).state.value})")
    return 0


async def worker(options: argparse.Namespace) -> int:
    """``kvstores worker module:app``: run the tasks of that FastMCP app's StoreTasks, serving no HTTP."""
    from kvstores.tasks._extension import serve_worker

    module_name, _, attribute = options.app.partition(":")
    app: Any = importlib.import_module(module_name)
    for part in (attribute or "mcp").split("."):
        app = getattr(app, part)
    print(f"kvstores worker: running the tasks of {options.app}", flush=True)
    try:
        await serve_worker(app, concurrency=options.concurrency)
    except asyncio.CancelledError:
        return 0
    return 0
