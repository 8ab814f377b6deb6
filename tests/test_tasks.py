"""kvstores.tasks through real servers: the tasks extension's wire over HTTP, on every row of the table.

A FastMCP server with StoreTasks runs on a uvicorn thread (its own store object and event loop) and
:class:`tests.support.tasks.TaskWire` drives it. Across processes, and when
things go wrong: tests/test_tasks_processes.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from kvstores import open_store
from kvstores._sealing import generate_key
from kvstores.backends.memory import MemoryStore
from kvstores.errors import EncryptionKeyError, StoreConnectionError
from kvstores.tasks._book import Change
from kvstores.tasks._claims import INLINE_RESULT_BYTES, _fits_inline
from kvstores.tasks._engine import QUEUE, RECORDS, Claim, TaskEngine
from kvstores.tasks._record import TaskRecord, TaskState, ref
from tests.support import Backend
from tests.support.faults import proxied
from tests.support.fixtures import rows, rows_with
from tests.support.tasks import RUNS, TaskWire, ThreadServer, build_server, run_log

pytestmark = pytest.mark.anyio


def served_store(backend: Backend, namespace: str, store: Any, **options: Any) -> Any:
    """The server's own store object on ``namespace``, opened from its URL (a row's client object is bound to
    the test's event loop; the server runs its own), or the test's ``store`` itself where data is per object."""
    if not backend.persistent:
        return store
    url, defaults = backend.url(namespace)
    return open_store(url, **{**defaults, **options})


class Served:
    """A task server on a thread and a client of it."""

    def __init__(self, server: ThreadServer, wire: TaskWire) -> None:
        self.server = server
        self.wire = wire


async def serve(backend: Backend, namespace: str, store: Any, *, auth: bool = False, **options: Any) -> Served:
    """Start a server (the caller stops it)."""
    server_store = served_store(backend, namespace, store)
    server = ThreadServer(build_server(server_store, auth=auth, **options).http_app()).__enter__()
    return Served(server, TaskWire(server.url, token="token-x" if auth else None))


@pytest.fixture
async def served(backend: Backend, namespace: str, store: Any) -> AsyncIterator[Served]:
    """A task server with the default options on the row's store."""
    running = await serve(backend, namespace, store)
    yield running
    await running.wire.aclose()
    running.server.__exit__()


def _error(answer: dict[str, Any]) -> dict[str, Any]:
    assert "error" in answer, answer
    error: dict[str, Any] = answer["error"]
    return error


# -- the wire, every row ----------------------------------------------------------------------


async def test_a_task_runs_and_its_result_is_polled(served: Served) -> None:
    answer = await served.wire.call("echo", {"text": "hi"})
    created = answer["result"]
    assert created["resultType"] == "task" and created["status"] == "working"
    assert created["ttlMs"] == 900_000 and created["pollIntervalMs"] == 5_000
    assert len(created["taskId"]) >= 43  # 32 random bytes, URL-safe base64
    done = await served.wire.wait(created["taskId"])
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"] == {"result": "echo hi"}
    assert done["createdAt"] == created["createdAt"] and done["lastUpdatedAt"] >= created["createdAt"]
    assert "error" not in done and "inputRequests" not in done


async def test_a_quick_tools_first_poll_finds_it_done(served: Served) -> None:
    """The first ``tasks/get``, sent as soon as the task is created, waits for the quick tool instead of
    answering "working" (``hold``): a client needs no second poll, as with fastmcp-tasks. It is answered with
    the final record the server wrote, its result in it or (over 1 KiB) kept beside it."""
    for text in ("a", "b", "c" * 2000):
        task_id = await served.wire.submit("echo", {"text": text})
        first = (await served.wire.get(task_id))["result"]
        assert first["status"] == "completed", first
        assert first["result"]["structuredContent"] == {"result": f"echo {text}"}


