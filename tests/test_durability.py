"""Durability across a server crash: Redis with ``appendonly yes`` and ``appendfsync always``.

A workload writes new keys (put, put_many) and deletes acknowledged ones through one
RedisStore while the test kills the server with SIGKILL and restarts it on the same port
and directory. Every operation must either succeed or raise StoreConnectionError within its
timeout; afterwards every acknowledged write (and delete) must be there, every write whose
outcome was an error must be either wholly there or absent, and the same store object must
have recovered. (Stopping and restarting mid-workload in general is tested in test_redis.py.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from kvstores.errors import StoreConnectionError
from tests.support.redis import RedisServer, own_redis

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

TIMEOUT = 1.0
"""The store's timeout: every operation must end within a few of these."""

AOF_OPTIONS = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def aof_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server with an fsync-always append-only file in its own directory."""
    with own_redis(tmp_path, *AOF_OPTIONS) as server:
        yield server


class Workload:
    """Writes new keys and deletes acknowledged ones, recording what was acknowledged."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.acknowledged: dict[str, dict[str, int] | None] = {}  # None: acknowledged delete
        self.uncertain: dict[str, dict[str, int]] = {}  # written or deleted with an error
        self.failures = 0
        self.successes_by_phase = [0, 0, 0]
        self.phase = 0
        self.slowest = 0.0

    async def operation(self, n: int) -> None:
        start = time.monotonic()
        try:
            victim = next((key for key, value in self.acknowledged.items() if value is not None), None)
            if n % 7 == 0 and victim is not None:
                key = victim
                self.uncertain[key] = self.acknowledged.pop(key)  # type: ignore[assignment]
                await self.store.delete(key)
                del self.uncertain[key]
                self.acknowledged[key] = None
            else:
                keys = [f"k{n}"] if n % 5 else [f"k{n}.{i}" for i in range(3)]
                values = [{"n": n, "i": i} for i in range(len(keys))]
                self.uncertain.update(zip(keys, values))
                await self.store.put_many(keys, values) if len(keys) > 1 else await self.store.put(keys[0], values[0])
                for key in keys:
                    self.acknowledged[key] = self.uncertain.pop(key)
            self.successes_by_phase[self.phase] += 1
        except StoreConnectionError:
            self.failures += 1
        self.slowest = max(self.slowest, time.monotonic() - start)

    async def run(self, done: anyio.Event) -> None:
        n = 0
        while not done.is_set():
            n += 1
            await self.operation(n)
            await anyio.sleep(0.001)


async def test_acknowledged_writes_survive_kill_and_restart(aof_server: RedisServer) -> None:
    from kvstores.backends.redis import RedisStore

    store = RedisStore(f"redis://127.0.0.1:{aof_server.port}/0", timeout=TIMEOUT)
    workload = Workload(store)
    done = anyio.Event()
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(workload.run, done)
            await anyio.sleep(0.5)
            workload.phase = 1
            await anyio.to_thread.run_sync(aof_server.kill)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(aof_server.start)
            workload.phase = 2
            await anyio.sleep(0.5)
            done.set()
    try:
        assert workload.successes_by_phase[0] > 50, "the workload hardly ran before the crash"
        assert workload.failures > 0, "no operation noticed the crash"
        assert workload.successes_by_phase[2] > 0, "the store did not recover after the restart"
        assert workload.slowest < 4 * TIMEOUT, f"an operation took {workload.slowest:.1f} s"
        acknowledged = list(workload.acknowledged)
        values = await store.get_many(acknowledged)
        lost = {
            key: workload.acknowledged[key]
            for key, got in zip(acknowledged, values)
            if got != workload.acknowledged[key]
        }
        assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged writes lost, e.g. {list(lost.items())[:5]}"
        uncertain = list(workload.uncertain)
        for key, got in zip(uncertain, await store.get_many(uncertain)):
            assert got in (None, workload.uncertain[key]), f"{key}: {got}"
    finally:
        await store.destroy()
        await store.aclose()
