"""py-key-value's wrappers and adapters over every backend of the table: composition is a tested promise.

The matrix (:data:`WRAPPERS` x the backend rows) checks round trips, TTLs, and that kvstores'
typed errors still surface through each wrapper. Then one group per wrapper checks what it is
for (encryption at rest and key rotation, compression, statistics, TTL clamping, prefixes,
the passthrough cache, the Pydantic and raise-on-missing adapters) and demonstrates, as
asserted and documented limitations, where a wrapper breaks a kvstores promise:

- PassthroughCacheWrapper serves stale values across store objects and processes, and its
  ttl() reports the cache's clamped TTL instead of the entry's;
- PrefixCollectionsWrapper joins prefix and collection with ``__``, so two prefixes can share
  storage;
- FernetEncryptionWrapper and CompressionWrapper serialize values themselves, so NaN is stored
  instead of raising SerializationError, and unserializable values raise py-key-value's
  SerializationError rather than kvstores'.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from cryptography.fernet import Fernet, MultiFernet
from key_value.aio import errors as pkv
from key_value.aio.adapters.pydantic import PydanticAdapter
from key_value.aio.adapters.raise_on_missing import RaiseOnMissingAdapter
from key_value.aio.protocols import AsyncKeyValue
from key_value.aio.wrappers.compression import CompressionWrapper
from key_value.aio.wrappers.encryption import FernetEncryptionWrapper
from key_value.aio.wrappers.passthrough_cache import PassthroughCacheWrapper
from key_value.aio.wrappers.prefix_collections import PrefixCollectionsWrapper
from key_value.aio.wrappers.statistics import StatisticsWrapper
from key_value.aio.wrappers.ttl_clamp import TTLClampWrapper
from pydantic import BaseModel

import kvstores
from kvstores import MAX_KEY_LENGTH, MemoryStore
from tests.support import Backend

pytestmark = pytest.mark.anyio

KEY = Fernet.generate_key()
OLD_KEY = Fernet.generate_key()

WRAPPERS: dict[str, Callable[[Any], Any]] = {
    "fernet": lambda store: FernetEncryptionWrapper(store, fernet=Fernet(KEY)),
    "multifernet": lambda store: FernetEncryptionWrapper(store, fernet=MultiFernet([Fernet(KEY), Fernet(OLD_KEY)])),
    "compression": lambda store: CompressionWrapper(store, min_size_to_compress=64),
    "compressed+encrypted": lambda store: CompressionWrapper(
        FernetEncryptionWrapper(store, fernet=Fernet(KEY)), min_size_to_compress=64
    ),
    "statistics": StatisticsWrapper,
    "ttl-clamp": lambda store: TTLClampWrapper(store, min_ttl=0.1, max_ttl=3600),
    "prefix-collections": lambda store: PrefixCollectionsWrapper(store, prefix="app"),
    "passthrough-cache": lambda store: PassthroughCacheWrapper(primary_key_value=store, cache_key_value=MemoryStore()),
    "raise-on-missing": RaiseOnMissingAdapter,
}
"""Each wrapper (or adapter with the store's own interface) as it is built over a kvstores store."""

SERIALIZING = {"fernet", "multifernet", "compression", "compressed+encrypted"}
"""Wrappers that turn the value into JSON text themselves before kvstores sees it."""

SMALL = {"name": "Ada", "tags": ["a", "b"], "n": 2**80, "ok": True, "none": None, "f": 1.5}
LARGE = {"text": "é€😀 " * 200, "nested": {"list": list(range(50)), "deep": {"x": "$.:*?[]"}}}
"""A value under, and one over, the compression threshold; both JSON only (kvstores' value contract)."""


@pytest.fixture(params=list(WRAPPERS))
def wrapper(request: pytest.FixtureRequest) -> str:
    """The name of each wrapper of the matrix in turn."""
    name: str = request.param
    return name


@pytest.fixture
def wrapped(wrapper: str, store: Any) -> Any:
    """The table's store inside the wrapper under test."""
    return WRAPPERS[wrapper](store)


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    """Poll ``check`` until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.05)


# -- the matrix: every wrapper over every backend ------------------------------------------------


async def test_round_trip(wrapped: Any) -> None:
    await wrapped.put("small", SMALL)
    await wrapped.put("large", LARGE, collection="c")
    assert await wrapped.ttl("small") == (SMALL, None)
    assert await wrapped.get("small") == SMALL
    assert await wrapped.get("large", collection="c") == LARGE
    assert await wrapped.get("large") is None

    await wrapped.put_many(["a", "b", "a"], [{"v": 1}, LARGE, {"v": 3}], collection="many")
    assert await wrapped.get_many(["a", "b", "missing"], collection="many") == [{"v": 3}, LARGE, None]
    assert [value for value, _ in await wrapped.ttl_many(["a", "b"], collection="many")] == [{"v": 3}, LARGE]

    assert await wrapped.delete("small") is True
    assert await wrapped.delete("small") is False
    assert await wrapped.get("small") is None
    assert await wrapped.delete_many(["a", "b", "missing"], collection="many") == 2
    assert await wrapped.get_many(["a", "b"], collection="many") == [None, None]


async def test_ttl_is_kept_and_expires(wrapped: Any) -> None:
    ttl_seconds = 2.0  # long enough for the four writes and the read on a loaded machine
    await wrapped.put("short", LARGE, ttl=ttl_seconds)
    await wrapped.put_many(["m1", "m2"], [SMALL, SMALL], ttl=ttl_seconds)
    await wrapped.put("forever", SMALL, ttl=ttl_seconds)
    await wrapped.put("forever", SMALL)  # a put without a TTL clears the earlier one
    value, ttl = await wrapped.ttl("short")
    assert value == LARGE and ttl is not None and 0 < ttl <= ttl_seconds

    async def expired() -> bool:
        return bool(await wrapped.get_many(["short", "m1", "m2"]) == [None, None, None])

    await eventually(expired, within=ttl_seconds + 8)
    assert await wrapped.ttl("short") == (None, None)
    assert await wrapped.ttl("forever") == (SMALL, None)


async def test_invalid_key_raises_kvstores_invalid_key_error(wrapped: Any) -> None:
    too_long = "k" * (MAX_KEY_LENGTH + 1)
    with pytest.raises(kvstores.InvalidKeyError):
        await wrapped.get(too_long)
    with pytest.raises(kvstores.InvalidKeyError):
        await wrapped.put(too_long, SMALL)
    with pytest.raises(kvstores.InvalidKeyError):
        await wrapped.get("k", collection=too_long)
    with pytest.raises(kvstores.InvalidKeyError):
        await wrapped.put_many(["ok", too_long], [SMALL, SMALL])
    assert await wrapped.get("ok") is None


async def test_invalid_ttl_raises_and_writes_nothing(wrapper: str, wrapped: Any) -> None:
    # TTLClampWrapper checks the TTL itself (py-key-value's error; NaN: see test_ttl_clamp_*);
    # the others pass it to kvstores
    clamp = wrapper == "ttl-clamp"
    expected = pkv.InvalidTTLError if clamp else kvstores.InvalidTTLError
    for bad in (-1, 0) if clamp else (-1, 0, math.nan, math.inf, True):
        with pytest.raises(expected):
            await wrapped.put("k", SMALL, ttl=bad)
    assert await wrapped.get("k") is None


async def test_unserializable_value_raises_and_writes_nothing(wrapper: str, wrapped: Any) -> None:
    # the serializing wrappers meet the value first: py-key-value's SerializationError, of which
    # kvstores' is a subclass, so `except key_value.aio.errors.SerializationError` catches both
    expected = pkv.SerializationError if wrapper in SERIALIZING else kvstores.SerializationError
    with pytest.raises(expected):
        await wrapped.put("k", {"v": {1, 2}, **LARGE})
    with pytest.raises(expected):
        await wrapped.put("k", {"v": b"bytes"})
    assert await wrapped.get("k") is None


@pytest.mark.parametrize("wrapper", sorted(set(WRAPPERS) - {"prefix-collections"}))
async def test_undecodable_stored_data_raises_kvstores_deserialization_error(
    backend: Backend, store: Any, wrapped: Any
) -> None:
    """(Not for prefix-collections: the row's corrupt() writes to the store's default collection.)"""
    await wrapped.put("k", SMALL)
    backend.corrupt(store, "k", "{not json")
    with pytest.raises(kvstores.DeserializationError):
        await wrapped.get("k")


async def test_a_second_store_object_sees_the_writes(wrapper: str, wrapped: Any, peer_store: Any) -> None:
    peer = WRAPPERS[wrapper](peer_store)
    await wrapped.put("k", LARGE, ttl=60)
    value, ttl = await peer.ttl("k")
    assert value == LARGE and ttl is not None and 0 < ttl <= 60


# -- FernetEncryptionWrapper: at rest, key rotation ----------------------------------------------


async def raw_values(store: Any) -> list[dict[str, Any]]:
    """Every live value in a kvstores store, across its collections."""
    values = []
    for collection in await store.collections():
        values += await store.get_many(await store.keys(collection), collection=collection)
    return [value for value in values if value is not None]


async def test_encryption_leaves_no_plaintext_in_the_store(store: Any) -> None:
    encrypted = FernetEncryptionWrapper(store, fernet=Fernet(KEY))
    await encrypted.put("token", {"access_token": "secret-token-text"}, ttl=60)
    raw = await raw_values(store)
    assert len(raw) == 1 and set(raw[0]) == {"__encrypted_data__", "__encryption_version__"}
    assert "secret-token-text" not in json.dumps(raw)
    assert 0 < (await store.ttl("token"))[1] <= 60  # the TTL is kvstores' own, not inside the ciphertext


async def test_key_rotation_with_multifernet(backend: Backend, namespace: str, store: Any) -> None:
    """Recipe: MultiFernet([new, old]) reads both, writes with new; re-put every entry, then drop old."""
    with_old = FernetEncryptionWrapper(store, fernet=Fernet(OLD_KEY))
    await with_old.put_many(["a", "b"], [{"v": "a"}, {"v": "b"}], collection="tokens")

    # a new process during the rotation: a new store object where the backend has one
    reopened = await backend.open(namespace) if backend.persistent else store
    try:
        rotating = FernetEncryptionWrapper(reopened, fernet=MultiFernet([Fernet(KEY), Fernet(OLD_KEY)]))
        for key in await reopened.keys("tokens"):
            value, ttl = await rotating.ttl(key, collection="tokens")
            assert value is not None
            await rotating.put(key, value, collection="tokens", ttl=ttl)
    finally:
        if reopened is not store:
            await reopened.aclose()

    with_new = FernetEncryptionWrapper(store, fernet=Fernet(KEY))
    assert await with_new.get_many(["a", "b"], collection="tokens") == [{"v": "a"}, {"v": "b"}]
    with pytest.raises(pkv.DecryptionError):
        await with_old.get("a", collection="tokens")
    # FastMCP's default OAuth storage reads undecryptable entries as misses: a new registration follows
    lenient = FernetEncryptionWrapper(store, fernet=Fernet(OLD_KEY), raise_on_decryption_error=False)
    assert await lenient.get("a", collection="tokens") is None


async def test_serializing_wrappers_store_nan_that_kvstores_rejects(store: Any) -> None:
    """Documented limitation: kvstores never sees the value, so NaN is stored instead of raising."""
    with pytest.raises(kvstores.SerializationError):
        await store.put("k", {"v": math.nan})
    encrypted = FernetEncryptionWrapper(store, fernet=Fernet(KEY))
    await encrypted.put("k", {"v": math.nan})
    value = await encrypted.get("k")
    assert value is not None and math.isnan(value["v"])


# -- CompressionWrapper, StatisticsWrapper, TTLClampWrapper --------------------------------------


async def test_compression_stores_large_values_compressed(store: Any) -> None:
    compressed = CompressionWrapper(store, min_size_to_compress=64)
    await compressed.put("large", LARGE)
    await compressed.put("small", {"v": 1})
    raw_large = await store.get("large")
    assert raw_large is not None and set(raw_large) >= {"__compressed_data__", "__compression_algorithm__"}
    assert len(json.dumps(raw_large)) < len(json.dumps(LARGE))
    assert await store.get("small") == {"v": 1}  # below the threshold: stored as it is
    assert await compressed.get("large") == LARGE


async def test_statistics_count_hits_and_misses(store: Any) -> None:
    counted = StatisticsWrapper(store)
    await counted.put("a", SMALL, collection="c")
    await counted.put_many(["b", "c"], [SMALL, SMALL], collection="c")
    assert await counted.get("a", collection="c") == SMALL
    assert await counted.get("missing", collection="c") is None
    await counted.get_many(["a", "b", "missing"], collection="c")
    assert await counted.delete("a", collection="c") is True
    stats = counted.statistics.get_collection("c")
    assert (stats.put.count, stats.get.hit, stats.get.miss) == (3, 3, 2)
    assert (stats.delete.hit, stats.delete.miss) == (1, 0)


async def test_ttl_clamp_bounds_what_reaches_the_store(store: Any) -> None:
    clamped = TTLClampWrapper(store, min_ttl=30, max_ttl=60, missing_ttl=45)
    await clamped.put("long", SMALL, ttl=3600)
    await clamped.put("short", SMALL, ttl=0.5)
    await clamped.put("none", SMALL)
    ttls = {key: (await store.ttl(key))[1] for key in ("long", "short", "none")}
    assert 55 < ttls["long"] <= 60 and 25 < ttls["short"] <= 30 and 40 < ttls["none"] <= 45, ttls


async def test_ttl_clamp_turns_a_nan_ttl_into_its_minimum(store: Any) -> None:
    """Documented limitation: kvstores rejects a NaN TTL (InvalidTTLError); behind the clamp it is stored."""
    with pytest.raises(kvstores.InvalidTTLError):
        await store.put("k", SMALL, ttl=math.nan)
    await TTLClampWrapper(store, min_ttl=30, max_ttl=60).put("k", SMALL, ttl=math.nan)
    ttl = (await store.ttl("k"))[1]
    assert ttl is not None and 25 < ttl <= 30


# -- PrefixCollectionsWrapper ---------------------------------------------------------------------


async def test_prefixes_keep_tenants_apart(store: Any) -> None:
    first = PrefixCollectionsWrapper(store, prefix="tenant1")
    second = PrefixCollectionsWrapper(store, prefix="tenant2")
    await first.put("k", {"who": 1})
    await second.put("k", {"who": 2}, collection="c")
    assert await first.get("k") == {"who": 1}
    assert await second.get("k") is None
    assert await second.get("k", collection="c") == {"who": 2}
    assert sorted(await store.collections()) == ["tenant1__default_collection", "tenant2__c"]


async def test_prefixes_joined_by_a_separator_can_collide(store: Any) -> None:
    """Documented limitation: prefix "a" + collection "b__c" and prefix "a__b" + collection "c" share storage."""
    await PrefixCollectionsWrapper(store, prefix="a").put("k", {"owner": "a"}, collection="b__c")
    assert await PrefixCollectionsWrapper(store, prefix="a__b").get("k", collection="c") == {"owner": "a"}


# -- PassthroughCacheWrapper ----------------------------------------------------------------------


async def test_passthrough_cache_serves_stale_values_across_store_objects(store: Any, peer_store: Any) -> None:
    """Documented limitation: each process's cache keeps what it read, whatever other processes write."""
    reader = PassthroughCacheWrapper(primary_key_value=store, cache_key_value=MemoryStore())
    writer = PassthroughCacheWrapper(primary_key_value=peer_store, cache_key_value=MemoryStore())
    await writer.put("k", {"v": 1})
    assert await reader.get("k") == {"v": 1}
    await writer.put("k", {"v": 2})
    assert await store.get("k") == {"v": 2}  # kvstores: every store object sees the write at once
    assert await reader.get("k") == {"v": 1}  # the cache: stale
    await writer.delete("k")
    assert await store.get("k") is None
    assert await reader.get("k") == {"v": 1}  # deleted everywhere but in the cache
    await reader.put("k", {"v": 3})  # its own writes invalidate its cache
    assert await reader.get("k") == {"v": 3}


async def test_passthrough_cache_reports_the_cache_ttl(store: Any) -> None:
    """Documented limitation: once cached, ttl() is the cache's clamped TTL, not the entry's (None here)."""
    cached = PassthroughCacheWrapper(primary_key_value=store, cache_key_value=MemoryStore(), missing_ttl=1800)
    await cached.put("k", SMALL)
    assert await cached.ttl("k") == (SMALL, None)  # a miss: read from kvstores
    value, ttl = await cached.ttl("k")  # a hit: read from the cache
    assert value == SMALL and ttl is not None and 1790 < ttl <= 1800
    assert await store.ttl("k") == (SMALL, None)


async def test_passthrough_cache_entries_expire_with_the_primary(store: Any) -> None:
    cached = PassthroughCacheWrapper(primary_key_value=store, cache_key_value=MemoryStore())
    ttl_seconds = 2.0  # long enough for the write and the read on a loaded machine
    await cached.put("k", SMALL, ttl=ttl_seconds)
    assert await cached.get("k") == SMALL  # now cached, with the primary's remaining TTL

    async def expired() -> bool:
        return await cached.get("k") is None

    await eventually(expired, within=ttl_seconds + 8)


# -- PydanticAdapter, RaiseOnMissingAdapter -------------------------------------------------------


class Profile(BaseModel):
    """A typed value."""

    name: str
    age: int
    tags: list[str] = []


async def test_pydantic_adapter_types_the_store(store: Any) -> None:
    profiles = PydanticAdapter[Profile](key_value=store, pydantic_model=Profile, default_collection="profiles")
    ada = Profile(name="Ada", age=36, tags=["math"])
    await profiles.put("ada", ada, ttl=60)
    assert await profiles.get("ada") == ada
    assert await store.get("ada", collection="profiles") == ada.model_dump()
    value, ttl = await profiles.ttl("ada")
    assert value == ada and ttl is not None and 0 < ttl <= 60
    await profiles.put_many(["b", "c"], [Profile(name="B", age=1), Profile(name="C", age=2)])
    assert [p.name if p else None for p in await profiles.get_many(["b", "c", "x"])] == ["B", "C", None]
    with pytest.raises(kvstores.InvalidKeyError):
        await profiles.get("k" * (MAX_KEY_LENGTH + 1))


async def test_pydantic_adapter_on_data_of_another_shape(store: Any) -> None:
    await store.put("ada", {"name": "Ada"}, collection="profiles")  # no age
    strict = PydanticAdapter[Profile](
        key_value=store, pydantic_model=Profile, default_collection="profiles", raise_on_validation_error=True
    )
    lenient = PydanticAdapter[Profile](key_value=store, pydantic_model=Profile, default_collection="profiles")
    with pytest.raises(pkv.DeserializationError):
        await strict.get("ada")
    assert await lenient.get("ada") is None


async def test_pydantic_adapter_surfaces_kvstores_deserialization_error(backend: Backend, store: Any) -> None:
    profiles = PydanticAdapter[Profile](key_value=store, pydantic_model=Profile)
    await profiles.put("k", Profile(name="Ada", age=36))
    backend.corrupt(store, "k", "{not json")
    with pytest.raises(kvstores.DeserializationError):
        await profiles.get("k")


async def test_raise_on_missing_adapter(store: Any) -> None:
    strict = RaiseOnMissingAdapter(store)
    await strict.put("here", SMALL, ttl=60)
    assert await strict.get("here", raise_on_missing=True) == SMALL
    assert (await strict.ttl("here", raise_on_missing=True))[0] == SMALL
    with pytest.raises(pkv.MissingKeyError):
        await strict.get("gone", raise_on_missing=True)
    with pytest.raises(pkv.MissingKeyError):
        await strict.get_many(["here", "gone"], raise_on_missing=True)
    with pytest.raises(pkv.MissingKeyError):
        await strict.ttl_many(["gone"], raise_on_missing=True)
    with pytest.raises(kvstores.InvalidKeyError):
        await strict.get("k" * (MAX_KEY_LENGTH + 1), raise_on_missing=True)


def test_every_wrapper_accepts_a_kvstores_store() -> None:
    """py-key-value's runtime protocol check accepts kvstores stores (as FastMCP's wrappers need)."""
    store = MemoryStore()
    assert isinstance(store, AsyncKeyValue)
    assert all(WRAPPERS[name](store) is not None for name in WRAPPERS)
