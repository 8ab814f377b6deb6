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
    ├── StoreConnectionError     (ConnectionError)  backend unreachable or timed out
    ├── StoreClosedError                       the store was closed
    └── ConflictError                          an atomic update kept losing races and gave up

Driver exceptions never escape raw: each backend translates them in one place and
chains the original as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "ConflictError",
    "DeserializationError",
    "InvalidKeyError",
    "InvalidTTLError",
    "KVStoreError",
    "SerializationError",
    "StoreClosedError",
    "StoreConnectionError",
    "ValueTooLargeError",
]


class KVStoreError(Exception):
    """Base class of every error raised by kvstores."""


class InvalidKeyError(KVStoreError, ValueError):
    """A key or collection name is not a str, too long, empty (collections) or has lone surrogates."""


class InvalidTTLError(KVStoreError, ValueError):
    """A TTL is not a finite number of seconds in (0, MAX_TTL_SECONDS]."""


class SerializationError(KVStoreError, ValueError):
    """A value is not a mapping of JSON content (NaN, bytes, sets, non-str keys, cycles...)."""


class ValueTooLargeError(SerializationError):
    """A value's encoded size exceeds the store's limit."""


class DeserializationError(KVStoreError):
    """Stored data could not be decoded back into a dict."""


class StoreConnectionError(KVStoreError, ConnectionError):
    """The backend could not be reached, or did not answer within the timeout."""


class StoreClosedError(KVStoreError):
    """The store was used after ``aclose()``."""


class ConflictError(KVStoreError):
    """``update()`` lost the race to concurrent writers more times than its retry bound allows."""
