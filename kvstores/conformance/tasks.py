"""TaskEngineConformance: background tasks (:mod:`kvstores.tasks`) kept on a store, as a pytest class.

Subclass it with a ``store`` fixture (and optionally ``peer_store``, a second store object on the
same namespace), or run ``kvstores check TARGET --suite tasks``::

    class TestMyStoreRunsTasks(TaskEngineConformance):
        @pytest.fixture
        async def store(self):
            async with MyStore(...) as store:
                yield store

The checks drive the engine and a worker directly (no MCP server): a task is known at once
after it is submitted, and only to its principal; one claim wins; a worker whose lease lapsed
can write nothing once another took the task over; a terminal state is final; a task expires
with its TTL; a worker runs what is submitted and a cancel reaches the running work. They need
the store's atomic operations and ``keys()``; the signal channel is optional (a store without
one is served by the workers' rescans).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from kvstores.conformance._base import StoreConformance, requires
from kvstores.errors import SerializationError
from kvstores.loop import stop, wait_event
from kvstores.tasks._claims import INLINE_RESULT_BYTES
from kvstores.tasks._engine import Claim, TaskEngine
from kvstores.tasks._record import TaskRecord, TaskState
from kvstores.tasks._worker import Outcome, Worker

__all__ = ["TaskEngineConformance"]


async def _submit(engine: TaskEngine, scope: str | None = "principal-a", **fields: Any) -> TaskRecord:
    options = {"tool": "tool", "version": None, "arguments": {"n": 1}, "caller": {}, "poll_interval_ms": 100}
    return await engine.submit(scope=scope, **{**options, **fields})


async def _claimed(engine: TaskEngine, task_ref: str, within: float = 5.0) -> Claim:
    deadline = time.monotonic() + within
    while (claim := await engine.claim(task_ref)) is None:
        assert time.monotonic() < deadline, "the task never became claimable"
        await asyncio.sleep(0.05)
    return claim


class TaskEngineConformance(StoreConformance):
    """A store keeps background tasks right; subclass it with a ``store`` fixture."""

    lease: ClassVar[float] = 0.5
    """The lease (seconds) of the fencing check."""
    ttl: ClassVar[float] = 1.0
    """The TTL (seconds) of the expiry check."""

    @requires("atomic", "keys")
    async def test_tasks_known_at_once_and_only_to_their_principal(self, store: Any) -> None:
        engine = TaskEngine(store)
        record = await _submit(engine)
        assert len(record.id) >= 43
        read = await engine.read(record.id, "principal-a")
        assert read is not None and read.state is TaskState.WORKING and read.arguments == {"n": 1}
        assert await engine.read(record.id, "principal-b") is None
        assert await engine.read(record.id, None) is None
        assert await engine.read("no-such-task", "principal-a") is None
        assert record.ref in await engine.runnable()
        assert record.id not in await engine.runnable(), "the id is a capability: never a key"

    @requires("atomic", "keys")
    async def test_tasks_known_at_once_to_another_store_object(self, store: Any, peer_store: Any) -> None:
        engine, peer = TaskEngine(store), TaskEngine(peer_store)
        for _ in range(20):
            record = await _submit(engine)
            assert await peer.read(record.id, "principal-a") is not None

    @requires("atomic", "keys")
    async def test_tasks_one_claim_wins(self, store: Any) -> None:
        record = await _submit(TaskEngine(store))
        engines = [TaskEngine(store) for _ in range(8)]
        claims = await asyncio.gather(*(engine.claim(record.ref) for engine in engines))
        won = [claim for claim in claims if claim is not None]
        assert len(won) == 1 and won[0].token == 1

    @requires("atomic", "keys")
    async def test_tasks_a_lapsed_lease_is_fenced_off(self, store: Any) -> None:
        first, second = TaskEngine(store, lease=self.lease), TaskEngine(store, lease=self.lease)
        record = await _submit(first)
        old = await _claimed(first, record.ref)
        assert await second.claim(record.ref) is None  # the lease holds
        await asyncio.sleep(self.lease + 0.1)
        new = await _claimed(second, record.ref)
        assert new.token == old.token + 1
        assert not await first.heartbeat(old)
        padding = "x" * INLINE_RESULT_BYTES  # results kept beside the record, each under its run's token
        assert not await first.finish(old, TaskState.COMPLETED, result={"from": "old", "padding": padding})
        assert await second.finish(new, TaskState.COMPLETED, result={"from": "new", "padding": padding})
        assert not await first.finish(old, TaskState.COMPLETED, result={"from": "old"})  # in the record: as fenced
        final = await first.read(record.id, "principal-a")
        assert final is not None and final.result == {"from": "new", "padding": padding} and final.attempts == 2

    @requires("atomic", "keys")
    async def test_tasks_a_terminal_state_is_final(self, store: Any) -> None:
        engine = TaskEngine(store)
        record = await _submit(engine)
        claim = await _claimed(engine, record.ref)
        result = {"ok": True, "text": "x" * INLINE_RESULT_BYTES}  # kept beside the record
        assert await engine.finish(claim, TaskState.COMPLETED, result=result)
        assert await engine.cancel(record.id, "principal-a")  # acknowledged, nothing changes
        assert not await engine.finish(claim, TaskState.FAILED, error={"code": -1, "message": "late"})
        final = await engine.read(record.id, "principal-a")
        assert final is not None and final.state is TaskState.COMPLETED and final.result == result
        [listed] = await engine.records([record.ref])
        assert listed is not None and listed.result is None, "a listing must not read a large result"
        assert await engine.all_refs() == [record.ref]
        assert record.ref not in await engine.runnable()
        assert not await engine.cancel(record.id, "principal-b")

    @requires("atomic", "keys")
    async def test_tasks_a_refused_submit_leaves_nothing(self, store: Any) -> None:
        engine = TaskEngine(store)
        with pytest.raises(SerializationError):
            await _submit(engine, arguments={"n": float("nan")})
        assert await engine.runnable() == [], "a refused submit must leave no queue entry"
        assert await engine.all_refs() == []

    @requires("atomic", "keys")
    async def test_tasks_declined_changes_write_nothing(self, store: Any) -> None:
        engine = TaskEngine(store, ttl=self.ttl)
        record = await _submit(engine)
        claim = await _claimed(engine, record.ref)
        assert await engine.finish(claim, TaskState.COMPLETED, result={"ok": True})
        _, remaining = await store.ttl(record.ref, collection="kvstores-tasks")
        assert remaining is not None
        for _ in range(3):  # a cancel, a zombie's renewal and its late outcome: declined, no write
            assert await engine.cancel(record.id, "principal-a")
            assert not await engine.heartbeat(claim)
            assert not await engine.finish(claim, TaskState.FAILED, error={"code": -1, "message": "late"})
        _, after = await store.ttl(record.ref, collection="kvstores-tasks")
        assert after is not None and after <= remaining, "a declined change must not extend the record's TTL"
        await asyncio.sleep(self.ttl + 0.3)
        assert await engine.read(record.id, "principal-a") is None, "known past its TTL after declined changes"

    @requires("atomic", "keys")
    async def test_tasks_a_lapse_is_claimed_only_once_confirmed(self, store: Any) -> None:
        holder, claimer = TaskEngine(store, lease=self.lease), TaskEngine(store, lease=self.lease)
        record = await _submit(holder)
        held = await _claimed(holder, record.ref)
        await asyncio.sleep(self.lease + 0.1)  # lapsed by the clock, as after an outage of the store
        assert await claimer.claim(record.ref) is None, "a lapse seen once may be the store's absence"
        assert await holder.heartbeat(held), "a holder that renews after its lease lapsed keeps the task"
        assert await claimer.claim(record.ref) is None
        assert await holder.finish(held, TaskState.COMPLETED, result={"attempt": 1})
        final = await claimer.read(record.id, "principal-a")
        assert final is not None and final.result == {"attempt": 1} and final.attempts == 1

    @requires("atomic", "keys")
    async def test_tasks_a_dead_holders_task_runs_once_its_lapse_is_confirmed(self, store: Any) -> None:
        holder = TaskEngine(store, lease=self.lease)
        record = await _submit(holder)
        held = await _claimed(holder, record.ref)
        assert held.record.lease is not None
        await asyncio.sleep(max(0.0, held.record.lease.expires - time.time()) + 0.05)  # the holder died
        ran = asyncio.Event()

        async def execute(claim: Claim, _: TaskEngine) -> Outcome:
            ran.set()
            return Outcome(TaskState.COMPLETED, {"result": {}})

        # the first scan sees the lapse; the next is an hour away: the claim must come when the window ends
        async with _working(Worker(TaskEngine(store, lease=self.lease), execute, rescan=3_599)):
            assert await wait_event(ran, 30), "a lapse seen once must be claimed when confirmed, not a scan later"

    @requires("atomic", "keys")
    async def test_tasks_a_running_task_outlives_its_ttl(self, store: Any) -> None:
        engine = TaskEngine(store, lease=self.lease, ttl=self.ttl)
        record = await _submit(engine)
        claim = await _claimed(engine, record.ref)
        deadline = time.monotonic() + 2 * self.ttl + 0.5
        while time.monotonic() < deadline:  # renewals keep both the record and its queue entry
            assert await engine.heartbeat(claim)
            await asyncio.sleep(self.lease / 3)
        assert record.ref in await engine.runnable(), "the queue entry of a running task must not expire"
        assert await engine.finish(claim, TaskState.COMPLETED, result={"ok": True})
        assert record.ref not in await engine.runnable()

    @requires("atomic", "keys")
    async def test_tasks_expire_with_their_ttl(self, store: Any) -> None:
        engine = TaskEngine(store, ttl=self.ttl)
        record = await _submit(engine)
        assert record.ttl_ms == int(self.ttl * 1000)
        await asyncio.sleep(self.ttl + 0.3)
        assert await engine.read(record.id, "principal-a") is None
        assert await engine.records([record.ref]) == [None]
        assert record.ref not in await engine.runnable()

    @requires("atomic", "keys")
    async def test_tasks_a_scan_pages_through_a_queue_of_held_tasks(self, store: Any) -> None:
        holder = TaskEngine(store, lease=60)
        refs = sorted([(await _submit(holder)).ref for _ in range(7)])
        for task_ref in refs[:-1]:  # held by a live worker: the scan passes over them
            assert await holder.claim(task_ref) is not None
        ran: list[str] = []
        done = asyncio.Event()

        async def execute(claim: Claim, _: TaskEngine) -> Outcome:
            ran.append(claim.task_ref)
            done.set()
            return Outcome(TaskState.COMPLETED, {"result": {}})

        worker = Worker(TaskEngine(store), execute, concurrency=1, rescan=0.2)
        worker.scan_page = 2  # the free task is on the last of four pages
        async with _working(worker):
            await asyncio.wait_for(done.wait(), 10)
        assert ran == [refs[-1]], "the scan must find the free task behind pages of held ones, and only it"

    @requires("atomic", "keys")
    async def test_tasks_a_worker_runs_them_and_a_cancel_reaches_the_work(self, store: Any) -> None:
        engine = TaskEngine(store)
        cancelled = asyncio.Event()

        async def execute(claim: Claim, _: TaskEngine) -> Outcome:
            if claim.record.arguments.get("sleep"):
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
            return Outcome(TaskState.COMPLETED, {"result": {"n": claim.record.arguments["n"] * 2}})

        worker = Worker(engine, execute, concurrency=2, rescan=0.2)
        async with _working(worker):
            record = await _submit(engine, arguments={"n": 21})
            done = await self._settled(engine, record.id)
            assert done.state is TaskState.COMPLETED and done.result == {"n": 42}
            sleeping = await _submit(engine, arguments={"n": 0, "sleep": True})
            deadline = time.monotonic() + 10
            while sleeping.ref not in worker.running:
                assert time.monotonic() < deadline, "the worker never started the task"
                await asyncio.sleep(0.02)
            assert await engine.cancel(sleeping.id, "principal-a")
            assert await wait_event(cancelled, 5), "the cancel never reached the tool"
            final = await engine.read(sleeping.id, "principal-a")
            assert final is not None and final.state is TaskState.CANCELLED

    async def _settled(self, engine: TaskEngine, task_id: str) -> TaskRecord:
        deadline = time.monotonic() + 10
        while True:
            record = await engine.read(task_id, "principal-a")
            assert record is not None
            if record.state is not TaskState.WORKING:
                return record
            assert time.monotonic() < deadline, "the task never finished"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _working(worker: Worker) -> AsyncIterator[Worker]:
    """``worker`` running in a task of its own, stopped (and its error raised) on the way out."""
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield worker
    finally:
        await stop(running)
