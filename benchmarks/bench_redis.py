"""RedisStore against raw redis.asyncio and py-key-value-aio's RedisStore, measured in one run.

Contenders run interleaved in many short rounds (round-robin, order rotated every round) so
that machine noise hits all of them alike; each figure is the median over the rounds, in items per second
(a batch call of 100 keys counts 100); the client process's CPU time per item is reported
too, as it is less sensitive to other load on the machine. Every contender stores {"value": "x"*100} as JSON
text and returns dicts, one coroutine at a time (latency-bound, as an MCP server's calls are):

- raw: redis.asyncio with json.dumps/json.loads: GET / SET, MGET, and a pipeline of one SET
  per item (not a transaction);
- kvstores: RedisStore.get / put / get_many / put_many (put_many is atomic);
- py-key-value: key_value.aio.stores.redis.RedisStore, same calls.

Run: python benchmarks/bench_redis.py [--url redis://127.0.0.1:6379/15] [--rounds 60] [--ops 250]
Writes benchmarks/results/redis.json. The keys used are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Any

import redis
from _interleave import (  # benchmarks/ is on sys.path when a script runs
    BATCH,
    BATCHES,
    KEYS,
    VALUE,
    Figures,
    Op,
    measure_ops,
    store_ops,
)
from key_value.aio.stores.redis import RedisStore as PyKeyValueRedisStore
from redis.asyncio import Redis
from redis.utils import HIREDIS_AVAILABLE

from kvstores.backends.redis import RedisStore

PREFIX = "bench-kvstores"
TARGETS = {"vs raw: get, put": 0.9, "vs raw: get_many, put_many": 0.7, "vs py-key-value: every op": 1.3}


def raw_ops(client: Redis) -> dict[str, Op]:
    """What a careful user of redis.asyncio writes by hand, JSON included."""

    async def get(i: int) -> Any:
        text = await client.get(f"raw:{KEYS[i % 1000]}")
        return None if text is None else json.loads(text)

    async def put(i: int) -> None:
        await client.set(f"raw:{KEYS[i % 1000]}", json.dumps(VALUE))

    async def get_many(i: int) -> Any:
        texts = await client.mget([f"raw:{key}" for key in BATCHES[i % len(BATCHES)]])
        return [None if text is None else json.loads(text) for text in texts]

    async def put_many(i: int) -> None:
        pipe = client.pipeline(transaction=False)
        for key in BATCHES[i % len(BATCHES)]:
            pipe.set(f"raw:{key}", json.dumps(VALUE))
        await pipe.execute()

    return {"get": get, "put": put, "get_many": get_many, "put_many": put_many}


async def scenarios(url: str, ops: int, rounds: int) -> tuple[Figures, Figures]:
    """Items/s and client CPU per item of every contender on every op; cleans up its keys."""
    raw = Redis.from_url(url)
    ours = RedisStore.from_url(url, prefix=PREFIX)
    theirs = PyKeyValueRedisStore(url=url)
    contenders = {"kvstores": store_ops(ours), "raw": raw_ops(raw), "py-key-value": store_ops(theirs)}
    try:
        results, cpu = await measure_ops(contenders, ops, rounds)
    finally:
        await ours.destroy()
        await theirs.delete_many(KEYS)
        await raw.delete(*(f"raw:{key}" for key in KEYS))
        await ours.aclose()
        await theirs.close()
        await raw.aclose()
    return results, cpu


def print_table(figures: Figures, ratios: dict[str, float], unit: str, number: str) -> None:
    """One line per op: each contender's figure, then kvstores' ratios to the others."""
    print(f"{'op':<10} {'kvstores':>12} {'raw':>12} {'py-key-value':>13} {'vs raw':>8} {'vs pykv':>8}  ({unit})")
    for op, row in figures.items():
        print(
            f"{op:<10} {row['kvstores']:>12{number}} {row['raw']:>12{number}} {row['py-key-value']:>13{number}}"
            f" {ratios[f'{op} vs raw']:>7.2f}x {ratios[f'{op} vs py-key-value']:>7.2f}x"
        )


def report(results: Figures, cpu: Figures) -> dict[str, Any]:
    """Print a table and return the JSON document with ratios."""
    ratios = {
        f"{op} vs {baseline}": figures["kvstores"] / figures[baseline]
        for op, figures in results.items()
        for baseline in ("raw", "py-key-value")
    }
    cpu_ratios = {  # like the ratios of items/s: above 1 means kvstores spends less CPU per item
        f"{op} vs {baseline}": figures[baseline] / figures["kvstores"]
        for op, figures in cpu.items()
        for baseline in ("raw", "py-key-value")
    }
    print_table(results, ratios, "items/s", ",.0f")
    print_table(cpu, cpu_ratios, "client CPU us/item", ".2f")
    met = {
        "vs raw: get, put": all(ratios[f"{op} vs raw"] >= TARGETS["vs raw: get, put"] for op in ("get", "put")),
        "vs raw: get_many, put_many": all(
            ratios[f"{op} vs raw"] >= TARGETS["vs raw: get_many, put_many"] for op in ("get_many", "put_many")
        ),
        "vs py-key-value: every op": all(
            ratios[f"{op} vs py-key-value"] >= TARGETS["vs py-key-value: every op"] for op in results
        ),
    }
    for target, ok in met.items():
        print(f"target {target} >= {TARGETS[target]}x: {'met' if ok else 'MISSED'}")
    return {
        "machine": {
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "redis-py": redis.__version__,
            "hiredis": HIREDIS_AVAILABLE,
            "load_average_1min": os.getloadavg()[0],  # other work on the machine at the end of the run
        },
        "unit": "items per second (median of interleaved rounds; batches of 100 keys count 100)",
        "items_per_second": results,
        "ratios": ratios,
        "client_cpu_us_per_item": cpu,
        "client_cpu_ratios": cpu_ratios,
        "targets": {name: f">= {value}x" for name, value in TARGETS.items()},
        "targets_met": met,
    }


async def main() -> None:
    """Parse the options, run the scenarios, print the table and write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--ops", type=int, default=250, help="single-key calls per contender per round (batches: a tenth)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "redis.json")
    options = parser.parse_args()
    document = report(*await scenarios(options.url, options.ops, options.rounds))
    document["options"] = {"rounds": options.rounds, "ops": options.ops, "batch": BATCH}
    with redis.Redis.from_url(options.url) as client:
        document["machine"]["redis-server"] = client.info("server")["redis_version"]
    options.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
