"""Encryption at rest: values sealed with AES-256-GCM under the operator's keys.

A store opened with ``encryption_keys`` seals every value it writes under the FIRST key and
opens values sealed under ANY of them, so keys rotate: put the new key first, keep the old ones
until ``kvstores rekey`` has re-sealed everything. Keys are the URL-safe base64 of 32 random
bytes (:func:`generate_key`, ``kvstores keygen``).

A sealed value is stored as text (every backend's value column holds text)::

    kvs1:<key id>:<URL-safe base64 of nonce (12 bytes) + ciphertext + tag (16 bytes)>

The key id is 8 characters derived from the key (never the key). The cipher authenticates the
value together with its collection and key, so a sealed value copied under another key or
collection fails to open instead of being read there. What stays plaintext: keys, collection
names and expiry times. A store with keys still reads plaintext values (written before
encryption was turned on; ``kvstores rekey`` seals them); a store without keys that meets a
sealed value, or a store whose keys do not include the value's key id, raises
:class:`~kvstores.errors.EncryptionKeyError` naming the key id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _json_string  # json.dumps' own, for one str

from kvstores._optional import missing_extra
from kvstores.errors import EncryptionKeyError

__all__ = ["SEALED_PREFIX", "Sealer", "generate_key", "is_sealed", "sealed_key_id"]

SEALED_PREFIX = "kvs1:"
"""How a sealed value's text starts (no JSON object text does)."""

_KEY_BYTES = 32
_NONCE_BYTES = 12
_ID_LENGTH = 8


def generate_key() -> str:
    """A new encryption key: the URL-safe base64 of 32 random bytes."""
    return base64.urlsafe_b64encode(os.urandom(_KEY_BYTES)).decode("ascii")


def _key_id(raw: bytes) -> str:
    digest = hashlib.sha256(b"kvstores encryption key id\0" + raw).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii")[:_ID_LENGTH]


def _raw_key(text: object, position: int) -> bytes:
    if isinstance(text, str):
        try:
            raw = base64.urlsafe_b64decode(text.strip().encode("ascii") + b"==")
        except (binascii.Error, UnicodeEncodeError):
            raw = b""
        if len(raw) == _KEY_BYTES:
            return raw
    # The message names the key's position only: a malformed key may still be most of a real one.
    raise ValueError(f"encryption key #{position + 1} is not the URL-safe base64 of 32 bytes (kvstores keygen)")


def is_sealed(text: str | bytes) -> bool:
    """True when ``text`` (a stored value) is sealed."""
    prefix = text[: len(SEALED_PREFIX)]
    return (prefix.decode("ascii", "replace") if isinstance(prefix, bytes) else prefix) == SEALED_PREFIX


def sealed_key_id(text: str | bytes) -> str:
    """The key id a sealed ``text`` names."""
    head = text[len(SEALED_PREFIX) : len(SEALED_PREFIX) + _ID_LENGTH]
    return head.decode("ascii", "replace") if isinstance(head, bytes) else head


def _context(collection: str, key: str) -> bytes:
    """The associated data: ``json.dumps([collection, key])`` (injective), made without the list's encoder."""
    return f"[{_json_string(collection)}, {_json_string(key)}]".encode("ascii")


def _describe(key: str) -> str:
    return repr(key if len(key) <= 100 else key[:100] + "...")


class Sealer:
    """Seals value texts under the first of ``keys`` and opens those sealed under any of them."""

    def __init__(self, keys: Sequence[str]) -> None:
        try:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:
            raise missing_extra("cryptography", "encryption") from exc

        if isinstance(keys, (str, bytes)) or not keys:
            raise ValueError("encryption_keys must be a non-empty list of keys (the first encrypts)")
        raws = [_raw_key(text, position) for position, text in enumerate(keys)]
        self._ciphers = {_key_id(raw): AESGCM(raw) for raw in reversed(raws)}  # the first wins an id clash
        self.key_ids = tuple(dict.fromkeys(_key_id(raw) for raw in raws))
        """The ids of the keys, in their order (the first seals): never the keys."""
        self.key_id = self.key_ids[0]
        """The id of the key that seals."""
        self._sealing = self._ciphers[self.key_id]
        self._refused: tuple[type[Exception], ...] = (InvalidTag, ValueError, binascii.Error)

    def seal(self, text: str, collection: str, key: str) -> str:
        """``text`` (a value's JSON) sealed under the first key, bound to its collection and key."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._sealing.encrypt(nonce, text.encode("utf-8"), _context(collection, key))
        return f"{SEALED_PREFIX}{self.key_id}:{base64.urlsafe_b64encode(nonce + sealed).decode('ascii')}"

    def open(self, stored: str | bytes, collection: str, key: str) -> str | bytes:
        """The JSON text of ``stored``: opened when sealed, as it is when plaintext."""
        if not is_sealed(stored):
            return stored
        key_id = sealed_key_id(stored)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise EncryptionKeyError(
                f"stored value for key {_describe(key)} is sealed with key id {key_id!r}, "
                f"which is not among this store's encryption keys"
            )
        text = stored if isinstance(stored, str) else stored.decode("ascii", "replace")
        try:
            blob = base64.urlsafe_b64decode(text[len(SEALED_PREFIX) + _ID_LENGTH + 1 :])
            return cipher.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], _context(collection, key)).decode("utf-8")
        except self._refused as exc:  # InvalidTag: altered, truncated, or moved from another key or collection
            raise EncryptionKeyError(
                f"stored value for key {_describe(key)} does not open with key id {key_id!r}: "
                f"it was altered, or sealed for another key or collection"
            ) from exc

    def needs_resealing(self, stored: str | bytes) -> bool:
        """True when ``stored`` is plaintext or sealed under another key than the first."""
        return not is_sealed(stored) or sealed_key_id(stored) != self.key_id