async def test_a_small_result_is_kept_in_its_record_and_a_large_one_beside_it(served: Served, store: Any) -> None:
    """A result up to 1 KiB (as JSON) is written with the task's outcome, in one write; a larger one beside
    the record, under the run's token, so that a listing of records never reads it."""
    for text, inline in (("short", True), ("x" * 2000, False)):
        task_id = await served.wire.submit("echo", {"text": text})
        done = await served.wire.wait(task_id)
        assert done["result"]["structuredContent"] == {"result": f"echo {text}"}, done
        stored = await store.get(ref(task_id), collection=RECORDS)
        assert stored is not None and stored["state"] == "completed", stored
        if inline:
            assert stored["result"] == done["result"] and stored["result_token"] is None, stored
        else:
            kept = await store.get(f"outcome/{ref(task_id)}/{stored['result_token']}", collection=RECORDS)
            assert stored["result"] is None and kept == {"result": done["result"]}, (stored, kept)


@pytest.mark.parametrize(
    "result",
    [
        {"text": "x" * (INLINE_RESULT_BYTES - 11)},  # exactly the limit as JSON
        {"text": "x" * (INLINE_RESULT_BYTES - 10)},  # one byte past it
        {"text": "\n" * (INLINE_RESULT_BYTES // 2)},  # under the limit in characters, past it once escaped
        {"text": "é" * (INLINE_RESULT_BYTES // 2 - 5)},  # two bytes a character
        list(range(100_000)),  # past the limit long before the walk would end
        [[], {}, None, True, 1.5, ""],
        {"model": object()},  # not JSON: kept beside the record, where the store's encoding decides
    ],
)
def test_a_result_is_kept_in_its_record_exactly_when_its_json_fits(result: Any) -> None:
    """The size check that decides where a result goes (it stops early for large results) agrees with
    the size of the result's JSON, byte for byte, at the limit and on either side of it."""
    try:
        fits = len(orjson.dumps(result)) <= INLINE_RESULT_BYTES
    except TypeError:
        fits = False
    assert _fits_inline(result) is fits


async def test_a_task_started_by_its_submitting_server_runs_outside_the_request(served: Served) -> None:
    """A task claimed as it is submitted starts from the tools/call handler, yet its tool runs in the worker's
    context: no request context of the submitting call (FastMCP's own test_context_wiring_in_background_task)."""
    done = await served.wire.wait(await served.wire.submit("background", {}))
    assert done["result"]["structuredContent"] == {"is_background": True, "no_request_context": True}, done


async def test_tasks_submitted_to_a_busy_worker_keep_to_its_concurrency(
    backend: Backend, namespace: str, store: Any
) -> None:
    """Tasks submitted here run here claimed as they are written while a slot is free, and never more at once
    than ``concurrency``: the slot is taken before the submit and the rest wait for the queue."""
    served = await serve(backend, namespace, store, concurrency=2)
    try:
        ids = await asyncio.gather(*(served.wire.submit("overlap", {"seconds": 0.3}) for _ in range(6)))
        done = [await served.wire.wait(task_id) for task_id in ids]
        assert {task["status"] for task in done} == {"completed"}, done
        assert max(task["result"]["structuredContent"]["result"] for task in done) == 2
    finally:
        await served.wire.aclose()
        served.server.__exit__()


@pytest.mark.parametrize("backend", rows_with("persistent"), indirect=True)
async def test_a_held_poll_wakes_when_another_replica_ends_the_task(
    backend: Backend, namespace: str, store: Any
) -> None:
    """A replica that runs no worker holds ``tasks/get`` until the replica that ran the task signals its end (a
    hold long enough that only the signal can end it in time), and a hold of 0 answers at once."""
    reader = await serve(backend, namespace, store, worker=False, hold=30)
    runner = await serve(backend, namespace, store)
    at_once = await serve(backend, namespace, store, worker=False, hold=0)
    try:
        task_id = await reader.wire.submit("sleeper", {"seconds": 0.5, "marker": f"held-{uuid.uuid4().hex}"})
        assert (await at_once.wire.get(task_id))["result"]["status"] == "working"
        held = (await reader.wire.get(task_id))["result"]
        assert held["status"] == "completed", held
        assert held["result"]["structuredContent"] == {"result": "slept"}
    finally:
        for served_ in (reader, runner, at_once):
            await served_.wire.aclose()
            served_.server.__exit__()


async def test_a_raising_tool_completes_with_an_error_result_and_a_protocol_fault_fails(served: Served) -> None:
    raised = await served.wire.wait(await served.wire.submit("boom", {"text": "x"}))
    assert raised["status"] == "completed" and raised["result"]["isError"] is True
    assert "boom x" in raised["result"]["content"][0]["text"]
    failed = await served.wire.wait(await served.wire.submit("fault", {}))
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": -32001, "message": "a protocol fault"}
    assert failed["statusMessage"] == "a protocol fault" and "result" not in failed


async def test_modes_optional_required_forbidden(served: Served) -> None:
    inline = await served.wire.call("echo", {"text": "a"}, declare=False)
    assert inline["result"]["structuredContent"] == {"result": "echo a"}
    refused = _error(await served.wire.call("required_echo", {"text": "a"}, declare=False))
    assert refused["code"] == -32021
    assert refused["data"] == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    tasked = await served.wire.wait(await served.wire.submit("required_echo", {"text": "b"}))
    assert tasked["result"]["structuredContent"] == {"result": "required b"}
    forbidden = await served.wire.call("plain_echo", {"text": "c"})
    assert forbidden["result"]["structuredContent"] == {"result": "plain c"}
    assert "taskId" not in forbidden["result"]
    undeclared = _error(await served.wire.request("tasks/get", {"taskId": "x"}, declare=False))
    assert undeclared["code"] == -32021


async def test_cancel_reaches_the_running_tool_within_a_second(served: Served) -> None:
    marker = uuid.uuid4().hex
    task_id = await served.wire.submit("sleeper", {"seconds": 60, "marker": marker})
    deadline = time.monotonic() + 30
    while (await run_log(served.wire, marker))["runs"] is None:
        assert time.monotonic() < deadline, "the tool never started"
        await asyncio.sleep(0.05)
    asked = time.time()
    assert "result" in await served.wire.cancel(task_id)
    assert (await served.wire.get(task_id))["result"]["status"] == "cancelled"
    while (cancelled := (await run_log(served.wire, marker))["cancelled"]) is None:
        assert time.monotonic() < deadline, "the tool was never cancelled"
        await asyncio.sleep(0.05)
    assert cancelled["at"] - asked < 1.0
    # a terminal task stays as it is; cancelling it again is acknowledged (as fastmcp-tasks does)
    assert "result" in await served.wire.cancel(task_id)
    done = await served.wire.wait(await served.wire.submit("echo", {"text": "x"}))
    assert "result" in await served.wire.cancel(done["taskId"])
    assert (await served.wire.get(done["taskId"]))["result"]["status"] == "completed"
    for odd in ("x" * 5_000, "fault/" + task_id):
        assert _error(await served.wire.get(odd))["code"] == -32602
    assert _error(await served.wire.cancel("no-such-task")) == {
        "code": -32602,
        "message": "Task no-such-task not found",
    }


@pytest.mark.parametrize(("tool", "text"), [("stepper", "step {} of 4"), ("reporter", "report {}")])
async def test_progress_is_visible_while_polling(served: Served, tool: str, text: str) -> None:
    task_id = await served.wire.submit(tool, {"steps": 4, "pause": 0.4})
    seen = set()
    deadline = time.monotonic() + 30
    while (status := (await served.wire.get(task_id))["result"])["status"] == "working":
        if status.get("statusMessage"):
            seen.add(status["statusMessage"])
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert status["status"] == "completed", status
    assert len(seen & {text.format(step) for step in range(1, 5)}) >= 3, seen


async def test_input_required_then_update_reenters_the_tool(served: Served) -> None:
    task_id = await served.wire.submit("ask", {})
    waiting = await served.wire.wait(task_id, until=("input_required", "completed", "failed"))
    assert waiting["status"] == "input_required", waiting
    [key] = waiting["inputRequests"]
    assert waiting["inputRequests"][key]["method"] == "elicitation/create"
    assert "result" in await served.wire.update(task_id, {"unknown-key": {"action": "decline"}})
    assert _error(await served.wire.update(task_id, {key: {"action": "not-an-action"}}))["code"] == -32602
    assert (await served.wire.get(task_id))["result"]["status"] == "input_required"
    assert "result" in await served.wire.update(task_id, {key: {"action": "accept", "content": {"name": "ada"}}})
    done = await served.wire.wait(task_id)
    assert done["result"]["structuredContent"] == {"result": "hello ada"}


async def test_another_principal_sees_an_unknown_task(backend: Backend, namespace: str, store: Any) -> None:
    running = await serve(backend, namespace, store, auth=True)
    other = TaskWire(running.server.url, token="token-y")
    try:
        task_id = await running.wire.submit("whoami", {})
        mine = await running.wire.wait(task_id)
        assert mine["result"]["structuredContent"]["client_id"] == "principal-x"
        unknown = "A" * len(task_id)
        for call in (other.get, other.cancel, lambda task: other.update(task, {"k": {}})):
            theirs, nobodys = _error(await call(task_id)), _error(await call(unknown))
            assert theirs == {**nobodys, "message": nobodys["message"].replace(unknown, task_id)}
        assert (await running.wire.get(task_id))["result"]["status"] == "completed"
    finally:
        await other.aclose()
        await running.wire.aclose()
        running.server.__exit__()


async def test_the_caller_identity_and_headers_reach_the_tool(backend: Backend, namespace: str, store: Any) -> None:
    running = await serve(backend, namespace, store, auth=True)
    wire = TaskWire(running.server.url, token="token-x", headers={"x-marker": "m-42"})
    try:
        done = await wire.wait(await wire.submit("whoami", {}))
        assert done["result"]["structuredContent"] == {"client_id": "principal-x", "marker": "m-42"}
    finally:
        await wire.aclose()
        await running.wire.aclose()
        running.server.__exit__()


async def test_after_its_ttl_a_task_is_unknown_and_reclaimed(backend: Backend, namespace: str, store: Any) -> None:
    running = await serve(backend, namespace, store, ttl=4)
    try:
        task_id = await running.wire.submit("echo", {"text": "x"})
        done = await running.wire.wait(task_id)
        assert done["ttlMs"] == 4_000
        await asyncio.sleep(4.5)
        assert _error(await running.wire.get(task_id))["code"] == -32602
        if backend.persistent:
            assert await store.get(ref(task_id), collection=RECORDS) is None
            assert await store.get(ref(task_id), collection=QUEUE) is None
    finally:
        await running.wire.aclose()
        running.server.__exit__()


async def test_a_result_too_large_for_the_store_fails_the_task(served: Served) -> None:
    failed = await served.wire.wait(await served.wire.submit("huge", {"megabytes": 20}), within=60)
    assert failed["status"] == "failed"
    assert "cannot be stored" in failed["error"]["message"] and "result" not in failed


@pytest.mark.parametrize("backend", rows("redis"), indirect=True)
async def test_the_store_down_at_creation_fails_the_call_and_creates_nothing(backend: Backend) -> None:
    from tests.support import free_port

    dead = open_store(f"redis://127.0.0.1:{free_port()}/0?timeout=1")
    server = ThreadServer(build_server(dead).http_app()).__enter__()
    wire = TaskWire(server.url)
    try:
        error = _error(await wire.call("echo", {"text": "x"}))
        assert error["code"] == -32603 and "could not be stored" in error["message"]
    finally:
        await wire.aclose()
        server.__exit__()


@pytest.mark.parametrize("backend", rows_with("persistent"), indirect=True)
async def test_values_are_sealed_at_rest(backend: Backend, namespace: str, store: Any) -> None:
    key = generate_key()
    running = await serve_with_keys(backend, namespace, [key])
    try:
        task_id = await running.wire.submit("echo", {"text": "secret-argument"})
        done = await running.wire.wait(task_id)
        assert done["result"]["structuredContent"] == {"result": "echo secret-argument"}
        with pytest.raises(EncryptionKeyError):
            await store.get(ref(task_id), collection=RECORDS)  # no keys: the value cannot be read
    finally:
        await running.wire.aclose()
        running.server.__exit__()


async def serve_with_keys(backend: Backend, namespace: str, keys: list[str]) -> Served:
    """A task server whose store seals its values under ``keys``."""
    server_store = served_store(backend, namespace, None, encryption_keys=keys)
    server = ThreadServer(build_server(server_store).http_app()).__enter__()
    return Served(server, TaskWire(server.url))


# -- processes: rows whose stores share data between processes ----------------------------------


@pytest.mark.parametrize("backend", rows_with("proxied"), indirect=True)
async def test_the_store_down_while_a_task_runs_loses_no_result(backend: Backend, namespace: str, store: Any) -> None:
    url, options = backend.url(namespace)
    with proxied(url) as (proxy, through_proxy):
        server_store = open_store(through_proxy, **{**options, "timeout": 1})
        server = ThreadServer(build_server(server_store).http_app()).__enter__()
        wire = TaskWire(server.url)
        try:
            marker = uuid.uuid4().hex
            task_id = await wire.submit("counted", {"seconds": 2, "marker": marker})
            deadline = time.monotonic() + 30
            while await store.get(marker, collection=RUNS) is None:
                assert time.monotonic() < deadline, "the tool never started"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the tool's own write has its reply
            proxy.blackhole()  # the tool finishes while the store cannot be reached
            await asyncio.sleep(4)
            record = await store.get(ref(task_id), collection=RECORDS)
            assert record is not None and record["state"] == "working"
            proxy.reset_all()
            proxy.heal()
            while (record := await store.get(ref(task_id), collection=RECORDS))["state"] == "working":
                assert time.monotonic() < deadline + 30, "the outcome was never written"
                await asyncio.sleep(0.1)
            assert record["state"] == "completed" and record["attempts"] == 1
            answer = (await wire.get(task_id))["result"]
            assert answer["status"] == "completed"
            assert answer["result"]["structuredContent"]["result"].startswith("pid")
        finally:
            await wire.aclose()
            server.__exit__()


# -- the engine, in this process ---------------------------------------------------------------------


class _FirstOutcomeWriteFails(TaskEngine):
    """A TaskEngine whose store drops its first fenced write (an outage: the outcome is retried)."""

    dropped = False

    async def fenced(self, claim: Claim, change: Change) -> TaskRecord | None:
        if not self.dropped:
            self.dropped = True
            raise StoreConnectionError("the store dropped the connection")
        return await super().fenced(claim, change)


@pytest.mark.parametrize("size", [10, 2_000], ids=["in-the-record", "beside-the-record"])
async def test_a_held_reader_is_handed_the_result_of_an_outcome_written_after_a_retry(size: int) -> None:
    """An outcome whose first write failed is written again; the reader held in this process is handed the
    final record with its result, whether the result went in the record or beside it."""
    engine = _FirstOutcomeWriteFails(MemoryStore())
    record = await engine.submit(
        tool="tool", version=None, arguments={}, scope=None, caller={}, poll_interval_ms=100, claim=True
    )
    result = {"text": "x" * size}
    with engine.changes.watching(record.ref) as watch:
        assert await engine.finish(Claim(record, record.token), TaskState.COMPLETED, result=result)
        assert engine.dropped and watch.event.is_set()
        assert watch.final is not None and watch.final.result == result, watch.final
    stored = await engine.read(record.id, None)
    assert stored is not None and stored.result == result
