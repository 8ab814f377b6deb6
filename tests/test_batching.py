"""Opportunistic batching: concurrent single-key calls share round trips, each keeps its own outcome.

The Coalescer is checked on its own (bounds, order, cancellation, failures), then through real
stores on every row that batches (all but memory): a lone caller goes out alone, concurrent
callers share bulk calls, and per-call results and errors are kept. The conformance, model,
adversarial and multi-process suites run with batching on (the default) and, in CI, again
with ``KVSTORES_BATCHING=off`` (which these tests ignore).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from kvstores import DeserializationError, InvalidKeyError, MemoryStore, StoreConnectionError, open_store
from kvstores._batching import Coalescer
from tests.support import Backend

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def batching_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of batching itself: a run with ``KVSTORES_BATCHING=off`` (CI's 3.11 loop) keeps it on here."""
    monkeypatch.delenv("KVSTORES_BATCHING", raising=False)


class Recorder:
    """A fake backend: records batches and answers after yielding to the loop (a round trip)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.singles: list[str] = []
        self.batches: list[list[str]] = []
        self.fail_on = fail_on

    async def one(self, item: str) -> str:
        self.singles.append(item)
        await asyncio.sleep(0.01)
        return item.upper()

    async def many(self, items: Sequence[str]) -> list[str]:
        self.batches.append(list(items))
        await asyncio.sleep(0.01)
        if self.fail_on in items:
            raise StoreConnectionError("the batch's connection was lost")
        return [item.upper() for item in items]


async def test_a_lone_caller_goes_out_alone_at_once() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.one, recorder.many)
    assert [await coalescer("a"), await coalescer("b")] == ["A", "B"]
    assert (recorder.singles, recorder.batches) == (["a", "b"], [])


async def test_callers_arriving_in_flight_share_the_next_round_trip() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.one, recorder.many)
    items = [f"k{i}" for i in range(50)]
    assert await asyncio.gather(*(coalescer(item) for item in items)) == [item.upper() for item in items]
    assert recorder.singles == ["k0"]
    assert recorder.batches == [items[1:]]  # FIFO: nobody overtakes


async def test_batches_are_bounded_in_count_and_bytes() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.one, recorder.many, size=len, max_items=10, max_bytes=12)
    items = [f"k{i:02}" for i in range(40)]  # 3 bytes each: 4 fit in 12 bytes
    await asyncio.gather(*(coalescer(item) for item in items))
    assert all(len(batch) <= 4 for batch in recorder.batches)
    assert [item for batch in recorder.batches for item in batch] == items[1:]
    coalescer = Coalescer(recorder.one, recorder.many, max_items=10)
    recorder.batches.clear()
    await asyncio.gather(*(coalescer(item) for item in items))
    assert [len(batch) for batch in recorder.batches] == [10, 10, 10, 9]


async def test_a_failed_batch_fails_only_its_own_calls() -> None:
    recorder = Recorder(fail_on="bad")
    coalescer = Coalescer(recorder.one, recorder.many, max_items=3)
    items = ["first", "a", "b", "bad", "c", "d", "e"]
    outcomes = await asyncio.gather(*(coalescer(item) for item in items), return_exceptions=True)
    # batches: [first] alone, then [a, b, bad] fails together, then [c, d, e] succeeds
    assert outcomes[0] == "FIRST"
    assert all(isinstance(outcome, StoreConnectionError) for outcome in outcomes[1:4])
    assert outcomes[4:] == ["C", "D", "E"]


async def test_a_cancelled_caller_leaves_the_others_intact() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.one, recorder.many)
    tasks = [asyncio.create_task(coalescer(f"k{i}")) for i in range(6)]
    await asyncio.sleep(0)  # all queued behind k0
    tasks[0].cancel()  # the one in flight
    tasks[3].cancel()  # one waiting
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[0], asyncio.CancelledError) and isinstance(outcomes[3], asyncio.CancelledError)
    assert [outcomes[i] for i in (1, 2, 4, 5)] == ["K1", "K2", "K4", "K5"]
    assert recorder.batches == [["k1", "k2", "k4", "k5"]]
    assert await coalescer("after") == "AFTER"  # idle again: a lone call goes out alone


class Flights(Recorder):
    """A Recorder that logs when each flight takes off and lands, and the most ever out at once."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.out = self.most = 0

    async def one(self, item: str) -> str:
        return (await self.many([item]))[0]

    async def many(self, items: Sequence[str]) -> list[str]:
        self.out += 1
        self.most = max(self.most, self.out)
        self.log.append(f"off {' '.join(items)}")
        try:
            return await super().many(items)
        finally:
            self.out -= 1
            self.log.append(f"landed {' '.join(items)}")


