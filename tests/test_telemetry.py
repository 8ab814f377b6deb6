"""OpenTelemetry: spans and metrics for every store call, on every backend, and nothing without an SDK.

The SDK's in-memory span exporter and metric reader are installed as the global providers
for each test and removed afterwards (OpenTelemetry allows setting them once per process,
so the fixture resets the API's globals through kvstores._telemetry.reset_providers).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from fastmcp import FastMCP
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from kvstores import InvalidKeyError, StoreConnectionError, _telemetry, open_store
from kvstores.harness import connected_client
from tests.support import Backend

pytestmark = pytest.mark.anyio

SECRET_KEY = "key-holding-a-secret"
SECRET_VALUE = "value-holding-a-secret"


class Telemetry:
    """The spans and metrics recorded while installed."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [
            point
            for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    recorded = Telemetry()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(recorded.spans))
    _telemetry.reset_providers()
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[recorded.reader]))
    try:
        yield recorded
    finally:
        _telemetry.reset_providers()


def _no_secret_in(span: ReadableSpan) -> None:
    text = repr(dict(span.attributes or {})) + span.name
    assert SECRET_KEY not in text and SECRET_VALUE not in text and "password" not in text


async def test_every_call_is_a_client_span_with_database_attributes(
    telemetry: Telemetry, backend: Backend, namespace: str
) -> None:
    store = await backend.open(namespace)
    try:
        await store.put(SECRET_KEY, {"v": SECRET_VALUE}, collection="sessions", ttl=60)
        await store.get(SECRET_KEY, collection="sessions")
        await store.get_many([SECRET_KEY, "other"], collection="sessions")
        await store.put_if_absent("once", {"v": 1})
        await store.update("counter", lambda value: {"n": 1})
        await store.pop("once")
        await store.ping()
        await store.destroy()
    finally:
        await store.aclose()
    spans = {span.name: span for span in telemetry.finished()}
    put = spans["put sessions"]
    assert put.kind is SpanKind.CLIENT
    expected_system = {"redis-cluster": "redis", "mongodb-motor": "mongodb"}.get(backend.name, backend.name)
    assert put.attributes is not None
    assert put.attributes["db.system.name"] == expected_system
    assert put.attributes["db.operation.name"] == "put"
    assert put.attributes["db.collection.name"] == "sessions"
    assert "db.operation.batch.size" not in put.attributes
    if backend.server:
        assert put.attributes["server.address"] == "127.0.0.1" and isinstance(put.attributes["server.port"], int)
    else:
        assert "server.address" not in put.attributes
    assert spans["get_many sessions"].attributes["db.operation.batch.size"] == 2  # type: ignore[index]
    for name in ("get sessions", "put_if_absent default", "update default", "pop default", "ping", "destroy"):
        assert name in spans, sorted(spans)
    for span in telemetry.finished():
        _no_secret_in(span)
        assert span.status.status_code is not StatusCode.ERROR
    durations = telemetry.points("db.client.operation.duration")
    operations = {point.attributes["db.operation.name"] for point in durations}
    assert {"put", "get", "get_many", "put_if_absent", "update", "pop", "ping", "destroy"} <= operations
    assert all(point.attributes["db.system.name"] == expected_system for point in durations)


async def test_errors_mark_the_span_with_the_kvstores_error_class(telemetry: Telemetry) -> None:
    async with open_store("memory://") as store:
        with pytest.raises(InvalidKeyError):
            await store.get("x" * 5000)
    unreachable = open_store("redis://:hunter2-password@127.0.0.1:1/0?timeout=0.5")
    with pytest.raises(StoreConnectionError):
        await unreachable.get("k")
    await unreachable.aclose()
    failed = [span for span in telemetry.finished() if span.status.status_code is StatusCode.ERROR]
    assert [span.attributes["error.type"] for span in failed] == ["InvalidKeyError", "StoreConnectionError"]  # type: ignore[index]
    for span in telemetry.finished():
        assert "hunter2" not in repr(dict(span.attributes or {}))
    assert {point.attributes.get("error.type") for point in telemetry.points("db.client.operation.duration")} == {
        "InvalidKeyError",
        "StoreConnectionError",
    }


async def test_batches_are_measured(telemetry: Telemetry, tmp_path: Any) -> None:
    async with open_store(f"sqlite:///{tmp_path}/batch.db", batching=True) as store:  # KVSTORES_BATCHING aside
        await asyncio.gather(*(store.put(f"k{i}", {"i": i}) for i in range(32)))
    sizes = telemetry.points("kvstores.batch.size")
    assert sizes and sum(point.sum for point in sizes) == 31  # the first put went out alone
    assert {point.attributes["db.operation.name"] for point in sizes} == {"put"}


