"""Child processes of the reliability suite (tests/test_crash.py, test_multiprocess.py, test_sql_servers.py).

Run as ``python -m tests.support.workers crash URL FIRST_GENERATION [TABLE]`` from the
repository root (a writer that loops ``put_many`` of one crash-test batch after another, for
at most 60 s: the SIGKILL tests kill it long before), or as multiprocessing targets. Kept
apart from the test modules so that a child imports only kvstores, what its backend needs and
tests/support/__init__.py (no pytest: the crash test kills children at start-up, so they must
start fast).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import traceback
from typing import Any

from kvstores import open_store

BATCH_KEYS = 50
"""Keys a crash-test batch owns (plus as many shared keys that every batch overwrites)."""

OWN_KEYS = 40
"""Keys each multi-process worker owns."""

SHARED_KEYS = 8
"""Keys every multi-process worker writes."""


def batch(generation: int) -> tuple[list[str], list[dict[str, int]]]:
    """The 100 keys and values of one crash-test put_many."""
    own = [f"{generation}/{i}" for i in range(BATCH_KEYS)]
    shared = [f"shared/{i}" for i in range(BATCH_KEYS)]
    keys = own + shared
    return keys, [{"generation": generation, "i": i} for i in range(len(keys))]


def newest_whole_batch(entries: dict[str, dict[str, int]], *, contiguous: bool = False) -> int:
    """Check that every batch in ``entries`` is whole (and, if ``contiguous``, none is missing
    before the newest) and that the shared keys hold the newest; return it (-1: none)."""
    generations: dict[int, int] = {}
    for key, value in entries.items():
        if not key.startswith("shared/"):
            generations[value["generation"]] = generations.get(value["generation"], 0) + 1
    torn = {generation: count for generation, count in generations.items() if count != BATCH_KEYS}
    assert not torn, f"torn batches (generation: keys present): {torn}"
    newest = max(generations, default=-1)
    if contiguous:
        assert sorted(generations) == list(range(newest + 1)), "a committed batch is missing"
    if newest >= 0:
        keys, values = batch(newest)
        assert {key: entries.get(key) for key in keys} == dict(zip(keys, values))
    elif contiguous:
        assert not entries
    return newest


async def _write_batches(url: str, generation: int, table: str | None) -> None:
    store = open_store(url, **({} if table is None else {"table": table}))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        keys, values = batch(generation)
        await store.put_many(keys, values, collection="batches")
        print(generation, flush=True)  # acknowledged: committed
        generation += 1
    await store.aclose()


def first_use(url: str, table: str, worker: int, barrier: Any, results: Any) -> None:
    """Open a store on a table nobody created yet, at the same moment as the other workers, and write."""

    async def work() -> None:
        store = open_store(url, table=table)
        try:
            await asyncio.to_thread(barrier.wait)
            await store.put(f"w{worker}", {"worker": worker})
        finally:
            await store.aclose()

    try:
        asyncio.run(work())
        results.put((worker, None))
    except BaseException as exc:
        results.put((worker, f"{type(exc).__name__}: {exc}"))


def own_key(worker: int, index: int) -> str:
    """Key ``index`` of ``worker`` (no other worker writes it)."""
    return f"w{worker}/{index}"


def final_shared_value(index: int) -> dict[str, Any]:
    """The value shared key ``index`` holds at the end: written after the barrier by one worker."""
    return {"final": index, "writer": index % 4}


async def _mixed(url: str, options: dict[str, Any], worker: int, operations: int, seed: int, barrier: Any) -> Any:
    rng = random.Random(seed * 100 + worker)
    model: dict[str, dict[str, Any]] = {}
    store = open_store(url, **options)
    try:
        await store.get(own_key(worker, 0))  # connected: now start together
        await asyncio.to_thread(barrier.wait)
        for n in range(operations):
            roll = rng.random()
            keys = [own_key(worker, rng.randrange(OWN_KEYS)) for _ in range(rng.randint(1, 5))]
            key = keys[0]
            if roll < 0.3:
                value = {"worker": worker, "n": n}
                await store.put(key, value)
                model[key] = value
            elif roll < 0.45:
                values = [{"worker": worker, "n": n, "i": i} for i in range(len(keys))]
                await store.put_many(keys, values)
                model.update(zip(keys, values))
            elif roll < 0.6:
                got = await store.get(key)
                assert got == model.get(key), f"worker {worker} op {n}: {key} is {got}, wrote {model.get(key)}"
            elif roll < 0.7:
                got_many = await store.get_many(keys)
                assert got_many == [model.get(k) for k in keys], f"worker {worker} op {n}: get_many {keys}"
            elif roll < 0.8:
                existed = await store.delete(key)
                assert existed == (model.pop(key, None) is not None), f"worker {worker} op {n}: delete {key}"
            elif roll < 0.85:
                distinct = list(dict.fromkeys(keys))
                count = await store.delete_many(keys)
                assert count == sum(model.pop(k, None) is not None for k in distinct), f"worker {worker} op {n}"
            else:
                index = rng.randrange(SHARED_KEYS)
                if rng.random() < 0.5:
                    await store.put(f"shared/{index}", {"worker": worker, "n": n}, collection="shared")
                else:
                    got = await store.get(f"shared/{index}", collection="shared")
                    assert got is None or set(got) == {"worker", "n"}, f"worker {worker}: shared value {got}"
        await asyncio.to_thread(barrier.wait)
        finals = [index for index in range(SHARED_KEYS) if index % 4 == worker]
        for index in finals:
            await store.put(f"shared/{index}", final_shared_value(index), collection="shared")
        return model
    finally:
        await store.aclose()


def mixed_workload(
    url: str, options: dict[str, Any], worker: int, operations: int, seed: int, barrier: Any, results: Any
) -> None:
    """Run ``operations`` random operations on ``worker``'s own keys and on shared keys.

    Puts ``(worker, final model of its own keys)`` on ``results``, or ``(worker, traceback)``
    when anything went wrong (a lost write, "database is locked", a driver error...).
    """
    try:
        results.put((worker, asyncio.run(_mixed(url, options, worker, operations, seed, barrier))))
    except BaseException:
        barrier.abort()
        results.put((worker, traceback.format_exc()))


if __name__ == "__main__":
    if sys.argv[1] == "crash":
        asyncio.run(_write_batches(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None))
