"""The one place that validates keys, collections, values and TTLs, and encodes values.

Limits (the same on every backend):

- keys and collection names: ``str`` of at most :data:`MAX_KEY_LENGTH` characters with
  no lone surrogates; collection names must also be non-empty;
- values: a ``Mapping`` with ``str`` keys whose content is JSON (dict, list, tuple, str,
  int, finite float, bool, None; nested mappings must be dicts) nested at most
  :data:`MAX_DEPTH` levels, encoded as compact UTF-8 JSON of at most
  :data:`MAX_VALUE_BYTES` bytes. Integers are limited only by
  Python's ``sys.get_int_max_str_digits()`` (4,300 digits by default);
- TTLs: ``None`` (never expires) or a real number of seconds in
  ``(0, MAX_TTL_SECONDS]``; backends round it up to whole milliseconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from kvstores.errors import (
    DeserializationError,
    InvalidKeyError,
    InvalidTTLError,
    SerializationError,
    ValueTooLargeError,
)

MAX_KEY_LENGTH = 1024
"""Longest key or collection name, in characters."""

MAX_VALUE_BYTES = 16 * 1024 * 1024 - 64 * 1024
"""Largest encoded value, in UTF-8 bytes: fits a 16 MiB MongoDB document with its key."""

MAX_DEPTH = 100
"""Deepest nesting of dicts and lists in a value: deeper values could not be read back safely."""

MAX_TTL_SECONDS = 10 * 365 * 24 * 60 * 60
"""Longest TTL accepted: ten years. Use ``ttl=None`` for entries that never expire."""

_CONTAINERS = (dict, list, tuple)
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _reject_object(obj: object) -> NoReturn:
    raise TypeError(f"{type(obj).__name__} is not JSON (allowed: dict, list, tuple, str, int, float, bool, None)")


_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_reject_object).encode


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


_decode = json.JSONDecoder(parse_constant=_reject_constant).decode


def _describe(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def check_key(key: object, what: str = "key") -> None:
    """Raise InvalidKeyError unless ``key`` is a valid key (``what`` names it in the message)."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"{what} must be a str, not {type(key).__name__}")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"{what} is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidKeyError(f"{what} {_describe(key)} contains a lone surrogate") from None


def check_keys(keys: Sequence[str]) -> None:
    """Raise TypeError for a bare str, InvalidKeyError for any invalid key."""
    if isinstance(keys, str):
        raise TypeError("keys must be a sequence of str, not a single str")
    for key in keys:
        check_key(key)


def check_collection(collection: object) -> None:
    """Raise InvalidKeyError unless ``collection`` is a valid, non-empty collection name."""
    check_key(collection, "collection")
    if not collection:
        raise InvalidKeyError("collection must not be empty (pass None for the default collection)")


def check_ttl(ttl: object) -> float | None:
    """Return ``ttl`` as float seconds (or None), or raise InvalidTTLError."""
    if ttl is None:
        return None
    if isinstance(ttl, (bool, str, bytes)) or not hasattr(ttl, "__float__"):
        raise InvalidTTLError(f"ttl must be None or a number of seconds, not {type(ttl).__name__}")
    try:
        seconds = float(ttl)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidTTLError(f"ttl {ttl!r} is not a number of seconds: {exc}") from None
    if not 0 < seconds <= MAX_TTL_SECONDS:
        raise InvalidTTLError(f"ttl must be > 0 and <= {MAX_TTL_SECONDS} seconds, got {ttl!r}")
    return seconds


def ttl_milliseconds(seconds: float) -> int:
    """A validated TTL in whole milliseconds, rounded up so that it is never 0."""
    return math.ceil(seconds * 1000)


def _check_structure(value: dict[str, Any]) -> None:
    """Reject non-str dict keys (json.dumps would stringify them) and nesting beyond MAX_DEPTH."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SerializationError(f"cannot serialize value: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            for k, v in node.items():
                if k.__class__ is not str and not isinstance(k, str):
                    raise SerializationError(
                        f"cannot serialize value: dict keys must be str, found {type(k).__name__} key {k!r}"
                    )
                if v.__class__ in _CONTAINERS or (v.__class__ not in _SCALARS and isinstance(v, _CONTAINERS)):
                    stack.append((v, depth + 1))
        else:
            stack.extend((v, depth + 1) for v in node if isinstance(v, _CONTAINERS))


def encode_value(value: Mapping[str, Any]) -> str:
    """Validate ``value`` and return its compact JSON text; raise SerializationError.

    Every message starts "cannot serialize value": FastMCP's ``Context.set_state`` looks for
    "serialize" in a ValueError to tell the user about ``serializable=False``.
    """
    if type(value) is not dict:
        if not isinstance(value, Mapping):
            raise SerializationError(f"cannot serialize value: not a Mapping with str keys but {type(value).__name__}")
        value = dict(value)
    try:
        text = _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"cannot serialize value: {exc}") from exc
    _check_structure(value)
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise SerializationError("cannot serialize value: a lone surrogate is not valid UTF-8") from exc
    else:
        size = len(text)
    if size > MAX_VALUE_BYTES:
        raise ValueTooLargeError(f"cannot serialize value: it encodes to {size} bytes; the limit is {MAX_VALUE_BYTES}")
    return text


def encode_values(values: Sequence[Mapping[str, Any]]) -> list[str]:
    """Encode every value (validating all before any is written)."""
    return [encode_value(value) for value in values]


def decode_value(text: str | bytes, key: str) -> dict[str, Any]:
    """Decode stored JSON text (str or UTF-8 bytes) for ``key``; raise DeserializationError unless it is an object."""
    try:
        value = _decode(text if isinstance(text, str) else text.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise DeserializationError(f"stored value for key {_describe(key)} is not valid JSON: {exc}") from exc
    if type(value) is not dict:
        raise DeserializationError(f"stored value for key {_describe(key)} is a {type(value).__name__}, not an object")
    return value
