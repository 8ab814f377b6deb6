"""Resource bounds: MemoryStore stays within max_entries; aclose() leaves no thread, task or fd behind.

(The pytest configuration turns ResourceWarning into an error, so an unclosed socket or
file found by the garbage collector fails these tests too.)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
from typing import Any

import pytest

from kvstores import MemoryStore
from kvstores.errors import KVStoreError, StoreClosedError
from tests.support import Backend

pytestmark = pytest.mark.anyio

PUTS = 1_000_000
BATCH = 1_000
BOUND = 10_000


async def test_memory_store_stays_bounded_under_a_million_puts() -> None:
    store = MemoryStore(max_entries=BOUND, sweep_interval=0.01)
    values = [{"payload": "x" * 16}] * BATCH
    largest = 0
    for batch in range(PUTS // BATCH):
        await store.put_many([f"{batch}/{i}" for i in range(BATCH)], values, ttl=0.005 if batch % 2 else 60)
        largest = max(largest, len(store))
    assert largest == BOUND
    assert len(await store.keys()) <= BOUND
    await asyncio.sleep(0.01)
    await store.cull()
    remaining = await store.keys()
    assert 0 < len(store) == len(remaining) <= BOUND
    assert all(int(key.partition("/")[0]) % 2 == 0 for key in remaining), "an expired entry survived cull()"
    await store.aclose()


Snapshot = tuple[set[str], set[asyncio.Task[Any]], list[str]]


def _snapshot() -> Snapshot:
    """Threads (by name), asyncio tasks and open file descriptors of this process."""
    gc.collect()
    # bounded pools that outlive any store: the event loop's default executor (getaddrinfo runs
    # there, threads named asyncio_N) and motor's process-wide executor
    motor = sys.modules.get("motor.frameworks.asyncio")
    pools = set(motor._EXECUTOR._threads) if motor is not None else set()
    threads = {
        f"{t.name}#{t.ident}" for t in threading.enumerate() if not t.name.startswith("asyncio_") and t not in pools
    }
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the descriptor listdir itself used
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
    return threads, asyncio.all_tasks(), sorted(fds)


async def _settled(before: Snapshot | None = None, within: float = 5.0) -> Snapshot:
    """A snapshot once it matches ``before`` (or, without one, the previous snapshot): threads end late."""
    deadline = time.monotonic() + within
    previous = before
    while True:
        current = _snapshot()
        if current == previous or time.monotonic() > deadline:
            return current
        if before is None:
            previous = current
        await asyncio.sleep(0.1)


async def _use(store: Any) -> None:
    keys = [f"k{i}" for i in range(20)]
    await store.put_many(keys, [{"i": i} for i in range(20)], collection="c", ttl=60)
    await store.put("k", {"v": 1})
    assert await store.get("k") == {"v": 1}
    assert len(await store.get_many(keys, collection="c")) == 20
    await store.ttl_many(keys[:3], collection="c")
    assert sorted(await store.keys("c")) == sorted(keys)
    await store.collections()
    assert await store.delete_many(keys, collection="c") == 20


async def test_aclose_leaves_nothing_behind(backend: Backend, namespace: str) -> None:
    warm_up = await backend.open(namespace)  # process-wide things a first use may create (drivers, pools)
    await _use(warm_up)
    await warm_up.aclose()
    before = await _settled()
    for _ in range(5):
        store = await backend.open(namespace)
        await _use(store)
        await store.aclose()
        unused = await backend.open(namespace)  # lazy: closing a store never used is fine too
        await unused.aclose()
    threads, tasks, fds = await _settled(before)
    assert threads == before[0], f"threads left: {threads - before[0]}"
    assert tasks == before[1], f"tasks left: {tasks - before[1]}"
    assert fds == before[2], f"descriptors left: {sorted(set(fds) - set(before[2]))}"
    cleaner = await backend.open(namespace)
    await cleaner.destroy()
    await cleaner.aclose()


def _burst(store: Any, count: int) -> list[asyncio.Future[Any]]:
    """``count`` concurrent gets and puts, started but not awaited."""
    return [
        asyncio.ensure_future(store.get("k") if i % 2 else store.put(f"k{i}", {"i": i}, ttl=60)) for i in range(count)
    ]


@pytest.mark.parametrize("in_flight", [0, 1, 50])
@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no-batching"])
async def test_aclose_is_final(backend: Backend, namespace: str, batching: bool, in_flight: int) -> None:
    """Calls in flight at close complete or fail (never hang), queued ones fail with StoreClosedError,
    later ones too, and no thread, task or connection of the store is left or reopened."""
    warm_up = await backend.open(namespace, batching=batching)  # a client the store does not own grows
    await _use(warm_up)
    await asyncio.gather(*_burst(warm_up, in_flight))
    await warm_up.aclose()
    before = await _settled()
    store = await backend.open(namespace, batching=batching)
    await store.put("k", {"v": 1})
    calls = _burst(store, in_flight)
    await asyncio.sleep(0)  # each call is sent, or queued behind the one in flight
    await store.aclose()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 15)
    unexpected = [o for o in outcomes if not (o is None or o == {"v": 1} or isinstance(o, KVStoreError))]
    assert not unexpected, unexpected
    refused = sum(isinstance(outcome, StoreClosedError) for outcome in outcomes)
    if store.batching and in_flight == 50:
        assert refused >= 40, f"only {refused} of the queued calls failed with StoreClosedError: {outcomes}"
    for call in (
        lambda: store.get("k"),
        lambda: store.put("k", {"v": 2}),
        lambda: store.get_many(["k"]),
        lambda: store.delete("k"),
        lambda: store.keys(),
        lambda: store.ping(),
        lambda: store.update("k", lambda v: v),
    ):
        with pytest.raises(StoreClosedError):
            await call()
    await asyncio.sleep(0.2)  # anything that would reopen has had its chance
    threads, tasks, fds = await _settled(before)
    assert threads == before[0], f"threads left: {threads - before[0]}"
    assert tasks == before[1], f"tasks left: {tasks - before[1]}"
    assert fds == before[2], f"descriptors left: {sorted(set(fds) - set(before[2]))}"
    cleaner = await backend.open(namespace)
    await cleaner.destroy()
    await cleaner.aclose()