async def test_store_calls_nest_under_the_fastmcp_tool_span(telemetry: Telemetry) -> None:
    store = open_store("memory://")

    def server_factory(state: Any) -> FastMCP[Any]:
        server: FastMCP[Any] = FastMCP("traced")

        @server.tool
        async def remember(text: str) -> str:
            await state.put("note", {"text": text}, collection="notes")
            return "ok"

        return server

    async with connected_client(store, server_factory=server_factory) as client:
        await client.call_tool("remember", {"text": "hello"})
    spans = telemetry.finished()
    store_span = next(span for span in spans if span.name == "put notes")
    parent = next(span for span in spans if span.context.span_id == store_span.parent.span_id)  # type: ignore[union-attr]
    assert "remember" in parent.name


async def test_a_store_in_use_is_traced_once_told_and_plain_again_once_told(request: pytest.FixtureRequest) -> None:
    """``trace_calls()``, as the bench's with-SDK rows use it (kvstores.bench._otel): a store that
    decided without an SDK is traced from the call after it, and runs its plain methods after ``on=False``."""
    async with open_store("memory://") as store:
        await store.put("k", {"v": 1})  # decided now: no SDK, the plain methods
        recorded: Telemetry = request.getfixturevalue("telemetry")  # the SDK comes while the store is in use
        await store.get("k")
        assert recorded.finished() == []
        store.trace_calls()
        await store.get("k")
        assert [span.name for span in recorded.finished()] == ["get default"]
        store.trace_calls(on=False)
        await store.get("k")
        assert len(recorded.finished()) == 1


def test_no_spans_and_no_sdk_work_without_a_provider() -> None:
    """Without an SDK nothing is recorded: the check is the API's globals, and no instrument is made."""
    script = textwrap.dedent(
        """
        import asyncio
        from kvstores import _telemetry, open_store

        async def main():
            async with open_store("memory://") as store:
                await store.put("k", {"v": 1})
                await store.get("k")
            assert not _telemetry.active()
            assert _telemetry._instruments is None
            print("ok")

        asyncio.run(main())
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


PASSWORD = "hunter2Secret"
_SHAPES = (
    f"app:{PASSWORD}@:x@127.0.0.1:1/db",  # unescaped "@" and ":" in the password
    f"app:{PASSWORD}é€@127.0.0.1:1/db",  # non-ASCII, as typed
    f"app@127.0.0.1:1/db?password={PASSWORD}",  # in the query
    f"app:{PASSWORD}@127.0.0.1:1,127.0.0.1:2/db",  # several hosts
)


@pytest.mark.parametrize("shape", _SHAPES)
# MongoDB's shapes run in tests/test_secrets_output.py's child processes: pymongo, refusing some of
# them while it builds its client, leaves a socket for the garbage collector, an error in this process.
@pytest.mark.parametrize("scheme", ["redis", "postgresql", "mysql"])
async def test_no_url_shape_puts_its_password_in_a_span_or_an_error(
    telemetry: Telemetry, scheme: str, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{scheme}://{shape}{'&' if '?' in shape else '?'}timeout=0.5"
    seen: list[str] = []
    try:
        store = open_store(url)
    except ValueError as exc:  # a URL the driver cannot read: refused at open
        seen.append(repr(exc))
    else:
        with pytest.raises(Exception) as raised:  # nothing listens: a kvstores error, or the driver's refusal
            await store.get("k")
        await store.aclose()
        seen += [repr(raised.value), repr(raised.value.__cause__)]
    for span in telemetry.finished():
        seen += [repr(dict(span.attributes or {})), span.status.description or ""]
        seen += [repr(dict(event.attributes or {})) for event in span.events]
    seen.append(caplog.text)
    assert not [text for text in seen if PASSWORD in text]


async def test_background_tasks_have_submit_run_and_finish_spans(telemetry: Telemetry) -> None:
    from tests.support.tasks import TaskWire, ThreadServer, build_server

    with ThreadServer(build_server(open_store("memory://")).http_app()) as server:
        wire = TaskWire(server.url)
        try:
            task_id = await wire.submit("echo", {"text": SECRET_VALUE})
            assert (await wire.wait(task_id))["status"] == "completed"
        finally:
            await wire.aclose()
    spans = {span.name: span for span in telemetry.finished() if span.name.startswith("kvstores.tasks")}
    assert set(spans) == {"kvstores.tasks submit", "kvstores.tasks run", "kvstores.tasks finish"}
    labels = {(span.attributes or {})["kvstores.task"] for span in spans.values()}
    assert len(labels) == 1 and labels.pop().startswith("#")
    assert (spans["kvstores.tasks run"].attributes or {})["kvstores.task.tool"] == "echo"
    assert (spans["kvstores.tasks finish"].attributes or {})["kvstores.task.state"] == "completed"
    for span in spans.values():
        _no_secret_in(span)
        assert task_id not in repr(dict(span.attributes or {}))
