"""What the standalone benchmark scripts share: the data, the store calls, the measuring loop.

Contenders run interleaved (round-robin, the order rotated every round) so that machine
noise hits all of them alike; round 0 warms up and is discarded; each figure is a median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

Op = Callable[[int], Awaitable[Any]]
"""One operation: called with the iteration number."""

Figures = dict[str, dict[str, float]]
"""op -> contender -> number."""

VALUE = {"value": "x" * 100}
KEYS = [f"key-{i}" for i in range(1000)]
BATCH = 100
BATCHES = [KEYS[start : start + BATCH] for start in range(0, len(KEYS), BATCH)]


def store_ops(store: Any) -> dict[str, Op]:
    """get, put, get_many and put_many (of BATCH keys) on a key-value store (kvstores or py-key-value)."""

    async def get(i: int) -> Any:
        return await store.get(KEYS[i % 1000])

    async def put(i: int) -> None:
        await store.put(KEYS[i % 1000], VALUE)

    async def get_many(i: int) -> Any:
        return await store.get_many(BATCHES[i % len(BATCHES)])

    async def put_many(i: int) -> None:
        keys = BATCHES[i % len(BATCHES)]
        await store.put_many(keys, [VALUE] * len(keys))

    return {"get": get, "put": put, "get_many": get_many, "put_many": put_many}


async def measure(
    contenders: dict[str, Op], calls: int, items_per_call: int, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median items/s, and median client CPU microseconds per item, of each contender."""
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(rounds + 1):  # round 0 warms up and is discarded
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            op = contenders[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for i in range(calls):
                await op(i)
            if round_:
                items = calls * items_per_call
                rates[name].append(items / (time.perf_counter() - start))
                cpu[name].append((time.process_time() - start_cpu) * 1e6 / items)
    return (
        {name: statistics.median(values) for name, values in rates.items()},
        {name: statistics.median(values) for name, values in cpu.items()},
    )


async def measure_ops(contenders: dict[str, dict[str, Op]], ops: int, rounds: int) -> tuple[Figures, Figures]:
    """Populate every contender, then items/s and client CPU per item of each on every op."""
    for ops_of in contenders.values():  # every get reads a stored value
        for i in range(len(BATCHES)):
            await ops_of["put_many"](i)
    results: Figures = {}
    cpu: Figures = {}
    for op in ("get", "put", "get_many", "put_many"):
        batch = op.endswith("_many")
        calls = max(1, ops // 10) if batch else ops
        measured = {name: ops_of[op] for name, ops_of in contenders.items()}
        results[op], cpu[op] = await measure(measured, calls, BATCH if batch else 1, rounds)
    return results, cpu
