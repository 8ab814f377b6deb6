"""The codec's two paths agree: orjson where it gives the stdlib's answer, json where it cannot.

Both paths run on the same generated inputs: they accept and reject the same values with the
same error, and what either writes reads back, through either, as the same value. Texts that
kvstores 0.1.0 (the stdlib-only codec) wrote are committed in tests/data and must still read back.
"""

from __future__ import annotations

import collections
import enum
import json
import math
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstores import MAX_DEPTH, MAX_VALUE_BYTES, _codec
from kvstores.errors import DeserializationError, SerializationError, ValueTooLargeError

RELEASE_TEXTS = Path(__file__).parent / "data" / "codec_0_1_0.json"
"""What kvstores 0.1.0 (537a644, json only) wrote for each value of :func:`release_samples`."""


def _nested_lists(depth: int) -> list[Any]:
    """``depth`` lists, each inside the next."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def release_samples() -> dict[str, dict[str, Any]]:
    """The values whose 0.1.0 encodings RELEASE_TEXTS holds."""
    return {
        "empty": {},
        "scalars": {"s": "text", "i": 42, "f": 2.5, "t": True, "n": None, "neg": -7, "zero": 0.0, "negzero": -0.0},
        "big_ints": {"u64": 2**64 - 1, "over": 2**64, "under": -(2**63) - 1, "huge": 10**300, "min": -(2**63)},
        "floats": {
            **{"tiny": 1e-7, "small": 1.2345e-5, "edge": 1e-4, "big": 1e16, "max": 1.7976931348623157e308},
            **{"denormal": 5e-324, "third": 1 / 3, "long": 123456789012345680.0},
        },
        "strings": {
            **{"escapes": '"\\/\b\f\n\r\t\x00\x1f\x7f', "unicode": "héllo ✓ 😀 \u2028\u2029", "nfd": "e\u0301"},
            **{"keys \u00e9\n": "k", "": "empty key"},
        },
        "nested": {"a": [1, [2, [3, {"b": [[], {}]}]]], "t": (1, "two", (3.0,)), "order": {"z": 1, "a": 2, "m": 3}},
        "many_objects": {
            "items": [{"id": i, "name": f"item-{i}", "tags": ["a", "b"], "score": i * 0.5} for i in range(200)]
        },
        "deepest": {"d": _nested_lists(MAX_DEPTH - 1)},
        "long_string": {"v": "x" * 100_000},
    }


def exact(value: Any) -> str:
    """A spelling that tells apart what == does not: 1 from 1.0 and True, -0.0 from 0.0, key order."""
    return repr(value)


def outcome(encode: Any, value: Any) -> tuple[str, str]:
    """("ok", the value read back by json) or (the error class, its message)."""
    try:
        text = encode(value)
    except SerializationError as exc:
        return type(exc).__name__, str(exc)
    return "ok", exact(json.loads(text))


class Color(enum.Enum):
    """A plain enum: orjson writes its value, json refuses it."""

    RED = "red"


class Level(enum.IntEnum):
    """An int enum: json writes it as the int."""

    HIGH = 3


class Text(str):
    """A str subclass: json writes its text."""


class Number(float):
    """A float subclass: json writes it as a float."""


Pair = collections.namedtuple("Pair", "a b")

FIELD_NAMES = st.text(max_size=6) | st.sampled_from(["\ud800", "a\udfffb", Text("sub")])
ODD_KEYS = st.sampled_from([1, 1.5, None, True, (1, 2), b"k"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**70).flatmap(lambda n: st.sampled_from([n, -n]))
    | st.floats()
    | st.floats(min_value=-1e-3, max_value=1e-3)
    | st.text(max_size=8)
    | st.sampled_from([-0.0, 1e16, 1e-7, 1.5e300, "\ud800", "\x00\x1f\x7f\u2028", "null", "NaN"])
)
NOT_JSON = st.sampled_from(
    [b"x", {1}, ..., complex(1, 2), uuid.UUID(int=7), Color.RED, Level.HIGH, Text("t"), Number(0.5), Pair(1, 2)]
)
JSONISH = st.recursive(
    SCALARS | NOT_JSON,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(FIELD_NAMES, children, max_size=4)
        | st.dictionaries(FIELD_NAMES | ODD_KEYS, children, max_size=2)
    ),
    max_leaves=20,
)
VALUES = st.dictionaries(FIELD_NAMES, JSONISH, max_size=4) | st.builds(
    lambda depth, inner: {"d": _nested_lists(depth) if inner is None else [inner] * 3 + [_nested_lists(depth)]},
    st.integers(min_value=MAX_DEPTH - 3, max_value=MAX_DEPTH + 3),
    st.none() | SCALARS,
)


@settings(max_examples=1000)
@given(VALUES)
def test_both_encoders_accept_the_same_values_and_write_the_same(value: dict[str, Any]) -> None:
    fast = outcome(_codec.encode_value, value)
    assert fast == outcome(_codec._encode_stdlib, value)
    if fast[0] == "ok":
        text = _codec.encode_value(value)
        stdlib_text = _codec._encode_stdlib(value)
        # the texts differ only in the spelling of floats below 1e-4 (``1e-7`` for ``1e-07``)
        assert text == stdlib_text or "e-" in stdlib_text
        for written in (text, stdlib_text):
            assert exact(_codec.decode_value(written, "k")) == exact(json.loads(stdlib_text))
            assert exact(_codec.decode_value(written.encode(), "k")) == exact(json.loads(stdlib_text))


def containers(value: Any) -> list[int]:
    """The ids of every dict and list in ``value``, each time it is met."""
    found: list[int] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            found.append(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


SHARED = st.builds(lambda inner: {"a": inner, "b": [inner, {"c": inner}]}, st.lists(st.integers(), max_size=3))


@settings(max_examples=1000)
@given(VALUES | SHARED)
def test_the_native_form_reads_back_as_json_does(value: dict[str, Any]) -> None:
    """MemoryStore's marshal form: the same checks, and read back exactly as the JSON text, unshared."""
    try:
        native = _codec.encode_native(value)
    except SerializationError as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            _codec.encode_value(value)
        return
    expected = exact(json.loads(_codec.encode_value(value)))  # and encode_value accepts it too
    read = _codec.decode_native(native, "k") if isinstance(native, bytes) else _codec.decode_value(native, "k")
    assert exact(read) == expected
    ids = containers(read)
    assert len(ids) == len(set(ids)), "a container read back shared between two places"
    again = _codec.decode_native(native, "k") if isinstance(native, bytes) else _codec.decode_value(native, "k")
    assert not set(ids) & set(containers(again)), "two reads share a container"


