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

import gc
import json
import marshal
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import orjson

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
_CONTAINER_TYPES = frozenset(_CONTAINERS)
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


class _NotPlainJSON(Exception):
    """The fast path cannot vouch for a value: the stdlib path decides (and explains a rejection)."""


def _not_plain(obj: object) -> NoReturn:
    raise _NotPlainJSON


_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""Subclasses (namedtuples, numpy floats, ...), datetimes and dataclasses go to ``default``: the stdlib path."""

_ORJSON_MAX_DEPTH = 254
"""orjson refuses values nested deeper than this many dicts and lists."""

_PADDING = _ORJSON_MAX_DEPTH - MAX_DEPTH
"""Lists wrapped around a value so that orjson's own depth limit falls exactly on MAX_DEPTH."""

_NON_FINITE_FLOAT = re.compile(rb"[g\xe7][\x00-\xff]{6}[\xf0-\xff][\x7f\xff]")
"""A float in marshal's format 4 ('g', with or without its reference flag, then 8 little-endian
IEEE bytes) whose exponent bits are all ones: NaN or +-inf. UTF-8 text never holds the last two
bytes, so strings cannot match; any other false match only sends the value down the stdlib path."""

_FLOAT_MARKERS = (ord("g"), ord("g") | 0x80)
"""The first byte of a float in marshal's format 4: 'g', with or without the reference flag."""

_LAST_BYTE_LOOKS = 64
"""Bytes 0x7f and 0xff (a non-finite float's last byte) checked one by one, plus one per KB of JSON
text, before the text and the pattern are searched instead (a look costs about what searching a KB
does): integers hold such bytes too (-1 is four 0xff), but most values hold a few per KB."""


def _holds_non_finite(screened: bytes, raw: bytes) -> bool:
    """Whether marshal's ``screened`` form of a value whose orjson text is ``raw`` may hold NaN or inf.

    Each 0x7f and 0xff byte is found with memchr and looked at in place (:data:`_NON_FINITE_FLOAT`'s
    test): a scan of a megabyte costs microseconds where ``b"null" in raw`` cost half a millisecond.
    Past a budget of them (:data:`_LAST_BYTE_LOOKS`), orjson's text is looked at instead (it writes NaN and inf
    as null), then the pattern.
    """
    looks = _LAST_BYTE_LOOKS + len(raw) // 1024
    for last in (b"\x7f", b"\xff"):
        at = screened.find(last, 8)
        while at != -1:
            if screened[at - 1] >= 0xF0 and screened[at - 8] in _FLOAT_MARKERS:
                return True
            looks -= 1
            if not looks:
                return b"null" in raw and _NON_FINITE_FLOAT.search(screened) is not None
            at = screened.find(last, at + 1)
    return False


_COUNT_BYTES = 4096
"""Up to this size, counting brackets (a value deeper than MAX_DEPTH has more than MAX_DEPTH)
costs less than dumping the value inside the padding's lists; beyond it, more."""

_FAST_MAX_BYTES = MAX_VALUE_BYTES // 2
"""Above this size the stdlib path measures the value, so that the size limit falls where it
always did: orjson spells floats below 1e-4 differently (``1e-7`` for ``1e-07``, ``0.00001`` for
``1e-05``, same value), which moves the encoded size by less than half."""


class _Padding(threading.local):
    """Each thread's lists for :func:`_dumps_padded`: _PADDING of them, each inside the next."""

    def __init__(self) -> None:
        self.inner: list[Any] = [None]
        self.outer = self.inner
        for _ in range(_PADDING - 1):
            self.outer = [self.outer]


_padding = _Padding()


def _dumps_padded(value: dict[str, Any]) -> bytes:
    """orjson's text of ``value`` dumped inside _PADDING lists, so that it fails beyond MAX_DEPTH."""
    padding = _padding  # the thread's own lists, built once: building them costs more than a small dump
    padding.inner[0] = value
    try:
        raw = orjson.dumps(padding.outer, _not_plain, _ORJSON_OPTIONS)
        if padding.inner[0] is not value:  # a signal handler encoded on this thread meanwhile
            raise _NotPlainJSON
    finally:
        padding.inner[0] = None
    return raw[_PADDING:-_PADDING]


_WALK_ITEMS = 64
"""Values with at most this many items in all their dicts and lists are walked in Python (a
few hundred ns): the walk vouches for their depth and tells whether marshal reads them back
as JSON would. Larger values are checked by orjson alone (padded or bracket-counted)."""

