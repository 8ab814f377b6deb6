"""Adversarial input on every backend: injection, oversized or malformed input, corrupt data.

- Keys and collections crafted to inject (SQL quotes and comments, Redis glob patterns and
  ``{}`` hash tags, MongoDB ``$`` operators and dotted paths) can neither read, list nor
  delete another collection's (or another tenant's) data.
- Oversized values, 10,000-level nesting, huge key lists and bad TTLs raise typed errors and
  leave stored data untouched.
- A corrupt value written behind the store's back raises DeserializationError naming the
  key: not a crash, not a silent None; and the key can be overwritten afterwards.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import pytest

from kvstores import MAX_KEY_LENGTH, MAX_TTL_SECONDS, MAX_VALUE_BYTES, MemoryStore
from kvstores.errors import (
    DeserializationError,
    InvalidKeyError,
    InvalidTTLError,
    SerializationError,
    ValueTooLargeError,
)
from tests.support import Backend

pytestmark = pytest.mark.anyio

VICTIM = "victim"
VICTIM_DATA = {"secret": {"pin": 1234}, "a": {"n": 1}, "*": {"star": True}, "victim": {"self": 1}}

ATTACK_COLLECTIONS = [
    "*",
    "?",
    "vic*",
    "victim*",
    "v?ctim",
    "[v]ictim",
    "[^x]*",
    "\\*",
    "victim\\",
    "{victim}",
    "victim}",
    "}victim",
    "{victim",
    "victim{",
    "%7Bvictim%7D",
    "victim%7D",
    "{}",
    "' OR '1'='1",
    "victim' --",
    "victim'; DELETE FROM kvstores_entries; --",
    '" OR 1=1 /*',
    "victim\x00",
    "victim\x00x",
    "vict",
    "victimx",
    "$ne",
    "$regex",
    '{"$ne": null}',
    "$where",
    "_id.c",
    "victim.secret",
    "_id",
    ".",
    "VICTIM",
]
"""Collection names that an encoding built by string concatenation could confuse with VICTIM."""

ATTACK_KEYS = [
    "*",
    "secre?",
    "s*",
    "[s]ecret",
    "secret\x00",
    "' OR '1'='1",
    "secret' --",
    "$ne",
    "$gt",
    "secret.pin",
    "}secret",
    "{victim}secret",
    "victim}secret",
    "%7Dsecret",
    "",
]
"""Keys crafted to match VICTIM's keys through globs, SQL or MongoDB operators."""


async def _victim_intact(store: Any) -> None:
    assert await store.get_many(list(VICTIM_DATA), collection=VICTIM) == list(VICTIM_DATA.values())
    assert sorted(await store.keys(VICTIM)) == sorted(VICTIM_DATA)


async def test_injected_collections_cannot_reach_another(store: Any) -> None:
    await store.put_many(list(VICTIM_DATA), list(VICTIM_DATA.values()), collection=VICTIM)
    probes = list(VICTIM_DATA) + ATTACK_KEYS
    for name in ATTACK_COLLECTIONS:
        assert await store.keys(name) == [], name
        assert await store.get_many(probes, collection=name) == [None] * len(probes), name
        assert await store.ttl_many(probes, collection=name) == [(None, None)] * len(probes), name
        assert await store.delete_many(probes, collection=name) == 0, name
        assert await store.destroy_collection(name) is False, name
    await _victim_intact(store)
    assert await store.collections() == [VICTIM]

    for key in ATTACK_KEYS:
        if key not in VICTIM_DATA:
            assert await store.get(key, collection=VICTIM) is None, key
            assert await store.delete(key, collection=VICTIM) is False, key
    await _victim_intact(store)


