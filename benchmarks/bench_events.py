"""Event stores: kvstores' StoreEventStore against FastMCP's KV-backed EventStore, on the same stores.

Run: ``python benchmarks/bench_events.py [--rounds N] [--output PATH]``. Not a test.

Both event stores run over the very same kvstores store object (memory, SQLite file, and
Redis at 127.0.0.1:6379 when it answers), in the same process, in interleaved rounds (the
order of the two flips every round); every figure is the median over the rounds.

- append: mean cost of one ``store_event`` while a fresh stream grows to 100 events.
- replay: one ``replay_events_after`` from the first event of a 100-event stream (99 sent).
- append by length: mean cost of 20 ``store_event`` calls on a stream that already holds
  10, 100 or 1,000 events; both stores keep 1,000 events per stream here, so nothing is
  trimmed and the figure shows how the cost grows with the stream.

``in-process`` compares the two stores' in-memory defaults: InMemoryEventStore against
FastMCP's EventStore() (py-key-value's MemoryStore).
Writes ``benchmarks/results/events.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

from fastmcp.server.event_store import EventStore as FastMCPEventStore
from mcp.server.streamable_http import EventMessage, EventStore
from mcp.types import JSONRPCNotification

from kvstores.backends.memory import MemoryStore
from kvstores.backends.sqlite import SQLiteStore
from kvstores.events import InMemoryEventStore, StoreEventStore

STREAM = 100
LENGTHS = (10, 100, 1_000)
GROWTH_APPENDS = 20
RESULTS = Path(__file__).parent / "results" / "events.json"

Factory = Callable[[int], EventStore]


def message(index: int) -> JSONRPCNotification:
    """A typical progress notification."""
    params = {"progressToken": "tok-1", "progress": index, "total": 1000, "message": f"processed item {index}"}
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params=params)


async def fill(event_store: EventStore, stream_id: str, count: int) -> str:
    """Store a priming event and ``count - 1`` messages; return the priming event's id."""
    first = await event_store.store_event(stream_id, None)
    for index in range(1, count):
        await event_store.store_event(stream_id, message(index))
    return first


async def time_append(event_store: EventStore) -> float:
    """Seconds per store_event while a fresh stream grows to STREAM events."""
    stream_id = uuid.uuid4().hex
    began = time.perf_counter()
    await fill(event_store, stream_id, STREAM)
    return (time.perf_counter() - began) / STREAM


async def time_replay(event_store: EventStore, first: str) -> float:
    """Seconds for one replay of a STREAM-event stream."""
    received: list[EventMessage] = []

    async def send(event: EventMessage) -> None:
        received.append(event)

    began = time.perf_counter()
    await event_store.replay_events_after(first, send)
    elapsed = time.perf_counter() - began
    assert len(received) == STREAM - 1, len(received)
    return elapsed


async def time_append_at(event_store: EventStore, length: int) -> float:
    """Seconds per store_event on a stream that already holds ``length`` events."""
    stream_id = uuid.uuid4().hex
    await fill(event_store, stream_id, length)
    began = time.perf_counter()
    for index in range(GROWTH_APPENDS):
        await event_store.store_event(stream_id, message(length + index))
    return (time.perf_counter() - began) / GROWTH_APPENDS


async def redis_store() -> Any | None:
    """A RedisStore on 127.0.0.1:6379 under a private prefix, or None when Redis does not answer."""
    try:
        from kvstores.backends.redis import RedisStore
    except ImportError:
        return None
    store = RedisStore("redis://127.0.0.1:6379/0", prefix=f"kvbench{uuid.uuid4().hex[:8]}", timeout=1.0)
    try:
        await store.put("probe", {"ok": True})
    except Exception:
        await store.aclose()
        return None
    return store


def pairs(stores: dict[str, Any]) -> dict[str, dict[str, Factory]]:
    """Backend -> {"kvstores": factory, "fastmcp": factory}, each factory taking max events per stream."""
    table: dict[str, dict[str, Factory]] = {
        name: {
            "kvstores": lambda keep, store=store: StoreEventStore(store, max_events_per_stream=keep),
            "fastmcp": lambda keep, store=store: FastMCPEventStore(storage=store, max_events_per_stream=keep),
        }
        for name, store in stores.items()
    }
    table["in-process"] = {
        "kvstores": lambda keep: InMemoryEventStore(max_events_per_stream=keep),
        "fastmcp": lambda keep: FastMCPEventStore(max_events_per_stream=keep),
    }
    return table