async def test_a_burst_within_capacity_flies_beside_the_first_call() -> None:
    flights = Flights()
    coalescer = Coalescer(flights.one, flights.many, capacity=lambda: 10)
    items = [f"k{i}" for i in range(8)]
    assert await asyncio.gather(*(coalescer(item) for item in items)) == [item.upper() for item in items]
    assert flights.batches == [["k0"], items[1:]]  # one alone, the rest together: two flights ...
    assert flights.most == 2  # ... side by side, so the burst costs one round trip


@pytest.mark.parametrize(("capacity", "most"), [(1, 1), (10, 2)])
async def test_one_batch_flies_at_a_time_and_only_beside_a_spare_connection(capacity: int, most: int) -> None:
    flights = Flights()
    coalescer = Coalescer(flights.one, flights.many, capacity=lambda: capacity, max_items=5)
    items = [f"k{i:02}" for i in range(40)]
    await asyncio.gather(*(coalescer(item) for item in items))
    assert flights.most == most  # the lone call, and one batch beside it when there is a second connection
    assert [item for batch in flights.batches for item in batch] == items  # FIFO: nobody overtakes


async def test_calls_on_one_key_never_fly_at_once() -> None:
    flights = Flights()
    coalescer = Coalescer(flights.one, flights.many, key=lambda item: item[0], capacity=lambda: 10)
    await asyncio.gather(coalescer("a1"), coalescer("a2"), coalescer("b1"), coalescer("a3"))
    # b1 flies beside a1 at once; a2 and a3 wait for a1 to land, then go together, in order
    assert flights.log.index("landed a1") < flights.log.index("off a2 a3")
    assert flights.batches == [["a1"], ["b1"], ["a2", "a3"]]


def test_memory_does_not_batch() -> None:
    assert MemoryStore().batching is False


@pytest.fixture
def batching(backend: Backend) -> Backend:
    if not backend.persistent:
        pytest.skip(f"{backend.name}: no round trips to share")
    return backend


