"""OpenTelemetry spans and metrics for store calls, through ``opentelemetry-api`` only.

Every public store call is a CLIENT span named ``"<operation> <collection>"`` with the
database semantic conventions' attributes: ``db.system.name`` (redis, sqlite, mongodb,
postgresql, mysql, memory), ``db.operation.name`` (the kvstores method), ``db.collection.name``,
``db.operation.batch.size`` (bulk calls of two or more keys), ``server.address`` and
``server.port`` where there is a server, and on failure an ERROR status with ``error.type``
(the exception's class name). Keys, values and credentials are never recorded. Spans nest
under the caller's current span (a FastMCP tool call shows its store calls as children).

Metrics: the histogram ``db.client.operation.duration`` (seconds) with the same
low-cardinality attributes, and ``kvstores.batch.size``: how many concurrent calls each
coalesced batch carried (see kvstores._batching).

Cost: none until the application installs an OpenTelemetry SDK (``trace.set_tracer_provider``
/ ``metrics.set_meter_provider``, or the ``OTEL_PYTHON_*_PROVIDER`` variables). Each store
decides once, at its first call: with an SDK installed by then, it binds traced versions of
its methods on itself; without, its calls run the plain methods, with no check per call. So
install the SDK before a store's first call (at start-up, as usual): a store already in use
is not traced, unless told to decide again (``store.trace_calls()``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sized
from contextlib import AbstractContextManager, contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

__all__ = [
    "SHAPE",
    "Observer",
    "active",
    "metrics",
    "observed",
    "record_batch",
    "reset_providers",
    "span",
    "trace",
    "traced",
]

_MAX_COLLECTION = 256  # characters of a collection name kept in attributes
# OpenTelemetry's recommended buckets for db.client.operation.duration
_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the otel extra is optional: without it nothing is ever recorded
    trace = None  # type: ignore[assignment]
    metrics = None  # type: ignore[assignment]

try:
    _VERSION = version("kvstores")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
    _VERSION = "0"

_instruments: tuple[Any, Any, Any] | None = None  # (tracer, duration histogram, batch histogram)

_API_MODULES = ("opentelemetry.trace", "opentelemetry.metrics")
"""Where the API defines its placeholder providers; an SDK's (or a vendor's) live elsewhere."""


def active() -> bool:
    """True once an OpenTelemetry SDK is installed: then store calls are traced and measured.

    A provider counts once it is not one of the API's own placeholders (its proxies and no-op
    providers, all defined in ``opentelemetry.trace`` and ``opentelemetry.metrics``); asking for
    them loads the providers that ``OTEL_PYTHON_*_PROVIDER`` names. Called when a store decides
    whether to trace itself and per coalesced batch, never per call.
    """
    return trace is not None and (_installed(trace.get_tracer_provider()) or _installed(metrics.get_meter_provider()))


def _installed(provider: object) -> bool:
    return not type(provider).__module__.startswith(_API_MODULES)


def _get_instruments() -> tuple[Any, Any, Any]:
    global _instruments
    if _instruments is None:
        meter = metrics.get_meter("kvstores", _VERSION)
        _instruments = (
            trace.get_tracer("kvstores", _VERSION),
            meter.create_histogram(
                "db.client.operation.duration",
                unit="s",
                description="Duration of kvstores store calls",
                explicit_bucket_boundaries_advisory=_BUCKETS,
            ),
            meter.create_histogram(
                "kvstores.batch.size",
                unit="{call}",
                description="Concurrent single-key calls carried by one coalesced bulk call",
            ),
        )
    return _instruments


def reset_providers() -> None:
    """Forget the process's OpenTelemetry providers, and the instruments kvstores made from them.

    OpenTelemetry lets a process set its providers once; the benchmark's with- and without-SDK
    rows (kvstores.bench._otel) install and remove one, so this resets the API's globals as
    OpenTelemetry's own tests do. Never for an application. Those globals are private names of
    opentelemetry-api, used here only: tests/test_private_names.py checks them against what is
    installed, and the ``otel`` extra caps the API's version.
    """
    global _instruments
    from opentelemetry import trace as trace_api
    from opentelemetry.metrics import _internal as metrics_internal
    from opentelemetry.util._once import Once

    trace_api._TRACER_PROVIDER = None
    trace_api._TRACER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    _instruments = None


def record_batch(system: str, operation: str, size: int) -> None:
    """Record that one coalesced bulk call carried ``size`` calls (a no-op until an SDK is installed)."""
    if active():
        _get_instruments()[2].record(size, {"db.system.name": system, "db.operation.name": operation})


@contextmanager
def span(name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """An INTERNAL span named ``name`` around a block (kvstores.tasks: submit, run, finish), under the
    caller's current span; nothing until an SDK is installed. An exception leaves its class name in
    ``error.type`` and an ERROR status (never its message: it may quote a value)."""
    if not active():
        yield None
        return
    tracer = _get_instruments()[0]
    with tracer.start_as_current_span(
        name,
        kind=SpanKind.INTERNAL,
        attributes=dict(attributes),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_attribute("error.type", type(exc).__name__)
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


class Observer:
    """Traces and measures one store's calls; ``attributes`` are the store's own (system, server)."""

    def __init__(self, attributes: Mapping[str, Any]) -> None:
        self.attributes = dict(attributes)

    async def observe(
        self,
        operation: str,
        collection: object,
        batch_size: int | None,
        call: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Run ``call`` inside a CLIENT span, recording its duration."""
        tracer, durations, _ = _get_instruments()
        attributes = {**self.attributes, "db.operation.name": operation}
        if isinstance(collection, str):
            attributes["db.collection.name"] = collection[:_MAX_COLLECTION]
        name = f"{operation} {attributes['db.collection.name']}" if "db.collection.name" in attributes else operation
        span_attributes = dict(attributes)
        if batch_size is not None and batch_size >= 2:
            span_attributes["db.operation.batch.size"] = batch_size
        started = time.perf_counter()
        span_context: AbstractContextManager[Any] = tracer.start_as_current_span(
            name,
            kind=SpanKind.CLIENT,
            attributes=span_attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        with span_context as span:
            try:
                return await call()
            except BaseException as exc:
                error_type = type(exc).__name__
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, error_type))
                attributes["error.type"] = error_type
                raise
            finally:
                durations.record(time.perf_counter() - started, attributes)


Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])