async def test_injected_collections_are_separate(store: Any) -> None:
    await store.put_many(list(VICTIM_DATA), list(VICTIM_DATA.values()), collection=VICTIM)
    for name in ATTACK_COLLECTIONS:
        await store.put_many(ATTACK_KEYS, [{"c": name, "k": key} for key in ATTACK_KEYS], collection=name)
    assert sorted(await store.collections()) == sorted([VICTIM, *ATTACK_COLLECTIONS])
    for name in ATTACK_COLLECTIONS:
        assert sorted(await store.keys(name)) == sorted(ATTACK_KEYS), name
        assert await store.get_many(ATTACK_KEYS, collection=name) == [{"c": name, "k": key} for key in ATTACK_KEYS]
    for index, name in enumerate(ATTACK_COLLECTIONS):
        assert await store.destroy_collection(name) is True, name
        remaining = ATTACK_COLLECTIONS[index + 1 :]
        assert sorted(await store.collections()) == sorted([VICTIM, *remaining]), name
        await _victim_intact(store)


@pytest.mark.parametrize("suffix", ["x", "*", "[x]", "}"])
async def test_tenants_sharing_a_backend_are_isolated(backend: Backend, namespace: str, suffix: str) -> None:
    if not backend.persistent:
        pytest.skip(f"{backend.name}: every store object has its own data")
    tenant = await backend.open(namespace)
    neighbour = await backend.open(namespace + suffix)
    try:
        await tenant.put_many(["k", "*"], [{"tenant": 1}, {"tenant": 1}], collection="c")
        await neighbour.put_many(["k", "*"], [{"tenant": 2}, {"tenant": 2}], collection="c")
        assert await neighbour.get_many(["k", "*"], collection="c") == [{"tenant": 2}, {"tenant": 2}]
        assert sorted(await neighbour.keys("c")) == ["*", "k"]
        assert await tenant.destroy() is True
        assert await tenant.collections() == []
        assert await neighbour.collections() == ["c"]
        assert await neighbour.get_many(["k", "*"], collection="c") == [{"tenant": 2}, {"tenant": 2}]
        assert await neighbour.destroy() is True
    finally:
        await tenant.aclose()
        await neighbour.aclose()


def _nested(depth: int, *, lists: bool) -> dict[str, Any]:
    value: Any = {"leaf": 1}
    for _ in range(depth):
        value = [value] if lists else {"d": value}
    return {"v": value}


HUGE = 20_000
"""Keys in the 'huge key list' calls."""

BAD_TTLS = [0, -1, -0.0, 1e-320 * 0, math.nan, math.inf, -math.inf, True, False, "10", b"1", MAX_TTL_SECONDS + 1]
BAD_TTLS += [Decimal("NaN"), complex(1, 0), object(), [1]]
BAD_KEYS = [None, 1, b"k", "x" * (MAX_KEY_LENGTH + 1), "\ud800", "a\udfffb"]


