"""No cancel is swallowed on the way out (Python 3.11's ``asyncio.wait_for`` drops one that arrives as its
awaitable completes; kvstores.loop's docstring).

A server's lifespan left with tasks just submitted returns and leaves no worker behind; a process whose
StoreTasks lifespan ran on Redis closes its event loop (a hang there cannot be caught in-process: a child
process, with a timeout); and the helpers themselves: :func:`kvstores.loop.wait_event` lets a cancel through
that arrives as its event is set, :func:`kvstores.loop.stop` neither swallows its caller's cancel nor leaves
the task running.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from typing import Any, cast

import pytest
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID

from kvstores import open_store
from kvstores.loop import stop, wait_event
from kvstores.tasks import StoreTasks, TaskRecord, TaskState
from tests.support import Backend
from tests.support.fixtures import rows
from tests.support.tasks import ROOT, build_server

pytestmark = pytest.mark.anyio

BOUND = 30.0  # seconds: generous, only a hang ever reaches it

_CALLER = {"access_token": None, "headers": None, "session_id": None, "origin_request_id": None}


async def _submit(extension: StoreTasks, text: str) -> str:
    """Submit an ``echo`` task as the extension's tools/call does; its id."""
    record = await extension.engine.submit(
        tool="echo", version=None, arguments={"text": text}, scope=None, caller=_CALLER, poll_interval_ms=50, rerun=True
    )
    return record.id


def _completed(record: TaskRecord | None) -> bool:
    return record is not None and record.state is TaskState.COMPLETED


def _workers() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__ == "Worker.run"]  # type: ignore[union-attr]


async def test_leaving_the_lifespan_with_two_tasks_just_submitted_returns_and_stops_the_worker() -> None:
    """The memory store submits without suspending, so both submissions and the lifespan's exit happen in
    one loop turn: the worker's wait for its wake-up is cancelled as the wake-up comes."""
    store = open_store("memory://")
    extension = cast(StoreTasks, build_server(store)._extensions[TASKS_EXTENSION_ID])
    left = asyncio.Event()

    async def serve() -> None:
        async with extension.lifespan():
            worker = extension._local
            assert worker is not None
            warm_up = await _submit(extension, "warm-up")
            # the worker ran it and has nothing left to do: it waits for its next wake-up
            until = time.monotonic() + BOUND
            while not _completed(await extension.engine.read(warm_up, None)) or worker.running:
                assert time.monotonic() < until, "the worker never ran the first task"
                await asyncio.sleep(0.01)
            await _submit(extension, "a")
            await _submit(extension, "b")
        left.set()

    serving = asyncio.get_running_loop().create_task(serve())
    try:
        # not anyio.fail_after: its cancel would hit the lifespan, not the worker that swallowed one
        left_in_time = await wait_event(left, BOUND)
        stuck = _workers()
        assert left_in_time, "leaving the lifespan hung: the worker swallowed its cancel"
        assert not stuck, "the lifespan left its worker running"
    finally:
        for worker_task in _workers():
            worker_task.cancel()  # a second cancel reaches a worker that swallowed the first
        await asyncio.gather(serving, return_exceptions=True)
        await store.aclose()


_REDIS_CHILD = """
import asyncio
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID
from kvstores import open_store
from tests.support.tasks import build_server

async def main(turns):
    store = open_store({url!r}, **{options!r})
    extension = build_server(store)._extensions[TASKS_EXTENSION_ID]
    async with extension.lifespan():
        assert await extension.engine.read("no-such-task", None) is None  # what one tasks/get reads
        for _ in range(turns):
            await asyncio.sleep(0)
    # the store is left open, as FastMCP leaves it: asyncio.run cancels what still runs, then ends

for turns in range({rounds}):  # a stop at each step of the reader's connection in turn
    asyncio.run(main(turns))
print("loops closed", flush=True)
"""


@pytest.mark.parametrize("backend", rows("redis"), indirect=True)
def test_a_process_whose_tasks_lifespan_ran_on_redis_closes_its_loop(backend: Backend, namespace: str) -> None:
    """The lifespan starts the worker, whose subscription starts the Redis signal reader; the lifespan ends
    while the reader connects, and asyncio.run's cancel reaches it inside redis-py (which swallowed it on
    3.11, in one of its wait_for calls, about every other run: twelve runs, each stopping a turn later)."""
    url, options = backend.url(namespace)
    script = textwrap.dedent(_REDIS_CHILD.format(url=url, options=options, rounds=12))
    try:
        child = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=BOUND, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the child's event loop never closed:\n{exc.stderr!r}") from None
    assert (child.returncode, child.stdout, child.stderr) == (0, "loops closed\n", "")


async def test_wait_event_lets_through_a_cancel_that_arrives_as_the_event_is_set() -> None:
    event = asyncio.Event()
    woke = asyncio.Event()

    async def waiter() -> None:
        await wait_event(event, BOUND)
        woke.set()  # only reached when the cancel was swallowed

    task = asyncio.get_running_loop().create_task(waiter())
    for _ in range(100):  # until it is parked in event.wait() (two turns)
        if event._waiters:
            break
        await asyncio.sleep(0)
    assert event._waiters, "the waiter never waited"
    event.set()
    task.cancel()  # in the same turn: the waiter wakes with both
    await asyncio.wait([task], timeout=BOUND)
    assert task.cancelled() and not woke.is_set()


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, BOUND) is True


async def test_stop_ends_the_task_and_lets_its_callers_cancel_through() -> None:
    release = asyncio.Event()
    ended = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(BOUND)
        finally:
            await release.wait()  # its clean-up takes a while
            ended.set()

    task = asyncio.get_running_loop().create_task(slow_to_stop())
    await asyncio.sleep(0)
    stopping = asyncio.get_running_loop().create_task(stop(task))
    await asyncio.sleep(0)
    stopping.cancel()  # the caller is cancelled while the task cleans up
    await asyncio.sleep(0)
    assert not stopping.done(), "stop() returned before the task ended"
    release.set()
    await asyncio.wait([stopping], timeout=BOUND)
    assert ended.is_set() and task.cancelled() and stopping.cancelled()


async def test_stop_raises_the_tasks_own_error() -> None:
    async def failing_on_cancel() -> None:
        try:
            await asyncio.sleep(BOUND)
        finally:
            raise RuntimeError("clean-up failed")

    task = asyncio.get_running_loop().create_task(failing_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="clean-up failed"):
        await stop(task)
