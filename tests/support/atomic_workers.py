"""Child processes of the several-processes atomic-operations tests (tests/test_atomic.py).

Each worker opens its own store from a URL, waits at a barrier so that all race at once, runs
one kind of contention and reports what it saw; the test checks the union of the reports.
No pytest here: children import only kvstores and what their backend needs.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from kvstores import open_store

INCREMENTS = 100
"""update() increments each worker makes to the one shared counter."""

CLAIMS = 50
"""Keys every worker tries to claim with put_if_absent."""

ITEMS = 100
"""Entries the workers pop between them."""


def _increment(value: dict[str, Any] | None) -> dict[str, Any]:
    return {"n": (value or {"n": 0})["n"] + 1}


async def _race(url: str, options: dict[str, Any], kind: str, worker: int, barrier: Any) -> list[str]:
    """Run one ``kind`` of contention; return the keys this worker won (claims, pops)."""
    store = open_store(url, **options)
    won: list[str] = []
    try:
        await store.get("warm-up")  # connected: now start together
        await asyncio.to_thread(barrier.wait)
        if kind == "update":
            for _ in range(INCREMENTS):
                await store.update("counter", _increment)
        elif kind == "put_if_absent":
            for index in range(CLAIMS):
                key = f"claim/{index}"
                if await store.put_if_absent(key, {"worker": worker}):
                    won.append(key)
        else:
            for index in range(ITEMS):
                value = await store.pop(f"item/{index}")
                if value is not None:
                    assert value == {"item": index}, f"item/{index} popped as {value}"
                    won.append(f"item/{index}")
        return won
    finally:
        await store.aclose()


def race(url: str, options: dict[str, Any], kind: str, worker: int, barrier: Any, results: Any) -> None:
    """Put ``(worker, keys won)`` on ``results``, or ``(worker, traceback)`` when anything failed."""
    try:
        results.put((worker, asyncio.run(_race(url, options, kind, worker, barrier))))
    except BaseException:
        barrier.abort()
        results.put((worker, traceback.format_exc()))