# A walked value is nested at most _WALK_ITEMS + 1 deep (each level but the last holds an item),
# which is below MAX_DEPTH: the walk alone vouches for the depth.


def _marshal_reads_back(value: dict[str, Any]) -> bool | None:
    """None when ``value`` holds more than _WALK_ITEMS items; else whether marshal reads it back as JSON would.

    It would not for a tuple (JSON reads a list) or a container met twice (marshal would share
    it between the two places, JSON reads two). Only exact built-in types are here: marshal
    has refused every other type already.
    """
    if len(value) > _WALK_ITEMS:
        return None
    for item in value.values():
        if item.__class__ in _CONTAINER_TYPES:
            break
    else:
        return True  # the common case, a dict of scalars
    stack: list[Any] = [value]
    seen = {id(value)}
    items = 0
    reads_back = True
    while stack:  # to the end, whatever it finds: the walk also vouches for the depth
        node = stack.pop()
        items += len(node)
        if items > _WALK_ITEMS:
            return None
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is dict or kind is list or kind is tuple:
                if kind is tuple or id(item) in seen:
                    reads_back = False
                seen.add(id(item))
                stack.append(item)
    return reads_back


def _encode_fast(value: dict[str, Any], native: bool = False) -> tuple[bytes, bytes | None]:
    """orjson's compact JSON of ``value`` and, when ``native`` and it reads back as the JSON
    does, its marshal form (else None); raise _NotPlainJSON when unsure.

    The text is json.dumps' own but for the spelling of floats below 1e-4 (the same values).

    One pass of orjson validates as it encodes: it refuses what is not JSON (non-str keys,
    lone surrogates, bytes, sets, ...), and what it refuses only for speed (integers beyond
    64 bits, subclasses), and nesting beyond MAX_DEPTH once the value is padded to its limit.
    It also writes what the stdlib refuses (NaN and inf as null, UUIDs, plain enums), so
    marshal, a C walk that takes only the exact built-in types, screens the value for those.
    """
    walked = _marshal_reads_back(value) if native else False  # None: more items than a walk takes
    # a value too large to walk is dumped inside the padding at once (one pass where there would be two)
    raw = _dumps_padded(value) if walked is None else orjson.dumps(value, _not_plain, _ORJSON_OPTIONS)
    if len(raw) > _FAST_MAX_BYTES:
        raise _NotPlainJSON
    try:
        screened = marshal.dumps(value, 4)
    except ValueError:
        raise _NotPlainJSON from None
    # orjson writes NaN and inf as null: marshal's form tells them apart from None
    if _holds_non_finite(screened, raw):
        raise _NotPlainJSON
    if native:
        return raw, screened if walked else None  # walked (or padded): the depth is vouched for
    # too deep only if longer than MAX_DEPTH times "[]" and with more than MAX_DEPTH containers
    reads_back = _marshal_reads_back(value) if len(raw) > 2 * MAX_DEPTH else False
    if reads_back is None and (len(raw) > _COUNT_BYTES or raw.count(b"[") + raw.count(b"{") > MAX_DEPTH):
        raw = _dumps_padded(value)
    return raw, None


def _encode_stdlib(value: dict[str, Any]) -> str:
    """json.dumps' compact text of ``value`` after the full structure walk; raise SerializationError."""
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


