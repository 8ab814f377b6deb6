"""The public surface: a pinned __all__, docstrings, protocol compatibility, error tree."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
from key_value.aio.protocols import AsyncKeyValue as PyKeyValueProtocol

import kvstores
from kvstores import _codec, errors
from kvstores.protocol import CAPABILITIES, missing_methods
from kvstores.sessions import SessionRegistry

PUBLIC = [
    "AsyncKeyValue",
    "AtomicStore",
    "BaseStore",
    "ConflictError",
    "CullStore",
    "DEFAULT_COLLECTION",
    "DeserializationError",
    "DestroyCollectionStore",
    "DestroyStore",
    "EncryptionKeyError",
    "EnumerateCollectionsStore",
    "EnumerateKeysStore",
    "InvalidKeyError",
    "InvalidTTLError",
    "KVStoreError",
    "LifecycleStore",
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_TTL_SECONDS",
    "MAX_VALUE_BYTES",
    "MemoryStore",
    "SerializationError",
    "StoreClosedError",
    "StoreConnectionError",
    "UNCHANGED",
    "Unchanged",
    "ValueTooLargeError",
    "capabilities",
    "implements",
    "open_store",
]


def test_all_is_pinned_and_sorted() -> None:
    assert kvstores.__all__ == PUBLIC
    assert kvstores.__all__ == sorted(kvstores.__all__)


def test_every_public_name_has_a_docstring() -> None:
    for name in kvstores.__all__:
        obj = getattr(kvstores, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name
            for member_name, member in vars(obj).items():
                if not member_name.startswith("_") and inspect.isfunction(member):
                    assert inspect.getdoc(member), f"{name}.{member_name}"


def test_error_tree() -> None:
    assert issubclass(errors.InvalidKeyError, ValueError)
    assert issubclass(errors.InvalidTTLError, ValueError)
    assert issubclass(errors.ValueTooLargeError, errors.SerializationError)
    assert issubclass(errors.SerializationError, ValueError)
    assert issubclass(errors.StoreConnectionError, ConnectionError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.KVStoreError)


def test_signatures_match_py_key_value() -> None:
    for name in ["get", "ttl", "put", "delete", "get_many", "ttl_many", "put_many", "delete_many"]:
        ours = inspect.signature(getattr(kvstores.AsyncKeyValue, name))
        theirs = inspect.signature(getattr(PyKeyValueProtocol, name))
        assert list(ours.parameters) == list(theirs.parameters), name
        for parameter in ours.parameters.values():
            assert parameter.kind == theirs.parameters[parameter.name].kind, (name, parameter.name)
            assert parameter.default == theirs.parameters[parameter.name].default, (name, parameter.name)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _codec.check_key("x" * 2000), "2000 characters long; the limit is 1024"),
        (lambda: _codec.check_key(5), "key must be a str, not int"),
        (lambda: _codec.check_collection(""), "collection must not be empty"),
        (lambda: _codec.check_ttl(0), "ttl must be > 0 and <= 315360000 seconds, got 0"),
        (lambda: _codec.check_ttl("5"), "not str"),
        (lambda: _codec.encode_value({"a": float("nan")}), "not JSON"),
        (lambda: _codec.encode_value({1: "a"}), "dict keys must be str, found int key 1"),
        (lambda: _codec.encode_value({"a": b"x"}), "bytes is not JSON"),
        (lambda: _codec.encode_value({"v": "x" * _codec.MAX_VALUE_BYTES}), f"the limit is {_codec.MAX_VALUE_BYTES}"),
    ],
)
def test_errors_say_what_was_wrong_and_the_limit(call: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        call()  # type: ignore[operator]
    assert message in str(caught.value)


class Forwarding:
    """An instrumented wrapper: it counts calls and forwards every attribute through ``__getattr__``."""

    def __init__(self, store: object, *, hiding: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.hiding = hiding
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in self.hiding:
            raise AttributeError(name)
        method = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return call


class ForwardingWithLifecycle(Forwarding):
    """The same wrapper with ``async with`` (special methods are looked up on the class, never forwarded)."""

    async def __aenter__(self) -> ForwardingWithLifecycle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@pytest.mark.anyio
async def test_a_forwarding_wrapper_is_a_store_on_every_python() -> None:
    """What __getattr__ forwards counts as implemented (isinstance() stopped seeing it in Python 3.12)."""
    wrapper = Forwarding(kvstores.MemoryStore())
    assert kvstores.implements(wrapper, kvstores.AsyncKeyValue)
    assert kvstores.implements(wrapper, kvstores.AtomicStore)
    assert kvstores.capabilities(wrapper) == set(CAPABILITIES) - {"lifecycle"}
    with pytest.raises(TypeError):  # Python finds no __aenter__ either: the capability is truly absent
        async with wrapper:  # type: ignore[attr-defined]
            pass
    async with ForwardingWithLifecycle(kvstores.MemoryStore()) as store:
        assert kvstores.capabilities(store) == set(CAPABILITIES)
        assert await store.put_if_absent("k", {"v": 1}) is True
        assert store.calls == ["put_if_absent"]

    registry = SessionRegistry(wrapper)  # type: ignore[arg-type]  # durable sessions accept it
    assert registry.store is wrapper
    assert registry.refresh_interval > 0


def test_what_a_store_lacks_is_named() -> None:
    hiding_atomic = Forwarding(kvstores.MemoryStore(), hiding=frozenset({"pop", "update"}))
    assert kvstores.implements(hiding_atomic, kvstores.AsyncKeyValue)
    assert missing_methods(hiding_atomic, kvstores.AtomicStore) == ("pop", "update")
    assert "atomic" not in kvstores.capabilities(hiding_atomic)
    assert missing_methods(SimpleNamespace(get="not callable"), kvstores.AsyncKeyValue)[:2] == ("get", "ttl")
    with pytest.raises(TypeError, match=r"Forwarding has no pop\(\), update\(\)"):
        SessionRegistry(hiding_atomic)  # type: ignore[arg-type]