class Counting:
    """Counts a store's primitive calls (round trips) by wrapping them on the instance."""

    def __init__(self, store: Any) -> None:
        self.calls: dict[str, int] = {}
        for name in ("_get", "_get_many", "_get_pairs", "_put", "_put_many", "_put_entries"):
            setattr(store, name, self._counted(name, getattr(store, name)))

    def _counted(self, name: str, method: Any) -> Any:
        async def counted(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return await method(*args)

        return counted


async def test_store_coalesces_concurrent_gets_and_puts(batching: Backend, namespace: str) -> None:
    store = await batching.open(namespace)
    try:
        assert store.batching is True
        counting = Counting(store)
        keys = [f"k{i}" for i in range(64)]
        await asyncio.gather(*(store.put(key, {"key": key}) for key in keys))
        assert await asyncio.gather(*(store.get(key) for key in keys)) == [{"key": key} for key in keys]
        assert counting.calls["_put"] == counting.calls["_get"] == 1  # the first of each went out alone
        assert counting.calls["_put_entries"] + counting.calls["_get_pairs"] < 2 * len(keys) / 4
    finally:
        await store.destroy()
        await store.aclose()


async def test_store_batched_calls_keep_their_own_outcomes(batching: Backend, namespace: str) -> None:
    store = await batching.open(namespace)
    try:
        await store.put_many(["good", "bad"], [{"ok": 1}, {"ok": 2}])
        batching.corrupt(store, "bad", "not json")
        calls = [store.get("good"), store.get("bad"), store.get("x" * 5000), store.get("good"), store.get("missing")]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert outcomes[0] == outcomes[3] == {"ok": 1}
        assert isinstance(outcomes[1], DeserializationError)
        assert isinstance(outcomes[2], InvalidKeyError)  # rejected before it was queued
        assert outcomes[4] is None
    finally:
        await store.destroy()
        await store.aclose()


async def test_store_get_after_put_returned_sees_it(batching: Backend, namespace: str) -> None:
    store = await batching.open(namespace)
    try:

        async def writer_then_reader(index: int) -> None:
            for round_ in range(5):
                await store.put(f"k{index}", {"round": round_})
                assert await store.get(f"k{index}") == {"round": round_}

        await asyncio.gather(*(writer_then_reader(index) for index in range(32)))
    finally:
        await store.destroy()
        await store.aclose()


async def test_batching_can_be_turned_off(batching: Backend, namespace: str) -> None:
    url, options = batching.url(namespace)
    separator = "&" if "?" in url else "?"
    for store in (
        open_store(url, **{**options, "batching": False}),
        open_store(f"{url}{separator}batching=false", **options),
    ):
        try:
            assert store.batching is False
            counting = Counting(store)
            await asyncio.gather(*(store.get(f"k{i}") for i in range(16)))
            assert counting.calls == {"_get": 16}
        finally:
            await store.aclose()


async def _queued_behind_one_in_flight(store: Any, calls: list[Any]) -> list[Any]:
    """Run ``calls`` while another put is in flight, so that they queue and go out as one batch."""
    in_flight = asyncio.ensure_future(store.put("in-flight", {}))
    await asyncio.sleep(0)
    outcomes = await asyncio.gather(*calls)
    await in_flight
    return outcomes


@pytest.mark.parametrize(
    ("ttls", "expected_ttl"), [((100, None, 100), 100), ((100, 100, None), None), ((None, None, 50), 50)]
)
async def test_the_last_queued_write_of_a_key_wins_whatever_its_ttl(
    batching: Backend, namespace: str, ttls: tuple[float | None, ...], expected_ttl: float | None
) -> None:
    store = await batching.open(namespace)
    try:
        counting = Counting(store)
        await _queued_behind_one_in_flight(store, [store.put("k", {"v": i}, ttl=ttl) for i, ttl in enumerate(ttls)])
        assert counting.calls.get("_put_entries") == 1, counting.calls  # the three writes did share a batch
        value, remaining = await store.ttl("k")
        assert value == {"v": len(ttls) - 1}
        if expected_ttl is None:
            assert remaining is None
        else:
            assert remaining is not None and expected_ttl - 5 < remaining <= expected_ttl
    finally:
        await store.destroy()
        await store.aclose()


async def test_a_batch_over_many_collections_is_one_round_trip(batching: Backend, namespace: str) -> None:
    store = await batching.open(namespace)
    try:
        counting = Counting(store)
        pairs = [(f"k{i}", f"c{i % 32}") for i in range(64)]
        ttls = [None, 60, 120]
        await _queued_behind_one_in_flight(
            store, [store.put(k, {"k": k}, collection=c, ttl=ttls[i % 3]) for i, (k, c) in enumerate(pairs)]
        )
        got = await _queued_behind_one_in_flight(store, [store.get(k, collection=c) for k, c in pairs])
        assert got == [{"k": k} for k, _ in pairs]
        # one bulk call per batch, whatever the collections and TTLs: not one per collection
        assert counting.calls.get("_put_entries") == counting.calls.get("_get_pairs") == 1, counting.calls
        assert "_get_many" not in counting.calls and "_put_many" not in counting.calls, counting.calls
        remaining = [seconds for _, seconds in await store.ttl_many(["k1", "k33"], collection="c1")]
        assert remaining[0] is not None and 55 < remaining[0] <= 60  # k1: ttls[1]
        assert remaining[1] is None  # k33: ttls[0]
    finally:
        await store.destroy()
        await store.aclose()


async def test_a_cancelled_call_may_still_land(batching: Backend, namespace: str) -> None:
    """Documented in the README: a write cancelled once taken into a batch still lands, although
    its caller saw CancelledError."""
    store = await batching.open(namespace)
    try:
        taken = asyncio.Event()
        put_entries = store._put_entries

        async def batch_in_flight(entries: Any) -> None:
            taken.set()
            await put_entries(entries)

        store._put_entries = batch_in_flight
        in_flight = asyncio.ensure_future(store.put("in-flight", {}))
        await asyncio.sleep(0)
        early = asyncio.ensure_future(store.put("k", {"by": "cancelled"}))  # queued: in_flight is out
        await asyncio.wait_for(taken.wait(), 10)  # the queued write was taken into a batch, now in flight
        early.cancel()
        with pytest.raises(asyncio.CancelledError):
            await early
        await in_flight
        for _ in range(200):  # the batch lands on its own (beside other flights, nothing waits for it)
            if await store.get("k") is not None:
                break
            await asyncio.sleep(0.01)
        assert await store.get("k") == {"by": "cancelled"}
    finally:
        await store.destroy()
        await store.aclose()
