"""Running a benchmark plan against store URLs: the key-value, atomic and event-store rows, and the sweeps.

A row is one scenario measured on every contender at once (see :mod:`kvstores.bench._measure`):
``{"target": URL label, "backend": family, "store": class under test, "group": "kv" | "atomic"
| "events", "operation", "value_bytes", "concurrency", "contenders": {name: figures},
"ratios": {baseline: ours ÷ baseline ops/s}}``, or the same with ``"skipped": reason``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstores._urls import redact_text
from kvstores.bench._backends import baselines, bench_backend, family
from kvstores.bench._measure import OBJECTS, STRING, RowSkipped, Scenario, Settings, measure
from kvstores.bench._otel import otel_contenders
from kvstores.bench._proxy import LatencyProxy, proxy_target, through
from kvstores.bench._scenarios import (
    ATOMIC_VALUE_BYTES,
    BATCHING_COLLECTION,
    BATCHING_OPERATIONS,
    BATCHING_VALUE_BYTES,
    COLLECTION,
    EVENT_COLLECTION,
    SCALE_COLLECTION,
    append_at_length,
    atomic_scenarios,
    batching_keys,
    batching_scenario,
    event_scenarios,
    full_stream,
    key_space,
    kv_scenarios,
    replay_subject,
    size_label,
    value_of,
)
from kvstores.bench._sealing import SEALED_COLLECTION, sealed_contenders
from kvstores.registry import open_store

__all__ = ["BATCHING_OFF", "LatencyPlan", "Plan", "Progress", "run_batching_latency", "run_target"]

_FASTMCP_COLLECTIONS = ("fastmcp_events", "fastmcp_streams")  # where fastmcp's EventStore writes
_LOAD_BYTES = 8_000_000  # data per put_many call while populating


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    value_sizes: tuple[int, ...]
    """Sizes of the long-string values."""
    concurrencies: tuple[int, ...]
    settings: Settings
    compare: bool
    events: bool
    scaling: bool
    atomic: bool = True
    """Measure put_if_absent, pop and update on stores that implement them."""
    stream_lengths: tuple[int, ...] = ()
    """Stream lengths of the ``append@N`` event-store rows."""
    collection_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Backend family -> collection sizes of the collection-size sweep."""
    scaling_value_sizes: tuple[int, ...] = ()
    scaling_concurrencies: tuple[int, ...] = ()
    """Concurrent tasks of the concurrency sweep (every contender, get and put of 100 B)."""
    object_sizes: tuple[int, ...] = ()
    """Sizes of the many-small-objects values, measured like ``value_sizes``."""


@dataclass(frozen=True)
class LatencyPlan:
    """The batching-through-latency run: batching on against off, through a loopback proxy adding ``delay_seconds``."""

    delay_seconds: float
    """Added to every chunk in each direction (a round trip gains twice as much)."""
    callers: tuple[int, ...]
    """Concurrent calls per round."""
    collections: tuple[int, ...]
    """Collections a round's calls are spread over."""
    settings: Settings
    budget_seconds: float
    """Wall-clock cap of the whole run: rows that would start later are skipped and say so."""


class Progress:
    """Where a run reports progress: ``start`` a stage of ``total`` ticks, then ``tick``."""

    def start(self, description: str, total: int) -> None:
        """Begin a stage."""

    def tick(self) -> None:
        """One round of one contender is done."""


@dataclass(frozen=True)
class _Target:
    """Where rows come from: the URL's label, its backend family and the class under test."""

    label: str
    backend: str
    store: str


def _describe(target: _Target, group: str, scenario: Scenario) -> dict[str, Any]:
    return {
        "target": target.label,
        "backend": target.backend,
        "store": target.store,
        "group": group,
        "operation": scenario.operation,
        "value_bytes": scenario.value_bytes,
        "shape": scenario.shape,
        "concurrency": scenario.concurrency,
    }


async def _row(
    target: _Target,
    group: str,
    scenario: Scenario,
    subjects: dict[str, Any],
    plan: Plan | LatencyPlan,
    progress: Progress,
    **described: Any,
) -> dict[str, Any]:
    """Measure one scenario; the row holds each contender's figures and ours/baseline ratios.

    ``described`` adds to (or overrides) the row's description, e.g. ``collections=4``.
    """
    row = {**_describe(target, group, scenario), **described}
    try:
        stats = await measure(scenario, subjects, plan.settings, progress.tick)
    except RowSkipped as exc:
        return {**row, "skipped": str(exc)}
    except Exception as exc:  # e.g. a server that cannot keep up with 64 tasks within its timeout
        return {**row, "skipped": f"failed: {type(exc).__name__}: {exc}"}
    ours = stats["kvstores"].ops_per_second
    return {
        **row,
        "contenders": {name: figures.as_json() for name, figures in stats.items()},
        "ratios": {
            name: round(ours / figures.ops_per_second, 3) for name, figures in stats.items() if name != "kvstores"
        },
    }


