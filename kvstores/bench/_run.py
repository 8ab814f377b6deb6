"""Running a benchmark plan against store URLs: the main rows, event stores and scaling sweeps."""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from kvstores.bench._baselines import baselines, family
from kvstores.bench._measure import RowSkipped, Scenario, Settings, measure
from kvstores.bench._scenarios import (
    COLLECTION,
    EVENT_COLLECTION,
    SCALE_COLLECTION,
    event_scenarios,
    key_space,
    kv_scenarios,
    replay_subject,
    value_of,
)
from kvstores.registry import open_store

__all__ = ["Plan", "Progress", "run_target"]

_FASTMCP_COLLECTIONS = ("fastmcp_events", "fastmcp_streams")  # where fastmcp's EventStore writes
_LOAD_BYTES = 8_000_000  # data per put_many call while populating


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    value_sizes: tuple[int, ...]
    concurrencies: tuple[int, ...]
    settings: Settings
    compare: bool
    events: bool
    scaling: bool
    collection_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Backend family -> collection sizes of the collection-size sweep."""
    scaling_value_sizes: tuple[int, ...] = ()
    scaling_concurrencies: tuple[int, ...] = ()


class Progress:
    """Where a run reports progress: ``start`` a stage of ``total`` ticks, then ``tick``."""

    def start(self, description: str, total: int) -> None:
        """Begin a stage."""

    def tick(self) -> None:
        """One round of one contender is done."""


def _describe(target: str, backend: str, group: str, scenario: Scenario) -> dict[str, Any]:
    return {
        "target": target,
        "backend": backend,
        "group": group,
        "operation": scenario.operation,
        "value_bytes": scenario.value_bytes,
        "concurrency": scenario.concurrency,
    }


async def _row(
    target: str, backend: str, group: str, scenario: Scenario, subjects: dict[str, Any], plan: Plan, progress: Progress
) -> dict[str, Any]:
    """Measure one scenario; the row holds each contender's figures and ours/baseline ratios."""
    row = _describe(target, backend, group, scenario)
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
    store: Any, names: list[str], value: dict[str, Any], collection: str = COLLECTION, chunk: int = 100
) -> None:
    step = max(1, min(chunk, _LOAD_BYTES // max(1, len(value["data"]))))
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
            print(f"kvstores bench: could not clean up {type(store).__name__}: {exc!r}", file=sys.stderr)
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


def _event_contenders(store: Any, kind: str, contenders: dict[str, Any], compare: bool) -> dict[str, dict[str, Any]]:
    """Event-store label -> {contender name -> event store}."""
    from kvstores.events import InMemoryEventStore, StoreEventStore

    groups: dict[str, dict[str, Any]] = {
        "StoreEventStore": {"kvstores": StoreEventStore(store, collection=EVENT_COLLECTION)}
    }
    if kind == "memory":
        groups["InMemoryEventStore"] = {"kvstores": InMemoryEventStore()}
    if compare and importlib.util.find_spec("fastmcp") is not None:
        from fastmcp.server.event_store import EventStore

        groups["StoreEventStore"]["fastmcp"] = EventStore(storage=store)
        if "py-key-value" in contenders:
            groups["StoreEventStore"]["fastmcp+py-key-value"] = EventStore(storage=contenders["py-key-value"])
        if kind == "memory":
            groups["InMemoryEventStore"]["fastmcp"] = EventStore()
    return groups


async def _event_rows(
    target: str, kind: str, store: Any, contenders: dict[str, Any], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    rows = []
    for label, subjects in _event_contenders(store, kind, contenders, plan.compare).items():
        append, replay = event_scenarios(label)
        progress.start(f"{target} {label}", 2 * len(subjects) * (plan.settings.rounds + 1))
        rows.append(await _row(target, kind, "events", append, subjects, plan, progress))
        try:
            replays = {name: await replay_subject(subject) for name, subject in subjects.items()}
        except Exception as exc:  # e.g. the backend failed while the stream was written
            rows.append({**_describe(target, kind, "events", replay), "skipped": f"failed: {exc!r}"})
            continue
        rows.append(await _row(target, kind, "events", replay, replays, plan, progress))
    return rows


async def _main_rows(
    target: str, kind: str, contenders: dict[str, Any], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    rows = []
    for size in plan.value_sizes:
        scenarios = [scenario for tasks in plan.concurrencies for scenario in kv_scenarios(size, tasks)]
        try:
            for store in contenders.values():
                await _populate(store, key_space(size), value_of(size))
        except Exception as exc:  # the size's rows cannot run; the other sizes still may
            failed = f"failed: writing the key space: {exc!r}"
            rows += [{**_describe(target, kind, "kv", scenario), "skipped": failed} for scenario in scenarios]
            continue
        progress.start(f"{target} {size:,} B", len(scenarios) * len(contenders) * (plan.settings.rounds + 1))
        for scenario in scenarios:
            rows.append(await _row(target, kind, "kv", scenario, contenders, plan, progress))
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
    target: str, store: Any, scenarios: list[tuple[str, int, Scenario]], plan: Plan, progress: Progress
) -> list[dict[str, Any]]:
    rows = []
    for axis, point, scenario in scenarios:
        row = {"target": target, "operation": scenario.operation, axis: point}
        try:
            stats = (await measure(scenario, {"kvstores": store}, plan.settings, progress.tick))["kvstores"]
        except RowSkipped as exc:
            rows.append({**row, "skipped": str(exc)})
        except Exception as exc:  # e.g. a server that cannot serve 256 tasks within its timeout
            rows.append({**row, "skipped": f"failed: {type(exc).__name__}: {exc}"})
        else:
            rows.append({**row, **stats.as_json()})
    return rows


async def _scaling(target: str, url: str, kind: str, plan: Plan, progress: Progress) -> dict[str, list[dict[str, Any]]]:
    """Cost of get and put against collection size, value size and concurrency (kvstores only)."""
    sizes = plan.collection_sizes.get(kind, plan.collection_sizes.get("other", ()))
    store: Any = open_store(url, **({"max_entries": 2 * max(sizes, default=1)} if kind == "memory" else {}))
    small = value_of(100)
    result: dict[str, list[dict[str, Any]]] = {"collection_size": [], "value_size": [], "concurrency": []}
    ticks = 2 * (plan.settings.rounds + 1)
    try:
        loaded = 0
        for count in sizes:
            started = time.perf_counter()
            await _populate(store, [f"s{i}" for i in range(loaded, count)], small, SCALE_COLLECTION, 1000)
            load_seconds = time.perf_counter() - started
            loaded = count
            progress.start(f"{target} scaling: {count:,} keys", ticks)
            scenarios = [("keys", count, scenario) for scenario in _collection_size_scenarios(count, small)]
            for row in await _sweep(target, store, scenarios, plan, progress):
                result["collection_size"].append({**row, "load_seconds": round(load_seconds, 2)})
        await store.destroy_collection(SCALE_COLLECTION)
        for size in plan.scaling_value_sizes:
            await _populate(store, key_space(size), value_of(size))
            progress.start(f"{target} scaling: {size:,} B", ticks)
            scenarios = [("value_bytes", size, scenario) for scenario in kv_scenarios(size, 1, ("get", "put"))]
            result["value_size"] += await _sweep(target, store, scenarios, plan, progress)
        await _populate(store, key_space(100), small)
        progress.start(f"{target} scaling: concurrency", ticks * len(plan.scaling_concurrencies))
        scenarios = [
            ("concurrency", tasks, scenario)
            for tasks in plan.scaling_concurrencies
            for scenario in kv_scenarios(100, tasks, ("get", "put"))
        ]
        result["concurrency"] += await _sweep(target, store, scenarios, plan, progress)
    finally:
        await _close(store)
    return result


async def run_target(
    target: str, url: str, plan: Plan, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Benchmark the store at ``url`` (shown as ``target``); return (rows, scaling results)."""
    kind = family(url)
    store: Any = open_store(url)
    contenders: dict[str, Any] = {"kvstores": store}
    if plan.compare:
        contenders |= baselines(url, getattr(store, "path", None) if kind == "sqlite" else None)
    rows: list[dict[str, Any]] = []
    try:
        rows += await _main_rows(target, kind, contenders, plan, progress)
        if plan.events:
            rows += await _event_rows(target, kind, store, contenders, plan, progress)
    finally:
        for contender in contenders.values():
            await _close(contender)
    scaling: dict[str, Any] = {}
    if plan.scaling:
        try:
            scaling = await _scaling(target, url, kind, plan, progress)
        except Exception as exc:  # keep the rows measured so far
            print(f"kvstores bench: {target}: scaling failed: {exc!r}", file=sys.stderr)
    return rows, scaling