SHAPE = "_kvstores_shape"
"""The attribute :func:`observed` sets on a method: where its calls name their collection."""


def observed(shape: str) -> Callable[[Method], Method]:
    """Mark a public store method as one to trace and measure while OpenTelemetry is active.

    ``shape`` says where the call's collection is: ``key`` and ``keys`` (keyword-only; ``keys``
    also has a batch size, the length of its first argument), ``collection`` (first
    argument), ``store`` (none). The method itself is left as it is: a store binds traced
    versions on itself (:func:`traced`) only once it finds an SDK installed, so an untraced
    call costs nothing at all.
    """

    def mark(method: Method) -> Method:
        setattr(method, SHAPE, shape)
        return method

    return mark


def traced(
    store: Any, method: Callable[..., Awaitable[Any]], observer: Callable[[], Observer]
) -> Callable[..., Awaitable[Any]]:
    """``method`` (marked by :func:`observed`) of ``store``, its calls traced by the store's ``observer()``."""
    shape: str = getattr(method, SHAPE)
    operation = method.__name__

    @functools.wraps(method)
    def traced_call(*args: Any, **kwargs: Any) -> Awaitable[Any]:
        if shape == "collection":
            collection = args[0] if args else kwargs.get("collection")
        else:
            collection = kwargs.get("collection") if shape != "store" else None
        if collection is None and shape != "store":
            collection = store.default_collection
        batch = len(args[0]) if shape == "keys" and args and isinstance(args[0], Sized) else None
        return observer().observe(operation, collection, batch, functools.partial(method, store, *args, **kwargs))

    return traced_call