def _plain_dict(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as a dict, or SerializationError when it is no Mapping."""
    if type(value) is dict:
        return value
    if not isinstance(value, Mapping):
        raise SerializationError(f"cannot serialize value: not a Mapping with str keys but {type(value).__name__}")
    return dict(value)


def encode_value(value: Mapping[str, Any]) -> str:
    """Validate ``value`` and return its compact JSON text; raise SerializationError.

    Every message starts "cannot serialize value": FastMCP's ``Context.set_state`` looks for
    "serialize" in a ValueError to tell the user about ``serializable=False``.
    """
    value = _plain_dict(value)
    try:
        return _encode_fast(value)[0].decode()
    except (_NotPlainJSON, orjson.JSONEncodeError):
        return _encode_stdlib(value)


_OWN_JSON = b"\x00"
"""The first byte of :func:`encode_native`'s JSON form: no marshal form starts with it (it starts
with its type code), so :func:`decode_native` tells the two apart by it."""


def encode_native(value: Mapping[str, Any]) -> bytes | str:
    """Validate ``value`` as :func:`encode_value` does, for a store that keeps values in this process.

    Returns bytes that only :func:`decode_native` reads: the value's marshal form (several times
    faster to read than JSON for long strings) when that reads back exactly as its JSON text
    would (a value of at most _WALK_ITEMS items, with no tuple and no container met twice), else
    orjson's text after :data:`_OWN_JSON` (orjson reads many small objects faster than marshal does
    without sharing; text it wrote itself needs none of the checks text from elsewhere does).
    The JSON text of the stdlib's path (what the fast path cannot vouch for) is returned as str.
    """
    value = _plain_dict(value)
    try:
        raw, native = _encode_fast(value, native=True)
    except (_NotPlainJSON, orjson.JSONEncodeError):
        return _encode_stdlib(value)
    return _OWN_JSON + raw if native is None else native


def decode_native(data: bytes, key: str) -> dict[str, Any]:
    """The value of what :func:`encode_native` returned as bytes (never from outside this process)."""
    try:
        # orjson reads its own text back without checks (integers within 64 bits, no constants)
        own = data[:1] == _OWN_JSON
        value = _reading_many(orjson.loads, memoryview(data)[1:]) if own else marshal.loads(data)
    except (ValueError, EOFError, TypeError) as exc:
        raise DeserializationError(f"stored value for key {_describe(key)} is not a value: {exc}") from exc
    if type(value) is not dict:
        raise DeserializationError(f"stored value for key {_describe(key)} is a {type(value).__name__}, not an object")
    return value


_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
_LONG_NUMBER = b"0" * 19
"""19 digits in a row: orjson reads an integer beyond 64 bits as a float, json.loads as an int."""

_PROBE_BYTES = 1024
_BYTES_PER_QUOTE = 16
"""Longer text whose first KB has fewer quotes than one per this many bytes is mostly long
strings: scanning its bytes for long integers would cost more than looking at what it holds."""

_LONG_FLOAT = float(2**63)
"""orjson reads an integer beyond 64 bits as a float at least this large (json.loads as an int)."""


def _holds_long_float(value: Any) -> bool:
    """Whether ``value`` holds a float of magnitude 2**63 or more (it may have been a long integer)."""
    stack = [value]
    while stack:
        node = stack.pop()
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is float:
                if abs(item) >= _LONG_FLOAT:
                    return True
            elif kind is dict or kind is list:
                stack.append(item)
    return False


_PAUSE_GC_BYTES = 16 * 1024
"""Text longer than this is read with the cyclic garbage collector paused (:func:`_reading_many`)."""


def _reading_many(loads: Callable[[Any], Any], data: Any) -> Any:
    """``loads(data)`` with the cyclic garbage collector paused when ``data`` is long.

    Reading a long text makes many containers, and every 700 of them start a collection that
    scans them all and frees none (they are all reachable from the value being read): for a MB
    of small objects, more than half of the time a read takes. The pause ends with the read; the
    collector stays off if something else had turned it off.
    """
    if len(data) <= _PAUSE_GC_BYTES or not gc.isenabled():
        return loads(data)
    gc.disable()
    try:
        return loads(data)
    finally:
        gc.enable()


def _decode_fast(text: str | bytes) -> Any:
    """orjson's reading of ``text``, or None where json.loads must read it."""
    if isinstance(text, str):
        try:
            data = text.encode()
        except UnicodeEncodeError:  # lone surrogates: orjson refuses them, json.loads reads them
            return None
    elif isinstance(text, bytes):
        data = text
    else:
        return None
    sparse = len(data) > _PROBE_BYTES and data.count(b'"', 0, _PROBE_BYTES) * _BYTES_PER_QUOTE < _PROBE_BYTES
    if not sparse and data.translate(_DIGITS).find(_LONG_NUMBER) >= 0:
        return None
    try:
        value = _reading_many(orjson.loads, data)
    except orjson.JSONDecodeError:  # json.loads explains it (or reads what orjson refuses, like 1e400)
        return None
    if sparse and type(value) is dict and _holds_long_float(value):
        return None
    return value


def decode_value(text: str | bytes, key: str) -> dict[str, Any]:
    """Decode stored JSON text (str or UTF-8 bytes) for ``key``; raise DeserializationError unless it is an object."""
    value = _decode_fast(text)
    if value is None:
        try:
            value = _decode(text if isinstance(text, str) else text.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise DeserializationError(f"stored value for key {_describe(key)} is not valid JSON: {exc}") from exc
    if type(value) is not dict:
        raise DeserializationError(f"stored value for key {_describe(key)} is a {type(value).__name__}, not an object")
    return value
