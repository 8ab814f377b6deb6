"""Code written for py-key-value works on kvstores stores, down to the exceptions it catches."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client, Context, FastMCP
from key_value.aio import errors as py_key_value

from kvstores import MAX_DEPTH, MemoryStore, errors

pytestmark = pytest.mark.anyio

COUNTERPARTS = {
    errors.KVStoreError: py_key_value.BaseKeyValueError,
    errors.InvalidKeyError: py_key_value.InvalidKeyError,
    errors.InvalidTTLError: py_key_value.InvalidTTLError,
    errors.SerializationError: py_key_value.SerializationError,
    errors.ValueTooLargeError: py_key_value.ValueTooLargeError,
    errors.DeserializationError: py_key_value.DeserializationError,
    errors.StoreConnectionError: py_key_value.StoreConnectionError,
    errors.StoreClosedError: py_key_value.KeyValueStoreError,
    errors.ConflictError: py_key_value.KeyValueOperationError,
}


@pytest.mark.parametrize(("ours", "theirs"), list(COUNTERPARTS.items()), ids=lambda c: c.__name__)
def test_each_error_is_also_its_py_key_value_counterpart(ours: type[Exception], theirs: type[Exception]) -> None:
    error = ours("the message")
    assert isinstance(error, theirs)
    assert str(error) == "the message"


def test_the_kvstores_tree_and_builtin_bases_are_kept() -> None:
    assert issubclass(errors.ValueTooLargeError, errors.SerializationError)
    assert issubclass(errors.SerializationError, ValueError)
    assert issubclass(errors.StoreConnectionError, ConnectionError)
    assert all(issubclass(ours, errors.KVStoreError) for ours in COUNTERPARTS)


async def test_put_errors_are_caught_as_py_key_value_errors() -> None:
    async with MemoryStore() as store:
        with pytest.raises(py_key_value.SerializationError):
            await store.put("k", {"bad": {1, 2}})
        with pytest.raises(py_key_value.InvalidTTLError):
            await store.put("k", {"v": 1}, ttl=-1)
        with pytest.raises(py_key_value.InvalidKeyError):
            await store.get("x" * 2000)
        assert await store.get("k") is None


async def test_close_is_aclose() -> None:
    store = MemoryStore()
    await store.close()
    assert store.closed
    with pytest.raises(py_key_value.KeyValueStoreError):
        await store.get("k")


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"v": value}
    return value


async def test_fastmcp_set_state_turns_a_rejected_value_into_its_type_error() -> None:
    """FastMCP tells the user to pass serializable=False when the store cannot serialize a value."""
    store = MemoryStore()
    server: FastMCP[Any] = FastMCP("compat", session_state_store=store)

    @server.tool
    async def save(ctx: Context) -> str:
        try:
            await ctx.set_state("deep", _nested(MAX_DEPTH + 10))
        except TypeError as error:
            return f"TypeError: {error}"
        return "stored"

    async with Client(server, mode="legacy") as client:
        result = await client.call_tool("save")
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("TypeError: ") and "serializable=False" in text
    assert await store.collections() == []  # nothing was written