@pytest.mark.parametrize(
    ("value", "native"),
    [
        ({"v": "x" * 10_000}, True),
        ({"a": [1, {"b": "c"}], "n": None}, True),
        ({"t": (1, 2)}, False),  # a tuple: marshal would read a tuple back
        ({"items": [{"id": i} for i in range(100)]}, False),  # many items: orjson reads them faster
    ],
)
def test_the_native_form_is_marshal_where_it_reads_back(value: dict[str, Any], native: bool) -> None:
    encoded = _codec.encode_native(value)
    assert isinstance(encoded, bytes)  # orjson's own text otherwise, marked as such
    assert (encoded[:1] != _codec._OWN_JSON) is native
    assert _codec.decode_native(encoded, "k") == json.loads(_codec.encode_value(value))


def test_the_native_form_is_never_shared() -> None:
    shared = [1, 2]
    encoded = _codec.encode_native({"a": shared, "b": shared})
    assert isinstance(encoded, bytes) and encoded[:1] == _codec._OWN_JSON  # marshal would share the list
    read = _codec.decode_native(encoded, "k")
    read["a"].append(3)
    assert read["b"] == [1, 2]


NUMBERS = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.from_regex(r"-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
)
STORED_TEXTS = st.one_of(
    st.builds(lambda n: f'{{"n":{n},"l":[{n}]}}', NUMBERS),
    st.builds(lambda n: f'{{"long":"{"x" * 2000}","l":[{{"n":{n}}}]}}', NUMBERS),  # read as mostly long strings
    st.builds(lambda s: '{"s":"' + s + '"}', st.from_regex(r'([^"\\]|\\u[dD][89abAB][0-9a-fA-F]{2}|\\["\\/bfnrt])*')),
    st.text(max_size=12),
    st.sampled_from(['{"a":1,"a":2}', '{"a":NaN}', '{"a":1e400}', "[1]", '{"a":"\x01"}', "\ufeff{}", " {} "]),
)


