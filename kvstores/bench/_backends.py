"""What ``kvstores bench`` knows of each backend, in one table: a backend adds one row here, or none.

A row (:class:`BenchBackend`) holds everything per-backend the benchmark uses: the raw-driver
and py-key-value baselines (:mod:`kvstores.bench._baselines`), the ratio targets against them,
the batching and ``--signals`` bounds (:mod:`kvstores.bench._targets`), whether mcp-persist
runs beside it in ``--signals``, its collection sizes in ``--scaling``, and which URLs name one
TCP server a latency proxy can stand in for (:mod:`kvstores.bench._proxy`). A backend without a
row (a third party's, through the registry's entry points) is measured all the same, against
the baselines every backend has (``fastmcp``'s event store) and judged by the targets every
backend has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvstores.bench._baselines import (
    AsyncmyStore,
    AsyncpgStore,
    DictJsonStore,
    PymongoStore,
    RedisAsyncStore,
    aiosqlite_beside,
    libpq_url,
    py_key_value,
)
from kvstores.bench._measure import OBJECTS
from kvstores.bench._scenarios import KV_OPERATIONS, SINGLE_OPERATIONS

__all__ = ["BACKENDS", "BenchBackend", "Ratio", "baselines", "bench_backend", "family", "raw_name"]

PY_KEY_VALUE = "py-key-value"
"""The contender name of py-key-value-aio's store on the same backend."""


class Ratio(NamedTuple):
    """A target of one backend's ``kv`` rows: the median of ours ÷ baseline over those rows (the worst,
    with ``every_row``) must reach ``minimum``."""

    label: str
    baseline: str
    minimum: float
    operations: tuple[str, ...]
    value_bytes: int | None = None
    """Only rows of this value size (None: every size)."""
    shape: str | None = None
    """Only rows whose values have this shape (kvstores.bench._measure: STRING or OBJECTS; None: any)."""
    every_row: bool = False
    concurrency: int | None = None
    """Only rows with this many concurrent callers (None: any)."""


@dataclass(frozen=True)
class BenchBackend:
    """One backend family, as the benchmark sees it; the defaults fit a backend it knows nothing of."""

    raw: tuple[str, Callable[[str, Any], Any]] | None = None
    """(name, factory(url, store under test)) of the raw-driver baseline; the factory may return None."""
    py_key_value: Callable[[str], Any] | None = None
    """py-key-value-aio's store on the same URL (None: it has none, or it is not installed)."""
    targets: tuple[Ratio, ...] = ()
    """The ratio targets of this backend's ``kv`` rows."""
    batching: tuple[float, float, float] | None = None
    """Minimum ratios to the raw baseline with opportunistic batching on: one caller's get and put,
    64 callers' gets, 64 callers' puts (None: no such targets)."""
    signal_p99_ms: float | None = None
    """The bound on the p99 of cross-replica delivery, paced (``--signals``; None: no bound)."""
    mcp_persist: bool = False
    """mcp-persist has an event store on this backend: ``--signals`` rows hold its ``subscribe()`` too."""
    collection_sizes: tuple[int, ...] = (1_000, 10_000)
    """Entries per collection of the collection-size sweep (``--scaling``; ``--quick`` takes the default)."""
    large_sizes: tuple[int, ...] = (1_000, 100_000)
    """The same with ``--large``."""
    tcp_schemes: frozenset[str] = frozenset()
    """Schemes whose URL names the one TCP server the store talks to (a proxy can stand in for it)."""
    direct_options: Mapping[str, str] = field(default_factory=dict)
    """Query options that keep the driver on the proxy instead of the address the server reports."""


