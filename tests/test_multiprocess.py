"""Several processes on one store: 4 processes x 2,000 mixed operations, checked against models.

Each worker (tests/workers.py) owns 40 keys that no other worker writes and checks every
read of them against its own model as it goes (so a lost or misplaced write fails at once);
all workers also write and read 8 shared keys. The workers start together (a barrier once
connected); after the workload they meet again and each writes the final value of the
shared keys it is responsible for. The test then compares the whole store with the union of
the workers' models: nothing lost, nothing extra. Any error in a worker ("database is
locked", a connection error, a failed check) fails the test with the worker's traceback.
MongoDB is left out: on the SecantusDB test server the run takes half a minute.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import pytest

from tests.support import Backend
from tests.workers import OWN_KEYS, SHARED_KEYS, final_shared_value, mixed_workload, own_key

pytestmark = pytest.mark.anyio

WORKERS = 4
OPERATIONS = 2_000


def _store_url(backend: Backend, namespace: str) -> tuple[str, dict[str, Any]]:
    """A URL and options that open the store ``backend.open(namespace)`` would, in another process."""
    if backend.name == "sqlite":
        return f"sqlite:///{backend.folder / f'{namespace}.db'}", {}  # type: ignore[attr-defined]
    if backend.name == "redis":
        from tests.support.redis import REDIS_URL

        return REDIS_URL, {"prefix": namespace}
    return f"redis+cluster://127.0.0.1:{backend.ports[0]}", {"prefix": namespace}  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["sqlite", "redis", "redis-cluster"], indirect=True)
async def test_four_processes_lose_nothing(backend: Backend, namespace: str) -> None:
    url, options = _store_url(backend, namespace)
    seed = int.from_bytes(os.urandom(4), "big")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS, timeout=120)
    results = context.Queue()
    processes = [
        context.Process(target=mixed_workload, args=(url, options, worker, OPERATIONS, seed, barrier, results))
        for worker in range(WORKERS)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = dict(results.get(timeout=300) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
    failures = {worker: outcome for worker, outcome in outcomes.items() if isinstance(outcome, str)}
    assert not failures, f"seed {seed}: " + "\n".join(f"worker {w}:\n{text}" for w, text in failures.items())
    assert [process.exitcode for process in processes] == [0] * WORKERS

    expected = {key: value for model in outcomes.values() for key, value in model.items()}
    store = await backend.open(namespace)
    try:
        every_key = [own_key(worker, index) for worker in range(WORKERS) for index in range(OWN_KEYS)]
        assert await store.get_many(every_key) == [expected.get(key) for key in every_key], f"seed {seed}"
        assert sorted(await store.keys()) == sorted(expected), f"seed {seed}"
        shared = [f"shared/{index}" for index in range(SHARED_KEYS)]
        assert await store.get_many(shared, collection="shared") == [final_shared_value(i) for i in range(SHARED_KEYS)]
    finally:
        await store.destroy()
        await store.aclose()
