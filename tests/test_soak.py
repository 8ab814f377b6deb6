"""Soak: a mixed load on every backend at once; resources stay flat and nothing warns.

Marked ``soak`` and skipped unless KVSTORES_SOAK_SECONDS is set: CI runs
``KVSTORES_SOAK_SECONDS=60 python -m pytest -m soak tests/test_soak.py``, the long run is
``KVSTORES_SOAK_SECONDS=600 python -m pytest -m soak tests/test_soak.py -s`` (``-s`` prints
the figures). Each backend (memory, SQLite, Redis, MongoDB, PostgreSQL) gets a few tasks of
single and bulk calls, TTLs, listings and atomic operations over a bounded key space, all in
one event loop. Sampled every tenth of the run: the process's RSS, open file descriptors and
asyncio tasks, the server-side connections of Redis (CLIENT LIST, by client name) and
PostgreSQL (pg_stat_activity, by application name). After the first fifth (warm-up), none may
grow beyond a small allowance, and no warning may be emitted.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvstores.errors import KVStoreError
from tests.support import BACKENDS, Backend, entry_class
from tests.support.fixtures import start_row

SECONDS_VARIABLE = "KVSTORES_SOAK_SECONDS"
KEYS = 500
"""Keys per backend: the data set stays bounded however long the run."""
WORKERS = 3
"""Tasks of load per backend."""
PAUSE = 0.002
"""Seconds each worker rests between calls."""
CLIENT_NAME = "kvstores-soak"
RSS_ALLOWANCE_MB = 25.0
"""RSS may grow this much after the warm-up (allocator noise, caches filling), no more."""
FD_ALLOWANCE = 6
"""Descriptors may grow this much after the warm-up: pools open connections lazily, when contention
first asks for one (a CI run saw 44 become 46 at 49 s). A leak grows with the calls, hundreds of
thousands of them, not by a few."""
TASK_ALLOWANCE = 20
"""Tasks beyond the workers, the test and two batch flushers a store: the drivers' own background
tasks (pymongo's monitors) and transient ones. A leak of one task per many calls exceeds it."""

pytestmark = [
    pytest.mark.soak,
    pytest.mark.anyio,
    pytest.mark.skipif(SECONDS_VARIABLE not in os.environ, reason=f"set {SECONDS_VARIABLE} to run the soak"),
]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Sample:
    at: float
    rss_mb: float
    fds: int
    tasks: int
    server_connections: dict[str, int]


@dataclass
class Soak:
    stores: dict[str, Any]
    counters: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    async def _step(self, row: str, store: Any, n: int) -> None:
        key = f"k{random.randrange(KEYS)}"
        kind = n % 10
        if kind in (0, 1):
            await store.put(key, {"n": n, "pad": "x" * (n % 200)}, ttl=random.choice([None, 0.5, 30]))
        elif kind in (2, 3):
            await store.get(key)
        elif kind == 4:
            keys = [f"k{random.randrange(KEYS)}" for _ in range(20)]
            await store.put_many(keys, [{"n": n}] * len(keys), ttl=10)
        elif kind == 5:
            await store.get_many([f"k{random.randrange(KEYS)}" for _ in range(50)])
        elif kind == 6:
            await store.delete_many([f"k{random.randrange(KEYS)}" for _ in range(5)])
        elif kind == 7:
            await store.update(key, lambda old: {"n": (old or {}).get("n", 0) + 1})
        elif kind == 8:
            if await store.put_if_absent(f"p{key}", {"n": n}, ttl=5):
                await store.pop(f"p{key}")
        else:
            await store.keys(limit=50)
            await store.ttl(key)

    async def worker(self, row: str, deadline: float) -> None:
        store = self.stores[row]
        for n in range(10_000_000):  # bounded by the deadline too
            if time.monotonic() > deadline:
                return
            try:
                await self._step(row, store, n)
            except KVStoreError as exc:  # a conflict under contention is allowed; it is counted
                self.counters[f"{row} {type(exc).__name__}"] = self.counters.get(f"{row} {type(exc).__name__}", 0) + 1
                if type(exc).__name__ != "ConflictError":
                    self.failures.append(f"{row}: {type(exc).__name__}: {exc}")
            self.counters[row] = self.counters.get(row, 0) + 1
            await asyncio.sleep(PAUSE)  # a steady load, not a saturating one (and memory calls never yield)


async def _server_connections(backends: dict[str, Backend]) -> dict[str, int]:
    """Connections the servers see from this soak, where a row can count them (by the tag's name)."""
    counts = {row: await backend.connections(CLIENT_NAME) for row, backend in backends.items()}
    return {row: count for row, count in counts.items() if count is not None}


def _soak_rows() -> list[str]:
    """One row per kind of store: every row but those that differ from another only in a client object."""
    return [name for name in BACKENDS if (entry := entry_class(name)).processes or not entry.persistent]


async def test_soak(started: dict[str, Backend | str], capsys: pytest.CaptureFixture[str]) -> None:
    seconds = float(os.environ[SECONDS_VARIABLE])
    backends: dict[str, Backend] = {}
    for row in _soak_rows():
        backends[row] = start_row(row, started)
    namespace = f"soak{os.getpid()}"
    stores = {row: await backend.open(namespace, **backend.tagged(CLIENT_NAME)) for row, backend in backends.items()}
    soak = Soak(stores)
    samples: list[Sample] = []

    async def sample() -> None:
        gc.collect()
        samples.append(
            Sample(time.monotonic(), _rss_mb(), _fds(), len(asyncio.all_tasks()), await _server_connections(backends))
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            deadline = time.monotonic() + seconds
            workers = [asyncio.create_task(soak.worker(row, deadline)) for row in stores for _ in range(WORKERS)]
            for _ in range(10):
                await asyncio.sleep(seconds / 10)
                await sample()
            await asyncio.gather(*workers)
        finally:
            for store in stores.values():
                await store.destroy()
                await store.aclose()
    baseline = samples[1]  # after the first fifth: the warm-up
    end = samples[-2]  # the last sample with every worker still running
    peak = {
        "rss_mb": max(s.rss_mb for s in samples[1:]),
        "fds": max(s.fds for s in samples[1:]),
        "tasks": max(s.tasks for s in samples[1:]),
    }
    report = (
        f"\nsoak {seconds:.0f} s, calls: {dict(sorted(soak.counters.items()))}\n"
        + "\n".join(
            f"  t={s.at - samples[0].at + seconds / 10:5.0f}s rss={s.rss_mb:6.1f} MB fds={s.fds:3d} "
            f"tasks={s.tasks:3d} server connections={s.server_connections}"
            for s in samples
        )
        + f"\n  peak after warm-up: {peak}"
    )
    with capsys.disabled():
        print(report)
    assert not soak.failures, soak.failures[:5]
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught][:5]
    assert peak["rss_mb"] - baseline.rss_mb <= RSS_ALLOWANCE_MB, report
    assert peak["fds"] - baseline.fds <= FD_ALLOWANCE, report
    assert peak["tasks"] <= len(stores) * (WORKERS + 2) + TASK_ALLOWANCE, report
    for server, count in end.server_connections.items():
        assert count <= max(s.server_connections[server] for s in samples[:2]) + 1, report
