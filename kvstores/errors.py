"""The kvstores error tree.

Every error a store raises on purpose is a :class:`KVStoreError`; input errors are
also :class:`ValueError` and connection errors also :class:`ConnectionError`, so code
written against plain Python exceptions keeps working::

    KVStoreError
    ├── InvalidKeyError          (ValueError)  bad key or collection name
    ├── InvalidTTLError          (ValueError)  bad time-to-live
    ├── SerializationError       (ValueError)  value is not storable JSON
    │   └── ValueTooLargeError                 encoded value above the size limit
    ├── DeserializationError                   stored data cannot be decoded
    │   └── EncryptionKeyError                 sealed with a key the store lacks, or altered
    ├── StoreConnectionError     (ConnectionError)  backend unreachable or timed out
    ├── StoreClosedError                       the store was closed
    └── ConflictError                          an atomic update kept losing races and gave up

Driver exceptions never escape raw: each backend translates them in one place and
chains the original as ``__cause__``.

When py-key-value (``key_value.aio``) is installed, each class also derives from its
py-key-value counterpart, so code ported from py-key-value (and FastMCP, which catches
``key_value.aio.errors.SerializationError``) catches kvstores errors unchanged:
KVStoreError is a BaseKeyValueError; InvalidKeyError, InvalidTTLError,
SerializationError, ValueTooLargeError, DeserializationError and StoreConnectionError are
their namesakes; StoreClosedError is a KeyValueStoreError and ConflictError a
KeyValueOperationError. py-key-value is never required.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

_py_key_value: ModuleType | None
try:
    from key_value.aio import errors as _py_key_value
except ImportError:  # py-key-value is optional: without it the tree stands alone
    _py_key_value = None

__all__ = [
    "ConflictError",
    "DeserializationError",
    "EncryptionKeyError",
    "InvalidKeyError",
    "InvalidTTLError",
    "KVStoreError",
    "SerializationError",
    "StoreClosedError",
    "StoreConnectionError",
    "ValueTooLargeError",
]


def _also(name: str) -> tuple[type[Any], ...]:
    """py-key-value's error class ``name`` as an extra base, when py-key-value is installed.

    (mypy cannot follow a computed base, hence the ``type: ignore[misc]`` on each class.)
    """
    return () if _py_key_value is None else (getattr(_py_key_value, name),)


class KVStoreError(*_also("BaseKeyValueError"), Exception):  # type: ignore[misc]
    """Base class of every error raised by kvstores."""


class InvalidKeyError(KVStoreError, ValueError, *_also("InvalidKeyError")):  # type: ignore[misc]
    """A key or collection name is not a str, too long, empty (collections) or has lone surrogates."""


class InvalidTTLError(KVStoreError, ValueError, *_also("InvalidTTLError")):  # type: ignore[misc]
    """A TTL is not a finite number of seconds in (0, MAX_TTL_SECONDS]."""


class SerializationError(KVStoreError, ValueError, *_also("SerializationError")):  # type: ignore[misc]
    """A value is not a mapping of JSON content (NaN, bytes, sets, non-str keys, cycles...)."""


class ValueTooLargeError(SerializationError, *_also("ValueTooLargeError")):  # type: ignore[misc]
    """A value's encoded size exceeds the store's limit."""


class DeserializationError(KVStoreError, *_also("DeserializationError")):  # type: ignore[misc]
    """Stored data could not be decoded back into a dict."""


class EncryptionKeyError(DeserializationError):
    """A sealed value names a key id the store was not given, or does not open (altered or moved)."""


class StoreConnectionError(KVStoreError, ConnectionError, *_also("StoreConnectionError")):  # type: ignore[misc]
    """The backend could not be reached, or did not answer within the timeout."""


class StoreClosedError(KVStoreError, *_also("KeyValueStoreError")):  # type: ignore[misc]
    """The store was used after ``aclose()``."""


class ConflictError(KVStoreError, *_also("KeyValueOperationError")):  # type: ignore[misc]
    """``update()`` lost the race to concurrent writers more times than its retry bound allows."""