@settings(max_examples=1000)
@given(STORED_TEXTS)
def test_both_decoders_read_the_same(text: str) -> None:
    try:
        expected = exact(_codec._decode(text))
    except (ValueError, RecursionError):
        with pytest.raises(DeserializationError):
            _codec.decode_value(text, "k")
        return
    if expected.startswith("{"):
        assert exact(_codec.decode_value(text, "k")) == expected
    else:
        with pytest.raises(DeserializationError):
            _codec.decode_value(text, "k")


@pytest.mark.parametrize("name", sorted(release_samples()))
def test_texts_written_by_0_1_0_read_back(name: str) -> None:
    written = json.loads(RELEASE_TEXTS.read_text(encoding="utf-8"))[name]
    value = release_samples()[name]
    expected = exact(json.loads(json.dumps(value)))  # tuples read back as lists
    assert exact(_codec.decode_value(written, name)) == expected
    assert exact(_codec.decode_value(_codec.encode_value(value), name)) == expected


@pytest.mark.parametrize("inner", [[], {}, 1], ids=["empty list", "empty dict", "scalar"])
@pytest.mark.parametrize("kind", ["lists", "dicts"])
@pytest.mark.parametrize("beside", [0, 10_000], ids=["short", "long"])  # the codec checks these two differently
def test_the_depth_limit_is_exact(inner: Any, kind: str, beside: int) -> None:
    def nested(depth: int) -> dict[str, Any]:  # depth containers, the value itself included
        node = inner
        for _ in range(depth - (1 if isinstance(inner, int) else 2)):
            node = [node] if kind == "lists" else {"k": node}
        return {"v": node, "beside": "x" * beside}

    assert _codec.decode_value(_codec.encode_value(nested(MAX_DEPTH)), "k") == nested(MAX_DEPTH)
    with pytest.raises(SerializationError, match=f"nested deeper than {MAX_DEPTH} levels"):
        _codec.encode_value(nested(MAX_DEPTH + 1))


def test_the_size_limit_is_exact() -> None:
    frame = len('{"v":""}')
    assert len(_codec.encode_value({"v": "x" * (MAX_VALUE_BYTES - frame)})) == MAX_VALUE_BYTES
    with pytest.raises(ValueTooLargeError):
        _codec.encode_value({"v": "x" * (MAX_VALUE_BYTES - frame + 1)})


@pytest.mark.parametrize("value", [{"a": math.nan}, {"a": [None, -math.inf]}, {"a": [math.inf, math.inf]}])
def test_non_finite_floats_are_refused_beside_nulls(value: dict[str, Any]) -> None:
    with pytest.raises(SerializationError, match="not JSON compliant"):
        _codec.encode_value(value)


@pytest.mark.parametrize("count", [0, 10, 5_000], ids=["alone", "few-lookalikes", "past-the-budget"])
@pytest.mark.parametrize("encode", [_codec.encode_value, _codec.encode_native], ids=["text", "native"])
def test_a_non_finite_float_is_found_among_integers_that_share_its_last_byte(
    count: int, encode: Callable[[dict[str, Any]], object]
) -> None:
    """A negative integer's marshal form holds 0xff bytes, as a NaN's or an infinity's last byte does: the
    screen looks at each in place (within a budget, then at the whole text) and finds the float wherever it
    is; without one, the integers pass."""
    integers = [-(i + 1_000) for i in range(count)]  # two 0xff bytes each, distinct objects (no marshal refs)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(SerializationError, match="not JSON compliant"):
            encode({"a": integers, "b": [None, bad]})
    encoded = encode({"a": integers, "b": [None, 1.5]})
    decoded = _codec.decode_native(encoded, "k") if isinstance(encoded, bytes) else json.loads(str(encoded))
    assert decoded == {"a": integers, "b": [None, 1.5]}
