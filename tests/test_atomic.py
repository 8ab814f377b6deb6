"""Atomic operations across processes: 4 processes race on one store, on every shared backend.

- update: 4 x 100 increments of one counter end at exactly 400 (no update lost);
- put_if_absent: 4 processes claim the same 50 keys, and each key has exactly one winner,
  whose value is the one stored;
- pop: 4 processes pop the same 100 entries, and each is popped by exactly one of them.

The single-process semantics and contention between tasks are checked by the ``atomic`` group
of AsyncKeyValueConformance (tests/test_conformance.py) on every row of the table.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.support import Backend, run_processes
from tests.support.atomic_workers import CLAIMS, INCREMENTS, ITEMS, race

pytestmark = pytest.mark.anyio

WORKERS = 4


def _run_race(url: str, options: dict[str, Any], kind: str) -> dict[int, list[str]]:
    """Run ``kind`` in WORKERS processes at once; return each worker's winnings."""
    outcomes = run_processes(race, [(url, options, kind, worker) for worker in range(WORKERS)])
    failures = {worker: outcome for worker, outcome in outcomes.items() if isinstance(outcome, str)}
    assert not failures, "\n".join(f"worker {worker}:\n{text}" for worker, text in failures.items())
    return outcomes


@pytest.fixture
def shared(backend: Backend) -> Backend:
    if not backend.processes:
        pytest.skip(f"{backend.name}: not run in several processes")
    return backend


async def test_update_loses_no_increment(shared: Backend, namespace: str) -> None:
    url, options = shared.url(namespace)
    _run_race(url, options, "update")
    store = await shared.open(namespace)
    try:
        assert await store.get("counter") == {"n": WORKERS * INCREMENTS}
    finally:
        await store.destroy()
        await store.aclose()


async def test_put_if_absent_has_one_winner_per_key(shared: Backend, namespace: str) -> None:
    url, options = shared.url(namespace)
    outcomes = _run_race(url, options, "put_if_absent")
    winners = {key: worker for worker, keys in outcomes.items() for key in keys}
    assert sum(len(keys) for keys in outcomes.values()) == CLAIMS  # no key won twice
    assert sorted(winners) == sorted(f"claim/{index}" for index in range(CLAIMS))
    store = await shared.open(namespace)
    try:
        stored = await store.get_many(list(winners))
        assert stored == [{"worker": worker} for worker in winners.values()]
    finally:
        await store.destroy()
        await store.aclose()


async def test_pop_hands_each_entry_to_one_process(shared: Backend, namespace: str) -> None:
    url, options = shared.url(namespace)
    store = await shared.open(namespace)
    try:
        keys = [f"item/{index}" for index in range(ITEMS)]
        await store.put_many(keys, [{"item": index} for index in range(ITEMS)])
        outcomes = _run_race(url, options, "pop")
        popped = Counter(key for won in outcomes.values() for key in won)
        assert popped == Counter(keys), f"popped twice: {[k for k, n in popped.items() if n > 1]}"
        assert await store.get_many(keys) == [None] * ITEMS
    finally:
        await store.destroy()
        await store.aclose()
