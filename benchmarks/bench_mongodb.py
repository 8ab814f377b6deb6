"""MongoDBStore against raw pymongo async on the same server, measured in one run.

Contenders run interleaved in many short rounds (round-robin, order rotated every round) so
that machine noise hits both alike; each figure is the median over the rounds, in items per
second (a batch call of 100 keys counts 100); the client process's CPU time per item is
reported too, as it is less sensitive to other load on the machine. Both contenders store
{"value": "x"*100} as JSON text in the same document shape ({"_id": <string>, "c":
<collection>, "v": <JSON text>}) and return dicts, one coroutine at a time (latency-bound, as
an MCP server's calls are):

- raw: pymongo.AsyncMongoClient with json.dumps/json.loads: find_one / replace_one(upsert=True),
  one find with $in, one unordered bulk_write of ReplaceOne(upsert=True);
- kvstores: MongoDBStore.get / put / get_many / put_many.

The raw client runs with pymongo's defaults, so it has no socket timeout; MongoDBStore's own
client has one (its ``timeout`` option, so that a hung server raises StoreConnectionError),
and pymongo's asyncio network layer spends about 25 us of client CPU per call on it.

The server is a SecantusDB started for the run (a MongoDB-wire server written in Python, so
absolute figures are far below a real mongod's), or the MongoDB at --url /
$KVSTORES_MONGODB_URL.

Run: python benchmarks/bench_mongodb.py [--url mongodb://...] [--rounds 40] [--ops 200]
Writes benchmarks/results/mongodb.json. The benchmark's collection is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pymongo
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
from pymongo import AsyncMongoClient, MongoClient, ReplaceOne

from kvstores.backends.mongodb import MongoDBStore

DATABASE = "kvstores_bench"
COLLECTIONS = {"kvstores": "kvstores", "raw": "raw"}  # one MongoDB collection per contender
TARGETS = {"vs raw: get, put": 0.85, "vs raw: get_many, put_many": 0.85}


@contextmanager
def secantus_server() -> Iterator[str]:
    """Run a SecantusDB on a free local port for the benchmark; yield its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(Path(sys.executable).parent / "secantusd-py"), "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--storage-path", ":memory:", "--log-level", "WARNING"], stderr=subprocess.DEVNULL
    )
    url = f"mongodb://127.0.0.1:{port}/"
    try:
        client: MongoClient[dict[str, Any]] = MongoClient(url, serverSelectionTimeoutMS=30_000)
        with client:
            client.admin.command("ping")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def raw_ops(collection: Any) -> dict[str, Op]:
    """What a careful user of pymongo's async API writes by hand, JSON included."""
    prefix = "7:default"  # the document shape MongoDBStore uses for collection "default"

    async def get(i: int) -> Any:
        document = await collection.find_one({"_id": prefix + KEYS[i % 1000]})
        return None if document is None else json.loads(document["v"])

    async def put(i: int) -> None:
        await collection.replace_one(
            {"_id": prefix + KEYS[i % 1000]}, {"c": "default", "v": json.dumps(VALUE)}, upsert=True
        )

    async def get_many(i: int) -> Any:
        ids = [prefix + key for key in BATCHES[i % len(BATCHES)]]
        found = {d["_id"]: d["v"] for d in await collection.find({"_id": {"$in": ids}}).to_list(None)}
        return [json.loads(found[id_]) if id_ in found else None for id_ in ids]

    async def put_many(i: int) -> None:
        requests = [
            ReplaceOne({"_id": prefix + key}, {"c": "default", "v": json.dumps(VALUE)}, upsert=True)
            for key in BATCHES[i % len(BATCHES)]
        ]
        await collection.bulk_write(requests, ordered=False)

    return {"get": get, "put": put, "get_many": get_many, "put_many": put_many}


