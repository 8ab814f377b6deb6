"""AsyncKeyValueConformance: the key-value contract as a reusable pytest class.

Subclass it and provide a ``store`` fixture that yields a store on an empty, isolated
namespace (the tests list, destroy and cull what they find there)::

    class TestMyStore(AsyncKeyValueConformance):
        @pytest.fixture
        async def store(self):
            async with MyStore(...) as store:
                yield store

Optionally provide ``peer_store`` (a second store object on the same namespace) to run
the cross-object visibility checks. The checks of an optional capability (``keys()``,
``cull()``, the atomic operations...) run when the store implements it, as
:func:`kvstores.capabilities` detects; set the ``capabilities`` class attribute to claim
less. Every check left out is reported as skipped with the reason. Test names start with
their group (``test_ttl_...``), which ``kvstores check`` uses for its summary.
"""

from __future__ import annotations

import asyncio
import math
import reprlib
import unicodedata
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any, ClassVar

import pytest

from kvstores import MAX_KEY_LENGTH, MAX_TTL_SECONDS, MAX_VALUE_BYTES, UNCHANGED
from kvstores.conformance._base import StoreConformance, requires
from kvstores.errors import (
    InvalidKeyError,
    InvalidTTLError,
    SerializationError,
    StoreClosedError,
    ValueTooLargeError,
)

__all__ = ["AsyncKeyValueConformance"]

EDGE_KEYS = [
    "",
    "plain",
    "a::b",
    "a:b",
    ":",
    "\x00",
    "nul\x00inside",
    "line\nbreak\r\n",
    "tab\t",
    "*",
    "?",
    "[ab]",
    "*?[]^!\\",
    "{tag}",
    "}{",
    "%",
    "%25",
    "'",
    '"',
    "'; DROP TABLE kvstores_entries; --",
    "$where",
    "a.b.c",
    "$",
    ".",
    " ",
    "emoji \U0001f600",
    unicodedata.normalize("NFC", "caf\u00e9"),
    unicodedata.normalize("NFD", "caf\u00e9"),
    "\u202e",
    "x" * MAX_KEY_LENGTH,
]
"""Keys every store must round-trip exactly and keep apart."""

COLLIDING_PAIRS = [
    ("a::b", "c"),
    ("a", "b::c"),
    ("a:b", "c"),
    ("a", "b:c"),
    ("a/b", "c"),
    ("a", "b/c"),
    ("{a}", "b"),
    ("a", "{b}"),
    ("a}", "{b"),
    ("a", "}{b"),
    ("a%7D", "b"),
]
"""(collection, key) pairs that naive separator-joined encodings would merge."""

GOOD_VALUES: list[dict[str, Any]] = [
    {},
    {"value": "x" * 100},
    {"s": "", "u": "caf\u00e9 \U0001f600", "nul": "a\x00b", "ctl": "\x01\x1f\n"},
    {"int": 0, "neg": -1, "big": 2**64 + 1, "huge": -(10**40)},
    {"float": 0.1, "tiny": 5e-324, "max": 1.7976931348623157e308, "neg": -2.5e-10},
    {"t": True, "f": False, "n": None, "one": 1, "zero": 0, "onef": 1.0},
    {"list": [1, "two", [3, [4, {"five": 5}]], None], "empty": [], "obj": {}},
    {"$set": 1, "a.b": 2, "": 3, "$": {"$in": [1]}, "..": None},
    {"deep": [[[[[[[[[[[[[[[[[[[[{"x": [1]}]]]]]]]]]]]]]]]]]]]]},
]
"""Values every store must return exactly (types included: True is not 1)."""

BAD_VALUES: list[Any] = [
    {"nan": math.nan},
    {"inf": math.inf},
    {"ninf": [-math.inf]},
    {"bytes": b"x"},
    {"set": {1, 2}},
    {"when": datetime(2026, 1, 1, tzinfo=UTC)},
    {"obj": object()},
    {"decimal": Decimal("1.5")},
    {1: "int key"},
    {"nested": {2: "int key"}},
    {"deeper": [{"ok": {None: 1}}]},
    {"surrogate": "\ud800"},
    ["not", "a", "mapping"],
    "not a mapping",
    None,
]
"""Values every store must reject with SerializationError."""

BAD_TTLS: list[Any] = [0, 0.0, -1, -0.001, math.nan, math.inf, -math.inf, True, False, "10", b"1", MAX_TTL_SECONDS + 1]
"""TTLs every store must reject with InvalidTTLError."""


@contextmanager
def rejected(error: type[Exception], what: str) -> Iterator[None]:
    """Like ``pytest.raises(error)``, but a failure says ``what`` was accepted instead."""
    try:
        yield
    except error:
        return
    pytest.fail(f"{what} was accepted; expected {error.__name__}", pytrace=False)


