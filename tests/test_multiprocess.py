"""Several processes on one store: 4 processes x 2,000 mixed operations, checked against models.

Every row of the backend table that other processes can share runs it (a row's
``process_operations`` lowers the count where the test server is slow: SecantusDB). Each
worker (tests/support/workers.py) owns 40 keys that no other worker writes and checks every
read of them against its own model as it goes (so a lost or misplaced write fails at once);
all workers also write and read 8 shared keys. The workers start together (a barrier once
connected); after the workload they meet again and each writes the final value of the
shared keys it is responsible for. The test then compares the whole store with the union of
the workers' models: nothing lost, nothing extra. Any error in a worker ("database is
locked", a connection error, a failed check) fails the test with the worker's traceback.
"""

from __future__ import annotations

import os

import pytest

from tests.support import Backend, run_processes
from tests.support.workers import OWN_KEYS, SHARED_KEYS, final_shared_value, mixed_workload, own_key

pytestmark = pytest.mark.anyio

WORKERS = 4


async def test_four_processes_lose_nothing(backend: Backend, namespace: str) -> None:
    if not backend.processes:
        pytest.skip(f"{backend.name}: not run in several processes")
    url, options = backend.url(namespace)
    operations = backend.process_operations
    seed = int.from_bytes(os.urandom(4), "big")
    outcomes = run_processes(mixed_workload, [(url, options, worker, operations, seed) for worker in range(WORKERS)])
    failures = {worker: outcome for worker, outcome in outcomes.items() if isinstance(outcome, str)}
    assert not failures, f"seed {seed}: " + "\n".join(f"worker {w}:\n{text}" for w, text in failures.items())

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