async def scenarios(url: str, ops: int, rounds: int) -> tuple[Figures, Figures]:
    """Items/s and client CPU per item of both contenders on every op; drops what it wrote."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    database = client[DATABASE]
    store = MongoDBStore(url, database=DATABASE, collection=COLLECTIONS["kvstores"])
    contenders = {"kvstores": store_ops(store), "raw": raw_ops(database[COLLECTIONS["raw"]])}
    try:
        results, cpu = await measure_ops(contenders, ops, rounds)
    finally:
        for name in COLLECTIONS.values():
            await database.drop_collection(name)
        await store.aclose()
        await client.close()
    return results, cpu


def print_table(figures: Figures, ratios: dict[str, float], unit: str, number: str) -> None:
    """One line per op: each contender's figure, then kvstores' ratio to raw."""
    print(f"{'op':<10} {'kvstores':>12} {'raw':>12} {'vs raw':>8}  ({unit})")
    for op, row in figures.items():
        print(f"{op:<10} {row['kvstores']:>12{number}} {row['raw']:>12{number}} {ratios[op]:>7.2f}x")


def report(results: Figures, cpu: Figures) -> dict[str, Any]:
    """Print the tables and return the JSON document with ratios."""
    ratios = {op: figures["kvstores"] / figures["raw"] for op, figures in results.items()}
    # like the ratios of items/s: above 1 means kvstores spends less client CPU per item
    cpu_ratios = {op: figures["raw"] / figures["kvstores"] for op, figures in cpu.items()}
    print_table(results, ratios, "items/s", ",.0f")
    print_table(cpu, cpu_ratios, "client CPU us/item", ".1f")
    met = {
        "vs raw: get, put": all(ratios[op] >= TARGETS["vs raw: get, put"] for op in ("get", "put")),
        "vs raw: get_many, put_many": all(
            ratios[op] >= TARGETS["vs raw: get_many, put_many"] for op in ("get_many", "put_many")
        ),
    }
    for target, ok in met.items():
        print(f"target {target} >= {TARGETS[target]}x: {'met' if ok else 'MISSED'}")
    return {
        "machine": {
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "pymongo": pymongo.__version__,
            "load_average_1min": os.getloadavg()[0],  # other work on the machine at the end of the run
        },
        "unit": "items per second (median of interleaved rounds; batches of 100 keys count 100)",
        "items_per_second": results,
        "ratios_vs_raw": ratios,
        "client_cpu_us_per_item": cpu,
        "client_cpu_ratios_vs_raw": cpu_ratios,
        "targets": {name: f">= {value}x" for name, value in TARGETS.items()},
        "targets_met": met,
    }


def server_description(url: str) -> str:
    """What answered at ``url``: SecantusDB with its package version, or MongoDB's version."""
    client: MongoClient[dict[str, Any]] = MongoClient(url, serverSelectionTimeoutMS=5000)
    with client:
        build = client.admin.command("buildInfo")
    if "secantus" in json.dumps(build, default=str).lower():
        try:
            return f"SecantusDB {version('SecantusDB')} (wire version of MongoDB {build.get('version')})"
        except PackageNotFoundError:
            return f"SecantusDB (MongoDB {build.get('version')})"
    return f"MongoDB {build.get('version')}"


async def run(url: str, options: argparse.Namespace) -> dict[str, Any]:
    """Run every scenario against ``url`` and return the JSON document."""
    document = report(*await scenarios(url, options.ops, options.rounds))
    document["machine"]["server"] = server_description(url)
    document["options"] = {"rounds": options.rounds, "ops": options.ops, "batch": BATCH}
    return document


def main() -> None:
    """Parse the options, run the scenarios, print the tables and write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("KVSTORES_MONGODB_URL"), help="default: start a SecantusDB")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument(
        "--ops", type=int, default=200, help="single-key calls per contender per round (batches: a tenth)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mongodb.json")
    options = parser.parse_args()
    if options.url:
        document = asyncio.run(run(options.url, options))
    else:
        with secantus_server() as url:
            document = asyncio.run(run(url, options))
    options.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
