"""MemoryStore and SQLiteStore against their baselines, measured in one run.

Contenders run interleaved (round-robin, order rotated every round) so that machine
noise hits all of them alike; each figure is the median ops/s over the rounds.

- memory put/get of {"value": "x"*100}: kvstores MemoryStore vs py-key-value-aio's
  MemoryStore vs a minimal asyncio dict + json baseline;
- sqlite get: SQLiteStore.get vs a raw aiosqlite primary-key SELECT on the same schema.

Run: python benchmarks/bench_core.py [--rounds 7] [--ops 20000]
Writes benchmarks/results/core.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import aiosqlite
from _interleave import KEYS, VALUE, Op, measure  # benchmarks/ is on sys.path when a script runs
from key_value.aio.stores.memory import MemoryStore as PyKeyValueMemoryStore

from kvstores import MemoryStore
from kvstores.backends.sqlite import SQLiteStore


def dict_json_baseline() -> tuple[Op, Op]:
    """The minimal asyncio dict + json store the issue names as the floor."""
    data: dict[str, str] = {}

    async def put(i: int) -> None:
        data[KEYS[i % 1000]] = json.dumps(VALUE)

    async def get(i: int) -> Any:
        return json.loads(data[KEYS[i % 1000]])

    return put, get


async def rates(contenders: dict[str, Op], ops: int, rounds: int) -> dict[str, float]:
    """Median ops/s of each contender."""
    return (await measure(contenders, ops, 1, rounds))[0]


async def memory_scenarios(ops: int, rounds: int) -> dict[str, dict[str, float]]:
    ours, theirs = MemoryStore(), PyKeyValueMemoryStore()
    base_put, base_get = dict_json_baseline()
    puts = await rates(
        {
            "kvstores": lambda i: ours.put(KEYS[i % 1000], VALUE),
            "py-key-value": lambda i: theirs.put(KEYS[i % 1000], VALUE),
            "dict+json": base_put,
        },
        ops,
        rounds,
    )
    gets = await rates(
        {
            "kvstores": lambda i: ours.get(KEYS[i % 1000]),
            "py-key-value": lambda i: theirs.get(KEYS[i % 1000]),
            "dict+json": base_get,
        },
        ops,
        rounds,
    )
    return {"memory put": puts, "memory get": gets}


async def sqlite_scenarios(ops: int, rounds: int, folder: Path) -> dict[str, dict[str, float]]:
    store = SQLiteStore(folder / "bench.db")
    await store.put_many(KEYS, [VALUE] * len(KEYS))
    raw = await aiosqlite.connect(folder / "bench.db", isolation_level=None)
    await raw.execute("PRAGMA journal_mode = WAL")
    select = "SELECT value FROM kvstores_entries WHERE collection = ? AND key = ?"

    async def raw_get(i: int) -> Any:
        async with raw.execute(select, ("default", KEYS[i % 1000])) as cursor:
            row = await cursor.fetchone()
        return json.loads(row[0]) if row else None

    async def raw_get_fetchall(i: int) -> Any:
        rows = await raw.execute_fetchall(select, ("default", KEYS[i % 1000]))
        return [json.loads(row[0]) for row in rows]

    try:
        gets = await rates(
            {
                "kvstores": lambda i: store.get(KEYS[i % 1000]),
                "aiosqlite": raw_get,
                "aiosqlite fetchall": raw_get_fetchall,
            },
            ops // 4,
            rounds,
        )
    finally:
        await raw.close()
        await store.aclose()
    return {"sqlite get": gets}


def report(results: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Print a table and return the JSON document with ratios."""
    ratios = {
        "memory put vs py-key-value": results["memory put"]["kvstores"] / results["memory put"]["py-key-value"],
        "memory get vs py-key-value": results["memory get"]["kvstores"] / results["memory get"]["py-key-value"],
        "memory put vs dict+json": results["memory put"]["kvstores"] / results["memory put"]["dict+json"],
        "memory get vs dict+json": results["memory get"]["kvstores"] / results["memory get"]["dict+json"],
        "sqlite get vs aiosqlite": results["sqlite get"]["kvstores"] / results["sqlite get"]["aiosqlite"],
        "sqlite get vs aiosqlite fetchall": results["sqlite get"]["kvstores"]
        / results["sqlite get"]["aiosqlite fetchall"],
    }
    for scenario, figures in results.items():
        for name, ops in figures.items():
            print(f"{scenario:<12} {name:<20} {ops:>12,.0f} ops/s")
    for name, ratio in ratios.items():
        print(f"{name:<34} {ratio:6.2f}x")
    return {
        "machine": {"python": platform.python_version(), "cpu_count": __import__("os").cpu_count()},
        "ops_per_second": results,
        "ratios": ratios,
        "targets": {
            "memory vs py-key-value": ">= 10x",
            "memory vs dict+json": ">= 0.5x (within 2x)",
            "sqlite get vs aiosqlite": ">= 0.8x",
        },
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "core.json")
    options = parser.parse_args()
    results = await memory_scenarios(options.ops, options.rounds)
    with tempfile.TemporaryDirectory() as folder:
        results |= await sqlite_scenarios(options.ops, options.rounds, Path(folder))
    options.out.write_text(json.dumps(report(results), indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