async def test_bad_input_raises_typed_errors_and_changes_nothing(store: Any) -> None:
    await store.put("k", {"v": 1}, ttl=100)
    await store.put("other", {"v": 2})
    too_large = {"big": "x" * MAX_VALUE_BYTES}
    huge_keys = [f"h{i}" for i in range(HUGE)]

    with pytest.raises(ValueTooLargeError):
        await store.put("k", too_large)
    with pytest.raises(ValueTooLargeError):
        await store.put_many(["k", "other", "new"], [{"ok": 1}, {"ok": 2}, too_large])
    for lists in (False, True):
        with pytest.raises(SerializationError):
            await store.put("k", _nested(10_000, lists=lists))
        with pytest.raises(SerializationError):
            await store.put_many(["other", "k"], [{"ok": 1}, _nested(10_000, lists=lists)])
    for ttl in BAD_TTLS:
        with pytest.raises(InvalidTTLError):
            await store.put("k", {"v": "bad ttl"}, ttl=ttl)
        with pytest.raises(InvalidTTLError):
            await store.put_many(["k", "other"], [{"v": 0}, {"v": 0}], ttl=ttl)
    for key in BAD_KEYS:
        with pytest.raises(InvalidKeyError):
            await store.put(key, {"v": "bad key"})
        with pytest.raises(InvalidKeyError):
            await store.put_many(["k", key], [{"v": 0}, {"v": 0}])
        with pytest.raises(InvalidKeyError):
            await store.delete_many(["k", "other", key])
    for name in [key for key in BAD_KEYS if key is not None] + [""]:  # None: the default collection
        with pytest.raises(InvalidKeyError):
            await store.put("k", {"v": "bad collection"}, collection=name)
    with pytest.raises(InvalidKeyError):
        await store.put_many([*huge_keys, "x" * (MAX_KEY_LENGTH + 1)], [{"i": 0}] * (HUGE + 1))
    with pytest.raises(SerializationError):
        await store.put_many(["k", *huge_keys], [{"i": 0}] * HUGE + [{"nan": math.nan}])
    with pytest.raises(InvalidKeyError):
        await store.delete_many(["k", "other", *huge_keys, b"k"])
    with pytest.raises(InvalidKeyError):
        await store.get_many([*huge_keys, None])
    with pytest.raises(ValueError):
        await store.put_many(["k", *huge_keys], [{"i": 0}] * HUGE)
    with pytest.raises(TypeError):
        await store.put_many("k", [{"v": 0}])

    value, remaining = await store.ttl("k")
    assert value == {"v": 1}
    assert remaining is not None
    assert 90 < remaining <= 100
    assert await store.ttl("other") == ({"v": 2}, None)
    assert sorted(await store.keys()) == ["k", "other"]
    assert await store.collections() == ["default"]

    # huge but valid key lists work, and miss nothing
    assert await store.get_many([*huge_keys, "k"]) == [None] * HUGE + [{"v": 1}]
    assert await store.delete_many([*huge_keys, "other"]) == 1


async def _deep_call(depth: int, call: Any) -> Any:
    """Await ``call()`` from ``depth`` coroutine frames further down the stack."""
    return await (_deep_call(depth - 1, call) if depth else call())


async def test_every_accepted_value_can_be_read_back_from_a_deeper_stack() -> None:
    async with MemoryStore() as store:
        depth = 0
        for step in (512, 256, 128, 64, 32, 16, 8, 4, 2, 1):  # the deepest nesting put accepts
            try:
                await store.put("deep", _nested(depth + step, lists=False))
                depth += step
            except SerializationError:
                pass
        await store.put("deep", _nested(depth, lists=False))
        assert await _deep_call(150, lambda: store.get("deep")) == _nested(depth, lists=False)


# -- corrupt data written behind the store's back ------------------------------------------


NOT_JSON_CONSTANTS = '{"a": NaN, "b": -Infinity}'
"""Python's json module accepts these; JSON (and kvstores' own put) does not."""

CORRUPTIONS: list[str | bytes | int] = [
    "{not json",
    "[1, 2]",
    "42",
    "null",
    '"text"',
    "",
    '{"a": 1}}',
    "{" * 3 + '"a":' + "[" * 100_000,
    '{"v": ' + "[" * 100_000 + "]" * 100_000 + "}",
    b"\xff\xfe{}",
    7,
    NOT_JSON_CONSTANTS,
]


@pytest.mark.parametrize("raw", CORRUPTIONS, ids=lambda raw: repr(raw)[:20])
async def test_corrupt_value_raises_naming_the_key(backend: Backend, store: Any, raw: str | bytes | int) -> None:
    key = "victim-key"
    await store.put_many([key, "fine"], [{"v": 1}, {"v": 2}])
    backend.corrupt(store, key, raw)
    named = re.escape(key)
    with pytest.raises(DeserializationError, match=named):
        await store.get(key)
    with pytest.raises(DeserializationError, match=named):
        await store.get_many(["fine", key])
    with pytest.raises(DeserializationError, match=named):
        await store.ttl(key)
    with pytest.raises(DeserializationError, match=named):
        await store.ttl_many([key])
    assert await store.get("fine") == {"v": 2}
    assert sorted(await store.keys()) == ["fine", key]
    await store.put(key, {"v": 3})
    assert await store.get(key) == {"v": 3}
