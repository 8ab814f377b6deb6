"""The scenario definitions: what each benchmarked operation does, on which data.

Key-value scenarios (every contender gets the same calls):

- values come in two shapes: long strings, ``{"data": "xxx..."}`` whose compact JSON is the
  row's value size, and many small objects (the rows marked ``objects``), ``{"items": [{"id": i,
  "name": f"item-{i}", "tags": ["a", "b"], "score": i * 0.5}, ...]}`` with 14,000 objects per
  1 MB of the row's size (compact JSON of about 63 bytes each), like a tool result: cheap and
  costly to encode;
- reads and overwrites cycle over a key space populated before the size's rows run
  (200 keys, so two distinct bulk batches; 16 keys for values of 1 MB and more);
- ``get``, ``ttl``, ``put`` (no TTL) and ``put_ttl`` (TTL of one hour) touch one key;
  ``get_many``, ``put_many`` and ``delete_many`` touch :data:`BATCH` keys per call, and
  their ops/s count calls, not keys; ``delete_many`` deletes keys that exist (written,
  untimed, before each batch); bulk rows are skipped for values of 1 MB and more (a call
  would move 100 MB);
- everything goes to collection :data:`COLLECTION`.

Atomic-operation scenarios (stores that implement ``kvstores.AtomicStore``), 100 B values:
``put_if_absent`` of a key that does not exist yet (the winning path); ``pop`` of a key that
exists (written, untimed, before each batch); ``update`` of an existing key with nobody else
writing it (one task only: the uncontended path, a read and a compare-and-set).

Event-store scenarios (MCP resumability): ``append`` stores a small JSON-RPC notification
on one stream; ``replay`` replays a 100-event stream after its first event (99 events
sent to a callback that drops them); ``append@N`` appends to a stream that holds N events
and is capped at N (so it stays at N: each append also drops the oldest event), which shows
how the cost of an append grows with the stream.

Batching-through-latency scenarios (``kvstores bench --batching-latency``): one call is a
*round* of C concurrent ``get`` (or ``put``) calls of 100 B values, gathered, call ``j`` on key
``k{j // K}`` of collection ``kvbench_batching{j % K}``: C distinct keys spread evenly over K
collections (:data:`BATCHING_COLLECTION` + index), populated beforehand. A row's latencies are
therefore round times, and its ops/s rounds per second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

from kvstores.bench._measure import OBJECTS, STRING, Scenario

__all__ = [
    "ATOMIC_OPERATIONS",
    "BATCH",
    "BATCHING_COLLECTION",
    "BATCHING_OPERATIONS",
    "BATCHING_VALUE_BYTES",
    "BULK_OPERATIONS",
    "COLLECTION",
    "EVENT_COLLECTION",
    "KV_OPERATIONS",
    "SCALE_COLLECTION",
    "SINGLE_OPERATIONS",
    "append_at_length",
    "atomic_scenarios",
    "batching_keys",
    "batching_scenario",
    "event_scenarios",
    "full_stream",
    "key_space",
    "kv_scenarios",
    "replay_subject",
    "size_label",
    "value_of",
]

COLLECTION = "kvbench"
"""The collection the key-value scenarios use (destroyed after each target)."""

EVENT_COLLECTION = "kvbench_events"
"""The collection StoreEventStore writes to in the benchmark."""

SCALE_COLLECTION = "kvbench_scale"
"""The collection the collection-size sweep fills."""

BATCHING_COLLECTION = "kvbench_batching"
"""Prefix of the collections the batching-through-latency rounds spread over (``kvbench_batching0``...)."""

BATCHING_OPERATIONS = ("get", "put")
"""The operations of the batching-through-latency rows, in report order."""

BATCHING_VALUE_BYTES = 100
"""Value size of the batching-through-latency rows."""

BATCH = 100
"""Keys per bulk call."""

TTL = 3600.0
"""Seconds of TTL in ``put_ttl``."""

SINGLE_OPERATIONS = ("get", "put", "put_ttl", "ttl")
"""Operations on one key."""

BULK_OPERATIONS = ("get_many", "put_many", "delete_many")
"""Operations on :data:`BATCH` keys."""

KV_OPERATIONS = SINGLE_OPERATIONS + BULK_OPERATIONS
"""Every key-value operation, in report order."""

ATOMIC_OPERATIONS = ("put_if_absent", "pop", "update")
"""The atomic operations, in report order."""

ATOMIC_VALUE_BYTES = 100
"""Value size of the atomic-operation rows."""

_OBJECTS_PER_MB = 14_000

_LARGE = 1_000_000  # values this size and above use a small key space and no bulk rows
_REFILL_BYTES = 16_000_000  # data one delete_many batch may (re)write before it runs


def value_of(size: int, shape: str = STRING, *, other: bool = False) -> dict[str, Any]:
    """A value of ``size`` bytes: one string whose compact JSON is that long (at least 11), or small objects;
    ``other``: a different value of exactly the same length."""
    if shape == OBJECTS:
        count = size * _OBJECTS_PER_MB // 1_000_000
        tags = ["c", "d"] if other else ["a", "b"]
        return {"items": [{"id": i, "name": f"item-{i}", "tags": tags, "score": i * 0.5} for i in range(count)]}
    return {"data": ("y" if other else "x") * max(0, size - 11)}


def size_label(value_bytes: int | None, shape: str = STRING) -> str:
    """A value size in words: ``100 B``, ``10 KB``, ``1 MB``, ``1 MB objects``; ``-`` for rows without values."""
    if value_bytes is None:
        return "-"
    marked = "" if shape == STRING else f" {shape}"
    for unit, scale in (("MB", 1_000_000), ("KB", 1_000)):
        if value_bytes >= scale:
            return f"{value_bytes / scale:g} {unit}{marked}"
    return f"{value_bytes} B{marked}"


def key_space(size: int) -> list[str]:
    """The keys populated for values of ``size`` bytes."""
    return [f"k{i}" for i in range(16 if size >= _LARGE else 200)]


def kv_scenarios(
    size: int,
    concurrency: int,
    operations: tuple[str, ...] = KV_OPERATIONS,
    shape: str = STRING,
    *,
    changing: bool = False,
) -> list[Scenario]:
    """The key-value rows for one value size, shape and concurrency, over the populated :func:`key_space`.

    ``changing``: each ``put`` writes the value its row does not hold (two values of one length, in
    turn per contender and key, the row populated with the first), so that every put changes its
    row; otherwise a put rewrites the value already there.
    """
    value = value_of(size, shape)
    names = key_space(size)
    count = len(names)
    turns = (value_of(size, shape, other=True), value)
    written: dict[tuple[int, str], int] = {}  # (contender, key): the index in turns of the last put

    def changed(store: Any, name: str) -> dict[str, Any]:
        turn = written[id(store), name] = 1 - written.get((id(store), name), 1)
        return turns[turn]

    def put(store: Any, i: int) -> Any:
        name = names[i % count]
        return store.put(name, changed(store, name) if changing else value, collection=COLLECTION)

    batches = [names[start : start + BATCH] for start in range(0, count - BATCH + 1, BATCH)]
    values = [value] * BATCH
    doomed: list[list[str]] = []  # delete_many's batches, rewritten before each run

    async def refill(store: Any, calls: int) -> None:
        doomed[:] = [[f"d{call}-{i}" for i in range(BATCH)] for call in range(calls)]
        for batch in doomed:
            await store.put_many(batch, values, collection=COLLECTION)

    every = {
        "get": Scenario("get", size, concurrency, lambda s, i: s.get(names[i % count], collection=COLLECTION)),
        "put": Scenario("put", size, concurrency, put),
        "put_ttl": Scenario(
            "put_ttl", size, concurrency, lambda s, i: s.put(names[i % count], value, collection=COLLECTION, ttl=TTL)
        ),
        "ttl": Scenario("ttl", size, concurrency, lambda s, i: s.ttl(names[i % count], collection=COLLECTION)),
    }
    if size < _LARGE:
        every |= {
            "get_many": Scenario(
                "get_many", size, concurrency, lambda s, i: s.get_many(batches[i % len(batches)], collection=COLLECTION)
            ),
            "put_many": Scenario(
                "put_many",
                size,
                concurrency,
                lambda s, i: s.put_many(batches[i % len(batches)], values, collection=COLLECTION),
            ),
            "delete_many": Scenario(
                "delete_many",
                size,
                concurrency,
                lambda s, i: s.delete_many(doomed[i], collection=COLLECTION),
                refill=refill,
                max_calls=max(1, min(200, _REFILL_BYTES // (BATCH * size))),
            ),
        }
    return [dataclasses.replace(every[operation], shape=shape) for operation in operations if operation in every]


def atomic_scenarios(concurrency: int) -> list[Scenario]:
    """The atomic-operation rows for one concurrency (``update`` only with one task: uncontended)."""
    value = value_of(ATOMIC_VALUE_BYTES)
    names = key_space(ATOMIC_VALUE_BYTES)
    fresh = itertools.count()
    doomed: list[str] = []  # pop's keys, rewritten before each batch
    size = ATOMIC_VALUE_BYTES

    async def refill(store: Any, calls: int) -> None:
        doomed[:] = [f"p{next(fresh)}" for _ in range(calls)]
        for start in range(0, calls, BATCH):
            part = doomed[start : start + BATCH]
            await store.put_many(part, [value] * len(part), collection=COLLECTION)

    def replace(old: dict[str, Any] | None) -> dict[str, Any]:
        return value

    scenarios = [
        Scenario(
            "put_if_absent",
            size,
            concurrency,
            lambda s, i: s.put_if_absent(f"n{next(fresh)}", value, collection=COLLECTION),
        ),
        Scenario("pop", size, concurrency, lambda s, i: s.pop(doomed[i], collection=COLLECTION), refill=refill),
    ]
    if concurrency == 1:
        scenarios.append(
            Scenario("update", size, 1, lambda s, i: s.update(names[i % len(names)], replace, collection=COLLECTION))
        )
    return scenarios


def batching_keys(callers: int, collections: int) -> list[tuple[str, str]]:
    """The (collection, key) of each call of a round of ``callers`` calls over ``collections`` collections."""
    return [(f"{BATCHING_COLLECTION}{j % collections}", f"k{j // collections}") for j in range(callers)]


def batching_scenario(operation: str, callers: int, collections: int) -> Scenario:
    """One round of ``callers`` concurrent gets or puts (``operation``) spread over ``collections`` collections."""
    value = value_of(BATCHING_VALUE_BYTES)
    calls = batching_keys(callers, collections)

    async def gets(store: Any, index: int) -> None:
        await asyncio.gather(*(store.get(key, collection=collection) for collection, key in calls))

    async def puts(store: Any, index: int) -> None:
        await asyncio.gather(*(store.put(key, value, collection=collection) for collection, key in calls))

    return Scenario(operation, BATCHING_VALUE_BYTES, 1, gets if operation == "get" else puts)


def _message() -> Any:
    from mcp.types import JSONRPCNotification

    return JSONRPCNotification(
        jsonrpc="2.0", method="notifications/progress", params={"progressToken": "bench", "progress": 1, "total": 100}
    )


async def _drop(event: object) -> None:
    """A replay callback that discards the events."""


async def replay_subject(event_store: Any) -> tuple[Any, str]:
    """Store a 100-event stream; return ``(event_store, id of its first event)`` for :func:`event_scenarios`."""
    message = _message()
    first = await event_store.store_event("bench-replay", message)
    for _ in range(99):
        await event_store.store_event("bench-replay", message)
    sent: list[object] = []

    async def keep(event: object) -> None:
        sent.append(event)

    await event_store.replay_events_after(first, keep)
    if len(sent) != 99:
        raise RuntimeError(f"{type(event_store).__name__} replayed {len(sent)} events, not 99")
    return event_store, first


def event_scenarios() -> tuple[Scenario, Scenario]:
    """``(append, replay)``: append's subject is an event store, replay's a :func:`replay_subject`."""
    message = _message()
    append = Scenario("append", None, 1, lambda s, i: s.store_event("bench-append", message))
    replay = Scenario("replay", None, 1, lambda s, i: s[0].replay_events_after(s[1], _drop))
    return append, replay


async def full_stream(event_store: Any, length: int) -> tuple[Any, str]:
    """Fill a fresh stream with ``length`` events; return ``(event_store, stream id)`` for :func:`append_at_length`.

    ``event_store`` must keep ``length`` events per stream, so that the stream stays that long.
    """
    stream = f"bench-length-{length}"
    message = _message()
    for _ in range(length):
        await event_store.store_event(stream, message)
    return event_store, stream


def append_at_length(length: int) -> Scenario:
    """``append@length``: its subject is a :func:`full_stream` of ``length`` events."""
    message = _message()
    return Scenario(f"append@{length}", None, 1, lambda s, i: s[0].store_event(s[1], message))