async def measure(table: dict[str, dict[str, Factory]], rounds: int) -> dict[str, Any]:
    """Run every scenario ``rounds`` times, interleaved; return the samples."""
    samples: dict[str, Any] = {}
    stores: dict[tuple[str, str, int], EventStore] = {}
    replay_from: dict[tuple[str, str], str] = {}
    for backend, impls in table.items():
        for impl, factory in impls.items():
            for keep in (STREAM, LENGTHS[-1]):
                stores[backend, impl, keep] = factory(keep)
            replay_from[backend, impl] = await fill(stores[backend, impl, STREAM], uuid.uuid4().hex, STREAM)
            samples[backend, impl] = {"append": [], "replay": [], **{f"append@{n}": [] for n in LENGTHS}}
    for round_index in range(rounds):
        for backend, impls in table.items():
            order = list(impls) if round_index % 2 == 0 else list(reversed(impls))
            for impl in order:
                got = samples[backend, impl]
                got["append"].append(await time_append(stores[backend, impl, STREAM]))
                got["replay"].append(await time_replay(stores[backend, impl, STREAM], replay_from[backend, impl]))
                for length in LENGTHS:
                    got[f"append@{length}"].append(await time_append_at(stores[backend, impl, LENGTHS[-1]], length))
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr)
    return samples


def summarize(table: dict[str, dict[str, Factory]], samples: dict[Any, Any]) -> dict[str, Any]:
    """Medians in microseconds and the speed-up of kvstores over FastMCP."""
    summary: dict[str, Any] = {}
    for backend in table:
        ours, theirs = samples[backend, "kvstores"], samples[backend, "fastmcp"]
        summary[backend] = {}
        for scenario in ours:
            mine, other = statistics.median(ours[scenario]) * 1e6, statistics.median(theirs[scenario]) * 1e6
            summary[backend][scenario] = {
                "kvstores_us": round(mine, 1),
                "fastmcp_us": round(other, 1),
                "speedup": round(other / mine, 2),
            }
    return summary


def print_tables(summary: dict[str, Any]) -> None:
    """Markdown tables of the medians."""
    columns = ["append kvstores", "append fastmcp", "x", "replay kvstores", "replay fastmcp", "x"]
    print("\n| backend | " + " | ".join(columns) + " |  (microseconds)")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for backend, row in summary.items():
        a, r = row["append"], row["replay"]
        print(
            f"| {backend} | {a['kvstores_us']} | {a['fastmcp_us']} | {a['speedup']} "
            f"| {r['kvstores_us']} | {r['fastmcp_us']} | {r['speedup']} |"
        )
    print("\nappend cost (us) by stream length, kvstores / fastmcp")
    print("| backend | " + " | ".join(f"{n:,} events" for n in LENGTHS) + " |")
    print("|---|" + "---:|" * len(LENGTHS))
    for backend, row in summary.items():
        cells = [f"{row[f'append@{n}']['kvstores_us']} / {row[f'append@{n}']['fastmcp_us']}" for n in LENGTHS]
        print(f"| {backend} | " + " | ".join(cells) + " |")


async def run(rounds: int, output: Path) -> None:
    """Open the backends, measure, write the JSON, clean up."""
    with tempfile.TemporaryDirectory(prefix="kvbench-events-") as folder:
        stores: dict[str, Any] = {
            "memory": MemoryStore(max_entries=1_000_000),
            "sqlite": SQLiteStore(Path(folder) / "e.db"),
        }
        redis = await redis_store()
        if redis is not None:
            stores["redis"] = redis
        try:
            table = pairs(stores)
            summary = summarize(table, await measure(table, rounds))
        finally:
            for store in stores.values():
                await store.destroy()
                await store.aclose()
    document = {
        "benchmark": "events",
        "description": __doc__.strip().splitlines()[0],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": {name: version(name) for name in ("kvstores", "fastmcp", "mcp", "redis", "aiosqlite")},
        "method": {
            "rounds": rounds,
            "statistic": "median over rounds, microseconds per operation",
            "stream_events": STREAM,
            "growth_lengths": list(LENGTHS),
            "growth_appends_per_sample": GROWTH_APPENDS,
            "max_events_per_stream": {"append/replay": STREAM, "append by length": LENGTHS[-1]},
        },
        "results": summary,
    }
    write(output, document)
    print_tables(summary)
    print(f"\nwrote {output}")


def write(output: Path, document: dict[str, Any]) -> None:
    """Write the results as JSON, creating the folder if needed."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON output (default {RESULTS})")
    args = parser.parse_args(argv)
    asyncio.run(run(args.rounds, args.output))


if __name__ == "__main__":
    main()
