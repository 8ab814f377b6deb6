"""Values as the backend keeps them: JSON text, sealed at rest when the store has encryption keys.

The mixin :class:`Encryption` gives :class:`kvstores.BaseStore` its value hooks (``_encoded``,
``_sealed``, ``_decoded``: every write and read passes them), the public ``encryption_key_ids``
and ``reseal()``, which ``kvstores rekey`` calls for every entry (:mod:`kvstores._rekey`). The
cipher itself is :mod:`kvstores._sealing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstores._atomic import UPDATE_ATTEMPTS
from kvstores._codec import MAX_VALUE_BYTES, check_key, decode_value, encode_value
from kvstores._primitives import Stored
from kvstores._sealing import is_sealed, sealed_key_id
from kvstores._store_core import StoreCore
from kvstores.errors import ConflictError, DeserializationError, EncryptionKeyError, ValueTooLargeError

__all__ = ["Encryption"]


class Encryption(StoreCore):
    """Encoding, sealing and opening values; the encryption keys' ids; re-sealing under the first key."""

    def _encoded(self, value: Mapping[str, Any]) -> str:
        """``value`` validated and encoded as the backend keeps it: its JSON text.

        Through :meth:`_sealed`, it is what the primitives (``_put``, ``_put_many``, ``_swap``) are handed.
        """
        return encode_value(value)

    def _sealed(self, text: str, collection: str, key: str) -> str:
        """``text`` as the backend stores it: sealed when the store has encryption keys."""
        if self._sealer is None:
            return text
        sealed = self._sealer.seal(text, collection, key)
        if len(sealed) > MAX_VALUE_BYTES:
            raise ValueTooLargeError(
                f"cannot serialize value: sealed, it takes {len(sealed)} bytes; the limit is {MAX_VALUE_BYTES}"
            )
        return sealed

    def _decoded(self, stored: Stored, collection: str, key: str) -> dict[str, Any]:
        """The value of ``stored`` (opened first when sealed); EncryptionKeyError when it cannot be opened."""
        if self._sealer is not None:
            return decode_value(self._sealer.open(stored, collection, key), key)
        try:
            return decode_value(stored, key)
        except DeserializationError:
            if not is_sealed(stored):  # looked at only when the text is not JSON: free on every good read
                raise
        raise EncryptionKeyError(
            f"stored value for key {key[:100]!r} is sealed with key id {sealed_key_id(stored)!r}; "
            f"this store has no encryption keys"
        )

    @property
    def encryption_key_ids(self) -> tuple[str, ...]:
        """The ids of the store's encryption keys, the one that seals first; empty without encryption.

        Ids only (8 characters derived from each key, as sealed values name them), never the keys.
        """
        return () if self._sealer is None else self._sealer.key_ids

    async def reseal(self, key: str, *, collection: str | None = None) -> bool:
        """Seal ``key``'s entry under the first encryption key, keeping its TTL; True when rewritten.

        False when the entry is absent, expired or sealed under that key already. A compare-and-set
        against the text read: a write that lands meanwhile is never overwritten (the entry is read
        again). EncryptionKeyError when it cannot be opened, ValueError on a store without encryption
        keys. ``kvstores rekey`` calls it for every entry (kvstores._rekey).
        """
        name = self._collection(collection)
        check_key(key)
        sealer = self._sealer
        if sealer is None:
            raise ValueError("re-sealing needs a store opened with encryption_keys")
        for _ in range(UPDATE_ATTEMPTS):
            stored, remaining = await self._ttl(name, key)
            if stored is None or not sealer.needs_resealing(stored):
                return False
            opened = sealer.open(stored, name, key)
            text = opened if isinstance(opened, str) else opened.decode("utf-8")
            decode_value(text, key)  # stored plaintext that is not a value is reported, not sealed
            if await self._swap(name, key, stored, self._sealed(text, name, key), remaining):
                return True
        raise ConflictError(f"re-sealing key {key!r} lost {UPDATE_ATTEMPTS} races to concurrent writers; giving up")
