"""The cost of OpenTelemetry on the store hot path: the ``otel`` rows of memory targets.

Contenders, interleaved on one MemoryStore (get and put of 100 B, one task): ``kvstores`` as
installed (opentelemetry-api present, no SDK: the common case), ``no opentelemetry-api``
(the module's API handle switched off, as when the ``otel`` extra is not installed) and
``with an SDK`` (a tracer provider with a span processor and exporter that drop everything,
and a meter provider without readers: the cost of recording, not of exporting).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvstores import _telemetry
from kvstores.bench._measure import Within

__all__ = ["NO_API", "WITH_SDK", "otel_contenders"]

NO_API = "no opentelemetry-api"
"""Contender: the same store as if opentelemetry-api were not installed."""

WITH_SDK = "with an SDK"
"""Contender: the same store with an OpenTelemetry SDK installed (no-op export)."""


@contextmanager
def _without_api() -> Iterator[None]:
    saved = _telemetry.trace
    _telemetry.trace = None  # type: ignore[assignment]
    try:
        yield
    finally:
        _telemetry.trace = saved


@contextmanager
def _with_sdk(store: Any) -> Iterator[None]:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class _Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Drop()))
    _telemetry.reset_providers()  # OpenTelemetry sets providers once per process
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider())
    store.trace_calls()  # as a store made (or first used) once the SDK is installed
    try:
        yield
    finally:
        store.trace_calls(on=False)  # back to the plain methods
        _telemetry.reset_providers()


def otel_contenders(store: Any) -> dict[str, Any]:
    """``store`` as measured, without the API, and with an SDK (when opentelemetry-sdk is installed)."""
    if _telemetry.trace is None:
        return {}
    contenders: dict[str, Any] = {"kvstores": store, NO_API: Within(store, _without_api)}
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        return contenders
    return {**contenders, WITH_SDK: Within(store, functools.partial(_with_sdk, store))}