BACKENDS: dict[str, BenchBackend] = {
    "memory": BenchBackend(
        raw=("dict+json", lambda url, store: DictJsonStore()),
        py_key_value=lambda url: py_key_value("memory:MemoryStore"),
        targets=(
            Ratio("{store} vs py-key-value MemoryStore, 100 B", PY_KEY_VALUE, 10.0, KV_OPERATIONS, 100),
            Ratio("{store} vs py-key-value MemoryStore, all sizes", PY_KEY_VALUE, 10.0, KV_OPERATIONS, None),
            Ratio("{store} vs dict+json (within 2x)", "dict+json", 0.5, KV_OPERATIONS, None),
            Ratio(
                "{store} vs py-key-value MemoryStore, no row slower", PY_KEY_VALUE, 1.0, KV_OPERATIONS, every_row=True
            ),
            Ratio(
                "{store} put of 1 MB objects vs py-key-value MemoryStore",
                PY_KEY_VALUE,
                5.0,
                ("put",),
                1_000_000,
                OBJECTS,
            ),
            Ratio(
                "{store} get of 1 MB objects vs py-key-value MemoryStore",
                PY_KEY_VALUE,
                2.0,
                ("get",),
                1_000_000,
                OBJECTS,
            ),
        ),
        signal_p99_ms=50.0,  # not in issue 22: the in-process floor
        collection_sizes=(1_000, 100_000, 1_000_000),
        large_sizes=(1_000, 100_000, 1_000_000),
    ),
    "sqlite": BenchBackend(
        raw=("aiosqlite", aiosqlite_beside),
        targets=(
            Ratio("{store} get vs raw aiosqlite", "aiosqlite", 0.8, ("get",), None),
            Ratio("{store} put, 1 caller, vs raw aiosqlite", "aiosqlite", 0.8, ("put",), 100, concurrency=1),
        ),
        batching=(0.8, 2.0, 3.0),
        signal_p99_ms=100.0,
        collection_sizes=(1_000, 100_000),
        large_sizes=(1_000, 100_000, 1_000_000),
    ),
    "redis": BenchBackend(
        raw=("redis.asyncio", lambda url, store: None if url.startswith("redis+cluster") else RedisAsyncStore(url)),
        py_key_value=lambda url: py_key_value("redis:RedisStore", url=url),
        targets=(
            Ratio("{store} single-key ops vs raw redis.asyncio", "redis.asyncio", 0.9, SINGLE_OPERATIONS, None),
            Ratio("{store} single-key ops vs py-key-value RedisStore", PY_KEY_VALUE, 1.3, SINGLE_OPERATIONS, None),
        ),
        batching=(0.9, 3.0, 2.0),
        signal_p99_ms=50.0,
        mcp_persist=True,
        tcp_schemes=frozenset({"redis"}),
    ),
    "mongodb": BenchBackend(
        raw=("pymongo", lambda url, store: PymongoStore(url)),
        py_key_value=lambda url: py_key_value("mongodb:MongoDBStore", url=url, db_name="kvbench"),
        targets=(Ratio("{store} vs raw pymongo", "pymongo", 0.85, KV_OPERATIONS, None),),
        batching=(0.85, 1.5, 1.5),
        signal_p99_ms=250.0,
        tcp_schemes=frozenset({"mongodb"}),
        direct_options={"directConnection": "true"},
    ),
    "postgresql": BenchBackend(
        raw=("asyncpg", lambda url, store: AsyncpgStore(url)),
        py_key_value=lambda url: py_key_value(
            "postgresql:PostgreSQLStore", url=libpq_url(url), table_name="kvbench_pykv"
        ),
        targets=(
            Ratio("{store} get and put vs raw asyncpg", "asyncpg", 0.85, ("get", "put"), None),
            Ratio("{store} bulk ops vs raw asyncpg", "asyncpg", 0.85, ("get_many", "put_many"), None),
            Ratio("{store} vs py-key-value PostgreSQLStore", PY_KEY_VALUE, 1.2, KV_OPERATIONS, None),
        ),
        batching=(0.85, 2.0, 2.0),
        signal_p99_ms=50.0,
        mcp_persist=True,
        tcp_schemes=frozenset({"postgresql", "postgres"}),
    ),
    "mysql": BenchBackend(
        raw=("asyncmy", lambda url, store: AsyncmyStore(url)),
        batching=(0.85, 2.0, 2.0),
        signal_p99_ms=100.0,  # polled like SQLite: SQLite's bound
        tcp_schemes=frozenset({"mysql", "mariadb"}),
    ),
}
"""Backend family (:func:`family`) -> what the benchmark knows of it. Redis Cluster has no raw
baseline; the SQLite one writes a file beside the store's."""

_UNKNOWN = BenchBackend()


def family(url: str) -> str:
    """The backend a store URL opens: its store's module name (``sqlite``, ``mysql``...), else the scheme."""
    from kvstores.registry import SCHEMES

    scheme = url.partition("://")[0].lower()
    return SCHEMES.get(scheme, "").partition(":")[0].rpartition(".")[2] or scheme


def bench_backend(kind: str) -> BenchBackend:
    """The row of backend family ``kind`` (the defaults for a backend the table does not name)."""
    return BACKENDS.get(kind, _UNKNOWN)


def raw_name(kind: str) -> str:
    """The name of the raw baseline of backend family ``kind`` (the family itself if it has none)."""
    raw = bench_backend(kind).raw
    return kind if raw is None else raw[0]


def baselines(url: str, store: Any) -> dict[str, Any]:
    """The baselines for ``store``, opened from ``url``: name -> store-like object with the benchmarked methods."""
    backend = bench_backend(family(url))
    found: dict[str, Any] = {}
    if backend.raw is not None:
        name, factory = backend.raw
        raw = factory(url, store)
        if raw is not None:
            found[name] = raw
    theirs = None if backend.py_key_value is None else backend.py_key_value(url)
    if theirs is not None:
        found[PY_KEY_VALUE] = theirs
    return found
