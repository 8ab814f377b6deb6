"""Model-based testing: a hypothesis state machine drives every backend against a pure-Python model.

Each backend of the table gets one run of :class:`StoreMachine`: random put / put_many / get /
get_many / ttl / ttl_many / delete / delete_many / keys / collections / destroy_collection
calls with adversarial keys, collections and values, and short real TTLs. The machine owns
its event loop (an ``asyncio.Runner``); the stores are opened on it.

Expiry is modelled with a tolerance: the model records the window in which each write
happened, and an entry whose expiry falls within ``TOLERANCE`` of the window of a read may
be seen either way. Once it is seen absent, the model drops it (it can never come back).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from kvstores import MAX_KEY_LENGTH, MAX_TTL_SECONDS
from tests.support import Backend

T = TypeVar("T")

TOLERANCE = 0.025
"""Seconds around an expiry within which an entry may be seen either present or absent."""

ADVERSARIAL_NAMES = [
    "k",
    "K",
    " k",
    "a:b",
    "a::b",
    "default",
    "{",
    "}",
    "{a}",
    "a}b",
    "}{",
    "%7B",
    "%25",
    "*",
    "?",
    "[a-z]",
    "\\",
    "\\*",
    "'",
    '"',
    "'; DROP TABLE kvstores_entries; --",
    "/* */",
    "$gt",
    "$where",
    "a.b",
    ".",
    "_id",
    "\x00",
    "k\x00",
    "\n",
    "\u00e9",  # NFC
    "e\u0301",  # NFD: a different key
    "\U0001f642",
    "x" * MAX_KEY_LENGTH,
    "\U0001f642" * MAX_KEY_LENGTH,
]
"""Keys and collection names that a careless encoding would confuse or inject through."""

KEYS = st.sampled_from(["", *ADVERSARIAL_NAMES]) | st.text(max_size=4)
COLLECTIONS = st.sampled_from(
    [
        *(None, "c", "default", "{", "}", "{a}", "a}b", "%7B", "*", "[a-z]", "\\*"),
        *("'; DROP TABLE kvstores_entries; --", "$gt", "a.b", "\x00", "\U0001f642", "x" * MAX_KEY_LENGTH),
    ]
)
TTLS = st.sampled_from([None, None, 0.05, 0.15, 60, MAX_TTL_SECONDS])

FIELD_NAMES = st.sampled_from(["", "$set", "$where", "a.b", ".", "_id", "\x00", "\U0001f642"]) | st.text(max_size=5)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["\x00", "x" * 3000, "\U0001f642" * 500, "'); --", "{*}"])
)
JSON = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(FIELD_NAMES, children, max_size=4),
    max_leaves=10,
)
VALUES = st.dictionaries(FIELD_NAMES, JSON, max_size=4)
INVALID_VALUES = st.sampled_from([{"nan": math.nan}, {"inf": math.inf}, {"b": b"x"}, {"s": {1}}, {1: "int key"}])
INVALID_TTLS = st.sampled_from([0, -1, math.nan, math.inf, True, "1", MAX_TTL_SECONDS + 1])


def same(got: Any, expected: Any) -> bool:
    """Equal as JSON: 1, 1.0 and True differ (== would confuse them)."""
    return json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


class State(Enum):
    """What the model knows about an entry at the time of a read."""

    ABSENT = "absent"
    LIVE = "live"
    MAYBE = "maybe"  # expiring within the tolerance of the read


@dataclass
class Entry:
    """A modelled entry: its value and the window (monotonic seconds) in which it expires."""

    value: dict[str, Any]
    ttl: float | None
    earliest: float = math.inf
    latest: float = math.inf


Pair = tuple[str, str]


class StoreMachine(RuleBasedStateMachine):
    """Drives ``store`` (and ``peer``, another store object on the same data) against a dict."""

    def __init__(self, run: Callable[[Awaitable[Any]], Any], store: Any, peer: Any) -> None:
        super().__init__()
        self.run = run
        self.store = store
        self.peer = peer
        self.model: dict[Pair, Entry] = {}
        self.seen: dict[tuple[str | None, str], None] = {}  # (collection as passed, key), in order
        self.short_ttls = False  # whether waiting can expire anything (never depends on the clock)
        run(store.destroy())

    # -- helpers -------------------------------------------------------------------

    def call(self, awaitable: Awaitable[T]) -> tuple[T, float, float]:
        """Run one store call; return its result and the monotonic window around it."""
        start = time.monotonic()
        result = self.run(awaitable)
        return result, start, time.monotonic()

    @staticmethod
    def name(collection: str | None) -> str:
        return "default" if collection is None else collection

    def write(
        self,
        collection: str | None,
        keys: list[str],
        values: list[dict[str, Any]],
        ttl: float | None,
        start: float,
        end: float,
    ) -> None:
        name = self.name(collection)
        for key, value in zip(keys, values):
            pair = (name, key)
            self.seen[collection, key] = None
            entry = Entry(json.loads(json.dumps(value)), ttl)
            if ttl is not None:
                self.short_ttls = self.short_ttls or ttl < 1
                entry.earliest, entry.latest = start + ttl, end + ttl
            self.model[pair] = entry

    def state(self, pair: Pair, start: float, end: float) -> State:
        entry = self.model.get(pair)
        if entry is None:
            return State.ABSENT
        if entry.earliest - TOLERANCE > end:
            return State.LIVE
        if entry.latest + TOLERANCE <= start:
            del self.model[pair]
            return State.ABSENT
        return State.MAYBE

    def check_value(self, pair: Pair, got: Any, start: float, end: float) -> None:
        state = self.state(pair, start, end)
        if state is State.ABSENT:
            assert got is None, f"{pair!r}: expected absent, got {got!r}"
        elif state is State.LIVE:
            assert same(got, self.model[pair].value), f"{pair!r}: expected {self.model[pair].value!r}, got {got!r}"
        elif got is None:
            del self.model[pair]  # seen expired: it stays expired
        else:
            assert same(got, self.model[pair].value), f"{pair!r}: expected {self.model[pair].value!r}, got {got!r}"

    def check_remaining(self, pair: Pair, got: Any, remaining: float | None, start: float, end: float) -> None:
        self.check_value(pair, got, start, end)
        entry = self.model.get(pair)
        if got is None or entry is None:
            assert remaining is None
        elif entry.ttl is None:
            assert remaining is None, f"{pair!r}: no TTL was set, got {remaining!r}"
        else:
            assert isinstance(remaining, float), f"{pair!r}: remaining {remaining!r} is not a float"
            low, high = entry.earliest - end - TOLERANCE, entry.latest - start + TOLERANCE
            assert low <= remaining <= high, f"{pair!r}: remaining {remaining} not in [{low}, {high}]"

    def existed(self, pairs: list[Pair], start: float, end: float) -> tuple[int, int]:
        """How many of ``pairs`` are surely live, and how many may be; drops them from the model."""
        states = [self.state(pair, start, end) for pair in pairs]
        for pair in pairs:
            self.model.pop(pair, None)
        return states.count(State.LIVE), states.count(State.MAYBE)

    def draw_collection(self, data: st.DataObject) -> str | None:
        """A collection written to before (often) or any collection."""
        seen = list(dict.fromkeys(collection for collection, _ in self.seen))
        return data.draw(st.sampled_from(seen) | COLLECTIONS if seen else COLLECTIONS, label="collection")

    def key_strategy(self, collection: str | None) -> st.SearchStrategy[str]:
        """Keys of ``collection`` written to before (often) or any keys."""
        name = self.name(collection)
        seen = [key for other, key in self.seen if self.name(other) == name]
        return st.sampled_from(seen) | KEYS if seen else KEYS

    def draw_key(self, data: st.DataObject, collection: str | None) -> str:
        return data.draw(self.key_strategy(collection), label="key")

    def draw_keys(self, data: st.DataObject, collection: str | None) -> list[str]:
        return data.draw(st.lists(self.key_strategy(collection), max_size=6), label="keys")

    # -- rules ---------------------------------------------------------------------

    @rule(data=st.data(), value=VALUES, ttl=TTLS)
    def put(self, data: st.DataObject, value: dict[str, Any], ttl: float | None) -> None:
        collection = self.draw_collection(data)
        key = self.draw_key(data, collection)
        _, start, end = self.call(self.store.put(key, value, collection=collection, ttl=ttl))
        self.write(collection, [key], [value], ttl, start, end)

    @rule(data=st.data(), ttl=TTLS)
    def put_many(self, data: st.DataObject, ttl: float | None) -> None:
        collection = self.draw_collection(data)
        keys = self.draw_keys(data, collection)
        values = data.draw(st.lists(VALUES, min_size=len(keys), max_size=len(keys)), label="values")
        _, start, end = self.call(self.store.put_many(keys, values, collection=collection, ttl=ttl))
        self.write(collection, keys, values, ttl, start, end)

    @rule(data=st.data(), bad=st.tuples(INVALID_VALUES, TTLS) | st.tuples(VALUES, INVALID_TTLS))
    def put_invalid(self, data: st.DataObject, bad: tuple[dict[Any, Any], Any]) -> None:
        """A bad value or TTL raises ValueError and writes nothing (the model is unchanged)."""
        collection = self.draw_collection(data)
        key = self.draw_key(data, collection)
        value, ttl = bad
        with pytest.raises(ValueError):
            self.run(self.store.put_many([key, "other"], [{"ok": 1}, value], collection=collection, ttl=ttl))

    @rule(data=st.data(), via_peer=st.booleans())
    def get(self, data: st.DataObject, via_peer: bool) -> None:
        collection = self.draw_collection(data)
        key = self.draw_key(data, collection)
        store = self.peer if via_peer else self.store
        got, start, end = self.call(store.get(key, collection=collection))
        self.check_value((self.name(collection), key), got, start, end)

    @rule(data=st.data())
    def get_many(self, data: st.DataObject) -> None:
        collection = self.draw_collection(data)
        keys = self.draw_keys(data, collection)
        got, start, end = self.call(self.store.get_many(keys, collection=collection))
        assert len(got) == len(keys)
        for key, value in zip(keys, got):
            self.check_value((self.name(collection), key), value, start, end)

    @rule(data=st.data())
    def ttl(self, data: st.DataObject) -> None:
        collection = self.draw_collection(data)
        key = self.draw_key(data, collection)
        (got, remaining), start, end = self.call(self.store.ttl(key, collection=collection))
        self.check_remaining((self.name(collection), key), got, remaining, start, end)

    @rule(data=st.data(), via_peer=st.booleans())
    def ttl_many(self, data: st.DataObject, via_peer: bool) -> None:
        collection = self.draw_collection(data)
        keys = self.draw_keys(data, collection)
        store = self.peer if via_peer else self.store
        rows, start, end = self.call(store.ttl_many(keys, collection=collection))
        assert len(rows) == len(keys)
        for key, (got, remaining) in zip(keys, rows):
            self.check_remaining((self.name(collection), key), got, remaining, start, end)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        collection = self.draw_collection(data)
        key = self.draw_key(data, collection)
        deleted, start, end = self.call(self.store.delete(key, collection=collection))
        live, maybe = self.existed([(self.name(collection), key)], start, end)
        assert live <= deleted <= live + maybe, f"delete returned {deleted}, expected {live} (+{maybe} expiring)"

    @rule(data=st.data())
    def delete_many(self, data: st.DataObject) -> None:
        collection = self.draw_collection(data)
        keys = self.draw_keys(data, collection)
        deleted, start, end = self.call(self.store.delete_many(keys, collection=collection))
        pairs = list(dict.fromkeys((self.name(collection), key) for key in keys))
        live, maybe = self.existed(pairs, start, end)
        assert live <= deleted <= live + maybe, f"delete_many returned {deleted}, expected {live} (+{maybe} expiring)"

    @rule(data=st.data())
    def keys(self, data: st.DataObject) -> None:
        collection = self.draw_collection(data)
        listed, start, end = self.call(self.store.keys(collection))
        assert len(listed) == len(set(listed)), f"duplicate keys listed: {listed!r}"
        name = self.name(collection)
        states = {key: self.state((other, key), start, end) for other, key in list(self.model) if other == name}
        surely = {key for key, state in states.items() if state is State.LIVE}
        maybe = {key for key, state in states.items() if state is State.MAYBE}
        assert surely <= set(listed) <= surely | maybe, f"{name!r}: listed {listed!r}, expected {surely!r}"
        for key in maybe - set(listed):
            del self.model[name, key]

    @rule()
    def collections(self) -> None:
        listed, start, end = self.call(self.store.collections())
        assert len(listed) == len(set(listed)), f"duplicate collections listed: {listed!r}"
        states = {pair: self.state(pair, start, end) for pair in list(self.model)}
        surely = {name for (name, _), state in states.items() if state is State.LIVE}
        maybe = {name for (name, _), state in states.items() if state is State.MAYBE}
        assert surely <= set(listed) <= surely | maybe, f"listed {listed!r}, expected {surely!r} (+{maybe!r})"

    @rule(data=st.data())
    def destroy_collection(self, data: st.DataObject) -> None:
        name = self.name(self.draw_collection(data))
        destroyed, start, end = self.call(self.store.destroy_collection(name))
        live, maybe = self.existed([pair for pair in self.model if pair[0] == name], start, end)
        if live or not maybe:
            assert destroyed is (live > 0), f"{name!r}: returned {destroyed} with {live} live entries"

    @precondition(lambda self: self.short_ttls)
    @rule(seconds=st.sampled_from([0.06, 0.16]))
    def wait(self, seconds: float) -> None:
        """Let short TTLs run out (only when some entry has one)."""
        time.sleep(seconds)


async def _open(backend: Backend, namespace: str) -> tuple[Any, Any]:
    store = await backend.open(namespace)
    peer = await backend.open(namespace) if backend.persistent else store
    return store, peer


async def _close(store: Any, peer: Any) -> None:
    await store.destroy()
    await store.aclose()
    await peer.aclose()


def test_backend_matches_model(backend: Backend, namespace: str) -> None:
    with asyncio.Runner() as runner:
        store, peer = runner.run(_open(backend, namespace))
        try:
            run_state_machine_as_test(lambda: StoreMachine(runner.run, store, peer))
        finally:
            runner.run(_close(store, peer))