async def _populate(
    store: Any,
    names: list[str],
    value: dict[str, Any],
    collection: str = COLLECTION,
    chunk: int = 100,
    size: int = 100,
) -> None:
    step = max(1, min(chunk, _LOAD_BYTES // size))
    for start in range(0, len(names), step):
        part = names[start : start + step]
        await store.put_many(part, [value] * len(part), collection=collection)


async def _close(store: Any) -> None:
    """Remove what the benchmark wrote through ``store`` (best effort), then close it."""
    for collection in (COLLECTION, EVENT_COLLECTION, SCALE_COLLECTION, *_FASTMCP_COLLECTIONS):
        try:
            await _clean(store, collection)
        except KeyError:
            pass  # py-key-value's MongoDBStore cannot destroy a collection it never opened
        except Exception as exc:  # a failed clean-up must not hide the run's results or its own error
            reason = redact_text(repr(exc))
            print(f"kvstores bench: could not clean up {type(store).__name__}: {reason}", file=sys.stderr)
    closer = getattr(store, "aclose", None) or getattr(store, "close", None)
    if closer is not None:
        await closer()


async def _clean(store: Any, collection: str) -> None:
    if hasattr(store, "destroy_collection"):
        await store.destroy_collection(collection=collection)
    elif hasattr(store, "keys"):  # py-key-value's RedisStore: enumerate, then delete
        while keys := await store.keys(collection=collection):
            await store.delete_many(keys, collection=collection)
    elif collection == COLLECTION:  # the raw baselines, which drop their own namespace on close
        await store.delete_many(key_space(100), collection=collection)


EventFactory = Callable[[int], Any]
"""Makes an event store keeping at most that many events per stream."""


def _event_contenders(
    store: Any, kind: str, contenders: dict[str, Any], compare: bool
) -> dict[str, dict[str, EventFactory]]:
    """Event-store class under test -> {contender name -> factory}."""
    from kvstores.events import InMemoryEventStore, StoreEventStore

    groups: dict[str, dict[str, EventFactory]] = {
        "StoreEventStore": {
            "kvstores": lambda keep: StoreEventStore(store, collection=EVENT_COLLECTION, max_events_per_stream=keep)
        }
    }
    if kind == "memory":
        groups["InMemoryEventStore"] = {"kvstores": lambda keep: InMemoryEventStore(max_events_per_stream=keep)}
    if compare and importlib.util.find_spec("fastmcp") is not None:
        from fastmcp.server.event_store import EventStore

        groups["StoreEventStore"]["fastmcp"] = lambda keep: EventStore(storage=store, max_events_per_stream=keep)
        if "py-key-value" in contenders:
            theirs = contenders["py-key-value"]
            groups["StoreEventStore"]["fastmcp+py-key-value"] = lambda keep: EventStore(
                storage=theirs, max_events_per_stream=keep
            )
        if kind == "memory":
            groups["InMemoryEventStore"]["fastmcp"] = lambda keep: EventStore(max_events_per_stream=keep)
    return groups


async def _prepared_row(
    target: _Target,
    scenario: Scenario,
    prepare: Mapping[str, Callable[[], Awaitable[Any]]],
    plan: Plan,
    progress: Progress,
) -> dict[str, Any]:
    """Prepare each contender's subject (untimed), then measure ``scenario`` on them."""
    try:
        subjects = {name: await make() for name, make in prepare.items()}
    except Exception as exc:  # e.g. the backend failed while the stream was written
        return {**_describe(target, "events", scenario), "skipped": f"failed: {exc!r}"}
    return await _row(target, "events", scenario, subjects, plan, progress)


async def _event_rows(
    target: _Target, store: Any, contenders: dict[str, Any], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    from kvstores.events import DEFAULT_MAX_EVENTS_PER_STREAM

    rows = []
    for label, factories in _event_contenders(store, target.backend, contenders, plan.compare).items():
        mine = _Target(target.label, target.backend, label)
        ticks = (2 + len(plan.stream_lengths)) * len(factories) * (plan.settings.rounds + 1)
        progress.start(f"{target.label} {label}", ticks)
        append, replay = event_scenarios()
        subjects = {name: factory(DEFAULT_MAX_EVENTS_PER_STREAM) for name, factory in factories.items()}
        rows.append(await _row(mine, "events", append, subjects, plan, progress))
        replays = {name: functools.partial(replay_subject, subject) for name, subject in subjects.items()}
        rows.append(await _prepared_row(mine, replay, replays, plan, progress))
        for length in plan.stream_lengths:
            streams = {
                name: functools.partial(full_stream, factory(length), length) for name, factory in factories.items()
            }
            rows.append(await _prepared_row(mine, append_at_length(length), streams, plan, progress))
    return rows


def _atomic(store: Any) -> bool:
    """True if ``store`` offers the atomic operations."""
    import kvstores

    protocol = getattr(kvstores, "AtomicStore", None)
    return protocol is not None and isinstance(store, protocol)


async def _atomic_rows(
    target: _Target, contenders: dict[str, Any], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    """put_if_absent, pop and uncontended update, against the contenders that have them."""
    if not _atomic(contenders["kvstores"]):
        return []
    able = {name: subject for name, subject in contenders.items() if hasattr(subject, "put_if_absent")}
    scenarios = [scenario for tasks in plan.concurrencies for scenario in atomic_scenarios(tasks)]
    for subject in able.values():
        await _populate(subject, key_space(ATOMIC_VALUE_BYTES), value_of(ATOMIC_VALUE_BYTES))
    progress.start(f"{target.label} atomic", len(scenarios) * len(able) * (plan.settings.rounds + 1))
    return [await _row(target, "atomic", scenario, able, plan, progress) for scenario in scenarios]


async def _otel_rows(target: _Target, store: Any, plan: Plan, progress: Progress) -> list[dict[str, Any]]:
    """get and put of 100 B on a memory store with and without OpenTelemetry (kvstores.bench._otel)."""
    contenders = otel_contenders(store)
    if target.backend != "memory" or not contenders:
        return []
    await _populate(store, key_space(100), value_of(100))
    scenarios = kv_scenarios(100, 1, ("get", "put"))
    progress.start(f"{target.label} otel", len(scenarios) * len(contenders) * (plan.settings.rounds + 1))
    return [await _row(target, "otel", scenario, contenders, plan, progress) for scenario in scenarios]


async def _encryption_rows(
    target: _Target, url: str, store: Any, plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    """get and put of 100 B by one task with and without encryption keys, on networked backends
    (kvstores.bench._sealing)."""
    if not bench_backend(target.backend).tcp_schemes:
        return []
    contenders = sealed_contenders(url, store)
    try:
        await _populate(store, key_space(100), value_of(100))
        await _populate(contenders["kvstores"].store, key_space(100), value_of(100), SEALED_COLLECTION)
        # a sealed value differs on every put (a fresh nonce); the unsealed side's puts change their rows too,
        # where a rewrite of the same value would be nearly free (MariaDB leaves an unchanged row alone)
        scenarios = kv_scenarios(100, 1, ("get", "put"), changing=True)
        progress.start(f"{target.label} encryption", len(scenarios) * len(contenders) * (plan.settings.rounds + 1))
        return [await _row(target, "encryption", scenario, contenders, plan, progress) for scenario in scenarios]
    finally:
        await contenders["kvstores"].aclose()


async def _main_rows(
    target: _Target, contenders: dict[str, Any], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    rows = []
    for size, shape in [(size, STRING) for size in plan.value_sizes] + [(size, OBJECTS) for size in plan.object_sizes]:
        scenarios = [scenario for tasks in plan.concurrencies for scenario in kv_scenarios(size, tasks, shape=shape)]
        try:
            for store in contenders.values():
                await _populate(store, key_space(size), value_of(size, shape), size=size)
        except Exception as exc:  # the size's rows cannot run; the other sizes still may
            failed = f"failed: writing the key space: {exc!r}"
            rows += [{**_describe(target, "kv", scenario), "skipped": failed} for scenario in scenarios]
            continue
        progress.start(
            f"{target.label} {size_label(size, shape)}", len(scenarios) * len(contenders) * (plan.settings.rounds + 1)
        )
        for scenario in scenarios:
            rows.append(await _row(target, "kv", scenario, contenders, plan, progress))
    return rows


def _collection_size_scenarios(count: int, value: dict[str, Any]) -> list[Scenario]:
    """get and put of keys spread over the whole of ``count`` populated keys."""

    def name(i: int) -> str:
        return f"s{(i * 7919) % count}"  # 7919 is prime: a permutation of every key space here

    return [
        Scenario("get", 100, 1, lambda s, i: s.get(name(i), collection=SCALE_COLLECTION)),
        Scenario("put", 100, 1, lambda s, i: s.put(name(i), value, collection=SCALE_COLLECTION)),
    ]


async def _sweep(
    target: _Target, store: Any, scenarios: list[tuple[str, int, Scenario]], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    """kvstores alone: one point per scenario, ``{axis: point}`` beside its figures."""
    rows = []
    for axis, point, scenario in scenarios:
        row = {"target": target.label, "backend": target.backend, "operation": scenario.operation, axis: point}
        try:
            stats = (await measure(scenario, {"kvstores": store}, plan.settings, progress.tick))["kvstores"]
        except RowSkipped as exc:
            rows.append({**row, "skipped": str(exc)})
        except Exception as exc:  # e.g. a server that cannot serve 256 tasks within its timeout
            rows.append({**row, "skipped": f"failed: {type(exc).__name__}: {exc}"})
        else:
            rows.append({**row, **stats.as_json()})
    return rows


async def _size_sweeps(target: _Target, url: str, plan: Plan, progress: Progress) -> dict[str, list[dict[str, Any]]]:
    """Cost of get and put against collection size and value size (kvstores only)."""
    sizes = plan.collection_sizes.get(target.backend, plan.collection_sizes.get("other", ()))
    options = {"max_entries": 2 * max(sizes, default=1)} if target.backend == "memory" else {}
    store: Any = open_store(url, **options)
    small = value_of(100)
    result: dict[str, list[dict[str, Any]]] = {"collection_size": [], "value_size": []}
    ticks = 2 * (plan.settings.rounds + 1)
    try:
        loaded = 0
        for count in sizes:
            started = time.perf_counter()
            await _populate(store, [f"s{i}" for i in range(loaded, count)], small, SCALE_COLLECTION, 1000)
            load_seconds = time.perf_counter() - started
            loaded = count
            progress.start(f"{target.label} scaling: {count:,} keys", ticks)
            scenarios = [("keys", count, scenario) for scenario in _collection_size_scenarios(count, small)]
            for row in await _sweep(target, store, scenarios, plan, progress):
                result["collection_size"].append({**row, "load_seconds": round(load_seconds, 2)})
        await store.destroy_collection(SCALE_COLLECTION)
        for size in plan.scaling_value_sizes:
            await _populate(store, key_space(size), value_of(size), size=size)
            progress.start(f"{target.label} scaling: {size:,} B", ticks)
            scenarios = [("value_bytes", size, scenario) for scenario in kv_scenarios(size, 1, ("get", "put"))]
            result["value_size"] += await _sweep(target, store, scenarios, plan, progress)
    finally:
        await _close(store)
    return result


async def _concurrency_sweep(
    target: _Target, contenders: dict[str, Any], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    """Throughput of get and put of 100 B against concurrent tasks, every contender in the same rounds."""
    for store in contenders.values():
        await _populate(store, key_space(100), value_of(100))
    scenarios = [
        scenario for tasks in plan.scaling_concurrencies for scenario in kv_scenarios(100, tasks, ("get", "put"))
    ]
    progress.start(
        f"{target.label} scaling: concurrency", len(scenarios) * len(contenders) * (plan.settings.rounds + 1)
    )
    return [await _row(target, "kv", scenario, contenders, plan, progress) for scenario in scenarios]


async def run_target(
    label: str, url: str, plan: Plan, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Benchmark the store at ``url`` (shown as ``label``); return (rows, scaling results)."""
    store: Any = open_store(url)
    target = _Target(label, family(url), type(store).__name__)
    contenders: dict[str, Any] = {"kvstores": store}
    if plan.compare:
        contenders |= baselines(url, store)
    rows: list[dict[str, Any]] = []
    scaling: dict[str, Any] = {}
    try:
        rows += await _main_rows(target, contenders, plan, progress)
        if plan.atomic:
            rows += await _atomic_rows(target, contenders, plan, progress)
        if plan.compare:
            rows += await _otel_rows(target, store, plan, progress)
            rows += await _encryption_rows(target, url, store, plan, progress)
        if plan.events:
            rows += await _event_rows(target, store, contenders, plan, progress)
        if plan.scaling:
            scaling["concurrency"] = await _concurrency_sweep(target, contenders, plan, progress)
    finally:
        for contender in contenders.values():
            await _close(contender)
    if plan.scaling:
        try:
            scaling |= await _size_sweeps(target, url, plan, progress)
        except Exception as exc:  # keep the rows measured so far
            print(f"kvstores bench: {label}: scaling failed: {redact_text(repr(exc), url)}", file=sys.stderr)
    for row in [*rows, *(point for points in scaling.values() for point in points)]:
        if "skipped" in row:  # the reason quotes an exception: a driver's may hold the URL's secrets
            row["skipped"] = redact_text(row["skipped"], url)
    return rows, scaling


BATCHING_OFF = "batching off"
"""The contender of the batching-through-latency rows that is the same store opened with
``batching=False`` (the store with batching on is ``kvstores``, as in every row)."""


def _batching_scenarios(plan: LatencyPlan) -> list[tuple[dict[str, int], Scenario]]:
    """(the row's callers and collections, its scenario) of every batching-through-latency row."""
    return [
        ({"concurrency": callers, "collections": count}, batching_scenario(operation, callers, count))
        for callers in plan.callers
        for count in plan.collections
        for operation in BATCHING_OPERATIONS
    ]


async def _populate_batching(store: Any, plan: LatencyPlan) -> None:
    """Write the keys the rounds read: every (collection, key) of the largest round at each spread."""
    value = value_of(BATCHING_VALUE_BYTES)
    keys_by_collection: dict[str, set[str]] = {}
    for count in plan.collections:
        for collection, key in batching_keys(max(plan.callers), count):
            keys_by_collection.setdefault(collection, set()).add(key)
    for collection, keys in keys_by_collection.items():
        await store.put_many(sorted(keys), [value] * len(keys), collection=collection)


async def _clean_batching(store: Any, plan: LatencyPlan, url: str) -> None:
    """Destroy the collections the rounds used (best effort: a failure must not hide the run's own error)."""
    try:
        for count in range(max(plan.collections)):
            await store.destroy_collection(f"{BATCHING_COLLECTION}{count}")
    except Exception as exc:
        reason = redact_text(repr(exc), url)
        print(f"kvstores bench: could not clean up {type(store).__name__}: {reason}", file=sys.stderr)


async def _proxied_rows(
    target: _Target, url: str, upstream: tuple[str, int], plan: LatencyPlan, deadline: float, progress: Progress
) -> list[dict[str, Any]]:
    scenarios = _batching_scenarios(plan)
    rows = []
    with LatencyProxy(*upstream, plan.delay_seconds) as proxy:
        proxied = through(url, proxy.port)
        subjects = {"kvstores": open_store(proxied, batching=True), BATCHING_OFF: open_store(proxied, batching=False)}
        try:
            ticks = len(scenarios) * len(subjects) * (plan.settings.rounds + 1)
            progress.start(f"{target.label} batching, +{plan.delay_seconds * 1e3:g} ms each way", ticks)
            for shape, scenario in scenarios:
                if time.monotonic() < deadline:
                    for subject in subjects.values():  # untimed: the pools open the connections a round needs
                        with contextlib.suppress(Exception):  # a failing round fails in the row, said there
                            await scenario.op(subject, 0)
                    rows.append(await _row(target, "batching", scenario, subjects, plan, progress, **shape))
                else:
                    cap = f"the run's wall-clock cap ({plan.budget_seconds:g} s) was reached"
                    rows.append({**_describe(target, "batching", scenario), **shape, "skipped": cap})
        finally:
            for subject in subjects.values():
                await subject.aclose()
    return rows


async def run_batching_latency(
    label: str, url: str, plan: LatencyPlan, deadline: float, progress: Progress
) -> list[dict[str, Any]]:
    """The batching-through-latency rows of the store at ``url`` (shown as ``label``).

    A :class:`~kvstores.bench._proxy.LatencyProxy` stands in front of the URL's server; the store
    is opened through it twice, batching on (``kvstores``) and off (:data:`BATCHING_OFF`), and
    both run the same rounds, interleaved. Every row is skipped, saying why, when the URL names
    no single TCP server (memory, SQLite, a Redis Cluster...); rows that would start after
    ``deadline`` (``time.monotonic()``) are skipped too.
    """
    direct: Any = open_store(url)
    target = _Target(label, family(url), type(direct).__name__)
    upstream = proxy_target(url)
    try:
        if isinstance(upstream, str):
            reason = f"no latency to add: {upstream}"
            return [
                {**_describe(target, "batching", scenario), **shape, "skipped": reason}
                for shape, scenario in _batching_scenarios(plan)
            ]
        await _populate_batching(direct, plan)
        rows = await _proxied_rows(target, url, upstream, plan, deadline, progress)
    finally:
        if not isinstance(upstream, str):
            await _clean_batching(direct, plan, url)
        await direct.aclose()
    for row in rows:
        if "skipped" in row:  # the reason quotes an exception: a driver's may hold the URL's secrets
            row["skipped"] = redact_text(row["skipped"], url)
    return rows
