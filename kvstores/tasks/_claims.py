"""The working side of the task engine: claims, renewals, fenced writes and outcomes (see :mod:`kvstores._lease`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from kvstores._lease import Lease
from kvstores._telemetry import span
from kvstores.errors import EncryptionKeyError, KVStoreError, SerializationError, StoreConnectionError
from kvstores.protocol import EnumerateKeysStore
from kvstores.tasks._book import QUEUE, RECORDS, SCAN_PAGE, Change, TaskBook, logger
from kvstores.tasks._record import TaskRecord, TaskRecordError, TaskState, label

__all__ = ["INLINE_RESULT_BYTES", "Claim", "Claims"]

INLINE_RESULT_BYTES = 1024
"""A run's result up to this size (as JSON) is stored in the task's record; a larger one beside it."""

_RETRY_CAP = 1.0
"""Seconds between two attempts at most, while an outcome cannot be stored."""


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


class Claims(TaskBook):
    """What a worker does with tasks: find runnable ones, claim them, keep and end their leases."""

    async def runnable(self, limit: int = SCAN_PAGE, after: str | None = None) -> list[str]:
        """Refs in the queue (runnable or running tasks), in order: at most ``limit``, those after ``after``."""
        try:
            return await cast(EnumerateKeysStore, self.store).keys(QUEUE, limit=limit, after=after)
        except (StoreConnectionError, TimeoutError):
            self._lapses.outage()
            raise

    async def claimable(self, refs: Sequence[str]) -> list[str]:
        """Those of ``refs`` that :meth:`claim` may act on, read in one round trip: all but the
        tasks whose lease is live or which wait for input (a record this worker cannot open or
        read is left to :meth:`claim`, which reports it)."""
        try:
            records = await self.records(refs)
        except (StoreConnectionError, TimeoutError):
            self._lapses.outage()
            raise
        except (EncryptionKeyError, TaskRecordError, SerializationError):
            return list(refs)  # one of them cannot be read here: claim() looks at each alone
        now = time.time()
        return [
            task_ref
            for task_ref, record in zip(refs, records, strict=True)
            if record is None
            or record.state.terminal
            or (record.state is TaskState.WORKING and (record.lease is None or record.lease.lapsed(now)))
        ]

    def confirmable_at(self, task_ref: str) -> float | None:
        """The ``time.monotonic()`` at which a lapse of ``task_ref`` that :meth:`claim` saw but could not
        yet claim is confirmed (in the past, or None: no lapse is waiting for its window)."""
        return self._lapses.due(task_ref)

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
        if seen is not None:
            logger.warning(
                "tasks: the lease of task %s (worker %s) lapsed %.1f s ago; %s",
                label(task_ref),
                seen.holder,
                now - seen.expires,
                "it fails (its tool opts out of re-runs)" if changed.state.terminal else "running it again here",
            )
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
            await self._atomic.put_if_absent(
                self._fault_key(task_ref), {"error": message}, collection=RECORDS, ttl=self.ttl
            )
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
        kept = result = None
        while True:
            if kept is None:  # once kept beside the record, the outcome's own field is None
                result = outcome[1].get("result")
            try:
                if kept is None and result is not None and not _fits_inline(result):
                    kept = await self._keep_result(claim, result)
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
        # readers held here answer at once, with the record as written; the signal wakes the others'
        self.changes.changed(claim.task_ref, changed if kept is None else dataclasses.replace(changed, result=result))
        if changed.state is not TaskState.WORKING:
            await self._unqueue(claim.task_ref)
        await self._signal("done", claim.task_ref)
        return True

    async def _keep_result(self, claim: Claim, result: Any) -> str:
        """Store a run's result beside its record, under its lease's token (a late run of a lost lease writes
        a key of its own, never the winner's); the key. Listing tasks then never reads large results (one of
        at most :data:`INLINE_RESULT_BYTES` goes in the record: the outcome is then one write)."""
        key = self._result_key(claim.task_ref, claim.token)
        await self.store.put(key, {"result": result}, collection=RECORDS, ttl=self.ttl)
        return key

    async def _forget(self, key: str) -> None:
        try:
            await self.store.delete(key, collection=RECORDS)
        except KVStoreError as exc:  # it expires with its TTL
            logger.warning("tasks: could not delete a dropped outcome: %s", exc)


def _fits_inline(result: Any) -> bool:
    """True when ``result`` is small enough to be stored in its task's record (as JSON).

    A large result is told by a walk that stops past the limit (the store encodes it once, beside
    the record); only a result that may fit is encoded here, to measure it.
    """
    if _json_floor(result, INLINE_RESULT_BYTES) > INLINE_RESULT_BYTES:
        return False
    try:
        return len(orjson.dumps(result)) <= INLINE_RESULT_BYTES
    except TypeError:  # not JSON as orjson sees it: the store's own encoding decides, beside the record
        return False


def _json_floor(value: Any, limit: int) -> int:
    """A lower bound of ``value``'s size as JSON, in bytes; the walk stops once it passes ``limit``."""
    size = 0
    pending = [value]
    while pending and size <= limit:
        item = pending.pop()
        if isinstance(item, str):
            size += len(item) + 2  # its quotes; a character is one byte at least
        elif isinstance(item, dict):
            size += 2 * len(item) + 1  # braces, and a colon and a comma per member
            if size <= limit:
                pending.extend(item.keys())
                pending.extend(item.values())
        elif isinstance(item, list | tuple):
            size += len(item) + 1  # brackets and commas
            if size <= limit:
                pending.extend(item)
        else:  # a number, true, false or null: one character at least
            size += 1
    return size


def _outcome(record: TaskRecord, state: TaskState, fields: Mapping[str, Any]) -> TaskRecord:
    if state is record.state:
        return dataclasses.replace(record, **fields)
    return record.entering(state, **fields)