def typed(value: Any) -> Any:
    """A comparable form of a JSON value that tells True from 1 and 1.0 from 1."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in sorted(value.items())])
    if isinstance(value, (list, tuple)):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, value)


def assert_same(actual: Any, expected: Any) -> None:
    """Assert that ``actual`` equals ``expected`` with JSON types preserved."""
    assert typed(actual) == typed(expected)


class AsyncKeyValueConformance(StoreConformance):
    """The kvstores key-value contract (README, "Semantics"); subclass it with a ``store`` fixture."""

    max_value_bytes: ClassVar[int | None] = MAX_VALUE_BYTES
    """The store's value size limit (None: do not test it)."""
    ttl_tolerance: ClassVar[float] = 0.25
    """Seconds of slack allowed on remaining-time checks."""
    large_batch: ClassVar[int] = 10_000
    """Keys in one bulk call for the large-batch checks."""

    # -- basics ----------------------------------------------------------------------

    async def test_basics_missing_key(self, store: Any) -> None:
        assert await store.get("missing") is None
        assert await store.ttl("missing") == (None, None)
        assert await store.delete("missing") is False
        assert await store.get("missing", collection="other") is None

    async def test_basics_round_trip_and_overwrite(self, store: Any) -> None:
        await store.put("k", {"v": 1})
        assert_same(await store.get("k"), {"v": 1})
        await store.put("k", {"v": 2, "w": [True]})
        assert_same(await store.get("k"), {"v": 2, "w": [True]})

    async def test_basics_delete(self, store: Any) -> None:
        await store.put("k", {"v": 1})
        assert await store.delete("k") is True
        assert await store.get("k") is None
        assert await store.delete("k") is False

    async def test_basics_default_collection(self, store: Any) -> None:
        await store.put("k", {"where": "default"})
        await store.put("k", {"where": "other"}, collection="other")
        assert_same(await store.get("k"), {"where": "default"})
        assert_same(await store.get("k", collection="other"), {"where": "other"})
        default = getattr(store, "default_collection", None)
        if default is not None:
            assert_same(await store.get("k", collection=default), {"where": "default"})

    async def test_basics_collections_isolated(self, store: Any) -> None:
        await store.put("k", {"c": 1}, collection="one")
        await store.put("k", {"c": 2}, collection="two")
        assert await store.delete("k", collection="one") is True
        assert await store.get("k", collection="one") is None
        assert_same(await store.get("k", collection="two"), {"c": 2})

    async def test_basics_no_collisions(self, store: Any) -> None:
        for index, (collection, key) in enumerate(COLLIDING_PAIRS):
            await store.put(key, {"i": index}, collection=collection)
        for index, (collection, key) in enumerate(COLLIDING_PAIRS):
            assert_same(await store.get(key, collection=collection), {"i": index})

    # -- keys and collection names ---------------------------------------------------

    async def test_keys_edge_cases_round_trip(self, store: Any) -> None:
        await store.put_many(EDGE_KEYS, [{"key": key} for key in EDGE_KEYS], collection="edge")
        for key in EDGE_KEYS:
            assert_same(await store.get(key, collection="edge"), {"key": key})
        assert_same(await store.get_many(EDGE_KEYS, collection="edge"), [{"key": key} for key in EDGE_KEYS])

    async def test_keys_edge_cases_as_collections(self, store: Any) -> None:
        names = [name for name in EDGE_KEYS if name]
        for name in names:
            await store.put("k", {"collection": name}, collection=name)
        for name in names:
            assert_same(await store.get("k", collection=name), {"collection": name})

    async def test_keys_invalid_key_rejected(self, store: Any) -> None:
        await store.put("k", {"v": 1})
        for bad in [1, None, b"k", ("k",), "x" * (MAX_KEY_LENGTH + 1), "lone \ud800 surrogate"]:
            with rejected(InvalidKeyError, f"put() of key {reprlib.repr(bad)}"):
                await store.put(bad, {"v": 2})
            with rejected(InvalidKeyError, f"get() of key {reprlib.repr(bad)}"):
                await store.get(bad)
            with rejected(InvalidKeyError, f"delete() of key {reprlib.repr(bad)}"):
                await store.delete(bad)
            with rejected(InvalidKeyError, f"put_many() of key {reprlib.repr(bad)}"):
                await store.put_many(["k", bad], [{"v": 2}, {"v": 2}])
            with rejected(InvalidKeyError, f"get_many() of key {reprlib.repr(bad)}"):
                await store.get_many([bad])
        assert_same(await store.get("k"), {"v": 1})

    async def test_keys_invalid_collection_rejected(self, store: Any) -> None:
        await store.put("k", {"v": 1})
        for bad in ["", 7, b"c", "x" * (MAX_KEY_LENGTH + 1), "\udfff"]:
            with rejected(InvalidKeyError, f"put() in collection {reprlib.repr(bad)}"):
                await store.put("k", {"v": 2}, collection=bad)
            with rejected(InvalidKeyError, f"get() in collection {reprlib.repr(bad)}"):
                await store.get("k", collection=bad)
            with rejected(InvalidKeyError, f"delete_many() in collection {reprlib.repr(bad)}"):
                await store.delete_many(["k"], collection=bad)
        assert_same(await store.get("k"), {"v": 1})

    async def test_keys_longest_collection(self, store: Any) -> None:
        name = "c" * MAX_KEY_LENGTH
        await store.put("k" * MAX_KEY_LENGTH, {"v": 1}, collection=name)
        assert_same(await store.get("k" * MAX_KEY_LENGTH, collection=name), {"v": 1})

    # -- values ------------------------------------------------------------------------

    async def test_values_fidelity(self, store: Any) -> None:
        for index, value in enumerate(GOOD_VALUES):
            await store.put(f"v{index}", value)
        for index, value in enumerate(GOOD_VALUES):
            assert_same(await store.get(f"v{index}"), value)

    async def test_values_tuples_and_mappings(self, store: Any) -> None:
        await store.put("tuple", {"t": (1, (2, 3))})
        assert_same(await store.get("tuple"), {"t": [1, [2, 3]]})
        await store.put("proxy", MappingProxyType({"a": 1}))
        assert_same(await store.get("proxy"), {"a": 1})
        await store.put("ordered", OrderedDict([("b", 2), ("a", 1)]))
        assert_same(await store.get("ordered"), {"a": 1, "b": 2})

    async def test_values_rejected_and_nothing_written(self, store: Any) -> None:
        await store.put("k", {"v": "kept"})
        for bad in BAD_VALUES:
            with rejected(SerializationError, f"put() of {reprlib.repr(bad)}"):
                await store.put("k", bad)
            with rejected(SerializationError, f"put() of {reprlib.repr(bad)}"):
                await store.put("new", bad)
        assert_same(await store.get("k"), {"v": "kept"})
        assert await store.get("new") is None

    async def test_values_cycle_and_depth_rejected(self, store: Any) -> None:
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        deep: Any = None
        for _ in range(100_000):
            deep = [deep]
        for bad in [cyclic, {"deep": deep}]:
            with rejected(SerializationError, f"put() of {reprlib.repr(bad)}"):
                await store.put("k", bad)
        assert await store.get("k") is None

    async def test_values_too_large(self, store: Any) -> None:
        if self.max_value_bytes is None:
            pytest.skip("max_value_bytes is None")
        await store.put("k", {"v": "kept"})
        with rejected(ValueTooLargeError, f"put() of a value of {self.max_value_bytes} bytes"):
            await store.put("k", {"v": "x" * self.max_value_bytes})
        with rejected(ValueTooLargeError, f"put_many() of a value of {self.max_value_bytes} bytes"):
            await store.put_many(["a", "k"], [{"v": 1}, {"v": "\u00e9" * (self.max_value_bytes // 2)}])
        assert_same(await store.get("k"), {"v": "kept"})
        assert await store.get("a") is None

    async def test_values_no_aliasing(self, store: Any) -> None:
        original: dict[str, Any] = {"list": [1, 2], "obj": {"a": 1}}
        await store.put("k", original)
        original["list"].append(3)
        original["obj"]["a"] = 99
        original["new"] = True
        first = await store.get("k")
        assert_same(first, {"list": [1, 2], "obj": {"a": 1}})
        first["list"].append(4)
        first["obj"].clear()
        assert_same(await store.get("k"), {"list": [1, 2], "obj": {"a": 1}})
        assert await store.get("k") is not await store.get("k")

    # -- TTL ---------------------------------------------------------------------------

    async def test_ttl_invalid_rejected_and_nothing_written(self, store: Any) -> None:
        await store.put("k", {"v": "kept"})
        for bad in BAD_TTLS:
            with rejected(InvalidTTLError, f"put() with ttl={reprlib.repr(bad)}"):
                await store.put("k", {"v": "changed"}, ttl=bad)
            with rejected(InvalidTTLError, f"put_many() with ttl={reprlib.repr(bad)}"):
                await store.put_many(["k", "new"], [{"v": 1}, {"v": 2}], ttl=bad)
        assert await store.ttl("k") == ({"v": "kept"}, None)
        assert await store.get("new") is None

    async def test_ttl_none_never_expires(self, store: Any) -> None:
        await store.put("k", {"v": 1}, ttl=None)
        assert await store.ttl("k") == ({"v": 1}, None)

    async def test_ttl_remaining_seconds(self, store: Any) -> None:
        await store.put("long", {"v": 1}, ttl=100)
        await store.put("short", {"v": 2}, ttl=0.5)
        await store.put("max", {"v": 3}, ttl=MAX_TTL_SECONDS)
        value, remaining = await store.ttl("long")
        assert value == {"v": 1}
        assert isinstance(remaining, float)
        assert 100 - self.ttl_tolerance <= remaining <= 100
        _, remaining = await store.ttl("short")
        assert remaining is not None
        assert 0.5 - self.ttl_tolerance <= remaining <= 0.5
        _, remaining = await store.ttl("max")
        assert remaining is not None
        assert remaining > MAX_TTL_SECONDS - 60

    async def test_ttl_numeric_types(self, store: Any) -> None:
        for ttl in [30, 30.0, Decimal("30"), 2**5]:
            await store.put("k", {"v": 1}, ttl=ttl)
            _, remaining = await store.ttl("k")
            assert remaining is not None
            assert 20 < remaining <= 32

    async def test_ttl_expiry_hides_everywhere(self, store: Any) -> None:
        await store.put("gone", {"v": 1}, ttl=0.3)
        await store.put_many(["b1", "b2"], [{"v": 1}, {"v": 2}], ttl=0.3, collection="bulk")
        await store.put("stays", {"v": 2})
        await asyncio.sleep(0.7)
        assert await store.get("gone") is None
        assert await store.ttl("gone") == (None, None)
        assert await store.get_many(["gone", "stays"]) == [None, {"v": 2}]
        assert await store.ttl_many(["gone"]) == [(None, None)]
        assert await store.get_many(["b1", "b2"], collection="bulk") == [None, None]
        assert await store.delete("gone") is False, "delete() of an expired entry returns False: it is gone"
        assert await store.delete_many(["b1", "b2"], collection="bulk") == 0
        if self.has(store, "keys"):
            assert await store.keys() == ["stays"]
        if self.has(store, "collections"):
            assert "bulk" not in await store.collections()

    async def test_ttl_cleared_by_put_without_ttl(self, store: Any) -> None:
        await store.put("k", {"v": 1}, ttl=0.3)
        await store.put("k", {"v": 2})
        await store.put_many(["m"], [{"v": 3}], ttl=0.3)
        await store.put_many(["m"], [{"v": 4}])
        await asyncio.sleep(0.6)
        assert await store.ttl("k") == ({"v": 2}, None)
        assert await store.ttl("m") == ({"v": 4}, None)

    async def test_ttl_replaced_by_new_ttl(self, store: Any) -> None:
        await store.put("k", {"v": 1}, ttl=0.3)
        await store.put("k", {"v": 2}, ttl=60)
        await asyncio.sleep(0.5)
        value, remaining = await store.ttl("k")
        assert value == {"v": 2}
        assert remaining is not None
        assert remaining > 50

    async def test_ttl_many(self, store: Any) -> None:
        await store.put_many(["a", "b"], [{"v": 1}, {"v": 2}], ttl=50)
        await store.put("c", {"v": 3})
        rows = await store.ttl_many(["a", "missing", "c", "b"])
        assert [value for value, _ in rows] == [{"v": 1}, None, {"v": 3}, {"v": 2}]
        remaining = [ttl for _, ttl in rows]
        assert remaining[1] is None
        assert remaining[2] is None
        for ttl in (remaining[0], remaining[3]):
            assert ttl is not None
            assert 50 - self.ttl_tolerance <= ttl <= 50

    @requires("cull")
    async def test_ttl_cull(self, store: Any) -> None:
        await store.put("gone", {"v": 1}, ttl=0.2)
        await store.put("stays", {"v": 2})
        await asyncio.sleep(0.4)
        await store.cull()
        assert await store.get("gone") is None
        assert_same(await store.get("stays"), {"v": 2})

    # -- bulk ----------------------------------------------------------------------------

    async def test_bulk_order_and_missing(self, store: Any) -> None:
        await store.put_many(["a", "b", "c"], [{"v": "a"}, {"v": "b"}, {"v": "c"}])
        assert await store.get_many(["c", "x", "a", "b"]) == [{"v": "c"}, None, {"v": "a"}, {"v": "b"}]
        rows = await store.ttl_many(["x", "b"])
        assert rows == [(None, None), ({"v": "b"}, None)]

    async def test_bulk_duplicates(self, store: Any) -> None:
        await store.put_many(["d", "d", "e"], [{"v": 1}, {"v": 2}, {"v": 3}])
        assert await store.get_many(["d", "d", "e"]) == [{"v": 2}, {"v": 2}, {"v": 3}]
        assert await store.delete_many(["d", "d", "missing"]) == 1
        assert await store.get("e") == {"v": 3}

    async def test_bulk_length_mismatch(self, store: Any) -> None:
        with pytest.raises(ValueError):
            await store.put_many(["a", "b"], [{"v": 1}])
        with pytest.raises(ValueError):
            await store.put_many(["a"], [{"v": 1}, {"v": 2}])
        assert await store.get_many(["a", "b"]) == [None, None]

    async def test_bulk_empty_is_noop(self, store: Any) -> None:
        assert await store.get_many([]) == []
        assert await store.ttl_many([]) == []
        assert await store.put_many([], []) is None
        assert await store.delete_many([]) == 0

    async def test_bulk_bare_str_rejected(self, store: Any) -> None:
        for call in (store.get_many, store.ttl_many, store.delete_many):
            with rejected(TypeError, f"{call.__name__}() of a bare str"):
                await call("abc")
        with rejected(TypeError, "put_many() of a bare str"):
            await store.put_many("ab", [{"v": 1}, {"v": 2}])
        assert await store.get_many(["a", "b"]) == [None, None]

    async def test_bulk_validates_everything_first(self, store: Any) -> None:
        keys = [f"k{i}" for i in range(10)]
        values: list[Any] = [{"i": i} for i in range(9)] + [{"bad": {1, 2}}]
        with rejected(SerializationError, f"put_many() of {values[-1]}"):
            await store.put_many(keys, values)
        assert await store.get_many(keys) == [None] * 10

    async def test_bulk_large_batch(self, store: Any) -> None:
        keys = [f"key-{i}" for i in range(self.large_batch)]
        await store.put_many(keys, [{"i": i} for i in range(self.large_batch)], ttl=600)
        values = await store.get_many(keys)
        assert values == [{"i": i} for i in range(self.large_batch)]
        rows = await store.ttl_many(keys)
        assert len(rows) == self.large_batch
        assert rows[-1][0] == {"i": self.large_batch - 1}
        if self.has(store, "keys"):
            assert len(await store.keys()) == self.large_batch
        assert await store.delete_many(keys) == self.large_batch
        assert await store.get_many(keys[:3]) == [None, None, None]

    # -- concurrency -----------------------------------------------------------------------

    async def test_concurrency_same_key(self, store: Any) -> None:
        written = [{"writer": i} for i in range(50)]
        await asyncio.gather(*(store.put("shared", value) for value in written))
        assert await store.get("shared") in written

    async def test_concurrency_many_keys(self, store: Any) -> None:
        count = 200
        await asyncio.gather(*(store.put(f"k{i}", {"i": i}) for i in range(count)))
        results = await asyncio.gather(*(store.get(f"k{i}") for i in range(count)))
        assert results == [{"i": i} for i in range(count)]
        deleted = await asyncio.gather(*(store.delete(f"k{i}") for i in range(0, count, 2)))
        assert all(deleted)
        remaining = await store.get_many([f"k{i}" for i in range(count)])
        assert remaining == [None if i % 2 == 0 else {"i": i} for i in range(count)]

    async def test_concurrency_peer_sees_writes(self, store: Any, peer_store: Any) -> None:
        await store.put("k", {"v": 1}, ttl=60)
        assert await peer_store.get("k") == {"v": 1}
        value, remaining = await peer_store.ttl("k")
        assert value == {"v": 1}
        assert remaining is not None
        assert 60 - 2 <= remaining <= 60
        await peer_store.put("k", {"v": 2})
        assert await store.get("k") == {"v": 2}
        assert await peer_store.delete("k") is True
        assert await store.get("k") is None

    # -- lifecycle ---------------------------------------------------------------------------

    @requires("lifecycle")
    async def test_lifecycle_async_with_and_double_close(self, store: Any) -> None:
        async with store as entered:
            assert entered is store
            await store.put("k", {"v": 1})
        await store.aclose()
        for call in (store.get("k"), store.put("k", {"v": 2}), store.delete("k"), store.get_many(["k"])):
            with pytest.raises(StoreClosedError):
                await call

    # -- capabilities --------------------------------------------------------------------------

    @requires("keys")
    async def test_capabilities_keys_and_limit(self, store: Any) -> None:
        keys = [f"k{i}" for i in range(7)]
        await store.put_many(keys, [{"i": i} for i in range(7)])
        await store.put("elsewhere", {"v": 1}, collection="other")
        assert sorted(await store.keys()) == keys
        assert await store.keys(collection="other") == ["elsewhere"]
        assert await store.keys(collection="empty") == [], "keys() of an unknown collection is empty"
        limited = await store.keys(limit=3)
        assert len(limited) == 3
        assert set(limited) <= set(keys)
        assert await store.keys(limit=0) == [], "keys(limit=0) returns no keys"
        assert sorted(await store.keys(limit=100)) == keys

    @requires("keys")
    async def test_capabilities_keys_page_in_code_point_order(self, store: Any) -> None:
        keys = ["", "a", "a\x00", "B", "é", "z", "日本", "\U0001f600", "k 1", "k/2"]
        await store.put_many(keys, [{"i": i} for i in range(len(keys))])
        await store.put("b", {"v": 1}, collection="other")
        ordered = sorted(keys)  # Python compares str by code point
        assert await store.keys() == ordered, "keys() lists in ascending code-point order"
        assert await store.keys(limit=3) == ordered[:3], "a limit keeps the first keys in that order"
        pages: list[str] = []
        page = await store.keys(limit=3)
        while page:
            pages += page
            page = await store.keys(limit=3, after=page[-1])
        assert pages == ordered, "pages joined by after= list every key once, in order"
        assert await store.keys(after="a") == [key for key in ordered if key > "a"]
        assert await store.keys(after="\U0010ffff") == []
        assert await store.keys(collection="other", after="") == ["b"]
        with pytest.raises(InvalidKeyError):
            await store.keys(after=1)

    @requires("keys")
    async def test_capabilities_keys_of_tricky_collections(self, store: Any) -> None:
        for collection, key in COLLIDING_PAIRS:
            await store.put(key, {"v": 1}, collection=collection)
        for collection in {collection for collection, _ in COLLIDING_PAIRS}:
            expected = sorted(key for name, key in COLLIDING_PAIRS if name == collection)
            assert sorted(await store.keys(collection=collection)) == expected
        await store.put("k", {"v": 1}, collection="*")
        await store.put("k", {"v": 1}, collection="[a]")
        assert await store.keys(collection="*") == ["k"]
        assert await store.keys(collection="?") == []

    @requires("collections")
    async def test_capabilities_collections(self, store: Any) -> None:
        await store.put("k", {"v": 1}, collection="one")
        await store.put("k", {"v": 1}, collection="two")
        await store.put("k", {"v": 1}, collection="a::b")
        names = await store.collections()
        assert {"one", "two", "a::b"} <= set(names)
        assert len(names) == len(set(names))
        assert len(await store.collections(limit=2)) == 2
        assert await store.collections(limit=0) == [], "collections(limit=0) returns no names"

    @requires("destroy_collection")
    async def test_capabilities_destroy_collection(self, store: Any) -> None:
        await store.put_many(["a", "b"], [{"v": 1}, {"v": 2}], collection="doomed")
        await store.put("a", {"v": 3}, collection="doomed2")
        await store.put("b", {"v": 4}, collection="doomed:")
        assert await store.destroy_collection("doomed") is True
        assert await store.get_many(["a", "b"], collection="doomed") == [None, None]
        assert await store.get("a", collection="doomed2") == {"v": 3}
        assert await store.get("b", collection="doomed:") == {"v": 4}
        assert await store.destroy_collection("doomed") is False
        with pytest.raises(InvalidKeyError):
            await store.destroy_collection("")

    @requires("destroy")
    async def test_capabilities_destroy(self, store: Any) -> None:
        await store.put("a", {"v": 1})
        await store.put("b", {"v": 2}, collection="other")
        assert await store.destroy() is True
        assert await store.get("a") is None
        assert await store.get("b", collection="other") is None
        await store.put("c", {"v": 3})
        assert await store.get("c") == {"v": 3}

    # -- atomic (put_if_absent, pop, update) ----------------------------------------------------

    @requires("atomic")
    async def test_atomic_put_if_absent(self, store: Any) -> None:
        assert await store.put_if_absent("k", {"v": 1}) is True
        assert await store.put_if_absent("k", {"v": 2}) is False
        assert await store.ttl("k") == ({"v": 1}, None)
        assert await store.put_if_absent("k", {"v": 3}, collection="other") is True
        assert_same(await store.get("k", collection="other"), {"v": 3})
        assert await store.delete("k") is True
        assert await store.put_if_absent("k", {"v": 4}) is True
        assert_same(await store.get("k"), {"v": 4})

    @requires("atomic")
    async def test_atomic_put_if_absent_ttl(self, store: Any) -> None:
        assert await store.put_if_absent("long", {"v": 1}, ttl=60) is True
        value, remaining = await store.ttl("long")
        assert value == {"v": 1}
        assert remaining is not None
        assert 60 - self.ttl_tolerance <= remaining <= 60
        assert await store.put_if_absent("short", {"v": "old"}, ttl=0.3) is True
        assert await store.put_if_absent("short", {"v": "live entry wins"}) is False
        await asyncio.sleep(0.6)
        assert await store.get("short") is None
        assert await store.put_if_absent("short", {"v": "new"}) is True, "an expired entry counts as absent"
        assert await store.ttl("short") == ({"v": "new"}, None), "the expired entry's TTL must not carry over"

    @requires("atomic")
    async def test_atomic_put_if_absent_rejects_what_put_rejects(self, store: Any) -> None:
        await self._check_rejected(
            store, "put_if_absent()", lambda key, value, **options: store.put_if_absent(key, value, **options)
        )

    @requires("atomic")
    async def test_atomic_pop(self, store: Any) -> None:
        await store.put("k", {"v": [1, True]}, ttl=60)
        await store.put("k", {"v": "elsewhere"}, collection="other")
        assert_same(await store.pop("k"), {"v": [1, True]})
        assert await store.pop("k") is None
        assert await store.get("k") is None
        assert await store.pop("missing") is None
        assert_same(await store.get("k", collection="other"), {"v": "elsewhere"})
        assert_same(await store.pop("k", collection="other"), {"v": "elsewhere"})
        with pytest.raises(InvalidKeyError):
            await store.pop("x" * (MAX_KEY_LENGTH + 1))
        with pytest.raises(InvalidKeyError):
            await store.pop("k", collection="")

    @requires("atomic")
    async def test_atomic_pop_expired_is_none(self, store: Any) -> None:
        await store.put("gone", {"v": 1}, ttl=0.3)
        await asyncio.sleep(0.6)
        assert await store.pop("gone") is None
        assert await store.get("gone") is None

    @requires("atomic")
    async def test_atomic_update_missing_and_existing(self, store: Any) -> None:
        seen: list[Any] = []

        def increment(old: dict[str, Any] | None) -> dict[str, Any]:
            seen.append(old)
            return {"n": 1, "keep": [True]} if old is None else {**old, "n": old["n"] + 1}

        assert_same(await store.update("k", increment), {"n": 1, "keep": [True]})
        assert seen == [None], "fn of a missing key gets None"
        assert_same(await store.update("k", increment), {"n": 2, "keep": [True]})
        assert_same(await store.get("k"), {"n": 2, "keep": [True]})
        assert await store.get("k", collection="other") is None
        assert_same(await store.update("k", increment, collection="other"), {"n": 1, "keep": [True]})

    @requires("atomic")
    async def test_atomic_update_returns_what_was_stored(self, store: Any) -> None:
        result = await store.update("k", lambda old: MappingProxyType({"t": (1, (2, 3))}))
        assert_same(result, {"t": [1, [2, 3]]})
        result["t"].append(4)
        assert_same(await store.get("k"), {"t": [1, [2, 3]]})

    @requires("atomic")
    async def test_atomic_update_none_deletes(self, store: Any) -> None:
        await store.put("k", {"v": 1})
        assert await store.update("k", lambda old: None) is None
        assert await store.get("k") is None
        assert await store.update("missing", lambda old: None) is None
        assert await store.get("missing") is None

    @requires("atomic")
    async def test_atomic_update_ttl_as_put(self, store: Any) -> None:
        await store.put("k", {"n": 1}, ttl=0.3)
        await store.update("k", lambda old: {"n": 2}, ttl=60)
        value, remaining = await store.ttl("k")
        assert value == {"n": 2}
        assert remaining is not None
        assert 60 - self.ttl_tolerance <= remaining <= 60
        await store.update("k", lambda old: {"n": 3})
        assert await store.ttl("k") == ({"n": 3}, None), "update without a TTL clears the TTL, as put does"
        await store.update("short", lambda old: {"n": 1}, ttl=0.3)
        await asyncio.sleep(0.6)
        assert await store.get("short") is None
        seen: list[Any] = []

        def replace(old: dict[str, Any] | None) -> dict[str, Any]:
            seen.append(old)
            return {"n": 2}

        await store.update("short", replace)
        assert seen == [None], "fn of an expired key gets None"
        assert await store.ttl("short") == ({"n": 2}, None)

    @requires("atomic")
    async def test_atomic_update_unchanged_writes_nothing(self, store: Any) -> None:
        await store.put("k", {"v": "kept"}, ttl=30)
        seen: list[Any] = []

        def decline(old: dict[str, Any] | None) -> Any:
            seen.append(old)
            return UNCHANGED

        for _ in range(3):
            assert_same(await store.update("k", decline, ttl=60), {"v": "kept"})
        assert seen == [{"v": "kept"}] * 3
        value, remaining = await store.ttl("k")
        assert value == {"v": "kept"}
        assert remaining is not None
        assert remaining <= 30, "a declined update must keep the entry's TTL"
        assert await store.update("missing", decline) is None
        assert await store.get("missing") is None, "a declined update of a missing key must write nothing"
        await store.put("short", {"v": 1}, ttl=0.3)
        await store.update("short", decline, ttl=60)
        await asyncio.sleep(0.6)
        assert await store.get("short") is None, "a declined update must not keep an entry alive"

    @requires("atomic")
    async def test_atomic_update_fn_raises_nothing_written(self, store: Any) -> None:
        class Refused(Exception):
            pass

        def refuse(old: dict[str, Any] | None) -> dict[str, Any]:
            raise Refused("no")

        await store.put("k", {"v": "kept"}, ttl=60)
        with pytest.raises(Refused):
            await store.update("k", refuse)
        with pytest.raises(Refused):
            await store.update("new", refuse)
        value, remaining = await store.ttl("k")
        assert value == {"v": "kept"}
        assert remaining is not None
        assert await store.get("new") is None

    @requires("atomic")
    async def test_atomic_update_rejects_what_put_rejects(self, store: Any) -> None:
        await self._check_rejected(
            store,
            "update()",
            lambda key, value, **options: store.update(key, lambda old: value, **options),
            none_deletes=True,
        )

    @requires("atomic")
    async def test_atomic_update_concurrent_increments(self, store: Any) -> None:
        def increment(old: dict[str, Any] | None) -> dict[str, Any]:
            return {"n": (old or {"n": 0})["n"] + 1}

        async def worker() -> None:
            for _ in range(20):
                await store.update("counter", increment)

        await asyncio.gather(*(worker() for _ in range(25)))
        assert await store.get("counter") == {"n": 500}, "25 tasks x 20 increments: no update may be lost"

    @requires("atomic")
    async def test_atomic_put_if_absent_one_winner(self, store: Any) -> None:
        results = await asyncio.gather(*(store.put_if_absent("lock", {"owner": i}) for i in range(30)))
        assert results.count(True) == 1, f"{results.count(True)} of 30 concurrent put_if_absent calls got True"
        assert await store.get("lock") == {"owner": results.index(True)}

    @requires("atomic")
    async def test_atomic_put_if_absent_one_winner_across_store_objects(self, store: Any, peer_store: Any) -> None:
        calls = [(store if i % 2 else peer_store).put_if_absent("lock", {"owner": i}) for i in range(30)]
        results = await asyncio.gather(*calls)
        assert results.count(True) == 1, f"{results.count(True)} of 30 concurrent put_if_absent calls got True"
        assert await peer_store.get("lock") == {"owner": results.index(True)}

    @requires("atomic")
    async def test_atomic_pop_each_value_once(self, store: Any) -> None:
        # three pops race on each key, ten keys at a time: 30 calls in flight, not 150, so that each call
        # still ends well within the store's timeout on a slow server beside other work (150 at once
        # took SecantusDB seconds per call on a loaded 2-core machine)
        keys = [f"k{i}" for i in range(50)]
        await store.put_many(keys, [{"i": i} for i in range(50)])
        popped: list[Any] = []
        for first in range(0, 50, 10):
            batch = keys[first : first + 10]
            popped += await asyncio.gather(*(store.pop(batch[n % 10]) for n in range(30)))
        values = sorted(value["i"] for value in popped if value is not None)
        assert values == list(range(50)), "three racing pops per key, 50 keys: each value must come back exactly once"
        assert await store.get_many(keys) == [None] * 50

    async def _check_rejected(self, store: Any, operation: str, write: Any, *, none_deletes: bool = False) -> None:
        """``write(key, value, **options)`` raises what put raises on bad input and changes nothing."""
        await store.put("k", {"v": "kept"})
        for bad_value in [value for value in BAD_VALUES if not (none_deletes and value is None)]:
            for key in ("k", "new"):
                with rejected(SerializationError, f"{operation} of {reprlib.repr(bad_value)}"):
                    await write(key, bad_value)
        for bad_ttl in BAD_TTLS:
            for key in ("k", "new"):
                with rejected(InvalidTTLError, f"{operation} with ttl={reprlib.repr(bad_ttl)}"):
                    await write(key, {"v": "changed"}, ttl=bad_ttl)
        for bad_key in [1, None, "x" * (MAX_KEY_LENGTH + 1), "lone \ud800 surrogate"]:
            with rejected(InvalidKeyError, f"{operation} of key {reprlib.repr(bad_key)}"):
                await write(bad_key, {"v": "changed"})
        with rejected(InvalidKeyError, f"{operation} in collection ''"):
            await write("k", {"v": "changed"}, collection="")
        if self.max_value_bytes is not None:
            for key in ("k", "new"):
                with rejected(ValueTooLargeError, f"{operation} of a value of {self.max_value_bytes} bytes"):
                    await write(key, {"v": "x" * self.max_value_bytes})
        assert await store.ttl("k") == ({"v": "kept"}, None)
        assert await store.get("new") is None
