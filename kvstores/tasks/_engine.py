"""Background tasks on a kvstores store: records, the queue, leases and fencing (no MCP import).

A task is one :class:`~kvstores.tasks._record.TaskRecord` in :data:`RECORDS`, keyed by its ref
(the SHA-256 of its id: the id, ``secrets.token_urlsafe(32)``, is a capability and is never a
key, a signal or a log line), holding everything about it: the tool and its arguments, the
caller's identity, its state, progress, outcome and lease. A runnable or running task also has
an entry in :data:`QUEUE` (same key), which workers scan; the signal channel (:data:`SIGNALS`)
wakes them, but never decides anything: a missed signal costs latency, not a task.

- The record is written before its queue entry, so no queue entry ever names a task that was
  never stored; an entry whose record is gone (expired) is dropped by the first worker that sees it.
- Claims, renewals and fenced writes follow :mod:`kvstores._lease` (its docstring is the whole
  mechanism): a worker whose lease was taken over can no longer change the task, and a lease
  that lapsed only because the store was unreachable is not taken from a live holder.
- Every change is one compare-and-set that checks the state table
  (:func:`~kvstores.tasks._record.check_transition`); a terminal state is final. A change that
  is declined (ended, fenced off, nothing to do) writes nothing, so it never extends the record's
  TTL: a task is unknown everywhere ``ttl`` seconds after its last real change.
- The holder's renewals refresh the queue entry too, so a task may run longer than its TTL.

A worker that cannot open a record (EncryptionKeyError: its keys are not the submitter's) leaves
a fault report beside it (key ``fault/<ref>``), which every server that can open the record
turns into a ``failed`` task naming the key mismatch; the tool never runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kvstores._lease import LapseWatch, Lease
from kvstores._telemetry import span
from kvstores.errors import EncryptionKeyError, KVStoreError, SerializationError, StoreConnectionError
from kvstores.protocol import UNCHANGED, AtomicStore, EnumerateKeysStore, Unchanged, missing_methods
from kvstores.tasks._record import TaskRecord, TaskRecordError, TaskState, check_transition, label, ref

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_TTL",
    "QUEUE",
    "RECORDS",
    "SIGNALS",
    "Claim",
    "TaskEngine",
    "label",
    "ref",
]

logger = logging.getLogger("kvstores.tasks")

RECORDS = "kvstores-tasks"
"""The collection of task records, their results (``outcome/<ref>/<token>``: a listing reads records only)
and workers' fault reports (``fault/<ref>``)."""

QUEUE = "kvstores-tasks-queue"
"""The collection of runnable and running tasks' refs: what workers scan."""

SIGNALS = "kvstores-tasks"
"""The signal channel's name: ``submit <ref>`` wakes workers, ``cancel <ref>`` reaches the holder."""

DEFAULT_LEASE = 10.0
"""Seconds a claim lasts without a renewal. A SIGKILLed worker's task runs again within this plus
:func:`kvstores._lease.confirm_after` (5 s) plus one rescan, whatever the traffic."""

DEFAULT_TTL = 3_600.0
"""Seconds a task is kept after its last change."""

SCAN_PAGE = 1_000
"""Queue entries one scan reads."""

_FAULT = "fault/"
_OUTCOME = "outcome/"
_RETRY_CAP = 1.0


def iso(seconds: float) -> str:
    """``seconds`` since the epoch as an ISO 8601 UTC timestamp."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).isoformat()


@dataclass(frozen=True)
class Claim:
    """A lease this worker holds on a task: the record as claimed, and the fencing token."""

    record: TaskRecord
    token: int

    @property
    def task_id(self) -> str:
        """The task's id (a capability: never log it; see :attr:`task_ref`)."""
        return self.record.id

    @property
    def task_ref(self) -> str:
        """The task's key."""
        return self.record.ref


Change = Callable[[TaskRecord], "TaskRecord | None"]
"""A change to a record: the record as it should be, or None to write nothing."""


