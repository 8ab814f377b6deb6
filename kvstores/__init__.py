"""kvstores: async key-value stores for MCP servers and beyond.

Open a store by URL with :func:`open_store` or construct a backend class directly;
every store implements :class:`AsyncKeyValue` (the protocol of py-key-value and FastMCP).
"""

from kvstores._codec import MAX_DEPTH, MAX_KEY_LENGTH, MAX_TTL_SECONDS, MAX_VALUE_BYTES
from kvstores.backends.memory import MemoryStore
from kvstores.base import DEFAULT_COLLECTION, BaseStore
from kvstores.errors import (
    ConflictError,
    DeserializationError,
    EncryptionKeyError,
    InvalidKeyError,
    InvalidTTLError,
    KVStoreError,
    SerializationError,
    StoreClosedError,
    StoreConnectionError,
    ValueTooLargeError,
)
from kvstores.protocol import (
    UNCHANGED,
    AsyncKeyValue,
    AtomicStore,
    CullStore,
    DestroyCollectionStore,
    DestroyStore,
    EnumerateCollectionsStore,
    EnumerateKeysStore,
    LifecycleStore,
    Unchanged,
    capabilities,
    implements,
)
from kvstores.registry import open_store

__all__ = [
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