class TaskEngine:
    """The store side of background tasks: submit, read, claim, fenced writes, cancel, answer input."""

    def __init__(self, store: Any, *, lease: float = DEFAULT_LEASE, ttl: float = DEFAULT_TTL) -> None:
        lacks = missing_methods(store, AtomicStore) + missing_methods(store, EnumerateKeysStore)
        if lacks:
            raise TypeError(
                f"background tasks need a store with atomic operations and keys() (kvstores.AtomicStore, "
                f"EnumerateKeysStore); {type(store).__name__} has no {', '.join(f'{name}()' for name in lacks)}"
            )
        for name, value in (("lease", lease), ("ttl", ttl)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number of seconds, not {value!r}")
        self.store = store
        self.lease = float(lease)
        self.ttl = float(ttl)
        self.worker_id = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        """This engine's name as a lease holder: host, process id and a random part."""
        self._lapses = LapseWatch(self.lease)
        self._queued: dict[str, float] = {}  # ref -> when this holder last refreshed its queue entry

    @property
    def _atomic(self) -> AtomicStore:
        return cast(AtomicStore, self.store)

    # -- the submitting side ---------------------------------------------------------

    async def submit(
        self,
        *,
        tool: str,
        version: str | None,
        arguments: Mapping[str, Any],
        scope: str | None,
        caller: Mapping[str, Any],
        poll_interval_ms: int,
        rerun: bool = True,
    ) -> TaskRecord:
        """Write a new task and return its record; once this returns, every replica knows the task.

        The record is written first, then its queue entry: a record the store refuses (too
        large, not JSON) leaves nothing behind, and a queue entry always names a stored task.
        Raises the store's error (nothing is reported to the client as created) when either
        write fails; the record of a failed queue write is deleted (best effort: nobody runs it,
        and it expires).
        """
        now = time.time()
        record = TaskRecord(
            id=secrets.token_urlsafe(32),
            scope=scope,
            tool=tool,
            version=version,
            arguments=dict(arguments),
            caller=dict(caller),
            rerun=rerun,
            created=now,
            updated=now,
            ttl_ms=int(self.ttl * 1000),
            poll_ms=poll_interval_ms,
        )
        task_ref = record.ref
        with span("kvstores.tasks submit", {"kvstores.task": label(task_ref), "kvstores.task.tool": tool}):
            if not await self._atomic.put_if_absent(task_ref, record.to_json(), collection=RECORDS, ttl=self.ttl):
                raise KVStoreError("a new task id collided with a stored one")  # 256 random bits: never
            try:
                await self.store.put(task_ref, {"at": now}, collection=QUEUE, ttl=self.ttl)
            except BaseException:
                try:
                    await self.store.delete(task_ref, collection=RECORDS)
                except KVStoreError as exc:
                    logger.warning("tasks: could not delete task %s after a failed submit: %s", label(task_ref), exc)
                raise
            await self.wake(task_ref)
        return record

    async def wake(self, task_ref: str) -> None:
        """Tell the workers that ``task_ref`` is runnable (best effort: their rescan finds it anyway)."""
        await self._signal("submit", task_ref)

    async def _signal(self, kind: str, task_ref: str) -> None:
        from kvstores.signals import channel

        try:
            await channel(self.store).publish(SIGNALS, f"{kind} {task_ref}")
        except (KVStoreError, TypeError, OSError) as exc:
            logger.warning("tasks: could not signal %s of task %s (%s); rescans catch up", kind, label(task_ref), exc)

    async def read(self, task_id: str, scope: str | None) -> TaskRecord | None:
        """The record of ``task_id``, its result loaded, when it exists and belongs to ``scope``; else None
        (the same answer). A worker's fault report beside a live record fails the task here (see the module
        docstring).
        """
        if not isinstance(task_id, str) or not task_id:
            return None
        task_ref = ref(task_id)
        record, fault = await self._with_fault(task_ref)
        if record is None or record.scope != scope or record.id != task_id:
            return None
        if fault is not None and not record.state.terminal:
            record = await self._fail_unfenced(task_ref, fault) or record
        if record.result_token is None:
            return record
        outcome = await self.store.get(_outcome_key(task_ref, record.result_token), collection=RECORDS)
        if outcome is None:  # expired a moment before its record: the task is gone
            return None
        return dataclasses.replace(record, result=outcome.get("result"))

    async def _with_fault(self, task_ref: str) -> tuple[TaskRecord | None, str | None]:
        """The record and the text of a worker's fault report on it (None: no report)."""
        try:
            stored, fault = await self.store.get_many([task_ref, _FAULT + task_ref], collection=RECORDS)
        except EncryptionKeyError:  # one of the two cannot be opened here: read them apart
            stored = await self.store.get(task_ref, collection=RECORDS)
            try:
                fault = await self.store.get(_FAULT + task_ref, collection=RECORDS)
            except EncryptionKeyError as exc:
                return _typed(stored, task_ref), (
                    "a worker could not open this task and failed it; its report is sealed with a key this "
                    f"server lacks ({exc}): the servers and workers of this store do not share encryption keys"
                )
        return _typed(stored, task_ref), None if fault is None else str(fault.get("error", "a worker failed the task"))

    async def _fail_unfenced(self, task_ref: str, message: str) -> TaskRecord | None:
        error = {"code": -32603, "message": message}
        return await self._change(
            task_ref, None, lambda record: record.entering(TaskState.FAILED, error=error, message=message)
        )

    async def cancel(self, task_id: str, scope: str | None) -> bool:
        """Cancel a task of ``scope``; False when unknown. A terminal task is left as it is (and True):
        nothing is written, so its TTL runs from its last real change."""
        record = await self.read(task_id, scope)
        if record is None:
            return False
        if record.state.terminal:
            return True
        changed = await self._change(record.ref, None, lambda record: record.entering(TaskState.CANCELLED))
        if changed is not None:
            await self._unqueue(record.ref)
            await self._signal("cancel", record.ref)
        return True

    async def answer(
        self,
        task_id: str,
        scope: str | None,
        responses: Mapping[str, Any],
        check: Callable[[str | None, Any], Any] | None = None,
    ) -> bool:
        """Store the client's answers to an ``input_required`` task; False when unknown.

        Keys that name no outstanding request are ignored; once every request is answered the
        task is runnable again (the tool is re-entered with the answers). Anything else is a no-op.
        ``check(method, answer)`` returns the answer as stored, or raises (then nothing is stored).
        """
        record = await self.read(task_id, scope)
        if record is None:
            return False

        def answered(record: TaskRecord) -> TaskRecord | None:
            outstanding = dict(record.input_requests or {})
            if record.state is not TaskState.INPUT_REQUIRED or not outstanding:
                return None
            matched = {key: value for key, value in responses.items() if key in outstanding}
            if not matched:
                return None
            keys = dict(record.input_keys or {})
            collected = dict(record.input_responses or {})
            for key, value in matched.items():
                method = outstanding[key].get("method")
                result = value if check is None else check(method, value)
                collected[keys.get(key, key)] = {"method": method, "result": result}
                del outstanding[key]
            if outstanding:
                return dataclasses.replace(record, input_requests=outstanding, input_responses=collected)
            return record.entering(TaskState.WORKING, input_requests=None, input_responses=collected, message=None)

        changed = await self._change(record.ref, None, answered)
        if changed is not None and changed.state is TaskState.WORKING:
            await self.store.put(record.ref, {"at": time.time()}, collection=QUEUE, ttl=self.ttl)
            await self.wake(record.ref)
        return True

    # -- the working side --------------------------------------------------------------

    async def runnable(self, limit: int = SCAN_PAGE) -> list[str]:
        """Refs in the queue (runnable or running tasks), at most ``limit``."""
        try:
            return await cast(EnumerateKeysStore, self.store).keys(QUEUE, limit=limit)
        except (StoreConnectionError, TimeoutError):
            self._lapses.outage()
            raise

    async def claim(self, task_ref: str) -> Claim | None:
        """Take the lease of ``task_ref`` when it is runnable: never leased, released, or its lease
        confirmed lapsed (:class:`kvstores._lease.LapseWatch`: a lapse seen right after an outage
        is the store's absence, not the holder's death, until it has lasted the confirmation window).

        A task whose lease lapsed and whose tool opted out of re-runs is failed instead. A
        terminal or vanished task leaves the queue. Raises EncryptionKeyError (after leaving a
        fault report) when this worker cannot open the record.
        """
        try:
            return await self._claim(task_ref)
        except (StoreConnectionError, TimeoutError):
            self._lapses.outage()
            raise

    async def _claim(self, task_ref: str) -> Claim | None:
        try:
            record, fault = await self._with_fault(task_ref)
        except EncryptionKeyError as exc:
            await self._report_fault(task_ref, exc)
            raise
        except TaskRecordError as exc:
            logger.debug("tasks: skipping a queue entry: %s", exc)
            return None
        if record is None or record.state.terminal:
            await self._unqueue(task_ref)  # expired, or ended: the entry names nothing to run
            return None
        if fault is not None:
            await self._fail_unfenced(task_ref, fault)
            await self._unqueue(task_ref)
            return None
        if record.state is not TaskState.WORKING:
            return None
        seen = record.lease
        if seen is not None and not (seen.lapsed(time.time()) and self._lapses.confirmed(task_ref, seen)):
            return None
        now = time.time()
        lease = Lease(self.worker_id, 0, now + self.lease)

        def claimed(record: TaskRecord) -> TaskRecord | None:
            if record.state is not TaskState.WORKING or record.lease != seen:
                return None  # claimed, renewed or ended since it was read
            if seen is not None and not record.rerun:
                message = (
                    f"the worker running this task stopped renewing its lease (attempt {record.attempts}); "
                    "the tool opts out of re-runs, so the task fails instead of running again"
                )
                return record.entering(TaskState.FAILED, error={"code": -32603, "message": message}, message=message)
            token = record.token + 1
            return dataclasses.replace(
                record, lease=dataclasses.replace(lease, token=token), token=token, attempts=record.attempts + 1
            )

        changed = await self._change(task_ref, None, claimed)
        self._lapses.forget(task_ref)
        if changed is None:
            return None
        if changed.state.terminal:
            await self._unqueue(task_ref)
            return None
        self._queued[task_ref] = time.monotonic()
        return Claim(changed, changed.token)

    async def _report_fault(self, task_ref: str, exc: EncryptionKeyError) -> None:
        message = (
            f"worker {self.worker_id} cannot open this task ({exc}); every server and worker of this store "
            "must share its encryption keys. The tool was not run."
        )
        logger.error("tasks: task %s cannot be opened here: %s", label(task_ref), exc)
        try:
            await self._atomic.put_if_absent(_FAULT + task_ref, {"error": message}, collection=RECORDS, ttl=self.ttl)
            await self._unqueue(task_ref)
        except KVStoreError as failure:
            logger.warning("tasks: could not report the fault of task %s: %s", label(task_ref), failure)

    async def fenced(self, claim: Claim, change: Change) -> TaskRecord | None:
        """Apply ``change`` to the record while ``claim`` still holds it; None when it does not (lost or ended)."""
        return await self._change(claim.task_ref, claim.token, change)

    async def release(self, claim: Claim) -> bool:
        """Give the task back (its worker stops): runnable again at once, or failed for a tool that opts out
        of re-runs. False when the lease was already lost."""
        message = "the worker stopped while it ran this task; the tool opts out of re-runs, so the task fails"

        def released(record: TaskRecord) -> TaskRecord:
            if record.rerun:
                return dataclasses.replace(record, lease=None)
            return record.entering(TaskState.FAILED, error={"code": -32603, "message": message}, message=message)

        self._queued.pop(claim.task_ref, None)
        changed = await self.fenced(claim, released)
        if changed is not None and changed.state is TaskState.WORKING:
            await self.wake(claim.task_ref)
        return changed is not None

    async def heartbeat(self, claim: Claim) -> bool:
        """Renew the lease (and, every quarter of the TTL, the queue entry); False when the lease is lost
        (taken over, cancelled, ended, expired away). A renewal refused by the store is its error."""
        now = time.time()
        changed = await self.fenced(
            claim,
            lambda record: dataclasses.replace(record, lease=record.lease and record.lease.renewed(now, self.lease)),
        )
        if changed is None:
            self._queued.pop(claim.task_ref, None)
            return False
        if time.monotonic() - self._queued.get(claim.task_ref, 0.0) >= self.ttl / 4:
            await self.store.put(claim.task_ref, {"at": now}, collection=QUEUE, ttl=self.ttl)
            self._queued[claim.task_ref] = time.monotonic()
        return True

    async def finish(self, claim: Claim, state: TaskState, **fields: Any) -> bool:
        """Write the run's outcome (``state`` and its fields), retrying while the store is down.

        An outcome the store refuses (too large, not JSON) fails the task instead, naming why,
        with nothing of the outcome written. False when the lease was lost: a re-run or a
        cancel owns the task, and this outcome is dropped.
        """
        attributes = {"kvstores.task": label(claim.task_ref), "kvstores.task.state": state.value}
        with span("kvstores.tasks finish", attributes) as current:
            written = await self._finish(claim, state, fields)
            if current is not None:
                current.set_attribute("kvstores.task.written", written)
        return written

    async def _finish(self, claim: Claim, state: TaskState, fields: Mapping[str, Any]) -> bool:
        delay = 0.05
        outcome = (state, dict(fields))
        self._queued.pop(claim.task_ref, None)
        kept = None
        while True:
            try:
                if kept is None and outcome[1].get("result") is not None:
                    kept = await self._keep_result(claim, outcome[1]["result"])
                if kept is not None:
                    outcome = (outcome[0], {**outcome[1], "result": None, "result_token": claim.token})
                changed = await self.fenced(claim, functools.partial(_outcome, state=outcome[0], fields=outcome[1]))
                break
            except SerializationError as exc:
                if outcome[0] is TaskState.FAILED:
                    raise
                message = f"the task's outcome cannot be stored: {exc}"
                outcome = (TaskState.FAILED, {"error": {"code": -32603, "message": message}, "message": message})
            except (TimeoutError, StoreConnectionError) as exc:
                logger.warning(
                    "tasks: storing the outcome of task %s failed (%s); retrying", label(claim.task_ref), exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_CAP)
        if changed is None:
            if kept is not None:  # this run lost the task: its result names a lease nobody holds
                await self._forget(kept)
            return False
        if changed.state is not TaskState.WORKING:
            await self._unqueue(claim.task_ref)
        return True

    async def _keep_result(self, claim: Claim, result: Any) -> str:
        """Store a run's result beside its record, under its lease's token (a late run of a lost lease writes
        a key of its own, never the winner's); the key. Listing tasks then never reads results."""
        key = _outcome_key(claim.task_ref, claim.token)
        await self.store.put(key, {"result": result}, collection=RECORDS, ttl=self.ttl)
        return key

    async def _forget(self, key: str) -> None:
        try:
            await self.store.delete(key, collection=RECORDS)
        except KVStoreError as exc:  # it expires with its TTL
            logger.warning("tasks: could not delete a dropped outcome: %s", exc)

    async def _unqueue(self, task_ref: str) -> None:
        try:
            await self.store.delete(task_ref, collection=QUEUE)
        except KVStoreError as exc:  # the entry expires anyway; workers skip what is not runnable
            logger.warning("tasks: could not drop task %s from the queue: %s", label(task_ref), exc)

    async def _change(self, task_ref: str, token: int | None, change: Change) -> TaskRecord | None:
        """Compare-and-set the record: ``change`` (fenced on ``token`` when given) or nothing.

        Returns the record as written, None when nothing was written (absent, ended, fenced off,
        or ``change`` declined): a declined change is no write at all, so it keeps the TTL.
        ``update`` may run the function more than once: the last run's verdict is the one written.
        """
        written: list[TaskRecord] = []

        def fn(old: dict[str, Any] | None) -> dict[str, Any] | Unchanged:
            written.clear()
            record = _typed(old, task_ref)
            if record is None or record.state.terminal:
                return UNCHANGED
            if token is not None and not record.held_by(token):
                return UNCHANGED
            new = change(record)
            if new is None:
                return UNCHANGED
            check_transition(record.state, new.state)
            new = dataclasses.replace(new, updated=time.time())
            written.append(new)
            return new.to_json()

        await self._atomic.update(task_ref, fn, collection=RECORDS, ttl=self.ttl)
        return written[0] if written else None

    async def records(self, refs: Sequence[str]) -> list[TaskRecord | None]:
        """The records of ``refs`` (operators' listing), None where gone."""
        stored = await self.store.get_many(list(refs), collection=RECORDS) if refs else []
        return [_typed(value, task_ref) for value, task_ref in zip(stored, refs, strict=True)]

    async def all_refs(self, limit: int = 10_000) -> list[str]:
        """Refs of every stored task (fault reports left out), at most ``limit``."""
        keys = await cast(EnumerateKeysStore, self.store).keys(RECORDS, limit=limit)
        return [key for key in keys if "/" not in key]  # records, not fault reports or results


def _outcome_key(task_ref: str, token: int) -> str:
    return f"{_OUTCOME}{task_ref}/{token}"


def _typed(stored: Mapping[str, Any] | None, task_ref: str) -> TaskRecord | None:
    return None if stored is None else TaskRecord.from_json(stored, task_ref)


def _renewed(record: TaskRecord, now: float, length: float) -> TaskRecord:
    return record if record.lease is None else dataclasses.replace(record, lease=record.lease.renewed(now, length))


def _outcome(record: TaskRecord, state: TaskState, fields: Mapping[str, Any]) -> TaskRecord:
    if state is record.state:
        return dataclasses.replace(record, **fields)
    return record.entering(state, **fields)
